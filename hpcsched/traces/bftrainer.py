"""BFTrainer/Replayer data: idle node intervals, node order, elastic job bounds (Jbnd) and curves (JNPs).

BFTrainer harvests nodes the batch scheduler leaves idle for elastic DL jobs. Its data set comes as
four files, each read here into ``hpcsched.model`` records:

- ``idle-intervals.csv.gz``: ``node,idle_start,idle_end`` in epoch seconds; ``idle_end = -1`` means
  the node was still idle when the log ended (``end=None``, counted as ``censored``).
- ``node-order.txt``: one node name per line, the order the replayer numbers nodes in.
- ``*-Jbnd-*.csv``: ``job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub`` (rescale costs s, node bounds, samples, epoch).
- ``*-JNPs-*.csv``: ``job,Ns,Ps,Os,Tsub`` where Ns/Ps are JSON lists: node counts -> samples/s.

Bounds and curves only make sense together, so ``read_elastic_jobs`` joins them and treats a
contradiction (Jmin > Jmax, a negative rate, unsorted breakpoints, a job in only one file) as an
``InputError`` naming file and line: a replay on silently wrong bounds would be worse than none.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.model import ElasticJob, IdleInterval, ScalingCurve
from hpcsched.traces.base import (
    CENSORED,
    DUPLICATE_ID,
    MALFORMED_ROW,
    NEGATIVE_RUNTIME,
    UNSORTED_SUBMIT,
    ZERO_RUNTIME,
    TraceFormat,
    TraceReport,
    csv_header_is,
    csv_records,
    csv_rows,
    numbered_lines,
)

IDLE_COLUMNS = ("node", "idle_start", "idle_end")
BOUNDS_COLUMNS = ("job", "Tcup", "Tcdw", "Jmin", "Jmax", "Pmax", "Tsub")
CURVE_COLUMNS = ("job", "Ns", "Ps")


@dataclass(frozen=True, slots=True)
class JobBounds:
    """One Jbnd row: what a job may use and what resizing it costs (half of an ElasticJob)."""

    id: str
    submit: float
    jmin: int
    jmax: int
    total_samples: float
    scale_up_s: float
    scale_down_s: float
    line: int


@dataclass(frozen=True, slots=True)
class JobCurve:
    """One JNPs row: the job's measured throughput per node count (the other half of an ElasticJob)."""

    id: str
    submit: float
    curve: ScalingCurve
    line: int


def _num(path: Path, lineno: int, name: str, text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise InputError(path, f"{name} is not a number: {text!r}", lineno) from None
    if not math.isfinite(v):
        raise InputError(path, f"{name} is not finite: {text!r}", lineno)
    return v


def _count(path: Path, lineno: int, name: str, text: str) -> int:
    v = _num(path, lineno, name, text)
    if v != int(v):
        raise InputError(path, f"{name} must be a whole node count, got {text!r}", lineno)
    return int(v)


# ---------------------------------------------------------------------------------------------- idle


def _read_idle(path: Path, report: TraceReport) -> Iterator[IdleInterval]:
    last_start = -math.inf
    cols: tuple[int, int, int] | None = None
    for lineno, row, index in csv_rows(path, IDLE_COLUMNS, report, what="idle-interval"):
        if cols is None:
            cols = (index["node"], index["idle_start"], index["idle_end"])
            i_node, i_start, i_end = cols
        try:
            node = row[i_node].strip()
            start = float(row[i_start])
            end_raw = float(row[i_end])
        except ValueError as e:
            report.anomaly(MALFORMED_ROW, lineno, str(e))
            continue
        if not node or not math.isfinite(start) or not math.isfinite(end_raw):
            report.anomaly(MALFORMED_ROW, lineno, "empty node name or non-finite time")
            continue
        end: float | None = end_raw
        if end_raw == -1:
            report.anomaly(CENSORED, lineno, f"node {node} still idle at trace end")
            end = None
        elif end_raw < start:
            report.anomaly(NEGATIVE_RUNTIME, lineno, f"idle_end {end_raw:g} before idle_start {start:g}")
            continue
        elif end_raw == start:
            report.anomaly(ZERO_RUNTIME, lineno)
        if start < last_start:
            report.anomaly(UNSORTED_SUBMIT, lineno, "idle_start earlier than the previous row")
        last_start = max(last_start, start)
        yield IdleInterval(node, start, end)


def read_idle_intervals(path: str | Path, report: TraceReport | None = None) -> Iterator[IdleInterval]:
    """Stream idle intervals; ``end`` is None for a node still idle when the log ended.

    Pass a ``report`` to see the anomaly counts (censored, unsorted, malformed rows skipped).
    """
    p = Path(path)
    return _read_idle(p, report if report is not None else TraceReport(str(p), IDLE_FORMAT.name))


# ---------------------------------------------------------------------------------------- node order


def _read_nodes(path: Path, report: TraceReport) -> Iterator[str]:
    seen: set[str] = set()
    any_line = False
    for lineno, line in numbered_lines(path, report):
        name = line.strip()
        if not name:
            continue
        any_line = True
        if any(c.isspace() for c in name) or "," in name:
            raise InputError(path, f"not a node-order file: {name[:40]!r} is not one node name", lineno)
        if name in seen:
            report.anomaly(DUPLICATE_ID, lineno, name)
            continue
        seen.add(name)
        yield name
    if not any_line:
        raise InputError(path, "empty file: no node names", 1)


def read_node_order(path: str | Path, report: TraceReport | None = None) -> list[str]:
    """Node names in the replayer's order (duplicates dropped and counted)."""
    p = Path(path)
    return list(_read_nodes(p, report if report is not None else TraceReport(str(p), NODES_FORMAT.name)))


# ------------------------------------------------------------------------------------ elastic jobs


def _job_rows(
    path: Path, columns: tuple[str, ...], report: TraceReport, what: str
) -> Iterator[tuple[int, str, dict[str, str]]]:
    """(line, job name, row) of a per-job table; a row of the wrong width, no name or a repeated name is
    an error: half a job table would silently drop jobs from a replay."""
    seen: set[str] = set()
    for lineno, row in csv_records(path, columns, report, what=what, lenient=False):
        job = row["job"].strip()
        if not job:
            raise InputError(path, "empty job name", lineno)
        if job in seen:
            raise InputError(path, f"job {job} appears twice", lineno)
        seen.add(job)
        yield lineno, job, row


def _read_bounds(path: Path, report: TraceReport) -> Iterator[JobBounds]:
    for lineno, job, row in _job_rows(path, BOUNDS_COLUMNS, report, "Jbnd (job bounds)"):
        up, down = _num(path, lineno, "Tcup", row["Tcup"]), _num(path, lineno, "Tcdw", row["Tcdw"])
        jmin, jmax = _count(path, lineno, "Jmin", row["Jmin"]), _count(path, lineno, "Jmax", row["Jmax"])
        pmax = _num(path, lineno, "Pmax", row["Pmax"])
        if up < 0 or down < 0:
            raise InputError(path, f"job {job}: rescale costs must be >= 0, got Tcup={up:g} Tcdw={down:g}", lineno)
        if jmin < 1 or jmax < jmin:
            raise InputError(path, f"job {job}: need 1 <= Jmin <= Jmax, got Jmin={jmin} Jmax={jmax}", lineno)
        if pmax <= 0:
            raise InputError(path, f"job {job}: Pmax must be > 0, got {pmax:g}", lineno)
        yield JobBounds(job, _num(path, lineno, "Tsub", row["Tsub"]), jmin, jmax, pmax, up, down, lineno)


def _json_numbers(path: Path, lineno: int, name: str, text: str) -> list[float]:
    try:
        v = json.loads(text)
    except (ValueError, RecursionError):
        raise InputError(path, f"{name} is not a JSON list: {text[:40]!r}", lineno) from None
    bad = InputError(path, f"{name} must be a non-empty JSON list of finite numbers", lineno)
    if not isinstance(v, list) or not v or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
        raise bad
    try:
        out = [float(x) for x in v]
    except OverflowError:
        raise bad from None
    if not all(math.isfinite(x) for x in out):
        raise bad
    return out


def _read_curves(path: Path, report: TraceReport) -> Iterator[JobCurve]:
    for lineno, job, row in _job_rows(path, CURVE_COLUMNS, report, "JNPs (scaling curves)"):
        ns, ps = _json_numbers(path, lineno, "Ns", row["Ns"]), _json_numbers(path, lineno, "Ps", row["Ps"])
        if len(ns) != len(ps):
            raise InputError(path, f"job {job}: {len(ns)} node counts (Ns) but {len(ps)} rates (Ps)", lineno)
        if any(b <= a for a, b in zip(ns, ns[1:], strict=False)):
            raise InputError(path, f"job {job}: node counts Ns must be strictly increasing, got {ns}", lineno)
        if ns[0] < 0:
            raise InputError(path, f"job {job}: node counts Ns must be >= 0, got {ns[0]:g}", lineno)
        if any(p < 0 for p in ps):
            raise InputError(path, f"job {job}: samples/s Ps must be >= 0, got {ps}", lineno)
        submit = _num(path, lineno, "Tsub", row["Tsub"]) if "Tsub" in row else math.nan
        yield JobCurve(job, submit, ScalingCurve(tuple(ns), tuple(ps)), lineno)


def read_elastic_jobs(bounds_path: str | Path, curves_path: str | Path) -> list[ElasticJob]:
    """Join a Jbnd and a JNPs file into ElasticJobs, in the bounds file's order.

    Tcup/Tcdw -> scale_up_s/scale_down_s, Pmax -> total_samples, Tsub -> submit (epoch s),
    Ns/Ps -> curve. A job in one file but not the other, or differing submit times, is an error.
    """
    bp, cp = Path(bounds_path), Path(curves_path)
    bounds = list(_read_bounds(bp, TraceReport(str(bp), BOUNDS_FORMAT.name, strict=True)))
    curves = {c.id: c for c in _read_curves(cp, TraceReport(str(cp), CURVES_FORMAT.name, strict=True))}
    bound_ids = {b.id for b in bounds}
    for unbound in curves.values():
        if unbound.id not in bound_ids:
            raise InputError(cp, f"job {unbound.id} has a scaling curve but no bounds in {bp.name}", unbound.line)
    jobs: list[ElasticJob] = []
    for b in bounds:
        c = curves.get(b.id)
        if c is None:
            raise InputError(bp, f"job {b.id} has bounds but no scaling curve in {cp.name}", b.line)
        if not math.isnan(c.submit) and c.submit != b.submit:
            raise InputError(cp, f"job {b.id}: Tsub {c.submit:g} differs from {bp.name} ({b.submit:g})", c.line)
        jobs.append(ElasticJob(b.id, b.submit, b.jmin, b.jmax, c.curve, b.total_samples, b.scale_up_s, b.scale_down_s))
    return jobs


# -------------------------------------------------------------------------------------- registry


def _sniff_nodes(first_lines: list[str]) -> bool:
    names = [s.strip() for s in first_lines if s.strip()]
    return bool(names) and all(
        len(n) <= 64 and n.replace("-", "").replace("_", "").replace(".", "").isalnum() and not n.isdigit()
        for n in names
    )


IDLE_FORMAT = TraceFormat(
    "bftrainer-idle", "idle", "BFTrainer idle node intervals (node,idle_start,idle_end; epoch s; -1 = still idle)",
    lambda lines: csv_header_is(lines, *IDLE_COLUMNS), _read_idle,
)
BOUNDS_FORMAT = TraceFormat(
    "bftrainer-bounds", "elastic-bounds", "BFTrainer job bounds Jbnd (job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub)",
    lambda lines: csv_header_is(lines, *BOUNDS_COLUMNS), _read_bounds,
)
CURVES_FORMAT = TraceFormat(
    "bftrainer-curves", "elastic-curves", "BFTrainer scaling curves JNPs (job,Ns,Ps,Os,Tsub; JSON lists)",
    lambda lines: csv_header_is(lines, *CURVE_COLUMNS), _read_curves,
)
NODES_FORMAT = TraceFormat(
    "bftrainer-nodes", "nodes", "BFTrainer node order (one node name per line)", _sniff_nodes, _read_nodes,
)
FORMATS = (IDLE_FORMAT, BOUNDS_FORMAT, CURVES_FORMAT, NODES_FORMAT)
