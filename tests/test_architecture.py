"""The package's shape: its floors (a layer table over its packages, every import counted, lazy ones too), no
import cycles between modules at import time, no module importing another's private names, and the simulator
used only by the tools that run simulations."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "hpcsched"
# the tools that run simulations as their job; everything else (the core, policies, interleaving, the
# runtime, harvesting, readers) must not depend on the simulator
SIM_USERS = ("hpcsched.sim", "hpcsched.sweep", "hpcsched.testbed", "hpcsched.cli")

# The floors of the package, lowest first: a unit (a package, or a module directly under hpcsched/) imports only
# units of lower floors, never one beside it on its own floor, wherever the import is (top level, in a
# function, under TYPE_CHECKING: a lazy import is still a dependency). docs/architecture.md draws them. A new
# package takes its place here; a command-line front end (``cli.py``, ``*_cli.py``, ``__main__.py`` in any
# package) wires floors together and may import any of them, and nothing but another command imports it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "model", "progress", "argline", "plugins", "solvers", "goodput"),  # records, shared services
    ("results", "allocator", "cluster_spec", "milp"),  # results, the policy contract, the cluster, the MILP
    ("window", "primitives", "traces"),  # ground floor of the decision core; trace readers
    ("metrics", "harvest", "compat", "interleave", "admission"),  # figures; replayer; compat rules; pipeline steps
    ("hetero",),  # Gavel's policies, rounds and throughput table
    ("placements", "sia"),  # placement steps (throughput-aware reads Gavel's table); Sia on Gavel's rounds
    ("core", "policies"),  # the decision pipeline; the policies it runs
    ("sim", "runtime"),  # the simulator; the live runtime
    ("slurm", "pbs", "sweep", "testbed"),  # Slurm node source and harvester; the PBS node source; sweeps; testbed
    ("report",),  # reports over sweeps and runs
)
NODE_SOURCE_FLOOR = 8
"""A package holding a ``node_source.py`` (a node source plug-in, ``hpcsched.runtime.node_source``) stands on this
floor without a line here: adding a node source is adding that one module."""
# Imports that break the floors today, each with the reason it is still there (the list only shrinks).
KNOWN_BREAKS: dict[tuple[str, str], str] = {}


@functools.cache  # parsed once for every test here (they only read it)
def _modules() -> dict[str, ast.Module]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        if "_pb2" in p.name:
            continue
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(p.read_text(), str(p))
    return out


def _imports(tree: ast.Module, top_level_only: bool) -> list[tuple[str, str | None]]:
    """(module, name or None) for each ``hpcsched`` import; at top level only, or anywhere."""
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out: list[tuple[str, str | None]] = []
    for n in nodes:
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("hpcsched"):
            out += [(n.module, a.name) for a in n.names]
        elif isinstance(n, ast.Import):
            out += [(a.name, None) for a in n.names if a.name.startswith("hpcsched")]
    return out


def test_no_module_imports_another_modules_private_names() -> None:
    bad = [f"{mod} imports {src}.{name}" for mod, tree in _modules().items()
           for src, name in _imports(tree, top_level_only=False)
           if name and name.startswith("_") and not name.startswith("__") and src != mod]
    assert bad == []


def test_no_import_cycles_at_import_time() -> None:
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for mod, tree in mods.items():
        deps = set()
        for src, name in _imports(tree, top_level_only=True):
            deps.add(f"{src}.{name}" if name and f"{src}.{name}" in mods else src)
        graph[mod] = {d for d in deps if d in mods and d != mod}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1 and not d.startswith(m + "."):  # a package importing its own module is fine
                cycles.append(path[path.index(d):] + [d] if d in path else [m, d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_only_the_simulation_tools_import_the_simulator() -> None:
    users = sorted({mod for mod, tree in _modules().items()
                    for src, _ in _imports(tree, top_level_only=False)
                    if (src == "hpcsched.sim" or src.startswith("hpcsched.sim."))
                    and not mod.startswith(SIM_USERS) and not mod.endswith(".cli")})
    assert users == []


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _is_command(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return last in ("cli", "__main__") or last.endswith("_cli")


def _floors(mods: dict[str, ast.Module]) -> dict[str, int]:
    """unit -> floor: the table's, and the node-source floor for an unplaced package holding a node source."""
    floor = {unit: k for k, units in enumerate(LAYERS) for unit in units}
    return {_unit(m): NODE_SOURCE_FLOOR for m in mods if m.endswith(".node_source") and _unit(m) not in floor} | floor


def _floor_breaks(mods: dict[str, ast.Module]) -> list[str]:
    """Every import in ``mods`` that does not go down the floors (``LAYERS``), as one line each."""
    floor = _floors(mods)
    bad = []
    for mod, tree in mods.items():
        src = _unit(mod)
        for target, name in _imports(tree, top_level_only=False):
            full = f"{target}.{name}" if name and f"{target}.{name}" in mods else target
            dst = _unit(full)
            if _is_command(full) and not _is_command(mod):
                bad.append(f"{mod} imports the command {full}")
            if _is_command(mod) or not dst or dst == src or (mod, dst) in KNOWN_BREAKS:
                continue
            if floor[dst] >= floor[src]:
                bad.append(f"{mod} ({src}, floor {floor[src]}) imports {full} ({dst}, floor {floor[dst]})")
    return bad


def test_every_import_goes_down_the_floors() -> None:
    units = [unit for floor in LAYERS for unit in floor]
    assert len(units) == len(set(units)), "a unit on two floors"
    assert {"slurm", "pbs"} <= set(LAYERS[NODE_SOURCE_FLOOR])
    mods = _modules()
    floors = _floors(mods)
    unplaced = sorted({_unit(m) for m in mods if _unit(m) and _unit(m) not in floors and not _is_command(m)})
    assert unplaced == [], f"place these packages or modules on a floor of LAYERS: {unplaced}"
    assert _floor_breaks(mods) == []


def test_the_floor_test_finds_lazy_imports_and_imports_beside() -> None:
    """The rule on modules written for the purpose: the ground floor importing the simulator inside a function
    and the core under TYPE_CHECKING, a policy importing the core beside it, a module importing a command and an
    unplaced node-source package importing above its floor are each found; a package importing its own modules, a
    command importing anything and that node source importing the runtime are not."""
    mods = {
        "hpcsched.primitives.x": ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                           "    from hpcsched.core.decide import decide\n"
                                           "def f():\n    from hpcsched.sim.engine import simulate\n"
                                           "from hpcsched.primitives import speed\nfrom hpcsched.model import Job\n"),
        "hpcsched.policies.y": ast.parse("from hpcsched.core import decide\n"),
        "hpcsched.metrics.z": ast.parse("from hpcsched.sim.cli import main\n"),
        "hpcsched.sim.cli": ast.parse("from hpcsched.report.build import build\n"),
        "hpcsched.fixed.node_source": ast.parse("from hpcsched.runtime.node_source import SourceView\n"
                                                "from hpcsched.report import build\n"),
    }
    assert _floor_breaks(mods) == [
        "hpcsched.primitives.x (primitives, floor 2) imports hpcsched.core.decide (core, floor 6)",
        "hpcsched.primitives.x (primitives, floor 2) imports hpcsched.sim.engine (sim, floor 7)",
        "hpcsched.policies.y (policies, floor 6) imports hpcsched.core (core, floor 6)",
        "hpcsched.metrics.z imports the command hpcsched.sim.cli",
        "hpcsched.metrics.z (metrics, floor 3) imports hpcsched.sim.cli (sim, floor 7)",
        "hpcsched.fixed.node_source (fixed, floor 8) imports hpcsched.report (report, floor 9)",
    ]
