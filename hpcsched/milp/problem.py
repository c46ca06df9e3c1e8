"""One harvesting decision: who holds what now, what the pool offers, and what a new size is worth.

Nodes in the idle pool are interchangeable, so the decision is a node COUNT per job; which node ids
a job gets is settled afterwards (``mapping``). Every solver, exact or heuristic, maximises the same
per-job value function ``JobValue.value(n)``, which is what makes their objectives comparable and
lets tests check any of them against brute force.

Two objectives (``Objective``):

- ``reference``: BFTrainer's, ``Tfwd * S(n) - (Tup*[n > c] + Tdw*[n < c]) * R`` with ``c`` the
  current count and ``R = S(c)`` its current rate (0 below Jmin). A job started from zero nodes pays
  nothing, and a job the batch scheduler just preempted pays again for any resize.
- ``window``: charges rescale time inside the look-ahead window: a resized job is stalled for its
  Tup/Tdw, so it earns ``max(Tfwd - T, 0) * S(n)``; starting from zero is a scale-up; a job already
  preempted at this event restarts anyway, so its restart is not charged twice.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

import numpy as np

from hpcsched.errors import InputError
from hpcsched.model import ElasticJob, ScalingCurve


class Objective(StrEnum):
    REFERENCE = "reference"
    WINDOW = "window"


@dataclass(frozen=True, slots=True)
class MilpJob:
    """An admitted elastic job at decision time.

    ``nodes`` are the nodes it holds now (after any preemption at this event); ``lost`` the nodes the
    batch scheduler took from it at this event: the mapping never hands those back to it.
    """

    job: ElasticJob
    nodes: Sequence[str] = ()  # a tuple, or the runs of a pool's indices (``mapping.NodeRuns``)
    lost: Collection[str] = frozenset()

    @property
    def count(self) -> int:
        return len(self.nodes)

    @property
    def preempted(self) -> bool:
        return bool(self.lost)

    @property
    def rate(self) -> float:
        """Samples/s at the current count; a job below its Jmin cannot run and makes no progress."""
        return job_rate(self.job, self.count)


@dataclass(frozen=True, slots=True)
class Problem:
    """Everything one decision needs. ``pool`` lists every node harvesting may use now, held or free."""

    jobs: tuple[MilpJob, ...]
    pool: tuple[str, ...]
    tfwd: float = 10.0
    objective: Objective = Objective.REFERENCE

    def __post_init__(self) -> None:
        if not (self.tfwd > 0 and math.isfinite(self.tfwd)):
            raise ValueError(f"Tfwd must be a finite number > 0, got {self.tfwd!r}")
        ids = [s.job.id for s in self.jobs]
        if len(set(ids)) != len(ids):
            raise ValueError("a job appears twice in the decision")
        pool = set(self.pool)
        if len(pool) != len(self.pool):
            raise ValueError("a node appears twice in the idle pool")
        seen: set[str] = set()
        for s in self.jobs:
            check_job(s.job)
            for n in s.nodes:
                if n in seen:
                    raise ValueError(f"node {n} is held by two jobs")
                if n not in pool:
                    raise ValueError(f"job {s.job.id} holds node {n}, which is not in the idle pool")
                seen.add(n)


def job_rate(job: ElasticJob, n: int) -> float:
    return job.curve.rate(n) if n >= job.jmin else 0.0


def check_job(job: ElasticJob, path: str | None = None, line: int | None = None) -> None:
    """Reject bounds and curves no allocation can be right for, naming the job (and file/line if known).

    ElasticJob and ScalingCurve check themselves on construction; this re-checks records built some
    other way (``object.__new__``, a subclass) so a solver never silently optimises nonsense.
    """
    c: ScalingCurve = job.curve
    problems = []
    if not (1 <= job.jmin <= job.jmax):
        problems.append(f"need 1 <= Jmin <= Jmax, got Jmin={job.jmin} Jmax={job.jmax}")
    if any(b <= a for a, b in zip(c.nodes, c.nodes[1:], strict=False)):
        problems.append(f"curve breakpoints must be strictly increasing, got {list(c.nodes)}")
    if any(not (r >= 0 and math.isfinite(r)) for r in c.rates):
        problems.append(f"curve rates must be finite and >= 0, got {list(c.rates)}")
    if job.scale_up_s < 0 or job.scale_down_s < 0:
        problems.append("rescale costs Tup/Tdw must be >= 0")
    if problems:
        msg = f"job {job.id}: " + "; ".join(problems)
        if path is not None:
            raise InputError(path, msg, line)
        raise ValueError(msg)


@dataclass(frozen=True)
class JobValue:
    """What each feasible count is worth to one job in one decision (samples over the window).

    ``value(n)`` is the plain scalar definition (tests brute-force against it); ``table`` is the same
    function for every n = 0..cap at once, which is what the solvers read.
    """

    state: MilpJob
    tfwd: float
    objective: Objective
    cap: int  # the most nodes this job could get: min(Jmax, pool size)

    @property
    def domain(self) -> range:
        """Feasible counts other than 0: Jmin..cap (empty if the pool cannot fit Jmin)."""
        return range(self.state.job.jmin, self.cap + 1)

    def value(self, n: int) -> float:
        s, job = self.state, self.state.job
        c = s.count
        if n != 0 and not (job.jmin <= n <= self.cap):
            return -math.inf
        rate = job_rate(job, n)
        if self.objective is Objective.REFERENCE:
            r = s.rate
            cost = job.scale_up_s * r if n > c else job.scale_down_s * r if n < c else 0.0
            return self.tfwd * rate - cost
        # window: a resize stalls the job for its Tup/Tdw; a preempted job is restarting anyway
        if n == 0:
            return 0.0
        if s.preempted:
            stall = job.scale_down_s
        else:
            stall = job.scale_up_s if n > c else job.scale_down_s if n < c else 0.0
        return max(self.tfwd - stall, 0.0) * rate

    @cached_property
    def table(self) -> np.ndarray:
        """``value(n)`` for n = 0..cap in one numpy pass; -inf for 0 < n < Jmin."""
        s, job = self.state, self.state.job
        ns = np.arange(self.cap + 1, dtype=float)
        xs, ys = np.asarray(job.curve.nodes, dtype=float), np.asarray(job.curve.rates, dtype=float)
        rate = np.interp(ns, xs, ys)  # clamps to the last rate beyond the last breakpoint, like rate()
        rate[(ns < xs[0]) | (ns < job.jmin)] = 0.0
        c = s.count
        up, down = ns > c, ns < c
        if self.objective is Objective.REFERENCE:
            r = s.rate
            out = self.tfwd * rate - np.where(up, job.scale_up_s * r, np.where(down, job.scale_down_s * r, 0.0))
        else:
            if s.preempted:
                stall = np.full(len(ns), float(job.scale_down_s))
            else:
                stall = np.where(up, job.scale_up_s, np.where(down, job.scale_down_s, 0.0))
            out = np.maximum(self.tfwd - stall, 0.0) * rate
            out[0] = 0.0
        out[1:job.jmin] = -np.inf
        return out

    def breakpoints(self) -> list[int]:
        """Counts in Jmin..cap where the value may stop being affine: around curve breakpoints and c."""
        job, c = self.state.job, self.state.count
        lo, hi = job.jmin, self.cap
        pts = {lo, hi, c - 1, c, c + 1}
        for x in job.curve.nodes:
            f = math.floor(x)
            pts.update((f - 1, f, f + 1, f + 2))
        return sorted(p for p in pts if lo <= p <= hi)


def job_values(problem: Problem) -> list[JobValue]:
    size = len(problem.pool)
    return [JobValue(s, problem.tfwd, problem.objective, min(s.job.jmax, size)) for s in problem.jobs]


def objective_value(values: Sequence[JobValue], counts: Sequence[int]) -> float:
    """The objective of a count vector, evaluated directly (no solver): the ground truth for tests."""
    return sum(v.value(n) for v, n in zip(values, counts, strict=True))
