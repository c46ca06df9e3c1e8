"""Job completion time, percentiles, makespan and utilisation from a results table; JCT CDF plots.

Definitions are chosen for comparability with the peers:
- ``p99_jct`` is Muri's ``sorted(jct)[int(0.99 * n)]``; ``p99_jct_interp`` the interpolated one.
- ``makespan`` is the last end minus the first submit (``span`` is the same figure, kept under its old
  name), so it means the same for every trace; ``last_end`` and ``first_submit`` are the absolute times
  behind it. Muri's simulator reports its last end time as the makespan; on its traces (first submit
  0) the two agree, and ``hpcsched.report.published`` compares with Muri's definition where they do not.
  Before this, ``makespan`` was the last end time, which for a trace with calendar times (Philly, an
  idle log) is an epoch timestamp, not a duration.
- ``utilization`` is resource-seconds held / (capacity x span), GPUs if the run has GPUs, else nodes;
  a run whose capacity varies (harvesting) gives ``capacity_node_seconds`` in its metadata instead.

This module is the summary of a results table; beside it are the labels of runs shown side by side
(``labels``), the JCT CDF plot (``plot``), fairness and cost (``fairness``) and a controller run's pilot
figures (``pilots``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from hpcsched.results import JobResult

# numpy and pandas are imported only where a frame or a plot is handled: `hpcsched simulate` summarises its run
# from the job records (``summarize_results``) and must not pay for importing them (its start-up time is a target).

SUMMARY_KEYS = ("jobs", "avg_jct", "p50_jct", "p95_jct", "p99_jct", "makespan", "utilization")
# Facts a run records in meta.json that no jobs table can recompute (harvesting, preemption); shown as they are.
_META_PASSTHROUGH = ("policy", "trace", "cluster", "tool", "harvested_node_hours", "preemptions", "max_lost_steps")
# The jobs-table columns the summary reads.
_NUMERIC = ("submit", "start", "end", "gpus", "nodes", "gpu_seconds", "node_seconds")
_NAN = float("nan")


def muri_percentile(sorted_values: Sequence[float], q: float) -> float:
    """Muri's percentile: the element at index int(q * n) of the sorted values (clamped)."""
    n = len(sorted_values)
    return float(sorted_values[min(int(q * n), n - 1)])


def summarize(df: pd.DataFrame, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The summary every tool prints; keys in ``SUMMARY_KEYS`` are a contract.

    ``df`` is a jobs table (``hpcsched.results.read_results``). The figures are computed by the same code as
    ``summarize_results`` (job records, no pandas), so a run's summary is the same whichever way it is read.
    """
    cols = {}
    for c in _NUMERIC:
        if c in df.columns:
            values, missing = df[c].tolist(), df[c].isna().tolist()
            cols[c] = [_NAN if m else v for v, m in zip(values, missing, strict=True)]
    return _summarize(cols, len(df), meta or {})


def summarize_results(results: Iterable[JobResult], meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``summarize`` of the jobs table these records would make, without building it (or importing pandas).

    What ``hpcsched simulate`` prints; the same numbers, to the last bit, as ``summarize`` of the table read
    back from the files it writes.
    """
    rows = list(results)
    cols = {c: [_NAN if (v := getattr(r, c)) is None else v for r in rows] for c in _NUMERIC}
    return _summarize(cols, len(rows), meta or {})


def _summarize(cols: Mapping[str, list[Any]], n: int, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The summary of a jobs table given as columns (a missing value is NaN).

    Every figure is computed as numpy and pandas compute it (``_np_sum``'s summation order, numpy's median
    and linear percentile, pandas' NaN-skipping sums and means), not merely to the same precision: these
    numbers were printed and stored with pandas before, and a run's figures must not move by a last bit
    because the code that prints them no longer imports it.
    """
    submit, start, end = cols["submit"], cols["start"], cols["end"]
    done = [i for i in range(n) if end[i] == end[i]]
    jct = [float(end[i] - submit[i]) for i in done]
    out: dict[str, Any] = {"jobs": len(done), "unfinished": n - len(done)}
    if jct:
        jct = _np_sort(jct)
        nan = jct[-1] != jct[-1]  # numpy's median and percentile of data holding a NaN are NaN
        out |= {
            "avg_jct": _np_sum(jct) / len(jct),
            "p50_jct": _NAN if nan else _np_median(jct),
            "p95_jct": muri_percentile(jct, 0.95),
            "p99_jct": muri_percentile(jct, 0.99),
            "p99_jct_interp": _NAN if nan else np_percentile(jct, 99),
            "max_jct": jct[-1],
        }
    else:
        out |= {k: None for k in ("avg_jct", "p50_jct", "p95_jct", "p99_jct", "p99_jct_interp", "max_jct")}
    started = [i for i in range(n) if start[i] == start[i]]
    out["avg_queue"] = _nanmean([start[i] - submit[i] for i in started]) if started else None
    ends = [end[i] for i in done]
    last_end = float(max(ends)) if ends else None
    submits = [v for v in submit if v == v]
    first_submit = (float(min(submits)) if submits else _NAN) if n else None
    span = last_end - first_submit if last_end is not None and first_submit is not None else None
    out["makespan"] = span
    out["span"] = span
    out["first_submit"] = first_submit
    out["last_end"] = last_end
    out["utilization"] = _utilization(cols, n, meta, span)
    for k in _META_PASSTHROUGH:
        if k in meta:
            out[k] = meta[k]
    return out


def _utilization(cols: Mapping[str, list[Any]], n: int, meta: Mapping[str, Any], span: float | None) -> float | None:
    if meta.get("capacity_node_seconds"):
        return float(_nansum(cols.get("node_seconds", []))) / float(meta["capacity_node_seconds"])
    if not span:
        return None
    for held, cap, size in (("gpu_seconds", "capacity_gpus", "gpus"), ("node_seconds", "capacity_nodes", "nodes")):
        capacity = meta.get(cap)
        if capacity and held in cols and _nansum(cols[held]) > 0:
            return float(_nansum(cols[held])) / (float(capacity) * span)
        if capacity and size in cols and _nansum(cols[size]) > 0:  # no held-time column: assume start..end
            start, end, sizes = cols["start"], cols["end"], cols[size]
            held_s = [sizes[i] * (end[i] - start[i]) for i in range(n) if end[i] == end[i] and start[i] == start[i]]
            return float(_nansum(held_s)) / (float(capacity) * span)
    return None


def _np_sum(values: Sequence[Any]) -> Any:
    """``numpy.add.reduce`` of a float64 array, in numpy's own order (pairwise: blocks of up to 128 values
    summed in 8 interleaved partial sums, larger runs split in two at a multiple of 8), so that the result
    equals numpy's to the last bit; Python's left-to-right ``sum`` differs in the last digits."""
    return 0.0 + _pairwise(values, 0, len(values))


def _pairwise(a: Sequence[Any], lo: int, n: int) -> Any:
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= 128:
        r0, r1, r2, r3, r4, r5, r6, r7 = a[lo:lo + 8]
        stop = lo + n - n % 8
        for i in range(lo + 8, stop, 8):
            r0 += a[i]
            r1 += a[i + 1]
            r2 += a[i + 2]
            r3 += a[i + 3]
            r4 += a[i + 4]
            r5 += a[i + 5]
            r6 += a[i + 6]
            r7 += a[i + 7]
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for i in range(stop, lo + n):
            res += a[i]
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(a, lo, n2) + _pairwise(a, lo + n2, n - n2)


def _nansum(values: Sequence[Any]) -> Any:
    """pandas' ``Series.sum()``: NaNs replaced by 0 in place, then numpy's sum."""
    return _np_sum([0.0 if v != v else v for v in values])


def _nanmean(values: Sequence[Any]) -> float:
    """pandas' ``Series.mean()``: the NaN-skipping float64 sum (integers too) over the count of non-NaN values
    (NaN if none)."""
    count = sum(1 for v in values if v == v)
    return _np_sum([0.0 if v != v else float(v) for v in values]) / count if count else _NAN


def _np_sort(values: list[float]) -> list[float]:
    """``numpy.sort``: ascending, NaNs last."""
    nans = [v for v in values if v != v]
    return sorted(v for v in values if v == v) + nans if nans else sorted(values)


def _np_median(sorted_values: Sequence[float]) -> float:
    """``numpy.median`` of sorted values: the middle one, or numpy's mean of the middle two."""
    n = len(sorted_values)
    h = n // 2
    return _np_sum(sorted_values[h:h + 1]) / 1 if n % 2 else _np_sum(sorted_values[h - 1:h + 1]) / 2


def np_percentile(sorted_values: Sequence[float], q: float) -> float:
    """``numpy.percentile(values, q)`` (method 'linear') of sorted values, with numpy's interpolation."""
    n = len(sorted_values)
    virtual = (n - 1) * (q / 100)
    if virtual >= n - 1:
        return float(sorted_values[-1])
    below = math.floor(virtual)
    a, b = float(sorted_values[below]), float(sorted_values[below + 1])
    gamma = virtual - below
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


# The unit (and, where the name alone misleads, the definition) of each summary key, for tables.
METRIC_UNITS = {
    "jobs": "finished",
    "unfinished": "jobs",
    "avg_jct": "s",
    "p50_jct": "s",
    "p95_jct": "s, Muri's index",
    "p99_jct": "s, Muri's index",
    "p99_jct_interp": "s, interpolated",
    "max_jct": "s",
    "makespan": "s, from first submit",
    "span": "s, = makespan",
    "first_submit": "s, trace clock",
    "last_end": "s, trace clock",
    "avg_queue": "s",
    "utilization": "of capacity x span",
}
