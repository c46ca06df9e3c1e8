"""Group slowdown factors measured on the testbed: how much slower than its ideal pipeline a group really runs.

The simulator runs an interleaved group of k jobs at ``raw pipeline period x group_factor(k)``
(``hpcsched.interleave.period``, ``hpcsched.sim.semantics``): the period of the members' best stage
ordering, times a slowdown Muri measured on its GPUs (1.33, 1.5, 1.37 over its 1.015 solo factor). Nothing
says that slowdown holds for other hardware, or for CPU workloads whose stages contend for the same cores.
So it is fitted from the run itself: for every report window in which a job ran interleaved with k - 1 live
group mates on the same slots, the ratio of its measured pace to the raw pipeline period of the members'
stage profiles as the measured simulation has them (each member's solo stage split, scaled to sum to its
solo iteration time, ``feedback.measured_jobs``); ``factor_k`` is the median ratio over those windows. A
simulation using these factors runs such a group at the pace measured, so what is left of the error is
the schedule's, not the speed model's.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcsched.errors import InputError
from hpcsched.interleave.period import pipeline_periods
from hpcsched.model import ResourceProfile
from hpcsched.sim.semantics import SOLO_FACTOR
from hpcsched.testbed.measure import Measured

FILE = "group-factors.csv"  # in OUT/profile/


@dataclass(frozen=True)
class GroupFactor:
    k: int  # members
    factor: float  # median measured pace / raw pipeline period
    windows: int  # report windows it is the median of


def solo_stages(m: Measured) -> ResourceProfile | None:
    """The stage profile the measured simulation gives the job (real seconds): its solo split at its solo
    iteration time (pace / 1.015, so that the simulated solo speed is the measured one)."""
    pace, prof = m.solo_pace(), m.profile()
    if pace is None or prof is None or prof.total_s <= 0:
        return None
    return prof.scaled_to(pace / SOLO_FACTOR)


def raw_period(stages: list[tuple[float, float, float]]) -> float:
    """The pipeline period of a group of any size: the controller now caps a co-located group at 4, but runs
    recorded before the cap hold larger ones, and the pipeline model times k > 4 with k slots."""
    return float(pipeline_periods(np.asarray([stages], dtype=float))[0][0])


def fit_group_factors(by_runtime_id: Mapping[str, Measured]) -> list[GroupFactor]:
    """One factor per group size (2 and up) that occurred, from the windows whose every member was measured."""
    stages = {jid: solo_stages(m) for jid, m in by_runtime_id.items()}
    ratios: dict[int, list[float]] = {}
    periods: dict[tuple[str, ...], float] = {}
    for m in by_runtime_id.values():
        for w in m.windows:
            k = w.group_size
            if k < 2 or any(stages.get(j) is None for j in w.members):
                continue
            if w.members not in periods:
                periods[w.members] = raw_period([stages[j].stages() for j in w.members])
            if periods[w.members] > 0:
                ratios.setdefault(k, []).append(w.pace / periods[w.members])
    return [GroupFactor(k, statistics.median(r), len(r)) for k, r in sorted(ratios.items())]


def write_group_factors(path: Path, fits: list[GroupFactor]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("k", "factor", "windows"))
        for g in fits:
            w.writerow((g.k, f"{g.factor:.6f}", g.windows))
    return path


def read_group_factors(path: Path) -> dict[int, float]:
    """{k: factor} from a ``group-factors.csv``; {} when the file is absent (no group ran in that run)."""
    if not path.is_file():
        return {}
    out: dict[int, float] = {}
    with open(path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                k, factor = int(row["k"]), float(row["factor"])
            except (KeyError, TypeError, ValueError):
                raise InputError(path, "expected columns k (an integer) and factor (a number)", line) from None
            if k < 2 or not factor > 0:
                raise InputError(path, f"k must be >= 2 and factor > 0, got k={k}, factor={factor}", line)
            out[k] = factor
    return out
