"""What a job log's rows and its first hours say about a replay built from it: rows dropped or flagged by the
reader, and a warm-up (a machine filling up at the start of its log) that would count as idle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# Reader anomaly kinds that drop the row; every other kind flags a row that is kept (hpcsched.traces.base).
DROPPING_KINDS = frozenset({"malformed_row", "duplicate_job"})
_FLAG_MEANING = {
    "unsorted_submit": "submitted before a row above it; order does not matter here",
    "runtime_over_request": "ran longer than it requested",
    "unknown_field": "a field is unknown (-1/empty); a job without start, end or size is not replayed",
    "zero_runtime": "ran 0 s",
    "negative_runtime": "end before start: its run time became unknown, so it is not replayed",
    "duplicate_id": "repeated id, renamed id#n",
    "larger_than_machine": "larger than the machine the reader assumed",
    "censored": "no end at the log's end",
}
WARMUP_RATIO = 0.75  # a start window whose mean use is below this share of the typical use is a warm-up
WARMUP_MIN_S = 3600.0  # shorter low-use stretches at the start are not worth a warning


def split_rows(anomalies: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(dropped, flagged-but-kept) row counts by anomaly kind, from a reader's anomaly counts, most first."""
    ordered = sorted(anomalies.items(), key=lambda kn: (-kn[1], kn[0]))  # most first: not the reader's order
    dropped = {k: int(n) for k, n in ordered if k in DROPPING_KINDS and n}
    flagged = {k: int(n) for k, n in ordered if k not in DROPPING_KINDS and n}
    return dropped, flagged


def describe_rows(records: int, anomalies: Mapping[str, int]) -> str:
    """One sentence that keeps dropped rows and flagged-but-kept rows apart (a flag drops nothing).

    'skipped/flagged rows {'unsorted_submit': 9812}' read as if 9,812 rows were lost; this says
    '14,374 jobs read, 0 rows dropped; kept but flagged: 9,812 unsorted_submit (submitted before ...)'.
    """
    dropped, flagged = split_rows(anomalies)
    text = f"{records:,} jobs read; rows dropped: "
    text += ", ".join(f"{n:,} {k} ({'a second record of one job' if k == 'duplicate_job' else 'unparsable'})"
                      for k, n in dropped.items()) if dropped else "none"
    if flagged:
        text += "; kept but flagged (nothing dropped): " + ", ".join(
            f"{n:,} {k} ({_FLAG_MEANING.get(k, 'see hpcsched trace inspect')})" for k, n in flagged.items())
    return text


def busy_steps(times: Sequence[float], deltas: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Busy nodes as a step function from (time, -1 busy / +1 idle) marks: ``level[k]`` holds from
    ``times[k]`` to ``times[k + 1]``; nothing is busy before the first mark."""
    t = np.asarray(times, dtype=float)
    if len(t) == 0:
        return t, np.zeros(0, dtype=np.int64)
    o = np.argsort(t, kind="stable")
    t, level = t[o], np.cumsum(-np.asarray(deltas, dtype=np.int64)[o])
    last = np.r_[t[1:] != t[:-1], True]  # one value per instant: the level after all of its changes
    return t[last], level[last]


def _integral(times: np.ndarray, level: np.ndarray, a: float, b: float) -> float:
    """Integral of the step function over [a, b] (0 before the first step)."""
    if b <= a or len(times) == 0:
        return 0.0
    edges = np.clip(np.r_[times, max(b, times[-1])], a, b)
    return float((level * np.diff(edges)).sum())


def warmup_check(times: np.ndarray, level: np.ndarray, start: float) -> dict[str, object]:
    """Does the replay start on a machine far emptier than the log's typical use?

    A log cut out of a longer history lacks the jobs already running when it begins, so its first
    hours show the machine nearly empty and a replay counts them as a huge idle window. The typical
    use is the time-weighted median of busy nodes over the whole log; the warm-up lasts from
    ``start`` until use first reaches it. It is reported (``detected``) when it lasts at least
    ``WARMUP_MIN_S`` and its mean use is below ``WARMUP_RATIO`` of the typical use.
    """
    if len(times) < 2:
        return {"detected": False, "typical_busy_nodes": 0.0, "warmup_end": start, "warmup_hours": 0.0,
                "warmup_mean_busy_nodes": 0.0}
    dur, lv = np.diff(times), level[:-1]
    order = np.argsort(lv, kind="stable")
    cum = np.cumsum(dur[order])
    typical = float(lv[order][min(int(np.searchsorted(cum, cum[-1] / 2)), len(order) - 1)])
    k = int(np.searchsorted(times, start, side="right")) - 1
    if k >= 0 and level[k] >= typical:
        end = start
    else:
        later = np.flatnonzero((times > start) & (level >= typical))
        end = float(times[later[0]]) if len(later) else float(times[-1])
    mean = _integral(times, level, start, end) / (end - start) if end > start else float(level[max(k, 0)])
    detected = end - start >= WARMUP_MIN_S and mean < WARMUP_RATIO * typical
    return {"detected": bool(detected), "typical_busy_nodes": typical, "warmup_end": end,
            "warmup_hours": (end - start) / 3600.0, "warmup_mean_busy_nodes": mean}


