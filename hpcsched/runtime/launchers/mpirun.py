"""``mpirun`` (Open MPI): one command on the job's first node starts every rank; the other nodes hold their slots
with no process until the job ends. The other hosts are reached through hpcsched's rsh agent (``rsh_agent``: each
host's worker starts Open MPI's daemon there, no ssh)."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from hpcsched.runtime import hostaddr
from hpcsched.runtime.launchers.base import Launch, Launcher
from hpcsched.runtime.launchers.common import host_slots, local_alias, merged_hosts, own_host, program, rank_env

if TYPE_CHECKING:
    from hpcsched.runtime.rpc import pb

# Open MPI numbers ranks in OMPI_COMM_WORLD_*; programs written for torchrun read RANK / LOCAL_RANK.
RANK_SHIM = ["sh", "-c", 'RANK=$OMPI_COMM_WORLD_RANK LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK exec "$@"', "rank-env"]


def build(t: pb.LaunchTask, python: str, devices: str) -> Launch:
    env = rank_env(t, devices)
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
    return [*cmd, *RANK_SHIM, *program(list(t.command), python)], env


def mpi_hosts(t: pb.LaunchTask) -> str:
    """mpirun's ``--host``, this node's own entry written ``localhost`` where ``local_alias`` says so: Open MPI would
    count it another node and start a daemon for it through the agent, which this node's worker refuses, since
    mpirun itself, not a held slot, is its task. Other nodes' loopback addresses stay other nodes to it."""
    return merged_hosts(list(t.hosts), local_alias(t))


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


LAUNCHER = Launcher("mpirun", build, lambda: shutil.which("mpirun") is not None, one_command=True, via_agents=True)
