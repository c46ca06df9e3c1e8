#!/usr/bin/env bash
# A real 4-node Slurm on this machine for hpcsched's Slurm tests: one slurmctld and slurmd daemons
# n1..n4 on loopback (deploy/slurm/slurm.conf). Needs root and Debian/Ubuntu (apt-get); no systemd:
# the daemons are started by hand and stopped by the PIDs they write.
#
#   scripts/slurm_cluster.sh up      install if missing, stop any earlier cluster, wipe its state,
#                                    start munged/slurmctld/slurmd, wait until `srun -N4 true` ran
#   scripts/slurm_cluster.sh down    cancel jobs, stop the daemons by PID (munged only if we started it)
#   scripts/slurm_cluster.sh status  print whether it is up and the nodes' states
#
# Both `up` and `down` are idempotent. `up` wipes controller state, so job ids restart at 1 and the
# jobcomp log is empty. It installs deploy/slurm/slurm.conf as /etc/slurm/slurm.conf and refuses to
# overwrite a configuration that is not its own (set HPCSCHED_SLURM_FORCE=1 to override).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CONF_SRC="$ROOT/deploy/slurm/slurm.conf"
CONF=/etc/slurm/slurm.conf
MARKER="# hpcsched-test-cluster"
STATE=/run/hpcsched-slurm          # our own bookkeeping (did we start munged?)
NODES=$(sed -n 's/^NodeName=\([a-z]*\)\[\([0-9]*\)-\([0-9]*\)\].*/\1 \2 \3/p' "$CONF_SRC" | head -1)
read -r NODE_PREFIX NODE_LO NODE_HI <<<"$NODES"
NODE_NAMES=$(seq -f "${NODE_PREFIX}%g" "$NODE_LO" "$NODE_HI")
NODE_COUNT=$((NODE_HI - NODE_LO + 1))
WAIT_S=${HPCSCHED_SLURM_WAIT_S:-60}

log() { echo "slurm_cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Stop the processes whose PIDs are in the files "$@" (missing files are skipped): SIGTERM to all at
# once (each daemon takes ~2 s to exit), wait up to 10 s, then SIGKILL what is left.
stop_pidfiles() {
  local f pid pids=()
  for f in "$@"; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  for _ in $(seq 100); do
    local left=()
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
    [ ${#left[@]} -eq 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null && { log "pid $pid ignored SIGTERM; SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
  done
  rm -f "$@"
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_if_missing() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
    return 0
  fi
  command -v apt-get >/dev/null || die "slurmctld/slurmd/munged missing and no apt-get to install them"
  log "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurm-wlm munge >/dev/null
}

install_conf() {
  mkdir -p /etc/slurm
  if [ -e "$CONF" ] && ! grep -qx "$MARKER" "$CONF" && [ "${HPCSCHED_SLURM_FORCE:-0}" != 1 ]; then
    die "$CONF exists and is not hpcsched's test configuration; not overwriting (HPCSCHED_SLURM_FORCE=1 to force)"
  fi
  cp "$CONF_SRC" "$CONF"
}

cmd_down() {
  if alive /run/slurmctld.pid && command -v squeue >/dev/null; then
    # Cancel every job so no slurmstepd outlives its slurmd; wait for them to drain.
    local ids
    ids=$(squeue -h -o %i 2>/dev/null || true)
    if [ -n "$ids" ]; then
      # shellcheck disable=SC2086
      scancel $ids 2>/dev/null || true
      for _ in $(seq 100); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
    fi
  fi
  local f slurmd_pids=()
  for n in $NODE_NAMES; do slurmd_pids+=("/run/slurmd-$n.pid"); done
  stop_pidfiles "${slurmd_pids[@]}"
  stop_pidfiles /run/slurmctld.pid
  if [ -e "$STATE/munged.ours" ]; then
    stop_pidfiles /run/munge/munged.pid
    rm -f "$STATE/munged.ours"
  fi
  log "down"
}

cmd_up() {
  [ "$(id -u)" = 0 ] || die "must run as root (slurmd runs jobs as root in this test cluster)"
  local t0 t_inst
  t0=$(date +%s.%N)
  install_if_missing
  t_inst=$(date +%s.%N)
  cmd_down 2>/dev/null
  install_conf
  mkdir -p /var/spool/slurmctld /var/log/slurm /run/munge "$STATE"
  rm -rf /var/spool/slurmctld/* /var/log/slurm/jobcomp.txt
  for n in $NODE_NAMES; do rm -rf "/var/spool/slurmd/$n"; mkdir -p "/var/spool/slurmd/$n"; done
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey -c -f >/dev/null 2>&1 || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  if ! alive /run/munge/munged.pid; then
    chown munge:munge /run/munge
    runuser -u munge -- /usr/sbin/munged
    touch "$STATE/munged.ours"
  fi
  /usr/sbin/slurmctld -i
  for n in $NODE_NAMES; do /usr/sbin/slurmd -N "$n"; done
  local deadline=$(( $(date +%s) + WAIT_S ))
  until [ "$(sinfo -h -p batch -t idle -o %D 2>/dev/null)" = "$NODE_COUNT" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || { sinfo -N >&2 || true; die "nodes not idle after ${WAIT_S}s"; }
    sleep 0.2
  done
  timeout "$WAIT_S" srun -N"$NODE_COUNT" -p batch true || die "srun -N$NODE_COUNT -p batch true failed"
  local t1
  t1=$(date +%s.%N)
  log "up: $NODE_COUNT nodes ran srun -N$NODE_COUNT true;" \
      "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s total," \
      "$(awk -v a="$t_inst" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s after install"
}

cmd_status() {
  if alive /run/slurmctld.pid; then
    echo "up"; sinfo -N -h -o '%N %P %T'
  else
    echo "down"; return 3
  fi
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
