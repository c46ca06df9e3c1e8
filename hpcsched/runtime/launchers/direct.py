"""``direct``: the worker starts the node's ranks itself through ``ranks.py`` (a standard-library-only supervisor)
with the same environment torchrun's agent would give them and a static rendezvous at the master node's port.

No agent importing torch before the trainers do, and a relaunch forks its ranks from a supervisor the worker keeps
ready with torch imported (``warm_start``: ``worker.WarmRanks``): a 2-process resize takes under 1 s
(bench/RESULTS.md). Any program that reads RANK / WORLD_SIZE runs under it; it needs nothing but Python."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hpcsched.runtime.launchers.base import Launch, Launcher
from hpcsched.runtime.launchers.common import program, rank_env

if TYPE_CHECKING:
    from hpcsched.runtime.rpc import pb

# run as a file: no hpcsched import before the ranks
RANKS_SCRIPT = str(Path(__file__).resolve().parent.parent / "ranks.py")
# -P: the script's directory (hpcsched/runtime) is not put on sys.path, where our profile.py would shadow the
# standard library's (torch._dynamo imports cProfile, which imports profile).
RANKS = ["-P", RANKS_SCRIPT]


def build(t: pb.LaunchTask, python: str, devices: str) -> Launch:
    env = rank_env(t, devices)
    env["LOCAL_WORLD_SIZE"] = str(t.nprocs)
    return [python, *RANKS, f"--nprocs={t.nprocs}", f"--rank-offset={t.rank_offset}", "--",
            *program(list(t.command), python)], env


LAUNCHER = Launcher("direct", build, lambda: True, warm_start=True)
