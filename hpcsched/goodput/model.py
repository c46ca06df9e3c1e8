"""``GoodputModel``: one application's goodput on one GPU type, by name, from its shipped profile.

The step-time model is fitted once to every profiled step (placements and large-scale rows); efficiency uses the
gradient statistics the validation profiles measured in a given epoch at the base batch B0. This is the offline,
fully-profiled counterpart of what a Pollux agent learns online (:mod:`hpcsched.goodput.function`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from hpcsched.goodput.function import BatchChoice, GoodputFunction
from hpcsched.goodput.perf import GradParams, PerfParams, fit_perf_params, step_time
from hpcsched.goodput.profiles import ApplicationProfile, load_profile


@dataclass(frozen=True)
class BatchSplit:
    """How a global batch is run on ``replicas`` GPUs: micro-batches of ``atomic_bsz`` per GPU, ``accum_steps``
    of them accumulated before the synchronising one."""

    batch: int
    atomic_bsz: int
    accum_steps: int


@dataclass(frozen=True)
class GoodputModel:
    """Goodput of ``profile``'s application on its GPU type, with gradient statistics of ``epoch``.

    Example::

        m = GoodputModel.load("cifar10")
        m.throughput(2, 8, 1024)   # samples/s on 2 nodes x 4 GPUs at global batch 1024
        m.efficiency(1024)         # progress per sample relative to batch 128 (B0)
        m.best_batch(2, 8)         # BatchChoice(goodput, atomic_bsz, accum_steps)
    """

    profile: ApplicationProfile
    perf: PerfParams
    epoch: int = 0

    @classmethod
    def load(cls, application: str, gpu_type: str = "t4", epoch: int = 0) -> GoodputModel:
        """The shipped profile of ``application`` (``hpcsched.goodput.APPLICATIONS``) on ``gpu_type``; fits the
        step-time model to it (about 0.1 s; needs scipy)."""
        profile = load_profile(application, gpu_type)
        obs = profile.observations()
        perf = fit_perf_params(obs["num_nodes"], obs["num_replicas"], obs["local_bsz"],
                               obs["step_time"] - obs["sync_time"], obs["step_time"])
        return cls(profile, perf, epoch).at_epoch(epoch)

    def at_epoch(self, epoch: int) -> GoodputModel:
        """The same model with the gradient statistics of ``epoch`` (0-based, < ``profile.max_epochs``)."""
        if not 0 <= epoch < self.profile.max_epochs:
            raise ValueError(f"{self.profile.name}: epoch {epoch} outside 0..{self.profile.max_epochs - 1}")
        return replace(self, epoch=epoch)

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def gpu_type(self) -> str:
        return self.profile.gpu_type

    @property
    def grad(self) -> GradParams:
        """Gradient statistics at B0 in this model's epoch."""
        return GradParams(*self.profile.grad_stats(self.profile.init_batch_size, self.epoch))

    @cached_property
    def function(self) -> GoodputFunction:
        return GoodputFunction(self.perf, self.grad, self.profile.init_batch_size)

    def split(self, gpus: int, batch: int) -> BatchSplit:
        """Split a global ``batch`` over ``gpus`` GPUs, accumulating when a GPU's share exceeds the micro-batch
        limit (Pollux's rule: a single GPU above B0 accumulates at least once)."""
        p = self.profile
        if gpus < 1:
            raise ValueError(f"{p.name}: need at least one GPU, got {gpus}")
        local = math.ceil(batch / gpus - 1e-8)
        accum = math.ceil(local / p.max_local_bsz - 1e-8) - 1
        if gpus == 1 and batch > p.init_batch_size:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        return BatchSplit(gpus * atomic * (accum + 1), atomic, accum)

    def step_time(self, nodes: int, gpus: int, batch: int) -> float:
        """Predicted seconds per optimizer step at global ``batch`` on ``gpus`` GPUs over ``nodes`` nodes."""
        s = self.split(gpus, batch)
        return float(step_time(self.perf, nodes, gpus, s.atomic_bsz, s.accum_steps))

    def throughput(self, nodes: int, gpus: int, batch: int) -> float:
        """Predicted samples per second."""
        s = self.split(gpus, batch)
        return float(self.function.throughput(nodes, gpus, s.atomic_bsz, s.accum_steps))

    def efficiency(self, batch: float) -> float:
        """Statistical efficiency at ``batch`` (1 at B0; progress per sample relative to B0)."""
        return float(self.function.efficiency(batch))

    def goodput(self, nodes: int, gpus: int, batch: int) -> float:
        """Throughput x efficiency: B0-equivalent samples of progress per second."""
        s = self.split(gpus, batch)
        return float(self.function.evaluate(nodes, gpus, s.atomic_bsz, s.accum_steps))

    def best_batch(self, nodes: int, gpus: int) -> BatchChoice:
        """The goodput-maximising batch for the allocation (within the profiled batch and micro-batch ranges,
        accumulation allowed); ``.local_bsz * gpus`` is the global batch."""
        p = self.profile
        g, a, k = self.function.optimize(nodes, gpus, p.max_batch_size, (p.min_local_bsz, p.max_local_bsz), True)
        return BatchChoice(float(g), int(a), int(k))

    def speedup(self, nodes: int | np.ndarray, gpus: int | np.ndarray) -> np.ndarray | float:
        """Best goodput on (nodes, gpus) over the best on one GPU."""
        p = self.profile
        rng = (p.min_local_bsz, p.max_local_bsz)
        base = self.function.optimize(1, 1, p.max_batch_size, rng, True)[0]
        g = self.function.optimize(nodes, gpus, p.max_batch_size, rng, True)[0]
        return np.asarray(g) / base if not np.isscalar(g) else float(np.asarray(g)) / base
