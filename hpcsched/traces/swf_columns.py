"""``trace inspect`` of a clean SWF log by columns: pandas' C parser in chunks, every check as array operations.

The row reader builds one ``Job`` per row and checks it in Python, several times slower than parsing
(a 10^6-row log: ~5 CPU s against pandas' ~1 s). A summary needs no ``Job``: for a log whose data rows
are all 18 numbers with strictly increasing job ids (the Parallel Workloads Archive's logs and what
``trace convert`` writes), this computes the same counts, first lines, conversions and notes as the row
reader and ``hpcsched.traces``' checks, from the columns. Anything else (a row of another width, a word,
a blank or comment line among the rows, a repeated or unordered id, a skipped row) returns None before
anything is reported, and the caller reads the file row by row, as before.
"""

from __future__ import annotations

import gzip
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hpcsched.traces.base import (
    LARGER_THAN_MACHINE,
    NEGATIVE_RUNTIME,
    RUNTIME_OVER_REQUEST,
    UNKNOWN_FIELD,
    UNSORTED_SUBMIT,
    ZERO_RUNTIME,
    TraceReport,
    numbered_lines,
)
from hpcsched.traces.swf import UNKNOWN_WAIT, note_truncation, setup_header, waits_unknown
from hpcsched.traces.swf_header import NOT_KEPT, Header

__all__ = ["Columns", "summarise"]

_CHUNK = 500_000  # rows per pandas chunk: ~70 MB of floats at a time
_RUNS_CHUNK = 200_000  # a replay keeps the whole log's runs beside the chunk: smaller chunks, less at once
_LIMIT = 2.0**53
_NEEDED = ((2, "wait"), (3, "run_time"), (4, "allocated_procs"), (7, "requested_procs"), (8, "requested_time"),
           (10, "status"))


@dataclass
class Columns:
    """What ``trace inspect`` keeps of a log: 8 bytes a job per column."""

    count: int
    submits: array[float]
    sizes: array[float]
    durations: array[float]
    ends: array[float]
    nodes_max: int
    last_id: float = 0.0  # the last job id (ids must rise)
    top: float = -np.inf  # the latest submit so far (for the unsorted-submit count)
    # per job, in file order, for a replay: start and end (NaN: unknown), nodes, procs; the four summary
    # arrays above stay empty then, so a 10^7-row log costs 32 bytes a job, not 64
    runs: tuple[array[float], array[float], array[int], array[int]] | None = None


class _Unclean(Exception):
    """The log is not one this summary can take: the row reader does."""


def _header(path: Path) -> tuple[Header, int]:
    """The header and the number of lines before the first data row."""
    header = Header()
    for lineno, line in numbered_lines(path):
        s = line.strip()
        if not s:
            raise _Unclean
        if s[0] == ";":
            header.add(line)
            continue
        return header, lineno - 1
    raise _Unclean


def summarise(path: Path, report: TraceReport, tick: Callable[[int], None] | None = None,
              keep_runs: bool = False) -> Columns | None:
    """The summary of a clean SWF log (filling ``report`` as the row reader would), else None (nothing reported).

    ``keep_runs``: keep each job's start, end, nodes and procs (``Columns.runs``) instead of the summary's
    arrays: what a replay needs of the log, read at the parser's speed instead of one ``Job`` per row.
    """
    try:
        return _summarise(path, report, tick, keep_runs)
    except _Unclean:
        report.reset()
        return None


def _first(report: TraceReport, kind: str, mask: np.ndarray, lines: np.ndarray, detail: str = "") -> None:
    n = int(mask.sum())
    if n:
        report.anomalies[kind] += n
        report.first_lines.setdefault(kind, int(lines[int(mask.argmax())]))
        if detail:
            report.first_details.setdefault(kind, detail)


def _summarise(path: Path, report: TraceReport, tick: Callable[[int], None] | None, keep_runs: bool) -> Columns:
    import pandas as pd

    if report.strict:
        raise _Unclean
    header, skip = _header(path)
    report.reset()
    unknown: Counter[str] = Counter()
    report.meta.update(unknown_fields=unknown, cancelled_that_ran=0)
    wait_is_start = waits_unknown(path, report)
    if wait_is_start:
        report.meta["waits_unknown"] = True
        report.convert("no wait in the log (every wait -1): start = submit, each such job counted as unknown_wait "
                       "(the log's submit times are start times; swf_waits=unknown keeps starts unknown)")
    offset, cpn, _ = setup_header(path, report, header)
    not_kept: dict[str, int] = {}
    report.meta["swf_fields_not_kept"] = not_kept
    mach: dict[str, int] = {}
    for key in ("machine_nodes", "machine_procs"):
        given = report.options.get(key)
        if given:
            report.meta[key] = int(given)
            report.convert(f"{key.replace('_', ' ')} = {int(given)} (given as an option)")
        mach[key] = int(report.meta.get(key) or 0)
    with path.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    size = path.stat().st_size
    try:
        # the file is opened here, not by pandas, so that progress can say how far into it the parser is: the
        # compressed offset of a gzipped log (its uncompressed size is unknown until the end)
        with path.open("rb") as raw, (gzip.GzipFile(fileobj=raw) if gz else raw) as src:
            reader = pd.read_csv(src, sep=r"\s+", header=None, skiprows=skip, skip_blank_lines=False,
                                 dtype=np.float64, chunksize=_RUNS_CHUNK if keep_runs else _CHUNK, engine="c")
            out = Columns(0, array("d"), array("d"), array("d"), array("d"), 0)
            if keep_runs:
                out.runs = (array("d"), array("d"), array("q"), array("q"))
            for chunk in reader:
                _chunk(chunk.to_numpy(), report, out, unknown, not_kept, skip, offset, cpn, wait_is_start, mach)
                if report.progress is not None:
                    report.progress(raw.tell(), size)
                if tick is not None:
                    tick(out.count)
    except (ValueError, pd.errors.ParserError, EOFError, OSError, gzip.BadGzipFile) as e:
        raise _Unclean from e
    if out.count == 0:
        raise _Unclean
    report.records = out.count
    for k in ("MaxJobs", "MaxRecords"):
        if k in header:
            report.meta[f"header_{k.lower()}"] = header[k]
    note_truncation(path, header, out.count, report)
    return out


def _chunk(a: np.ndarray, report: TraceReport, out: Columns, unknown: Counter[str], not_kept: dict[str, int],
           skip: int, offset: float, cpn: float, wait_is_start: bool, mach: dict[str, int]) -> None:
    last_id, top = out.last_id, out.top
    if a.ndim != 2 or a.shape[1] != 18 or not np.isfinite(a).all() or (np.abs(a) > _LIMIT).any():
        raise _Unclean  # another width, a blank row (NaN) or damage: the row reader says which line
    ids, sub, wait, run, alloc = a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4]
    reqp, reqt, st = a[:, 7], a[:, 8], a[:, 10]
    if (sub < 0).any() or (st != np.floor(st)).any() or (ids != np.floor(ids)).any() or ids[0] <= last_id or (
            len(ids) > 1 and (np.diff(ids) <= 0).any()):
        raise _Unclean  # skipped rows, statuses the row reader rejects, ids it would have to compare as text
    n = len(a)
    lines = np.arange(skip + out.count + 1, skip + out.count + n + 1)
    for i, name in NOT_KEPT.items():
        if name not in not_kept:
            m = a[:, i] != -1
            if m.any():
                not_kept[name] = int(lines[int(m.argmax())])
    # the row reader's order: unknown_wait, then unknown fields in _NEEDED order, per row; first lines per kind
    if wait_is_start:
        wmask = wait == -1
        unknown["wait"] += int(wmask.sum())
        _first(report, UNKNOWN_WAIT, wmask, lines, "wait -1: start = submit")
        wait = np.where(wmask, 0.0, wait)
    for i, name in _NEEDED:
        if i == 2 and wait_is_start:
            continue
        m = a[:, i] == -1
        k = int(m.sum())
        if k:
            unknown[name] += k
            report.anomalies[UNKNOWN_FIELD] += k
            first = int(lines[int(m.argmax())])
            if first < report.first_lines.get(UNKNOWN_FIELD, first + 1):
                report.first_lines[UNKNOWN_FIELD] = first
                report.first_details[UNKNOWN_FIELD] = name
    report.meta["cancelled_that_ran"] += int(((st == 5) & (run > 0)).sum())
    submit = sub + offset
    procs = np.where(alloc > 0, alloc, np.where(reqp > 0, reqp, 0.0))
    nodes = np.where(procs > 0, np.ceil(procs / cpn - 1e-9), 0.0)
    start = np.where(wait >= 0, submit + wait, np.nan)
    dur = np.where(run != -1, run, np.nan)
    # hpcsched.traces' checks on every job
    prev = np.maximum.accumulate(np.r_[top, submit[:-1]])
    _first(report, UNSORTED_SUBMIT, submit < prev, lines)
    _first(report, ZERO_RUNTIME, dur == 0, lines)
    neg = dur < 0
    _first(report, NEGATIVE_RUNTIME, neg, lines)
    dur = np.where(neg, np.nan, dur)
    _first(report, RUNTIME_OVER_REQUEST, (dur > 0) & (reqt > 0) & (dur > reqt), lines)
    big = np.zeros(n, dtype=bool)
    if mach["machine_nodes"]:
        big |= nodes > mach["machine_nodes"]
    if mach["machine_procs"]:
        big |= procs > mach["machine_procs"]
    _first(report, LARGER_THAN_MACHINE, big, lines)
    end = np.where(~np.isnan(start) & (run >= 0) & ~neg, start + run, np.nan)
    if out.runs is not None:
        runs: tuple[array[Any], ...] = out.runs  # float and int columns alike: frombytes of their own typecode
        for arr, col in zip(runs, (start, end, nodes, procs), strict=True):
            arr.frombytes(col.astype(np.float64 if arr.typecode == "d" else np.int64).tobytes())
    else:
        out.submits.frombytes(submit.astype(np.float64).tobytes())
        out.sizes.frombytes(nodes.astype(np.float64).tobytes())
        out.durations.frombytes(dur[~np.isnan(dur)].astype(np.float64).tobytes())
        out.ends.frombytes(end[~np.isnan(end)].astype(np.float64).tobytes())
    out.nodes_max = max(out.nodes_max, int(nodes.max()))
    out.count += n
    out.last_id = float(ids[-1])
    out.top = float(max(top, submit.max()))
