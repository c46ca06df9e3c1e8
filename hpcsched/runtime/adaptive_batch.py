"""Adaptive batch size for elastic jobs (Pollux's idea, in the live runtime): what the job file declares, what the
controller learns from the job's reports, and the global batch it gives each attempt.

A job file's ``batch: {base: 64, max: 1024, min_per_proc: 16, max_per_proc: 256, lr_scaling: sqrt}`` says the job
was tuned at global batch ``base`` (B0) and can train at any batch up to ``max``, each process holding between
``min_per_proc`` and ``max_per_proc`` samples (memory). Each attempt is told its global batch and the learning-rate
rule (``LaunchTask.batch_size`` / ``lr_scaling``, and HPCSCHED_BATCH_SIZE, HPCSCHED_BASE_BATCH,
HPCSCHED_LR_SCALING in its environment); the program scales its rate itself (workloads/adaptive_train.py).

The program reports its gradient statistics with its progress (``Progress.grad_sqr``: |G|^2, ``grad_var``: the
per-sample variance tr(Sigma)) and the batch and step times they were measured at. ``BatchFit`` keeps them: running
averages of the statistics (the gradient noise scale is var / sqr) and the step times, to which Pollux's step-time
model (``hpcsched.goodput.fit_perf_params``) is fitted. With both, ``choose_batch`` gives each size the batch that
maximises goodput (``hpcsched.goodput.GoodputFunction``), and ``goodput_curve`` is what the MILP sizes the job by.
Before the first statistics (or without scipy, which the fit needs) a size gets the smallest batch allowed there,
as Pollux starts a job at its base batch; the choice always says which (``BatchChoice.how``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

LR_RULES = ("linear", "sqrt", "adascale", "none")
BATCH_KEYS = ("base", "max", "min_per_proc", "max_per_proc", "lr_scaling")
MAX_BATCH = 1 << 24
EMA = 0.7  # weight of the past in the per-report running averages (a report already averages several steps)
OBSERVATIONS = 64  # step-time observations kept per job (the most recent): enough to fit 7 parameters, bounded


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """The job file's ``batch:`` (module docstring)."""

    base: int
    max: int
    min_per_proc: int = 1
    max_per_proc: int = MAX_BATCH
    lr_scaling: str = "sqrt"

    def bounds(self, procs: int) -> tuple[int, int]:
        """The global batch range at ``procs`` processes: at least B0 and ``min_per_proc`` each, at most ``max``
        and ``max_per_proc`` each; when those cross (B0 does not fit in the processes' memory), the most that
        fits, both ways."""
        hi = min(self.max, procs * self.max_per_proc)
        lo = max(self.base, procs * self.min_per_proc)
        return (hi, hi) if lo > hi else (lo, hi)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"base": self.base, "max": self.max}
        if self.min_per_proc != 1:
            out["min_per_proc"] = self.min_per_proc
        if self.max_per_proc != MAX_BATCH:
            out["max_per_proc"] = self.max_per_proc
        out["lr_scaling"] = self.lr_scaling
        return out


def parse_batch(value: object) -> BatchSpec:
    """A ``batch:`` value as the job file wrote it; ValueError says what is wrong (the caller adds file:line)."""
    if not isinstance(value, dict) or "base" not in value or set(value) - set(BATCH_KEYS):
        raise ValueError("expected {base: B0, max: largest batch, min_per_proc: n, max_per_proc: n, "
                         f"lr_scaling: {'|'.join(LR_RULES)}}} (base required)")
    nums = {}
    for k in ("base", "max", "min_per_proc", "max_per_proc"):
        if k in value:
            v = value[k]
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_BATCH:
                raise ValueError(f"{k} must be a whole number from 1 to {MAX_BATCH}, got {v!r}")
            nums[k] = v
    rule = value.get("lr_scaling", "sqrt")
    if rule not in LR_RULES:
        raise ValueError(f"lr_scaling must be one of {', '.join(LR_RULES)}, got {rule!r}")
    base = nums["base"]
    top = nums.get("max", base)
    if top < base:
        raise ValueError(f"max ({top}) is below base ({base})")
    lo, hi = nums.get("min_per_proc", 1), nums.get("max_per_proc", MAX_BATCH)
    if lo > hi:
        raise ValueError(f"min_per_proc ({lo}) is above max_per_proc ({hi})")
    return BatchSpec(base, top, lo, hi, rule)


@dataclass(frozen=True, slots=True)
class BatchChoice:
    batch: int
    how: str  # "goodput" (fitted), or why not: "no statistics yet", "no scipy (goodput extra)", ...
    goodput: float | None = None  # predicted useful samples/s (goodput) at that batch, when fitted


@dataclass
class BatchFit:
    """What the controller has learnt of one adaptive job from its reports (module docstring)."""

    sqr: float = 0.0
    var: float = 0.0
    weight: float = 0.0  # bias correction of the running averages (1 - EMA^reports)
    reports: int = 0
    # (replicas, per-process batch, compute seconds, step seconds) of recent reports
    steps: deque[tuple[int, float, float, float]] = field(default_factory=lambda: deque(maxlen=OBSERVATIONS))

    def add(self, batch_size: int, world_size: int, grad_sqr: float, grad_var: float, compute_s: float,
            step_s: float) -> bool:
        """One report's figures; False (nothing kept) for a report without them (a first report, a program that
        measures none, or non-finite values)."""
        if batch_size <= 0 or world_size <= 0 or not all(map(math.isfinite, (grad_sqr, grad_var, compute_s, step_s))):
            return False
        if grad_sqr == 0.0 and grad_var == 0.0:
            return False
        self.sqr = EMA * self.sqr + (1 - EMA) * grad_sqr
        self.var = EMA * self.var + (1 - EMA) * grad_var
        self.weight = EMA * self.weight + (1 - EMA)
        self.reports += 1
        if compute_s > 0 and step_s >= compute_s:
            self.steps.append((world_size, batch_size / world_size, compute_s, step_s))
        return True

    def grad(self) -> tuple[float, float] | None:
        """(|G|^2, per-sample variance), bias-corrected; None before any report or while |G|^2 is not positive
        (noise can make the unbiased estimate negative: the noise scale is then unknown, not infinite)."""
        if self.reports == 0:
            return None
        sqr, var = self.sqr / self.weight, self.var / self.weight
        return (sqr, var) if sqr > 0 and var >= 0 else None

    def noise_scale(self) -> float | None:
        """The gradient noise scale var / |G|^2 (samples): the batch beyond which larger batches pay off less."""
        g = self.grad()
        return None if g is None else g[1] / g[0]


def _function(spec: BatchSpec, fit: BatchFit | None) -> tuple[Any, str]:
    """Pollux's goodput function for the job as fitted, or (None, why not)."""
    g = fit.grad() if fit is not None else None
    if fit is None or g is None:
        return None, "no statistics yet"
    if not fit.steps:
        return None, "no step times yet"
    try:
        from hpcsched.goodput import GoodputFunction, GradParams, fit_perf_params

        reps = [r for r, _, _, _ in fit.steps]
        perf = fit_perf_params([1] * len(reps), reps, [b for _, b, _, _ in fit.steps],
                               [c for _, _, c, _ in fit.steps], [s for _, _, _, s in fit.steps])
    except ImportError:  # the goodput extra (scipy) is missing
        return None, "no scipy (goodput extra)"
    # GradParams' variance is that of a base-batch gradient: the per-sample variance / B0
    return GoodputFunction(perf, GradParams(g[0], g[1] / spec.base), spec.base), "goodput"


def _best(spec: BatchSpec, fn: Any, procs: int) -> BatchChoice:
    """The goodput-best batch at ``procs`` among whole per-process batches in ``spec.bounds(procs)``."""
    import numpy as np

    lo, hi = spec.bounds(procs)
    lo_pp, hi_pp = max(1, math.ceil(lo / procs)), max(1, hi // procs)
    per = np.arange(lo_pp, max(lo_pp, hi_pp) + 1, max(1, (hi_pp - lo_pp) // 256))
    # below B0 only when B0 does not fit the processes (``bounds``): counted at B0's efficiency, 1
    good = fn.throughput(1, procs, per, 0) * fn.efficiency(np.maximum(per * procs, spec.base))
    k = int(np.argmax(good))
    return BatchChoice(int(per[k] * procs), "goodput", float(good[k]))


def choose_batch(spec: BatchSpec, fit: BatchFit | None, procs: int) -> BatchChoice:
    """The global batch for an attempt at ``procs`` processes: the goodput-best in ``spec.bounds(procs)`` (a whole
    number of samples per process) once fitted, else the smallest there (and why)."""
    fn, how = _function(spec, fit)
    if fn is None:
        return BatchChoice(spec.bounds(procs)[0], how)
    return _best(spec, fn, procs)


def goodput_curve(spec: BatchSpec, fit: BatchFit | None, sizes: range) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(sizes, goodput at each size's best batch): the job's value curve for the MILP, or ((), ()) before a fit."""
    fn, _ = _function(spec, fit)
    if fn is None or not sizes:
        return (), ()
    return tuple(sizes), tuple(float(_best(spec, fn, n).goodput or 0.0) for n in sizes)
