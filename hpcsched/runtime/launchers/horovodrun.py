"""``horovodrun`` (Horovod over Gloo): one command on the job's first node starts every rank; the other nodes hold
their slots with no process. It reaches other hosts with ``ssh``, which the worker makes hpcsched's rsh agent (the
agent first on the task's PATH under that name). An elastic job (min_procs < max_procs) runs in Horovod's elastic
mode and is resized in place (``horovod_elastic``)."""

from __future__ import annotations

import os
import shutil
import sys
from typing import TYPE_CHECKING

from hpcsched.runtime.launchers.base import Launch, Launcher
from hpcsched.runtime.launchers.common import interface, local_alias, merged_hosts, program, rank_env

if TYPE_CHECKING:
    from hpcsched.runtime.rpc import pb


def build(t: pb.LaunchTask, python: str, devices: str) -> Launch:
    env = rank_env(t, devices)
    if t.node_rank != 0:
        return None, env
    nic = os.environ.get("HPCSCHED_NETWORK_INTERFACE") or interface(t) or "lo"
    cmd = [*horovodrun_command(python), "-np", str(t.world_size), "-H", merged_hosts(list(t.hosts), local_alias(t)),
           "--gloo", "--network-interface", nic]
    return [*cmd, *program(list(t.command), python)], env


def horovodrun_command(python: str) -> list[str]:
    """The ``horovodrun`` beside the tasks' Python, run by that Python (its ``#!`` line may name an interpreter
    the task's user cannot execute: a venv whose base Python is under a private /root), else the one on PATH."""
    beside = os.path.join(os.path.dirname(python), "horovodrun")
    if os.path.exists(beside):
        return [python, beside]
    return [shutil.which("horovodrun") or beside]


def _available() -> bool:
    return bool(shutil.which("horovodrun")) or os.path.exists(os.path.join(os.path.dirname(sys.executable),
                                                                           "horovodrun"))


LAUNCHER = Launcher("horovodrun", build, _available, one_command=True, via_agents=True, agent_as_ssh=True,
                    elastic_in_place=True)
