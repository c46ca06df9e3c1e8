"""Group slowdown factors measured on the testbed: how much slower than its ideal pipeline a group really runs.

The simulator runs an interleaved group of k jobs at ``raw pipeline period x group_factor(k)``
(``hpcsched.interleave.period``, ``hpcsched.primitives.speed``): the period of the members' best stage
ordering, times a slowdown Muri measured on its GPUs (1.33, 1.5, 1.37 over its 1.015 solo factor). Nothing
says that slowdown holds for other hardware, or for CPU workloads whose stages contend for the same cores.
So it is fitted from the run itself: for every report window in which a job ran interleaved with k - 1
group mates that were training on the same slots (``measure``: a mate still starting takes no turn and does
not count), the ratio of its measured pace to the raw pipeline period of the members' stage profiles as the
measured simulation has them (each member's solo stage split, scaled to sum to its solo iteration time,
``feedback.measured_jobs``); ``factor_k`` is the median ratio over those windows. The median, not a
time-weighted mean: a window that stalls (a checkpoint, a mate's first steps) would pull a mean, and
windows are equal in steps (one report every N steps), so the median is the typical step's.

A size seen in fewer than ``MIN_WINDOWS`` windows keeps the simulator's default factor: a median of a
handful of windows is one group's first moments, not a property of the size. ``group-factors.csv`` still
reports it (``source = default``, its windows and their median), so the fallback is visible.

What the fit delivers, in sample: the simulation's assumed pace of each such window (period x factor)
matches the measured one for the median window (``compare.group_rows``' per-window error is ~0 for a fitted
size). It does not make the median of the simulated paces equal the median of the measured ones over
windows of different groups (medians of different windows), nor does it say that another run's groups of
that size run at the same factor (the ratios differ from group to group: the spread is in the file).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcsched.errors import InputError
from hpcsched.interleave.period import pipeline_periods
from hpcsched.model import ResourceProfile
from hpcsched.primitives.speed import SOLO_FACTOR, group_factor
from hpcsched.testbed.measure import Measured

FILE = "group-factors.csv"  # in OUT/profile/


MIN_WINDOWS = 10  # fewer windows of a size: the default factor is used (reported as such)


@dataclass(frozen=True)
class GroupFactor:
    k: int  # members
    factor: float  # the factor the simulations use: the median below, or the default (source "default")
    windows: int  # report windows the median is over
    median: float = 0.0  # median measured pace / raw pipeline period over those windows
    q25: float = 0.0  # quartiles of the per-window ratios: how much groups of this size differ
    q75: float = 0.0
    groups: int = 0  # distinct member sets the windows come from
    source: str = "fit"  # "fit", or "default" when windows < MIN_WINDOWS


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


def window_ratios(by_runtime_id: Mapping[str, Measured]) -> dict[int, list[tuple[tuple[str, ...], float]]]:
    """Per group size (2 and up), each window's (members, pace / raw pipeline period), for the windows whose
    every member was measured: what the fit takes the median of, kept apart so tests and reports can see the
    spread behind a factor."""
    stages = {jid: solo_stages(m) for jid, m in by_runtime_id.items()}
    out: dict[int, list[tuple[tuple[str, ...], float]]] = {}
    periods: dict[tuple[str, ...], float] = {}
    for m in by_runtime_id.values():
        for w in m.windows:
            k = w.group_size
            if k < 2 or any(stages.get(j) is None for j in w.members):
                continue
            if w.members not in periods:
                periods[w.members] = raw_period([stages[j].stages() for j in w.members])
            if periods[w.members] > 0:
                out.setdefault(k, []).append((w.members, w.pace / periods[w.members]))
    return out


def fit_group_factors(by_runtime_id: Mapping[str, Measured], min_windows: int = MIN_WINDOWS) -> list[GroupFactor]:
    """One factor per group size (2 and up) that occurred: the median ratio where at least ``min_windows``
    windows back it, else the simulator's default (module docstring)."""
    fits = []
    for k, rs in sorted(window_ratios(by_runtime_id).items()):
        r = [x for _, x in rs]
        q25, med, q75 = (float(q) for q in np.quantile(r, [0.25, 0.5, 0.75]))
        fitted = len(r) >= min_windows
        fits.append(GroupFactor(k, med if fitted else group_factor(k), len(r), med, q25, q75,
                                len({m for m, _ in rs}), "fit" if fitted else "default"))
    return fits


COLUMNS = ("k", "factor", "windows", "median", "q25", "q75", "groups", "source")


def write_group_factors(path: Path, fits: list[GroupFactor]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for g in fits:
            w.writerow((g.k, f"{g.factor:.6f}", g.windows, f"{g.median:.6f}", f"{g.q25:.6f}", f"{g.q75:.6f}",
                        g.groups, g.source))
    return path


def read_group_fits(path: Path) -> list[GroupFactor]:
    """Every row of a ``group-factors.csv``, fallbacks included; [] when the file is absent (no group ran).
    Files written before the fallback (columns k, factor, windows only) read as fits."""
    if not path.is_file():
        return []
    out: list[GroupFactor] = []
    with open(path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                k, factor = int(row["k"]), float(row["factor"])
                windows = int(row.get("windows") or 0)
                median, q25, q75 = (float(row.get(c) or factor) for c in ("median", "q25", "q75"))
                groups = int(row.get("groups") or 0)
            except (KeyError, TypeError, ValueError):
                raise InputError(path, "expected columns k (an integer) and factor (a number)", line) from None
            source = (row.get("source") or "fit").strip()
            if k < 2 or not factor > 0:
                raise InputError(path, f"k must be >= 2 and factor > 0, got k={k}, factor={factor}", line)
            if source not in ("fit", "default"):
                raise InputError(path, f"source must be fit or default, got {source!r}", line)
            out.append(GroupFactor(k, factor, windows, median, q25, q75, groups, source))
    return out


def read_group_factors(path: Path) -> dict[int, float]:
    """{k: factor} of the sizes fitted in that run (a size that fell back to the default is left out, so a
    simulation reading it keeps its own default); {} when the file is absent (no group ran in that run)."""
    return {g.k: g.factor for g in read_group_fits(path) if g.source == "fit"}
