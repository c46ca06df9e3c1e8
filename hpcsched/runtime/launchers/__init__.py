"""Launchers as plug-ins: how one node's task of a job becomes a command line, and what each launcher needs.

A launcher is one module of this package defining ``LAUNCHER``, a ``base.Launcher``: its name, the function that
builds a node's command and environment from a ``LaunchTask``, whether it can run on this node, and its traits
(``one_command``, ``via_agents``, ``agent_as_ssh``, ``elastic_in_place``, ``warm_start``). The worker, the
controller and the job-file reader ask a launcher's traits, never its name. ``REGISTRY`` below maps each name to
``module:attribute``; a module is imported only when its launcher is first asked for. The four shipped launchers
are listed by hand (their order is the job file's error message's); any other module of this package is a
launcher named after its module, found by listing the package (no import), so adding one is adding its module.
``tests/test_launchers.py`` runs every registered launcher through the same contract.

- ``torchrun`` (default): one agent per node with a static rendezvous at the master node's port.
- ``direct``: the worker starts the node's ranks itself (``ranks.py``), from a warm supervisor when it can.
- ``mpirun`` (Open MPI) and ``horovodrun``: one command on the first node starts every rank; the other nodes
  hold their slots with no process until the job ends, and other hosts are reached through their workers'
  agents (``rsh_agent``); ``horovodrun`` runs ``ssh``, so the worker puts the agent first on its PATH as ``ssh``.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from hpcsched.runtime.launchers.base import Launch, Launcher

if TYPE_CHECKING:
    from hpcsched.runtime.rpc import pb

__all__ = ["REGISTRY", "Launch", "Launcher", "available", "build", "get", "names"]

# name -> "module:attribute" of its ``Launcher``. The order is the job file's error message's.
REGISTRY: dict[str, str] = {
    "torchrun": "hpcsched.runtime.launchers.torchrun:LAUNCHER",
    "direct": "hpcsched.runtime.launchers.direct:LAUNCHER",
    "mpirun": "hpcsched.runtime.launchers.mpirun:LAUNCHER",
    "horovodrun": "hpcsched.runtime.launchers.horovodrun:LAUNCHER",
}
# modules of this package that are not launchers
HELPERS = frozenset({"base", "common"})
REGISTRY |= {name: f"{__name__}.{name}:LAUNCHER" for name in sorted(m.name for m in pkgutil.iter_modules(__path__))
             if name not in HELPERS and name not in REGISTRY and not name.startswith("_")}


def names() -> tuple[str, ...]:
    """Every registered launcher's name: what a job file's ``launcher:`` may say."""
    return tuple(REGISTRY)


def get(name: str) -> Launcher:
    """The registered launcher ``name`` (ValueError naming the known ones otherwise)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown launcher {name!r}; expected one of {', '.join(REGISTRY)}")
    module, _, attr = REGISTRY[name].partition(":")
    launcher = getattr(importlib.import_module(module), attr)
    if launcher.name != name:  # a registry line pointing at another launcher's module would run the wrong command
        raise ValueError(f"launcher {name!r} is registered as {REGISTRY[name]}, which defines {launcher.name!r}")
    return launcher


def available() -> list[str]:
    """Launchers that can run on this node now, in registry order (what a worker offers the controller)."""
    return [n for n in REGISTRY if get(n).available()]


def build(t: pb.LaunchTask, python: str, devices: str) -> Launch:
    """The argv (None: hold the slots with no process) and extra environment of one node's task."""
    return get(t.launcher).build(t, python, devices)
