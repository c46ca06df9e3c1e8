"""One cell of a sweep: a kind (``simulate`` or ``replay``) and its parameters, named by their hash.

The id is a hash of the kind and the fully defaulted parameters (paths relative to the config's
root), so the same experiment gets the same id on every run and every clone: a resumed sweep knows
which cells it already has.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

ID_LENGTH = 12


@dataclass(frozen=True)
class ParamSpec:
    """How one grid parameter is read: its converter, default, and whether it names a file."""

    convert: Callable[[Any], Any]
    default: Any = None
    required: bool = False
    is_path: bool = False
    help: str = ""


def _str(v: Any) -> str:
    if isinstance(v, (list, dict)) or v is None:
        raise ValueError(f"expected text, got {v!r}")
    return str(v)


def _positive_float(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError(f"expected a number > 0, got {v!r}")
    x = float(v)
    if not x > 0 or x == float("inf"):
        raise ValueError(f"expected a finite number > 0, got {v!r}")
    return x


def _int(v: Any) -> int:
    if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
        raise ValueError(f"expected an integer, got {v!r}")
    return int(v)


def _positive_int(v: Any) -> int:
    x = _int(v)
    if x < 1:
        raise ValueError(f"expected an integer >= 1, got {v!r}")
    return x


def _choice(*allowed: str) -> Callable[[Any], str]:
    def conv(v: Any) -> str:
        s = _str(v)
        if s not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {s!r}")
        return s

    return conv


def _policy(v: Any) -> str:
    """A registered policy name: a typo is caught at its line before any cell runs."""
    from hpcsched.policies import REGISTRY

    name = _str(v)
    if name not in REGISTRY.names():
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(REGISTRY.names())}")
    return name


def _solver(v: Any) -> str:
    from hpcsched.milp import SOLVERS

    name = _str(v)
    if name not in SOLVERS:
        raise ValueError(f"unknown solver {name!r}; known: {', '.join(SOLVERS)}")
    return name


_SEED = ParamSpec(_int, 0, help="seed for every random choice the cell makes")
_SCALE = ParamSpec(_positive_float, 1.0, help="inter-arrival times x this factor (0.5 = twice the load)")

SIMULATE: dict[str, ParamSpec] = {
    "policy": ParamSpec(_policy, required=True, help="scheduling policy name (hpcsched simulate --policy)"),
    "trace": ParamSpec(_str, required=True, is_path=True, help="DL job trace"),
    "cluster": ParamSpec(_str, required=True, is_path=True, help="cluster spec (csv or yaml)"),
    "compat": ParamSpec(_choice("default", "muri"), "default", help="simulator semantics"),
    "arrival_scale": _SCALE,
    "seed": _SEED,
}

REPLAY: dict[str, ParamSpec] = {
    "idle": ParamSpec(_str, is_path=True, help="idle-interval file (BFTrainer layout)"),
    "log": ParamSpec(_str, is_path=True, help="a batch job log replayed into idle intervals"),
    "bounds": ParamSpec(_str, required=True, is_path=True, help="elastic job bounds, Jbnd csv (replay --jobs)"),
    "curves": ParamSpec(_str, required=True, is_path=True, help="scaling curves (JNPs csv)"),
    "nodes": ParamSpec(_positive_int, None, help="use the first N nodes (none: all)"),
    "tfwd": ParamSpec(_positive_float, 10.0, help="look-ahead window Tfwd, seconds"),
    "solver": ParamSpec(_solver, "highs", help="allocator backend (replay --solver)"),
    "objective": ParamSpec(_choice("reference", "window"), "reference", help="MILP objective (replay --objective)"),
    "accounting": ParamSpec(_choice("reference", "restart"), "reference", help="rescale cost model"),
    "max_jobs": ParamSpec(_positive_int, 10, help="jobs admitted at once (the reference's maxJ)"),
    "time_limit": ParamSpec(_positive_float, 10.0, help="seconds per MILP decision"),
    "arrival_scale": _SCALE,
    "seed": _SEED,
}

KINDS: dict[str, dict[str, ParamSpec]] = {"simulate": SIMULATE, "replay": REPLAY}
PATH_PARAMS = {k: tuple(n for n, s in specs.items() if s.is_path) for k, specs in KINDS.items()}


@dataclass(frozen=True)
class Cell:
    """An experiment to run once: ``kind``, its parameters, and ``id`` = hash of both."""

    id: str
    kind: str
    params: Mapping[str, Any]

    @classmethod
    def make(cls, kind: str, params: Mapping[str, Any]) -> Cell:
        return cls(cell_id(kind, params), kind, dict(params))

    def label(self) -> str:
        """Short human name for progress bars and logs."""
        p = self.params
        if self.kind == "simulate":
            bits = [str(p["policy"]), _stem(p["trace"])]
            if p.get("compat") != "default":
                bits.append(str(p["compat"]))
            if p.get("arrival_scale") != 1.0:
                bits.append(f"x{p['arrival_scale']:g}")
        else:
            bits = [_stem(p.get("idle") or p.get("log")), f"tfwd={p['tfwd']:g}", str(p["solver"])]
        return " ".join(bits)


def cell_id(kind: str, params: Mapping[str, Any]) -> str:
    blob = json.dumps({"kind": kind, **params}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:ID_LENGTH]


def _stem(path: Any) -> str:
    name = str(path).rsplit("/", 1)[-1]
    for suffix in (".gz", ".csv", ".swf", ".yaml"):
        name = name.removesuffix(suffix)
    return name


def cell_filter(selectors: list[str]) -> Callable[[Cell], bool]:
    """``KEY=VALUE`` selectors: values of one key are alternatives, different keys must all match.

    A value matches the parameter's text or, for files, its stem (``trace=trace3`` selects
    ``trace-data/muri/trace3.csv``).
    """
    wanted: dict[str, set[str]] = {}
    for sel in selectors:
        key, sep, value = sel.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {sel!r}")
        wanted.setdefault(key.strip(), set()).add(value.strip())

    def match(cell: Cell) -> bool:
        for key, values in wanted.items():
            v = cell.params.get(key)
            texts = {str(v), _stem(v)} | ({f"{v:g}"} if isinstance(v, float) else set())
            if not texts & values:
                return False
        return True

    return match
