"""Slurm hostlist expressions: ``n[1-4,7]``, ``a[01-03]b``, ``gpu[1-2]-[0-1]``, comma lists.

Slurm logs, ``sinfo`` and ``squeue`` name node sets this way; the readers, the Slurm integration
and the harvester all need the same expansion, so it lives here, free of any trace format.
Zero padding is kept (``[08-10]`` -> ``08, 09, 10``), several bracket groups expand as a cartesian
product in Slurm's order, and an expansion past ``limit`` names is refused rather than exhausting
memory on a typo like ``n[1-999999999]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

DEFAULT_LIMIT = 1_000_000
_TAIL_NUMBER = re.compile(r"^(.*?)(\d+)$")


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in expr:
        if ch == "[":
            if depth:
                raise ValueError(f"nested '[' in hostlist {expr!r}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise ValueError(f"unbalanced ']' in hostlist {expr!r}")
            depth = 0
        elif ch == "," and not depth:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if depth:
        raise ValueError(f"unclosed '[' in hostlist {expr!r}")
    parts.append("".join(cur))
    return parts


def _ranges(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        lo, dash, hi = item.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"bad range {item!r} in hostlist {expr!r}")
        if not dash:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise ValueError(f"descending range {item!r} in hostlist {expr!r}")
        if b - a >= DEFAULT_LIMIT:
            raise ValueError(f"range {item!r} in hostlist {expr!r} is too large")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        out.extend(str(i).zfill(width) for i in range(a, b + 1))
    return out


def expand_hostlist(expr: str, limit: int = DEFAULT_LIMIT) -> list[str]:
    """Node names of a Slurm hostlist expression, in order (duplicates kept, as Slurm does).

    ``""`` and Slurm's ``(null)`` / ``None assigned`` give ``[]``. Raises ``ValueError`` on malformed
    input (unbalanced brackets, bad or descending ranges) or when more than ``limit`` names result.
    """
    expr = expr.strip()
    if not expr or expr in ("(null)", "None assigned", "None"):
        return []
    names: list[str] = []
    for part in _split_top(expr):
        part = part.strip()
        if not part:
            raise ValueError(f"empty name in hostlist {expr!r}")
        pieces = re.split(r"\[([^\]]*)\]", part)
        # pieces alternate literal, bracket body, literal, ...
        combos = [""]
        for i, piece in enumerate(pieces):
            if i % 2 == 0:
                if "[" in piece or "]" in piece:
                    raise ValueError(f"unbalanced brackets in hostlist {expr!r}")
                combos = [c + piece for c in combos]
            else:
                options = _ranges(piece, expr)
                if len(combos) * len(options) + len(names) > limit:
                    raise ValueError(f"hostlist {expr!r} expands to more than {limit:,} names")
                combos = [c + o for c in combos for o in options]
        names.extend(combos)
        if len(names) > limit:
            raise ValueError(f"hostlist {expr!r} expands to more than {limit:,} names")
    return names


def compress_hostlist(names: Iterable[str]) -> str:
    """The inverse: a compact Slurm expression for ``names`` (runs of consecutive numbers bracketed).

    Names are grouped by prefix and number width in first-seen order; ``expand_hostlist`` of the
    result gives the same set of names (sorted within each group).
    """
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for name in names:
        m = _TAIL_NUMBER.match(name)
        if not m:
            if name not in plain:
                plain.append(name)
                order.append(name)
            continue
        prefix, digits = m.groups()
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(digits))
    for prefix, width in [k for k in groups if k[1]]:  # gpu08, gpu09 + gpu10 -> gpu[08-10]
        plain_nums = groups.get((prefix, 0), [])
        groups[(prefix, width)] += [n for n in plain_nums if len(str(n)) == width]
        if (prefix, 0) in groups:
            groups[(prefix, 0)] = [n for n in plain_nums if len(str(n)) != width]
    out: list[str] = []
    for entry in order:
        if isinstance(entry, str):
            out.append(entry)
            continue
        prefix, width = entry
        nums = sorted(set(groups[entry]))
        if not nums:
            continue
        runs: list[str] = []
        start = prev = nums[0]
        for n in [*nums[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            lo, hi = str(start).zfill(width), str(prev).zfill(width)
            runs.append(lo if start == prev else f"{lo}-{hi}")
            if n is not None:
                start = prev = n
        if len(nums) == 1:
            out.append(f"{prefix}{str(nums[0]).zfill(width)}")
        else:
            out.append(f"{prefix}[{','.join(runs)}]")
    return ",".join(out)
