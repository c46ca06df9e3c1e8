"""Sweep configs: a YAML grid of experiment parameters, validated with the file and line of each mistake.

A config names one or more grids; each grid has a ``kind`` (``simulate`` or ``replay``) and
parameters whose values are a scalar or a list. The cells are the Cartesian product of the lists::

    name: muri-trace3          # optional, defaults to the file's stem
    root: ..                   # relative paths are resolved against this folder (relative to this file)
    report:
      baseline: srtf           # the policy (simulate) that the report normalises bars to
    grids:
      - kind: simulate
        policy: [srtf, srsf]
        trace: [trace-data/muri/trace3.csv]
        cluster: cluster_spec/n8g8.csv
        compat: [muri, default]
        arrival_scale: [1.0, 0.5]   # inter-arrival times x this factor: 0.5 = twice the load
        seed: [0, 1]

A single ``grid:`` mapping may stand instead of the ``grids:`` list. Defaults are filled in before
a cell's id is computed, so writing a default explicitly never changes the id (and resume still works).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpcsched.errors import InputError
from hpcsched.sweep.cell import KINDS, Cell, ParamSpec

_TOP_KEYS = {"name", "description", "root", "report", "grid", "grids"}
_REPORT_KEYS = {"baseline", "title", "published"}
_PUBLISHED_KEYS = {"source", "trace", "compat", "avg_jct", "p99_jct", "makespan"}


@dataclass(frozen=True)
class SweepConfig:
    """A parsed and validated sweep: where it came from, and the cells it expands to (in order)."""

    path: Path
    name: str
    root: Path
    cells: tuple[Cell, ...]
    description: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    text: str = ""


def load_config(path: str | Path) -> SweepConfig:
    """Parse, validate and expand a sweep config; every mistake is an InputError at its line."""
    p = Path(path)
    if not p.is_file():
        raise InputError(p, "no such sweep config file")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(p, f"cannot read sweep config: {e}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        line = e.problem_mark.line + 1 if e.problem_mark else None
        raise InputError(p, f"invalid YAML: {e.problem}", line) from None
    if node is None:
        raise InputError(p, "empty sweep config", 1)
    top = _mapping(p, node, "the config")
    unknown = set(top) - _TOP_KEYS
    if unknown:
        key = sorted(unknown)[0]
        raise InputError(p, f"unknown key {key!r}; allowed: {', '.join(sorted(_TOP_KEYS))}", _line(top[key][0]))
    name = _scalar_str(p, top["name"][1]) if "name" in top else p.stem
    root = p.parent
    if "root" in top:
        root = (p.parent / _scalar_str(p, top["root"][1])).resolve()
        if not root.is_dir():
            raise InputError(p, f"root {root} is not a folder", _line(top["root"][1]))
    report = _report(p, top["report"][1]) if "report" in top else {}
    if ("grid" in top) == ("grids" in top):
        raise InputError(p, "give exactly one of 'grid' (a mapping) or 'grids' (a list of mappings)", 1)
    if "grid" in top:
        grid_nodes = [top["grid"][1]]
    else:
        seq = top["grids"][1]
        if not isinstance(seq, yaml.SequenceNode) or not seq.value:
            raise InputError(p, "'grids' must be a non-empty list of grids", _line(seq))
        grid_nodes = list(seq.value)
    cells: list[Cell] = []
    seen: dict[str, int] = {}
    for gnode in grid_nodes:
        for cell in _expand(p, root, gnode):
            if cell.id in seen:
                continue  # two grids that overlap run the shared cells once
            seen[cell.id] = len(cells)
            cells.append(cell)
    description = _scalar_str(p, top["description"][1]) if "description" in top else ""
    return SweepConfig(p, name, root, tuple(cells), description, report, text)


def _expand(p: Path, root: Path, gnode: yaml.Node) -> Iterator[Cell]:
    grid = _mapping(p, gnode, "a grid")
    if "kind" not in grid:
        raise InputError(p, f"grid lacks 'kind' (one of {', '.join(KINDS)})", _line(gnode))
    kind = _scalar_str(p, grid["kind"][1])
    if kind not in KINDS:
        raise InputError(p, f"unknown kind {kind!r}; known: {', '.join(KINDS)}", _line(grid["kind"][1]))
    specs = KINDS[kind]
    axes: dict[str, list[Any]] = {}
    for key, (knode, vnode) in grid.items():
        if key == "kind":
            continue
        if key not in specs:
            raise InputError(p, f"unknown {kind} parameter {key!r}; known: {', '.join(specs)}", _line(knode))
        items = vnode.value if isinstance(vnode, yaml.SequenceNode) else [vnode]
        if not items:
            raise InputError(p, f"{key}: empty list, so the grid has no cells", _line(vnode))
        axes[key] = [_value(p, root, specs[key], key, item) for item in items]
    for name, spec in specs.items():
        if name not in axes:
            if spec.required:
                raise InputError(p, f"{kind} grid lacks required parameter {name!r}", _line(gnode))
            axes[name] = [spec.default]
    _check_kind_rules(p, kind, grid, axes, gnode)
    names = list(axes)
    for combo in itertools.product(*(axes[n] for n in names)):
        yield Cell.make(kind, dict(zip(names, combo, strict=True)))


def _check_kind_rules(p: Path, kind: str, grid: dict[str, Any], axes: dict[str, list[Any]], gnode: yaml.Node) -> None:
    """Rules that tie parameters together (one source of idle nodes for a replay)."""
    if kind == "replay":
        has_idle = axes.get("idle") != [None]
        has_log = axes.get("log") != [None]
        if has_idle == has_log:
            raise InputError(p, "a replay grid needs exactly one of 'idle' (idle intervals) or 'log' (a job log)",
                             _line(gnode))


def _value(p: Path, root: Path, spec: ParamSpec, key: str, node: yaml.Node) -> Any:
    """One grid value, converted and checked against its spec."""
    if not isinstance(node, yaml.ScalarNode):
        raise InputError(p, f"{key}: expected a value or a list of values", _line(node))
    raw = yaml.safe_load(node.value) if node.style is None else node.value  # plain scalars get YAML typing
    if raw is None and not spec.required:
        return None
    try:
        v = spec.convert(raw)
    except (TypeError, ValueError) as e:
        raise InputError(p, f"{key}: {e}", _line(node)) from None
    if spec.is_path:
        resolved = (root / v).resolve()
        if not resolved.exists():
            raise InputError(p, f"{key}: no such file {resolved}", _line(node))
        try:
            v = resolved.relative_to(root).as_posix()  # ids stay the same on every clone
        except ValueError:
            v = resolved.as_posix()
    return v


def _report(p: Path, node: yaml.Node) -> dict[str, Any]:
    m = _mapping(p, node, "'report'")
    out: dict[str, Any] = {}
    for key, (knode, vnode) in m.items():
        if key not in _REPORT_KEYS:
            raise InputError(p, f"unknown report key {key!r}; allowed: {', '.join(sorted(_REPORT_KEYS))}",
                             _line(knode))
        out[key] = _published(p, vnode) if key == "published" else _scalar_str(p, vnode)
    return out


def _published(p: Path, node: yaml.Node) -> list[dict[str, Any]]:
    """Figures a paper published, for the report to set beside ours: one block or a list of blocks.

    A block names its ``source``, the ``trace`` (file stem) and ``compat`` mode it belongs to, and per
    metric (avg_jct, p99_jct, makespan) a mapping of policy -> seconds.
    """
    blocks = node.value if isinstance(node, yaml.SequenceNode) else [node]
    out: list[dict[str, Any]] = []
    for bnode in blocks:
        m = _mapping(p, bnode, "a 'published' block")
        for key, (knode, _) in m.items():
            if key not in _PUBLISHED_KEYS:
                raise InputError(p, f"unknown published key {key!r}; allowed: {', '.join(sorted(_PUBLISHED_KEYS))}",
                                 _line(knode))
        for key in ("source", "trace"):
            if key not in m:
                raise InputError(p, f"a 'published' block needs {key!r}", _line(bnode))
        block: dict[str, Any] = {k: _scalar_str(p, m[k][1]) for k in ("source", "trace")}
        block["compat"] = _scalar_str(p, m["compat"][1]) if "compat" in m else "default"
        for metric in ("avg_jct", "p99_jct", "makespan"):
            if metric in m:
                block[metric] = {pol: _number(p, v) for pol, (_, v) in _mapping(p, m[metric][1], metric).items()}
        # a typo would only show in the report as "no finished cell matches": name it here, at its line
        checks = [("compat", block["compat"], m["compat"][0] if "compat" in m else bnode)]
        checks += [("policy", pol, m[metric][0]) for metric in ("avg_jct", "p99_jct", "makespan") if metric in m
                   for pol in block[metric]]
        for key, value, at in checks:
            try:
                KINDS["simulate"][key].convert(value)
            except ValueError as e:
                raise InputError(p, f"published {key}: {e}", _line(at)) from None
        out.append(block)
    return out


def _number(p: Path, node: yaml.Node) -> float:
    try:
        x = float(_scalar_str(p, node))
    except ValueError:
        x = float("nan")
    if not x > 0 or x == float("inf"):
        raise InputError(p, f"expected a number > 0, got {node.value!r}", _line(node))
    return x


def _mapping(p: Path, node: yaml.Node, what: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """A YAML mapping as key -> (key node, value node), so errors can point at either."""
    if not isinstance(node, yaml.MappingNode):
        raise InputError(p, f"{what} must be a mapping of keys to values", _line(node))
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for knode, vnode in node.value:
        key = str(knode.value)
        if key in out:
            raise InputError(p, f"duplicate key {key!r}", _line(knode))
        out[key] = (knode, vnode)
    return out


def _scalar_str(p: Path, node: yaml.Node) -> str:
    if not isinstance(node, yaml.ScalarNode):
        raise InputError(p, "expected a single value", _line(node))
    return str(node.value)


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1
