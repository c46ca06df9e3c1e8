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
as Pollux starts a job at its base batch; the choice always says which (``BatchDecision.how``).
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
class BatchDecision:
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
    # the last step-time fit as (what it was fitted to, PerfParams); replaced whole, so a reader on another thread
    # sees an old fit or the new one, never half of one
    perf: tuple[tuple[object, ...], Any] | None = field(default=None, repr=False)

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

    def fit_points(self) -> tuple[tuple[object, ...], list[tuple[int, float, float, float]]]:
        """(key, points) of the step-time fit this fit calls for: one mean point (processes, per-process batch,
        compute s, step s) per configuration seen. The key changes when a configuration is new or the
        observations have doubled: only then is a new fit worth its cost (0.2-5 s on this 2-core machine at load
        20: never under the controller's lock, see ``BatchTracker``)."""
        configs: dict[tuple[int, float], list[tuple[float, float]]] = {}
        for r, b, c, st in list(self.steps):  # a copy: the controller may append while the fitter thread reads
            configs.setdefault((r, round(b, 6)), []).append((c, st))
        key = (tuple(sorted(configs)), len(self.steps).bit_length())
        pts = [(r, b, sum(c for c, _ in v) / len(v), sum(st for _, st in v) / len(v))
               for (r, b), v in sorted(configs.items())]
        return key, pts

    def stale(self) -> bool:
        """Whether there are step times and no fit of what they now call for."""
        return bool(self.steps) and (self.perf is None or self.perf[0] != self.fit_points()[0])

    def refit(self) -> None:
        """Fit Pollux's step-time model now (``hpcsched.goodput.fit_perf_params``; ImportError without scipy)."""
        key, pts = self.fit_points()
        self.perf = (key, fit_points_perf(pts))

    def noise_scale(self) -> float | None:
        """The gradient noise scale var / |G|^2 (samples): the batch beyond which larger batches pay off less."""
        g = self.grad()
        return None if g is None else g[1] / g[0]


def fit_points_perf(pts: list[tuple[int, float, float, float]]) -> Any:
    """Pollux's step-time model fitted to (processes, per-process batch, compute s, step s) points, all on one node
    (the controller does not tell the model which processes share a node)."""
    from hpcsched.goodput import fit_perf_params

    return fit_perf_params([1] * len(pts), [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts],
                           [p[3] for p in pts])


def _function(spec: BatchSpec, fit: BatchFit | None, block: bool = True) -> tuple[Any, str]:
    """Pollux's goodput function for the job as fitted, or (None, why not). ``block``: fit the step times now if
    they have no fit of what they call for (else use the last fit, or none: the caller is the controller, which
    fits beside its lock)."""
    g = fit.grad() if fit is not None else None
    if fit is None or g is None:
        return None, "no statistics yet"
    if not fit.steps:
        return None, "no step times yet"
    try:
        from hpcsched.goodput import GoodputFunction, GradParams
    except ImportError:  # the goodput extra (scipy) is missing
        return None, "no scipy (goodput extra)"
    if fit.perf is None:
        if not block:
            return None, "step-time fit not ready"
        try:
            fit.refit()
        except ImportError:
            return None, "no scipy (goodput extra)"
    elif block and fit.stale():
        fit.refit()
    assert fit.perf is not None
    perf = fit.perf[1]
    # GradParams' variance is that of a base-batch gradient: the per-sample variance / B0
    return GoodputFunction(perf, GradParams(g[0], g[1] / spec.base), spec.base), "goodput"


def _best(spec: BatchSpec, fn: Any, procs: int) -> BatchDecision:
    """The goodput-best batch at ``procs`` among whole per-process batches in ``spec.bounds(procs)``."""
    import numpy as np

    lo, hi = spec.bounds(procs)
    lo_pp, hi_pp = max(1, math.ceil(lo / procs)), max(1, hi // procs)
    per = np.arange(lo_pp, max(lo_pp, hi_pp) + 1, max(1, (hi_pp - lo_pp) // 256))
    # below B0 only when B0 does not fit the processes (``bounds``): counted at B0's efficiency, 1
    good = fn.throughput(1, procs, per, 0) * fn.efficiency(np.maximum(per * procs, spec.base))
    k = int(np.argmax(good))
    return BatchDecision(int(per[k] * procs), "goodput", float(good[k]))


def choose_batch(spec: BatchSpec, fit: BatchFit | None, procs: int, block: bool = True) -> BatchDecision:
    """The global batch for an attempt at ``procs`` processes: the goodput-best in ``spec.bounds(procs)`` (a whole
    number of samples per process) once fitted, else the smallest there (and why). ``block`` as ``_function``."""
    fn, how = _function(spec, fit, block)
    if fn is None:
        return BatchDecision(spec.bounds(procs)[0], how)
    return _best(spec, fn, procs)


def goodput_curve(spec: BatchSpec, fit: BatchFit | None, sizes: range,
                  block: bool = True) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(sizes, goodput at each size's best batch): the job's value curve for the MILP, or ((), ()) before a fit.
    ``block`` as ``_function``."""
    fn, _ = _function(spec, fit, block)
    if fn is None or not sizes:
        return (), ()
    return tuple(sizes), tuple(float(_best(spec, fn, n).goodput or 0.0) for n in sizes)
