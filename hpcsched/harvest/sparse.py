"""Sparse logs: long stretches in which no job of a batch log runs.

A log of a few jobs spread over years replays as a machine idle for years; every figure averaged
over its span (utilisation above all) then measures the holes, so the replay says so.
"""

from __future__ import annotations

import numpy as np

EMPTY_GAP_S = 7 * 86400.0  # a week with no log job running is a hole in the log, not a quiet spell
EMPTY_SHARE = 0.2  # holes covering this share of the replayed span make the log sparse


def empty_stretches(times: np.ndarray, level: np.ndarray, a: float, b: float) -> dict[str, float] | None:
    """Week-long stretches in [a, b] with no log job running, when they cover ``EMPTY_SHARE`` of it: a
    sparse log (a few jobs over years) replays as a machine idle for years, and a utilisation over that
    measures the holes. None when there are none worth a note."""
    if len(times) < 2 or b <= a:
        return None
    edges = np.clip(np.r_[times, b], a, b)
    dur = np.diff(edges)
    holes = dur[(level <= 0) & (dur >= EMPTY_GAP_S)]
    head = min(float(times[0]), b) - a  # before the first mark nothing runs
    if head >= EMPTY_GAP_S:
        holes = np.r_[holes, head]
    if not len(holes) or holes.sum() < EMPTY_SHARE * (b - a):
        return None
    return {"stretches": int(len(holes)), "empty_days": float(holes.sum() / 86400), "span_days": (b - a) / 86400,
            "longest_days": float(holes.max() / 86400)}
