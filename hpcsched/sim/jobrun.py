"""The simulator's mutable state of one job during a run (the ``Job`` record itself stays frozen), shared by
the event loop (``engine``) and re-planning (``hpcsched.core.replan``, whose ``Member`` it is)."""

from __future__ import annotations

import math
from typing import Any

from hpcsched.allocator import Group, JobView
from hpcsched.model import DEFAULT_ITERATION_S, Job
from hpcsched.primitives.speed import SOLO_FACTOR, restart_cost

_INF = math.inf


class EngineJob:
    """Mutable per-run state of one job (the Job record itself stays frozen)."""

    __slots__ = (
        "job", "id", "idx", "submit", "gpus", "model", "total", "it", "dur", "restart",
        "done", "executed", "attained", "gpu_s", "first_start", "end", "running", "place",
        "period", "charge", "warm", "share", "group", "predicted", "view", "live", "ever_ran", "status", "since",
        "wake", "hint", "solo", "wkey", "q", "seq", "slow",
    )  # fmt: skip

    def __init__(self, job: Job, idx: int, compat: bool, restart_s: float | None = None,
                 slowdown: float = SOLO_FACTOR) -> None:
        self.job, self.id, self.idx = job, job.id, idx
        self.gpus = job.gpus
        self.model = job.model
        it, total = iterations_of(job)
        if compat:  # the reference reads milliseconds as integers: reproduce its rounding exactly
            it = round(it * 1000) / 1000 if job.iteration_time is not None else it
            self.submit = round(job.submit * 1000) / 1000
            self.dur = round((job.duration or total * it) * 1000) / 1000
        else:
            self.submit = job.submit
            self.dur = job.duration if job.duration is not None else total * it
        self.total, self.it = total, it
        self.restart = restart_s if restart_s is not None and not compat else restart_cost(job.model, job.gpus)
        self.done = self.executed = self.attained = self.gpu_s = 0.0
        self.first_start: float | None = None
        self.end: float | None = None
        self.running = False
        self.place: tuple[tuple[int, int], ...] | None = None
        self.slow = slowdown  # a solo job's period over its iteration time (``--slowdown-factor``)
        self.period = it * slowdown
        self.charge = 0.0  # compat: seconds lost per event
        self.warm = 0.0  # default: restart seconds still to pay
        self.share = float(job.gpus)  # GPUs accounted to this job while running
        self.group: tuple[str, ...] = ()
        self.predicted = _INF
        self.view: JobView | None = None
        self.live: Any = None  # the engine's live view of it, for order keys (made on first use)
        self.ever_ran = False
        self.status = "pending"
        self.since = 0.0  # default mode: progress is settled lazily up to this time
        self.wake = _INF  # default mode: when attained service crosses the next policy threshold
        self.hint: int | None = None  # compat queue policies: rank in the reference's queue lists
        self.solo = Group((job.id,))  # the job as a group of one (built once: order_key policies)
        self.wkey: tuple[Any, int] | None = None  # (order key, idx) while waiting, order_key policies
        self.q = 0  # compat queue policies: the reference's queue list this job is in
        self.seq = 0  # ... and its position there (lists are ordered by seq; see the engine's _reseq)


def iterations_of(job: Job) -> tuple[float, float]:
    """(solo seconds per iteration, total iterations); duration-only jobs get 1-s iterations."""
    if job.iterations is not None and job.iterations > 0:
        if job.iteration_time is not None and job.iteration_time > 0:
            return job.iteration_time, float(job.iterations)
        if job.duration is not None and job.duration > 0:
            return job.duration / job.iterations, float(job.iterations)
    if job.duration is not None and job.duration > 0:
        it = job.iteration_time if job.iteration_time and job.iteration_time > 0 else DEFAULT_ITERATION_S
        n = max(1.0, math.ceil(job.duration / it))
        return job.duration / n, n
    raise ValueError(f"job {job.id}: needs iterations with an iteration time, or a duration > 0")
