"""Node sources: where a controller's workers come from, as plug-ins registered by name.

A node source is an ops table (the ``NodeSource`` protocol below) that the controller server builds from the
controller file's ``node_source:`` key and drives without knowing what is behind it:

- ``static``: workers register themselves (an operator or a launcher started them); the source does nothing.
- ``slurm``: the controller claims a Slurm cluster's idle nodes with pilot jobs (``hpcsched.slurm.pilots``).
- ``pbs``: the same on a PBS Pro cluster (``hpcsched.pbs.pilots``).

Adding a source (a cloud API, another batch system) is one module: ``hpcsched/NAME/node_source.py`` defining
``make`` (the ``Factory`` below) and, when the controller file gives the source a section of its own (``NAME:``),
``read_section`` (its reader). The source is called after its package (``pbs`` is ``hpcsched/pbs/node_source.py``)
and found by looking for that file (nothing is imported until a controller file names it), so nothing else is
edited; ``tests/test_node_sources.py`` runs every registered source through the same contract.

The contract, for every source:

- ``start()`` returns at once (the source polls in its own thread, if it polls); ``stop()`` gives back every
  node it claimed before returning (its workers leave through the still-running server) and is idempotent;
- ``step()`` is one poll, callable directly (tests, benchmarks); it must cost the external system a bounded
  number of calls whatever the node count, and raise only ``commands.SlurmError``-like errors it can retry;
- ``arriving(registered)`` names the workers of nodes just claimed that have not registered yet (the controller
  holds its decisions for them, bounded by the source's own settle time); ``[]`` when nothing is coming;
- ``view()`` is what ``hpcsched workers --nodes`` and the pilot columns of ``workers``/``jobs`` show: the nodes
  the source sees with what each does for the controller, and its workers' external job, node and state. It is
  read from RPC threads: a source returns an immutable snapshot made at its last step, never a live table.
"""

from __future__ import annotations

import importlib
import socket
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# name -> "module:factory". Imported only when a controller file names it: a static controller never loads Slurm.
SOURCES: dict[str, str] = {
    "static": "hpcsched.runtime.node_source:StaticNodeSource",
    "slurm": "hpcsched.slurm.pilots:PilotManager",
}
# name -> "module:reader" of its controller-file section (``read(data, source, line, base)``: the config the factory
# is given, InputError naming the file and line when it is wrong); a source without one gets None
SECTIONS: dict[str, str] = {
    "slurm": "hpcsched.slurm.pilot_config:read_pilot_config",
}
PLUGIN_MODULE = "node_source"
"""The module name that makes a package of ``hpcsched/`` a node source (``make`` and optionally ``read_section``)."""


def _discover(root: Path) -> list[str]:
    """The packages under ``root`` holding a ``node_source.py``, by name: a directory listing, no import."""
    return sorted(d.name for d in root.iterdir()
                  if (d / f"{PLUGIN_MODULE}.py").is_file() and d.name not in SOURCES and d.name != "runtime")


PLUGINS = tuple(_discover(Path(__file__).resolve().parents[1]))
SOURCES |= {name: f"hpcsched.{name}.{PLUGIN_MODULE}:make" for name in PLUGINS}
SECTIONS |= {name: f"hpcsched.{name}.{PLUGIN_MODULE}:read_section" for name in PLUGINS}
NODE_SOURCES = tuple(SOURCES)


@dataclass(frozen=True, slots=True)
class SourceView:
    """A node source's last step as listings show it.

    ``nodes``: node -> (what it does for the controller or why it is not used, the external job holding it for
    the controller or ''). ``workers``: worker -> (external job, node, state) of the source's workers, those that
    have left included (state ``GONE``), so a listing names a worker's origin after its node was given back."""

    name: str
    time: float = 0.0
    nodes: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    workers: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)


class NodeSource(Protocol):
    """The ops table of a node source (module docstring: the contract)."""

    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def step(self) -> None: ...

    def arriving(self, registered: Container[str]) -> list[str]: ...

    def view(self) -> SourceView: ...


class ControllerView(Protocol):
    """What a source reads from (and records in) the controller: the queue's demand and the live workers."""

    def demand_slots(self) -> int: ...

    def workers(self) -> dict[str, tuple[bool, int, int]]:
        """worker -> (alive, slots, used)."""
        ...


# A factory builds a source from its config section (None for sources without one), the controller's view, the
# address workers dial, the workers' token and the state file (a source's identity across controller restarts).
Factory = Callable[[Any, ControllerView, str, "str | None", Any], NodeSource]


class StaticNodeSource:
    """``static``: workers register themselves; nothing to claim, poll or give back."""

    name = "static"

    def __init__(self, cfg: Any = None, view: ControllerView | None = None, address: str = "",
                 token: str | None = None, state: Any = None) -> None:
        self._view = SourceView("static")

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def step(self) -> None:
        return None

    def arriving(self, registered: Container[str]) -> list[str]:
        return []

    def view(self) -> SourceView:
        return self._view


def factory(name: str) -> Factory:
    """The registered factory of source ``name`` (ValueError naming the known ones otherwise)."""
    if name not in SOURCES:
        raise ValueError(f"unknown node source {name!r}; expected one of {', '.join(SOURCES)}")
    module, _, attr = SOURCES[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def read_section(name: str, data: Any, source: str, line: int | None, base: Any) -> Any:
    """Source ``name``'s section of a controller file (``data``: the mapping under its key, or None), read by the
    reader it registered in ``SECTIONS``; None for a source without a section."""
    if name not in SECTIONS:
        return None
    module, _, attr = SECTIONS[name].partition(":")
    reader = getattr(importlib.import_module(module), attr, None)
    if reader is None:  # a plug-in module without ``read_section``: its source takes no section
        return None
    return reader(data, source, line, base)


def build(name: str, cfg: Any, view: ControllerView, address: str, token: str | None, state: Any) -> NodeSource:
    """A source by its registered name, not started."""
    return factory(name)(cfg, view, address, token, state)


@dataclass(slots=True)
class ControllerDemand:
    """``ControllerView`` over a live ``Controller``: the slots its queue could use (each pending or running job's
    ``max_procs``: an elastic job grows into harvested nodes) and its workers; and a record of a source's events
    in the controller's store (``hpcsched calc`` reads pilot node time from them)."""

    ctl: Any

    def demand_slots(self) -> int:
        with self.ctl.lock:
            jobs = self.ctl.store.jobs(("pending", "running"))
        return sum(j.spec.max_procs for j in jobs)

    def workers(self) -> dict[str, tuple[bool, int, int]]:
        return {w.worker_id: (w.alive, w.slots, w.used) for w in self.ctl.list_workers()}

    def record(self, detail: dict[str, Any]) -> None:
        """A ``pilot`` event in the store (job_id NULL)."""
        with self.ctl.lock:
            self.ctl.store.event(None, "pilot", **detail)

    def pilot_history(self) -> dict[str, tuple[str, str]]:
        """worker -> (external job, node) of the pilots recorded in the store (a predecessor's included)."""
        with self.ctl.lock:
            events = self.ctl.store.events(kind="pilot")
        return {e["worker"]: (e.get("job") or e["slurm_job"], e["node"]) for e in events
                if e.get("worker") and e.get("node")}


def reachable(address: str) -> str:
    """The address a source's workers dial: the controller's bound one, with a wildcard host (0.0.0.0, ::)
    replaced by this machine's name (a worker on another node cannot dial 0.0.0.0)."""
    host, _, port = address.rpartition(":")
    return f"{socket.getfqdn()}:{port}" if host.strip("[]") in ("0.0.0.0", "::", "") else address
