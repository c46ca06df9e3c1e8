"""Read a ClusterSpec from Muri's CSV layout or from YAML.

CSV (Muri ``cluster_spec/*.csv``): ``num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node``.
YAML: ``switches``, ``nodes_per_switch``, ``gpus_per_node``, optional ``cpus_per_node``,
``mem_per_node_gb``, ``name``.
"""

from __future__ import annotations

import csv
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.model import ClusterSpec

_CSV_KEYS = {
    "num_switch": "switches",
    "num_node_p_switch": "nodes_per_switch",
    "num_gpu_p_node": "gpus_per_node",
    "num_cpu_p_node": "cpus_per_node",
    "mem_p_node": "mem_per_node_gb",
}
_YAML_KEYS = {"switches", "nodes_per_switch", "gpus_per_node", "cpus_per_node", "mem_per_node_gb", "name"}


def read_cluster_spec(path: str | Path) -> ClusterSpec:
    """A cluster spec from ``path`` (``.csv`` in Muri's layout, ``.yaml``/``.yml`` otherwise)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(p, "no such cluster spec file")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(p, f"cannot read cluster spec: {e}") from None
    if p.suffix.lower() == ".csv":
        return _from_csv(p, text)
    return _from_yaml(p, text)


def _from_csv(p: Path, text: str) -> ClusterSpec:
    rows = [r for r in csv.reader(text.splitlines()) if any(c.strip() for c in r)]
    if len(rows) < 2:
        raise InputError(p, "cluster spec CSV needs a header and one row", len(rows) or 1)
    header = [c.strip() for c in rows[0]]
    missing = [k for k in list(_CSV_KEYS)[:3] if k not in header]
    if missing:
        raise InputError(p, f"cluster spec header lacks {', '.join(missing)}", 1)
    if len(rows[1]) != len(header):
        raise InputError(p, f"{len(rows[1])} fields but the header has {len(header)}", 2)
    values = dict(zip(header, rows[1], strict=True))
    kwargs: dict[str, object] = {"name": p.stem}
    for src, dst in _CSV_KEYS.items():
        if src in values:
            kwargs[dst] = _number(p, 2, src, values[src], float if dst == "mem_per_node_gb" else int)
    return _build(p, kwargs, 2)


def _from_yaml(p: Path, text: str) -> ClusterSpec:
    import yaml  # only YAML specs need it: a CSV spec (simulate's usual case) starts faster without

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise InputError(p, f"invalid YAML: {getattr(e, 'problem', e)}", mark.line + 1 if mark else None) from None
    if not isinstance(data, dict):
        raise InputError(p, "cluster spec YAML must be a mapping of keys to values", 1)
    unknown = set(data) - _YAML_KEYS
    if unknown:
        raise InputError(p, f"unknown keys {sorted(unknown)}; allowed: {sorted(_YAML_KEYS)}")
    kwargs: dict[str, object] = {"name": str(data.get("name", p.stem))}
    for k, v in data.items():
        if k != "name":
            kwargs[k] = _number(p, None, k, v, float if k == "mem_per_node_gb" else int)
    return _build(p, kwargs, None)


def _number(p: Path, line: int | None, key: str, value: object, kind: type) -> int | float:
    try:
        f = float(str(value).strip())
    except ValueError:
        raise InputError(p, f"{key} must be a number, got {value!r}", line) from None
    if kind is int and f != int(f):
        raise InputError(p, f"{key} must be a whole number, got {value!r}", line)
    return int(f) if kind is int else f


def _build(p: Path, kwargs: dict[str, object], line: int | None) -> ClusterSpec:
    try:
        return ClusterSpec(**kwargs)  # type: ignore[arg-type]
    except (TypeError, ValueError) as e:
        raise InputError(p, str(e), line) from None
