"""The ``slurm:`` section of a controller file (node source ``slurm``) and the pilots' batch script.

Read once at start (errors name the file and the section's line); ``hpcsched.slurm.pilots`` runs pilots with it.
"""

from __future__ import annotations

import math
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcsched.errors import InputError
from hpcsched.runtime.worker_start import pilot_worker_argv


@dataclass(frozen=True, slots=True)
class PilotConfig:
    """The ``slurm:`` section of a controller file (``node_source: slurm``)."""

    partition: str | None = None  # the preemptible partition the site gives (scavenger); None: Slurm's default
    qos: str | None = None
    account: str | None = None
    time_limit_s: int = 3600  # each pilot's --time (fit-idle-window: the longest a pilot asks for)
    time_limit: str = "fixed"  # fixed: time_limit_s; fit-idle-window: each node's idle window (idle_windows.py)
    min_window_s: int = 600  # fit-idle-window: a node idle for less is not used ('idle window too short')
    window_margin_s: int = 60  # fit-idle-window: the pilot's time limit ends this long before the node's claim
    leave_before_s: int = 60  # SIGTERM this long before the time limit: checkpoint and leave in time
    signal: str = "TERM"  # the signal Slurm sends then (--signal=B:SIG@leave_before_s; fixed time_limit only)
    max_pilots: int = 4
    slots: int = 1  # per pilot's worker
    gpus: int = 0
    stop_grace_s: float = 4.0  # the pilot worker's checkpoint time on SIGTERM: below the partition's GraceTime
    orphan_timeout_s: float = 600.0  # a pilot whose controller is unreachable this long leaves (not restarted)
    poll_s: float = 2.0
    start_timeout_s: float = 300.0  # pending longer: cancelled (never started)
    register_timeout_s: float = 120.0  # running, but no worker registered by then: cancelled (hung)
    # Decisions wait at most this long after a pilot was submitted or started for its worker to register. Pilots
    # freed together register a few hundred ms apart; planning at each arrival started an elastic job at 1 proc
    # and relaunched it at every next one (a full stop, checkpoint and start each time).
    settle_s: float = 10.0
    idle_release_s: float = 60.0  # a pilot with nothing to run this long, while none is needed, is released
    work_dir: Path = Path("pilots")  # pilots' logs, work dirs and token file (a shared file system)
    python: str = sys.executable
    # The pilots' worker config file (``--config``): whom their tasks run as (run_as, users), task_python,
    # allowed_workdirs, checkpoint_quota_mb... A pilot submitted by a root controller runs as root, and so would its
    # tasks, able to read the pilot's token file, without one.
    worker_config: Path | None = None
    sbatch_args: tuple[str, ...] = ()  # anything else the site needs (--constraint, --mem, ...)
    # True: the worker runs as the job's step (srun), and every process of the step gets Slurm's signals, so an
    # elastic Horovod job's ranks there die instead of being removed at a commit and its survivors wait out Gloo's
    # timeout (docs/runtime.md). The default (False) runs the worker beside a sentinel step, which hears a
    # preemption as early (pilot_script) without signalling the tasks' processes.
    worker_step: bool = False


_KEYS = {f for f in PilotConfig.__dataclass_fields__}
FIT = "fit-idle-window"
TIME_LIMITS = ("fixed", FIT)
_FIT_KEYS = ("min_window_s", "window_margin_s")  # read only by fit-idle-window: refused beside fixed


def read_pilot_config(data: Any, source: str, line: int | None, base: Path) -> PilotConfig:
    """The ``slurm:`` mapping of a controller file, validated (errors name the file and the section's line)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(source, "slurm: expected a mapping (partition, qos, account, time_limit_s, ...)", line)
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise InputError(source, f"slurm: unknown key {unknown[0]!r}; expected one of {', '.join(sorted(_KEYS))}",
                         line)
    out: dict[str, Any] = {}
    defaults = PilotConfig()
    for k, v in data.items():
        want = type(getattr(defaults, k))
        if k in ("partition", "qos", "account"):
            want = str
        if k == "time_limit":
            if v not in TIME_LIMITS:
                raise InputError(source, f"slurm: time_limit: expected one of {', '.join(TIME_LIMITS)}, got {v!r}",
                                 line)
            out[k] = v
        elif k in ("work_dir", "worker_config"):
            if not isinstance(v, str) or not v:
                raise InputError(source, f"slurm: {k}: expected a path, got {v!r}", line)
            p = Path(v)
            out[k] = p if p.is_absolute() else (base / p).resolve()
        elif k == "sbatch_args":
            if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
                raise InputError(source, "slurm: sbatch_args: expected a list of strings", line)
            out[k] = tuple(v)
        elif want is bool and isinstance(v, bool):
            out[k] = v
        elif want is float and isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            out[k] = float(v)
        elif want is int and isinstance(v, int) and not isinstance(v, bool) and (v > 0 or k == "gpus" and v == 0):
            out[k] = v
        elif want is str and isinstance(v, str) and v:
            out[k] = v
        else:
            raise InputError(source, f"slurm: {k}: expected a {'positive ' if want in (int, float) else ''}"
                                     f"{want.__name__}, got {v!r}", line)
    cfg = PilotConfig(**out)
    if "work_dir" not in out:
        cfg = PilotConfig(**(out | {"work_dir": (base / "pilots").resolve()}))
    if cfg.leave_before_s >= cfg.time_limit_s:
        raise InputError(source, f"slurm: leave_before_s ({cfg.leave_before_s}) must be below time_limit_s "
                                 f"({cfg.time_limit_s})", line)
    if cfg.time_limit != FIT:
        given = [k for k in _FIT_KEYS if k in data]
        if given:
            raise InputError(source, f"slurm: {given[0]} is read only with time_limit: {FIT} (time_limit is "
                                     f"{cfg.time_limit})", line)
    elif "signal" in data:
        raise InputError(source, f"slurm: signal is not read with time_limit: {FIT} (its pilots' workers leave at "
                                 "their own deadline, not on a Slurm --signal)", line)
    else:
        # Slurm keeps time limits in whole minutes (--time=0:45 becomes 1:00), so the shortest window used must
        # leave a whole minute after the margin, and the pilot must still run before it leaves.
        shortest = (cfg.min_window_s - cfg.window_margin_s) // 60 * 60
        if shortest < 60 or shortest <= cfg.leave_before_s:
            raise InputError(source, f"slurm: min_window_s ({cfg.min_window_s}) minus window_margin_s "
                                     f"({cfg.window_margin_s}) must give a time limit of at least one whole minute "
                                     f"(Slurm's unit) above leave_before_s ({cfg.leave_before_s}); it gives "
                                     f"{shortest} s", line)
    return cfg


def pilots_wanted(demand_slots: int, live_slots: int, pending: int, running: int, idle_nodes: int,
                  cfg: PilotConfig) -> int:
    """How many new pilots to submit now: enough for the slots the queue could use beyond what the live workers
    and the pilots already on their way give, at most one per idle node and ``max_pilots`` in all."""
    missing = demand_slots - live_slots - pending * cfg.slots
    if missing <= 0:
        return 0
    return max(0, min(math.ceil(missing / cfg.slots), idle_nodes, cfg.max_pilots - pending - running))



# The worker beside a sentinel step (bash: ``wait -n``). On preemption with a GraceTime, Slurm signals a job's
# steps at once but its batch shell only when GraceTime ends: a batch job waited 15-20 s for pilots whose worker
# was the batch shell. The sentinel is a one-process step on the pilot's node that, on that first SIGTERM, passes
# it on to the worker alone (by its pid: a one-node job's step runs beside its batch shell) and ends; the script
# does the same when it sees the sentinel end (in case the step could not reach the worker). The worker
# checkpoints its tasks and leaves, and the pilot ends (its node free) within the worker's stop grace. The
# worker's tasks are in no step, so an elastic Horovod job's ranks elsewhere are removed at a commit instead of
# being signalled with the step (what ``worker_step`` does). The sentinel marks that it ran: one that ends
# without having run (srun refused) is said in the log and the worker keeps going. ``preempted`` and
# ``released`` (unix times) in the pilot's work dir give how long it held its node after Slurm signalled it (the
# manager reads them when the pilot is gone; ``hpcsched calc``: pilot_release_s). Those times are bash's
# $EPOCHREALTIME (bash 5.0+, a comma where the locale writes one; ``date`` on an older bash), taken before the
# signal is passed on: no fork of ``date`` stands between Slurm's signal and the worker's, nor between the
# worker's exit and the script's, which a loaded node can make take a tenth of a second each.
_SENTINEL = """mkdir -p {work}/"$id"
{worker} &
w=$!
trap 'kill -TERM $w 2>/dev/null' TERM INT USR1 USR2
srun --ntasks=1 --nodes=1 --cpus-per-task=1 --overlap --mpi=none --quiet --job-name=sentinel /bin/bash -c '
  touch "$1/sentinel"; f=$1/preempted; w=$2
  on_term() {{ t=${{EPOCHREALTIME:-$(date +%s.%N)}}; kill -TERM $w; echo "${{t/,/.}}" > "$f"; exit 0; }}
  trap on_term TERM; sleep 2147483647 & wait' bash {work}/"$id" $w </dev/null &
s=$!
told=
while kill -0 $w 2>/dev/null; do
  if [ -z "$told" ]; then wait -n $w $s; else wait $w; fi
  if [ -z "$told" ] && ! kill -0 $s 2>/dev/null; then
    told=1
    if [ -e {work}/"$id"/sentinel ]; then
      t=${{EPOCHREALTIME:-$(date +%s.%N)}}
      kill -TERM $w 2>/dev/null
      [ -e {work}/"$id"/preempted ] || echo "${{t/,/.}}" > {work}/"$id"/preempted
      echo "hpcsched pilot: Slurm signalled the job's steps (preemption or cancel): the worker leaves now"
    else
      echo "hpcsched pilot: the sentinel step did not run: a preemption reaches the worker at GraceTime's end"
    fi
  fi
done
wait $w
rc=$?
t=${{EPOCHREALTIME:-$(date +%s.%N)}}
[ -e {work}/"$id"/preempted ] && echo "${{t/,/.}}" > {work}/"$id"/released
kill $s 2>/dev/null
exit $rc
"""


def pilot_script(cfg: PilotConfig, controller: str, token_file: Path | None, tag: str) -> str:
    """The batch script: the worker, named after the pilot job, beside a sentinel step that passes a preemption's
    SIGTERM on to it at once (``_SENTINEL``); with ``worker_step`` the worker is the job's one step instead.

    With ``time_limit: fit-idle-window`` the script takes two arguments, the unix time its worker must have left
    by (the node's claim less the margin and ``leave_before_s``) and the seconds after its start it leaves at
    (its time limit less ``leave_before_s``), and runs the worker under ``timeout``, which sends it SIGTERM at the
    earlier of the two, to the second. Slurm's ``--signal`` is not used then: Slurm sends it from a timer, early by
    up to its check period (measured: 11 s), and counts from the job's start, not from the claim; the time limit
    itself stays the backstop (SIGTERM, on which the worker still checkpoints, then SIGKILL after KillWait). GNU
    ``timeout`` passes on the SIGTERM it is sent and, with ``--preserve-status``, exits with the worker's status,
    so a pilot that left cleanly ends COMPLETED rather than TIMEOUT."""
    argv = pilot_worker_argv(cfg.python, controller, cfg.slots, cfg.gpus, cfg.stop_grace_s, cfg.orphan_timeout_s,
                             token_file, cfg.worker_config)
    words = " ".join(shlex.quote(a) for a in argv)
    work = shlex.quote(str(cfg.work_dir))
    # the pilot's id as squeue lists it: ARRAYID_TASK for an element of a job array (SLURM_JOB_ID is then a number
    # of its own that squeue -r does not show while the element is pending)
    head = (f"#!/bin/bash\n# hpcsched pilot ({tag}): one worker for the controller at {controller}\n"
            'id="${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"; id="${id:-$SLURM_JOB_ID}"\n')
    worker = f'{words} --name "pilot-$id" --work-dir {work}/"$id"'
    if cfg.time_limit == FIT:
        # SIGKILL only if the worker is still there at its time limit, as Slurm would
        head += ("# fit-idle-window: $1 = unix time to have left by, $2 = seconds after the start to leave at\n"
                 'left=$(( $1 - $(date +%s) ))\n[ "$left" -gt "$2" ] && left=$2\n'
                 'if [ "$left" -lt 1 ]; then\n'
                 '  echo "hpcsched pilot: its idle window ended at $1: no worker"; exit 0\nfi\n'
                 'echo "hpcsched pilot: the worker leaves in $left s"\n')
        worker = f'timeout --preserve-status -s TERM -k {cfg.leave_before_s} "$left" ' + worker
    if cfg.worker_step:
        # every CPU of the node to the step; no MPI plugin (the worker's mpirun must not see one); timeout inside the
        # step, so that a worker leaving at its deadline ends the step (and the job) with its own status
        return (head + 'exec srun --ntasks=1 --nodes=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}" --mpi=none --quiet '
                + worker + "\n")
    return head + _SENTINEL.format(work=work, worker=worker)
