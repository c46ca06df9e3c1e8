"""``torchrun`` (the default launcher): one torch elastic agent per node with a static rendezvous at the master
node's port; the agent gives each process RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcsched.runtime.launchers.base import Launch, Launcher
from hpcsched.runtime.launchers.common import rank_env, torch_importable

if TYPE_CHECKING:
    from hpcsched.runtime.rpc import pb


def build(t: pb.LaunchTask, python: str, devices: str) -> Launch:
    cmd = [python, "-m", "torch.distributed.run", f"--nnodes={t.nnodes}", f"--node-rank={t.node_rank}",
           f"--nproc-per-node={t.nprocs}", f"--master-addr={t.master_addr}", f"--master-port={t.master_port}",
           "--max-restarts=0", "--monitor-interval=0.2"]
    if not t.command[0].endswith(".py"):
        cmd.append("--no-python")
    return [*cmd, *t.command], rank_env(t, devices)


LAUNCHER = Launcher("torchrun", build, torch_importable)
