"""The package's shape (issue 16): no import cycles between modules at import time, no module importing
another's private names, and the simulator used only by the tools that run simulations."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "hpcsched"
# the tools that run simulations as their job; everything else (the core, policies, interleaving, the
# runtime, harvesting, readers) must not depend on the simulator
SIM_USERS = ("hpcsched.sim", "hpcsched.sweep", "hpcsched.testbed", "hpcsched.cli")


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
