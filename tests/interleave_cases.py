"""Exhaustive references and candidate builders shared by the interleaving tests."""

from __future__ import annotations

import numpy as np

from hpcsched.interleave.grouping import Candidate
from hpcsched.primitives.speed import SOLO_FACTOR


def exhaustive_best(node_type: list[int], tw: np.ndarray) -> float:
    """Maximum matching weight by trying every matching (n <= 10)."""
    n = len(node_type)

    def best(free: tuple[int, ...]) -> float:
        if len(free) < 2:
            return 0.0
        first, rest = free[0], free[1:]
        value = best(rest)  # first stays unmatched
        for idx, other in enumerate(rest):
            w = tw[node_type[first], node_type[other]]
            if w > 0:
                value = max(value, w + best(rest[:idx] + rest[idx + 1 :]))
        return value

    return best(tuple(range(n)))


def cand(i: int, gpus: int, stages: tuple[float, float, float] | None, solo: float | None = None) -> Candidate:
    return Candidate(str(i), gpus, stages, (solo if solo is not None else sum(stages or (1.0,))) * SOLO_FACTOR)
