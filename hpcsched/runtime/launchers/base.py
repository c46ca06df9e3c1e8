"""The launcher contract: what a launcher plug-in declares (``Launcher``) and what its builder returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcsched.runtime.rpc import pb

# (argv, extra environment) of one node's task; argv None: the node holds its slots with no process
Launch = tuple[list[str] | None, dict[str, str]]


@dataclass(frozen=True, slots=True)
class Launcher:
    """One launcher: how a node's task is started, whether it can be here, and the traits callers decide on.

    ``build(task, python, devices)``: the node's argv and environment (``python``: the tasks' interpreter,
    ``devices``: the node's CUDA_VISIBLE_DEVICES). ``available()``: whether this node can run it now."""

    name: str
    build: Callable[[pb.LaunchTask, str, str], Launch]
    available: Callable[[], bool]
    # node 0's command starts every rank; the other nodes only hold slots (their argv is None), so when node 0's
    # task ends the whole attempt has ended
    one_command: bool = False
    # reaches a job's other hosts through those hosts' worker agents (``rsh_agent``): a launch across workers needs
    # every one's agent endpoint
    via_agents: bool = False
    # starts remote processes with ``ssh``: the worker puts the rsh agent first on the task's PATH under that name
    agent_as_ssh: bool = False
    # an elastic job (min_procs < max_procs) is resized in place, given a new host list, without a relaunch
    elastic_in_place: bool = False
    # a relaunch may be handed to the worker's warm supervisor (``WarmRanks``: torch imported ahead)
    warm_start: bool = False
