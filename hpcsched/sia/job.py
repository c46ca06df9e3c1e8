"""One training job in the Sia artifact's simulator: its progress, its restarts and what its agent learns.

A job runs on one GPU type at a time with a placement (GPUs per node). Each round it first sits out the
rest of its checkpoint-restore pause (GPUs held, no progress), then trains: progress accrues at
``gain / iteration time x calibration`` per second, where the gain is the statistical efficiency of its
global batch at the current epoch; an epoch ends when progress reaches the epoch's threshold. As it runs
it records each (nodes, GPUs, per-GPU batch) -> step time it sees on that GPU type and refits that type's
throughput model, and (when batch-size tuning is on: Sia) re-picks its batch size by goodput after every
stretch of training. A change of placement restarts it (the application's rescale time); moving to
another GPU type is a migration, which also restarts it.

A heterogeneity-unaware job (``unaware``: how the Sia artifact runs its Pollux baseline) keeps one set of
observations and one model for all GPU types, as Pollux's agent does: it does not know which type it ran on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hpcsched.sia.goodput import PerfParams, SiaGoodput, fit_perf_params
from hpcsched.sia.profiles import SLOWDOWNS, AppProfile

UNAWARE = "*"
"""The model key of a heterogeneity-unaware job: every GPU type's observations under one key."""
CALIBRATION_TYPE = "rtx"
"""The GPU type whose rescale time a job keeps as its nominal one (the artifact's ``calibrate_cluster``)."""


@dataclass
class SiaJob:
    """State of one job; ``apps`` maps each GPU type to the application's profile there."""

    name: str
    app: str
    submission_time: float
    apps: dict[str, AppProfile]
    target_num_replicas: int
    target_batch_size: int
    tune_bsz: bool = True
    fit_models: bool = True  # False: observations are not fitted (a policy that never reads the model)
    unaware: bool = False  # one model for all GPU types (Pollux's agent), not one per type (Sia's)
    profiles: dict[str, dict[tuple, tuple[float, float]]] = field(default_factory=dict)
    perf_params: dict[str, PerfParams | None] = field(default_factory=dict)
    grad_params: tuple[float, float] | None = None
    atomic_bsz: int = 0
    accum_steps: int = 0
    progress: float = 0.0
    epoch: int = 0
    completion_time: float | None = None
    current_time: float = 0.0
    rescale_time: float = 0.0
    placement: tuple[int, ...] = ()
    attained_service: float = 0.0
    num_restarts: int | None = None
    current_cluster: str | None = None
    contention: list[int] = field(default_factory=list)
    fits: int = 0
    fit_reuses: int = 0
    fit_cache: dict[tuple, PerfParams] | None = None  # shared by a run's jobs: the same observations, one fit
    gpu_seconds: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for t in (UNAWARE,) if self.unaware else self.apps:
            self.profiles.setdefault(t, {})
            self.perf_params.setdefault(t, None)
        self.calibration = 1.0 / SLOWDOWNS.get(self.app, 1.0)
        ref = self.apps.get(CALIBRATION_TYPE) or next(iter(self.apps.values()))
        self.completion_epoch = ref.max_epochs - 1

    # ---- the agent's model -----------------------------------------------------------------------------
    def on(self) -> str:
        """The GPU type the job is on (only called while it holds GPUs)."""
        if self.current_cluster is None:
            raise RuntimeError(f"{self.name}: not on any GPU type")
        return self.current_cluster

    def model_key(self, gpu_type: str) -> str:
        """Where the model of ``gpu_type`` is kept: that type's own, or the one of an unaware job."""
        return UNAWARE if self.unaware else gpu_type

    def max_profiled_replicas(self, gpu_type: str) -> int:
        return max((k[1] for k in self.profiles.get(self.model_key(gpu_type), {})), default=0)

    def goodput_fn(self, gpu_type: str) -> SiaGoodput | None:
        perf = self.perf_params.get(self.model_key(gpu_type))
        if perf is None or self.grad_params is None:
            return None
        return SiaGoodput(perf, self.grad_params, self.apps[gpu_type].init_batch_size)

    def _observe(self, nodes: int, reps: int, bsz: int, step: float, sync: float, grad: tuple[float, float]) -> None:
        self.grad_params = grad
        prof = self.profiles[self.model_key(self.on())]
        if (nodes, reps, bsz) in prof:
            return
        prof[nodes, reps, bsz] = (step, sync)
        if not self.fit_models:
            return
        # The fit is a function of the observations in their order (the objective sums them in that order), so
        # jobs of one application that saw the same configurations in the same order share it, bit for bit.
        key = tuple(prof.items())
        got = self.fit_cache.get(key) if self.fit_cache is not None else None
        if got is None:
            keys, vals = list(prof), list(prof.values())
            got = fit_perf_params([k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys],
                                  [v[0] - v[1] for v in vals], [v[0] for v in vals])
            self.fits += 1
            if self.fit_cache is not None:
                self.fit_cache[key] = got
        else:
            self.fit_reuses += 1
        self.perf_params[self.model_key(self.on())] = got

    # ---- batch size ------------------------------------------------------------------------------------
    def update_local_bsz(self) -> None:
        """Per-GPU (atomic) batch and accumulation for the current placement: by goodput when tuning and a
        model exists, else from the requested batch (or the smallest valid one before any observation)."""
        t = self.on()
        app = self.apps[t]
        placement = tuple(x for x in self.placement if x)
        nodes, reps = len(placement), sum(placement)
        batch_size = None if self.tune_bsz else self.target_batch_size
        perf = self.perf_params[self.model_key(t)]
        max_local = app.max_local_bsz_for(placement)
        if batch_size is None and (self.grad_params is None or perf is None):
            batch_size = max(app.init_batch_size, app.min_local_bsz * reps)
        fn = self.goodput_fn(t)
        if batch_size is None and fn is not None:
            _, atomic, accum = fn.optimize(nodes, reps, app.max_batch_size, (app.min_local_bsz, max_local))
            self.atomic_bsz, self.accum_steps = int(atomic), int(accum)
        elif batch_size is not None:
            local = math.ceil(batch_size / reps - 1e-8)
            self.accum_steps = math.ceil(local / max_local - 1e-8) - 1
            if reps == 1 and batch_size > app.init_batch_size:
                self.accum_steps = max(1, self.accum_steps)
            self.atomic_bsz = math.ceil(local / (self.accum_steps + 1) - 1e-8)
        cap = app.replicas_measured(reps)  # memory: never above what was measured at this GPU count
        if cap is not None and cap < self.atomic_bsz:
            self.atomic_bsz = cap
        self.atomic_bsz = min(self.atomic_bsz, int(app.max_batch_size / (reps * (self.accum_steps + 1))))

    # ---- progress --------------------------------------------------------------------------------------
    def step(self, seconds: float) -> None:
        """Advance ``seconds`` of wall time."""
        if self.completion_time is not None:
            return
        if not self.placement:
            self.current_time += seconds
            return
        gpus = sum(self.placement)
        delay = min(self.rescale_time, seconds)
        self.current_time += delay
        self.attained_service += delay * gpus
        self.rescale_time -= delay
        seconds -= delay
        if seconds > 0:
            self.gpu_seconds[self.on()] = self.gpu_seconds.get(self.on(), 0.0) + seconds * gpus
        while seconds > 0 and self.completion_time is None:
            app = self.apps[self.on()]
            placement = tuple(x for x in self.placement if x)
            nodes, reps = len(placement), sum(placement)
            local = self.atomic_bsz * (self.accum_steps + 1)
            batch_size = reps * local
            scale = batch_size / app.init_batch_size
            sqr, var = app.grad_stats(batch_size, self.epoch)
            gain = (var + sqr) / (var / scale + sqr)
            step_t, sync_t = app.step_time(placement, self.atomic_bsz)
            self._observe(nodes, reps, self.atomic_bsz, step_t, sync_t, (sqr, var))
            total = step_t + (step_t - sync_t) * self.accum_steps
            goodput = gain / total * self.calibration
            next_progress = app.progress_at(self.epoch + 1)
            if self.progress + goodput * seconds < next_progress:
                self.progress += goodput * seconds
                self.current_time += seconds
                self.attained_service += seconds * gpus
                seconds = 0
            else:
                self.epoch += 1
                delta = round(float((next_progress - self.progress) / goodput))
                if self.epoch > self.completion_epoch:
                    self.completion_time = self.current_time + delta
                self.progress = next_progress
                self.current_time += delta
                self.attained_service += delta * gpus
                seconds -= delta
            self.update_local_bsz()
        self.current_time += seconds

    # ---- allocation changes ----------------------------------------------------------------------------
    def _restart(self) -> None:
        self.update_local_bsz()
        self.rescale_time = self.apps[self.on()].rescale_time or 30
        self.num_restarts = 0 if self.num_restarts is None else self.num_restarts + 1

    def reallocate(self, placement: tuple[int, ...]) -> None:
        """A new placement on the same GPU type: a restart unless the GPUs per node are unchanged."""
        if placement:
            if tuple(placement) != self.placement:
                self.placement = tuple(placement)
                self._restart()
        else:
            self.placement = ()
            self.atomic_bsz = 0

    def migrate(self, gpu_type: str | None, placement: tuple[int, ...]) -> None:
        """Move to another GPU type (None with an empty placement: suspended)."""
        self.current_cluster = gpu_type
        if placement:
            self.placement = tuple(placement)
            self._restart()
        else:
            self.placement = ()
            self.atomic_bsz = 0
