"""``hpcsched jobs`` and ``workers`` as plain-text tables that read in the terminal they are printed in.

At 80 columns (the width when the output is not a terminal) a table of 13 columns squeezed every cell to ``j0…``:
not even a job's id and state could be read. So a listing shows a few columns by default (``-o wide``: all of them,
never shortened), and when those still do not fit, the cells of the columns that may be shortened (names, users,
hosts) are elided in the middle (``resnet50-lr…-seed3``: both ends of a name tell jobs apart), widest first. Ids and
states are never shortened: a row whose id alone is wider than the terminal is printed whole and wraps.
"""

from __future__ import annotations

import shutil
import sys
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

GAP = "  "
MIN_ELIDED = 5  # an elidable column is never narrower than this (or its widest cell, when narrower)


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    elide: bool = True  # may be shortened to fit; False for ids and states
    right: bool = False  # numbers: aligned right


def terminal_width() -> int:
    """$COLUMNS, else the terminal's width, else 80 (output to a file or a pipe)."""
    return shutil.get_terminal_size((80, 24)).columns


def ellipsis() -> str:
    """'…' where stdout can write it, else '~' (a C locale): one cell either way."""
    try:
        "…".encode(sys.stdout.encoding or "ascii")
        return "…"
    except (UnicodeEncodeError, LookupError):
        return "~"


def cells(text: str) -> int:
    """Terminal columns ``text`` takes: East Asian wide and full-width characters two, combining marks none (a job
    named in Japanese must fit 80 columns too)."""
    if text.isascii():  # nearly every cell: no per-character lookups (100,000 jobs make 700,000 cells)
        return len(text)
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def elide(text: str, width: int, mark: str = "…") -> str:
    """``text`` in at most ``width`` terminal columns, its middle replaced by ``mark`` when it is wider."""
    if cells(text) <= width:
        return text
    if width <= cells(mark):
        return _head(text, width)
    keep = width - cells(mark)
    head = _head(text, (keep + 1) // 2)
    tail = _head(text[::-1], keep - cells(head))[::-1]
    return head + mark + tail


def _head(text: str, width: int) -> str:
    """The longest start of ``text`` within ``width`` columns."""
    used = 0
    for k, c in enumerate(text):
        used += cells(c)
        if used > width:
            return text[:k]
    return text


def printable(text: str) -> str:
    """One line: control characters (from a program's output, a job's name) shown as '?'."""
    return "".join(c if c.isprintable() else "?" for c in text)


def render(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None,
           mark: str | None = None) -> str:
    """The table as lines of text, at most ``width`` characters each when the unelidable columns fit (None: no
    limit, every cell whole). Trailing spaces are stripped."""
    mark = ellipsis() if mark is None else mark
    rows_ = [[printable(c) for c in r] for r in rows]
    widths = [max([cells(col.header)] + [cells(r[k]) for r in rows_]) for k, col in enumerate(columns)]
    if width is not None:
        floor = [widths[k] if not col.elide else min(widths[k], max(MIN_ELIDED, cells(mark) + 2))
                 for k, col in enumerate(columns)]
        excess = sum(widths) + len(GAP) * (len(columns) - 1) - width
        while excess > 0:
            k = max((k for k in range(len(columns)) if widths[k] > floor[k]), key=lambda k: widths[k], default=None)
            if k is None:
                break  # only ids and states left at full width: print them whole
            widths[k] -= 1
            excess -= 1
    lines = [_line([c.header for c in columns], columns, widths, mark)]
    lines += [_line(r, columns, widths, mark) for r in rows_]
    return "\n".join(lines)


def _line(row: Sequence[str], columns: Sequence[Column], widths: list[int], mark: str) -> str:
    out = []
    for text, col, w in zip(row, columns, widths, strict=True):
        t = elide(text, w, mark) if col.elide else text
        pad = " " * max(0, w - cells(t))
        out.append(pad + t if col.right else t + pad)
    return GAP.join(out).rstrip()


def age(seconds: float) -> str:
    """A duration as kubectl shows ages: 45s, 12m, 3h, 5d."""
    s = max(0, int(seconds))
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s // n}{unit}"
    return f"{s}s"


def since(t: float, now: float | None = None) -> str:
    """The age of a wall-clock time ('-' for none)."""
    return age((now if now is not None else time.time()) - t) if t else "-"
