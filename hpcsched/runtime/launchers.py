"""Launchers, one interface: a ``LaunchTask`` in, the command line and environment of one node's task out.

- ``torchrun`` (default): one agent per node with a static rendezvous at the master node's port; the
  agent gives each process RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT. Gloo on CPU, NCCL on GPU is
  the program's choice. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` because restarts after a lost node
  failed here with the shared store (gloo "connectFullMesh failed", then a store timeout).
- ``direct``: the worker starts the node's ranks itself through ``ranks.py`` (a standard-library-only
  supervisor) with the same environment torchrun's agent would give them and a static rendezvous at the
  master node's port. No agent importing torch before the trainers do, and a relaunch forks its ranks from
  a supervisor the worker keeps ready with torch imported (``worker.WarmRanks``): a 2-process resize takes
  under 1 s (bench/RESULTS.md, issue 6). Any program that reads RANK / WORLD_SIZE runs under it.
- ``mpirun`` (Open MPI) and ``horovodrun``: one command on the first node starts every rank; the other nodes
  hold their slots with no process (``None``) until the job ends. ``mpirun`` reaches the other hosts through
  hpcsched's rsh agent (``rsh_agent.py``: each host's worker starts Open MPI's daemon there, no ssh);
  ``horovodrun`` runs ``ssh``, and the worker puts the same agent first on its PATH under that name.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import shutil
import sys
from pathlib import Path

from hpcsched.runtime import hostaddr
from hpcsched.runtime.rpc import pb

Launch = tuple[list[str] | None, dict[str, str]]


def available() -> list[str]:
    """Launchers that can run on this node now (``direct`` needs nothing but Python)."""
    out = ["torchrun"] if importlib.util.find_spec("torch") is not None else []  # no import: torch costs seconds
    out.append("direct")
    if shutil.which("mpirun"):
        out.append("mpirun")
    if shutil.which("horovodrun") or os.path.exists(os.path.join(os.path.dirname(sys.executable), "horovodrun")):
        out.append("horovodrun")
    return out


def host_slots(hosts: list[str]) -> dict[str, int]:
    """``a:1,a:1,b:2`` -> ``{a: 2, b: 2}``: launchers count slots per host name, so two hpcsched nodes on one
    address (loopback) are one host to MPI and Horovod."""
    slots: dict[str, int] = {}
    for h in hosts:
        name, _, n = h.rpartition(":")
        if not name or not n.isdigit():
            raise ValueError(f"bad host {h!r}: expected host:slots")
        slots[name] = slots.get(name, 0) + int(n)
    return slots


def merged_hosts(hosts: list[str], alias: dict[str, str] | None = None) -> str:
    """``a:1,a:1,b:2`` -> ``a:2,b:2``, the ``-H`` list of mpirun and horovodrun; ``alias`` renames hosts
    (``local_alias``)."""
    return ",".join(f"{(alias or {}).get(h, h)}:{n}" for h, n in host_slots(hosts).items())


def _program(command: list[str], python: str) -> list[str]:
    return [python, *command] if command[0].endswith(".py") else list(command)


def own_host(t: pb.LaunchTask) -> str:
    """This node's address as the controller placed it (its entry in the task's host list)."""
    if not t.hosts:
        return t.master_addr
    return t.hosts[min(t.node_rank, len(t.hosts) - 1)].rpartition(":")[0]


def interface(t: pb.LaunchTask) -> str | None:
    """The interface that carries this node's placed address: where Gloo, MPI and Horovod must talk. Left to
    them (None) when no interface here holds it (a host name, IPv6)."""
    return hostaddr.interface_of(own_host(t))


def _env(t: pb.LaunchTask, devices: str) -> dict[str, str]:
    env = dict(t.env) | agents_env(t)
    nic = interface(t)
    if nic and "GLOO_SOCKET_IFNAME" not in env:  # else Gloo uses the host name's address, or falls back to lo
        env["GLOO_SOCKET_IFNAME"] = nic
    env.update({
        "MASTER_ADDR": t.master_addr, "MASTER_PORT": str(t.master_port), "WORLD_SIZE": str(t.world_size),
        "HPCSCHED_NODE_RANK": str(t.node_rank), "CUDA_VISIBLE_DEVICES": devices,
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    })
    env.setdefault("OMP_NUM_THREADS", "1")  # N processes on N cores: one thread each, no oversubscription
    return env


def torchrun(t: pb.LaunchTask, python: str, devices: str) -> Launch:
    cmd = [python, "-m", "torch.distributed.run", f"--nnodes={t.nnodes}", f"--node-rank={t.node_rank}",
           f"--nproc-per-node={t.nprocs}", f"--master-addr={t.master_addr}", f"--master-port={t.master_port}",
           "--max-restarts=0", "--monitor-interval=0.2"]
    if not t.command[0].endswith(".py"):
        cmd.append("--no-python")
    return [*cmd, *t.command], _env(t, devices)


RANKS_SCRIPT = str(Path(__file__).with_name("ranks.py"))  # run as a file: no hpcsched import before the ranks
# -P: the script's directory (this package) is not put on sys.path, where our profile.py would shadow the
# standard library's (torch._dynamo imports cProfile, which imports profile).
RANKS = ["-P", RANKS_SCRIPT]


def direct(t: pb.LaunchTask, python: str, devices: str) -> Launch:
    env = _env(t, devices)
    env["LOCAL_WORLD_SIZE"] = str(t.nprocs)
    return [python, *RANKS, f"--nprocs={t.nprocs}", f"--rank-offset={t.rank_offset}", "--",
            *_program(list(t.command), python)], env


# Open MPI numbers ranks in OMPI_COMM_WORLD_*; programs written for torchrun read RANK / LOCAL_RANK.
RANK_SHIM = ["sh", "-c", 'RANK=$OMPI_COMM_WORLD_RANK LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK exec "$@"', "rank-env"]


def mpirun(t: pb.LaunchTask, python: str, devices: str) -> Launch:
    env = _env(t, devices)
    if t.node_rank != 0:
        return None, env
    # ras/plm ^slurm: in a pilot (a Slurm job) Open MPI would take Slurm's allocation (the pilot's one node) over
    # --host and refuse to start ("All nodes which are allocated for this job are already filled"), and would
    # start remote daemons with srun; the controller places the ranks, so --host is the allocation.
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(t.world_size),
           "--host", mpi_hosts(t), "--bind-to", "none", "--mca", "ras", "^slurm", "--mca", "plm",
           "^slurm", *mpi_remote_args(t, python)]
    for k in sorted(env):  # the job's own variables and ours reach every rank, remote ones included
        cmd += ["-x", k]
    return [*cmd, *RANK_SHIM, *_program(list(t.command), python)], env


def mpi_hosts(t: pb.LaunchTask) -> str:
    """mpirun's ``--host``, this node's own entry written ``localhost`` where ``local_alias`` says so: Open MPI would
    count it another node and start a daemon for it through the agent, which this node's worker refuses, since
    mpirun itself, not a held slot, is its task. Other nodes' loopback addresses stay other nodes to it."""
    return merged_hosts(list(t.hosts), local_alias(t))


def local_alias(t: pb.LaunchTask) -> dict[str, str]:
    """``{own address: "localhost"}`` when this node's own entry is a loopback address no interface here holds
    exactly (a worker given ``--host 127.0.0.11``, as on the loopback Slurm's nodes), else ``{}``. mpirun and
    horovodrun take a host they hold no interface address of for a remote one and reach it through the rsh agent,
    which this node's worker refuses (the launcher, not a held slot, is its task here): node 0's own ranks must be
    started as local ones."""
    own = own_host(t)
    slots = host_slots(list(t.hosts))
    if own in slots and "localhost" not in slots and _is_loopback(own) and not hostaddr.holds_exactly(own):
        return {own: "localhost"}
    return {}


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def agents_env(t: pb.LaunchTask) -> dict[str, str]:
    """What the rsh agent reads to find each host's worker (see ``rsh_agent``); empty for a one-host job."""
    return {"HPCSCHED_AGENTS": json.dumps(dict(sorted(t.agents.items())))} if t.agents else {}


def mpi_remote_args(t: pb.LaunchTask, python: str) -> list[str]:
    """mpirun options for a job on several hosts: daemons started by hpcsched's rsh agent (no ssh), all of them
    from this node (no tree spawn: a remote daemon would need the agent's environment) and kept attached to the
    agent's call (so each stays under its worker), and MPI's own traffic
    (out-of-band and TCP byte transfer) on the interface that carries this node's placed address, so neither
    tries loopback or an interface the other hosts cannot reach."""
    if len(host_slots(list(t.hosts))) < 2:
        return []
    if not t.agents:
        raise ValueError("a job on several hosts without their worker agents (an older controller?): "
                         "mpirun would need ssh")
    # --leave-session-attached: without it Open MPI tells each daemon to --daemonize (it does so whenever tree spawn
    # is off), and a daemonized orted leaves the worker's session: no parent-death signal, not killed with the task.
    out = ["--mca", "plm_rsh_agent", f"{python} -m hpcsched.runtime.rsh_agent", "--mca", "plm_rsh_no_tree_spawn", "1",
           "--leave-session-attached"]
    nic = hostaddr.subnet_of(own_host(t))
    if nic:
        out += ["--mca", "oob_tcp_if_include", nic, "--mca", "btl_tcp_if_include", nic]
    return out


def horovodrun(t: pb.LaunchTask, python: str, devices: str) -> Launch:
    env = _env(t, devices)
    if t.node_rank != 0:
        return None, env
    nic = os.environ.get("HPCSCHED_NETWORK_INTERFACE") or interface(t) or "lo"
    cmd = [*horovodrun_command(python), "-np", str(t.world_size), "-H", merged_hosts(list(t.hosts), local_alias(t)),
           "--gloo", "--network-interface", nic]
    return [*cmd, *_program(list(t.command), python)], env


def horovodrun_command(python: str) -> list[str]:
    """The ``horovodrun`` beside the tasks' Python, run by that Python (its ``#!`` line may name an interpreter
    the task's user cannot execute: a venv whose base Python is under a private /root), else the one on PATH."""
    beside = os.path.join(os.path.dirname(python), "horovodrun")
    if os.path.exists(beside):
        return [python, beside]
    return [shutil.which("horovodrun") or beside]


LAUNCHERS = {"torchrun": torchrun, "direct": direct, "mpirun": mpirun, "horovodrun": horovodrun}


def build(t: pb.LaunchTask, python: str, devices: str) -> Launch:
    """The argv (None: hold the slots with no process) and extra environment of one node's task."""
    return LAUNCHERS[t.launcher](t, python, devices)
