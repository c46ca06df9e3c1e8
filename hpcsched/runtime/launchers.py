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
- ``mpirun`` (Open MPI) and ``horovodrun``: one command on the first node starts every rank (remote
  ranks through the launcher's own agent, ssh on a real cluster); the other nodes hold their slots
  with no process (``None``) until the job ends.
"""

from __future__ import annotations

import importlib.util
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


def merged_hosts(hosts: list[str]) -> str:
    """``a:1,a:1,b:2`` -> ``a:2,b:2``, the ``-H`` list of mpirun and horovodrun."""
    return ",".join(f"{h}:{n}" for h, n in host_slots(hosts).items())


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
    env = dict(t.env)
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
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(t.world_size),
           "--host", merged_hosts(list(t.hosts)), "--bind-to", "none"]
    for k in sorted(env):  # the job's own variables and ours reach every rank, remote ones included
        cmd += ["-x", k]
    return [*cmd, *RANK_SHIM, *_program(list(t.command), python)], env


def horovodrun(t: pb.LaunchTask, python: str, devices: str) -> Launch:
    env = _env(t, devices)
    if t.node_rank != 0:
        return None, env
    exe = shutil.which("horovodrun") or os.path.join(os.path.dirname(python), "horovodrun")
    nic = os.environ.get("HPCSCHED_NETWORK_INTERFACE") or interface(t) or "lo"
    cmd = [exe, "-np", str(t.world_size), "-H", merged_hosts(list(t.hosts)), "--gloo", "--network-interface", nic]
    return [*cmd, *_program(list(t.command), python)], env


LAUNCHERS = {"torchrun": torchrun, "direct": direct, "mpirun": mpirun, "horovodrun": horovodrun}


def build(t: pb.LaunchTask, python: str, devices: str) -> Launch:
    """The argv (None: hold the slots with no process) and extra environment of one node's task."""
    return LAUNCHERS[t.launcher](t, python, devices)
