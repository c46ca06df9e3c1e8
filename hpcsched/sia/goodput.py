"""Goodput (throughput x statistical efficiency) as Sia's jobs model it: one throughput model per GPU type.

Throughput is Pollux's 7-parameter step-time model (compute linear in the per-GPU batch, an all-reduce whose
cost depends on whether replicas span nodes, overlapped by a gamma-norm), fitted to the step times a job
has observed on that GPU type; efficiency is the gradient-noise gain ``(var + sqr) / (var / scale + sqr)``
per sample, from the job's current gradient statistics. ``optimize`` picks the batch size (and gradient
accumulation) that maximises goodput among 50 geometric candidates, as the Sia artifact does.

Where the artifact computes in float32 (its allocation matrices are float32 and numpy 1.x kept float32
through mixed scalar arithmetic), this module does the same, so candidate batch sizes round the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from hpcsched.goodput import perf as pollux_perf
from hpcsched.goodput.perf import TINY, PerfParams, network_time

FIT_TOL = 1e-5
"""The Sia artifact's optimiser tolerance for the fit (it loosened Pollux's default for speed)."""


def fit_perf_params(num_nodes: ArrayLike, num_replicas: ArrayLike, atomic_bsz: ArrayLike,
                    accum_time: ArrayLike, step_time: ArrayLike) -> PerfParams:
    """Pollux's fit (``hpcsched.goodput.perf``: same objective, start and bounds) with the Sia artifact's
    tolerance."""
    return pollux_perf.fit_perf_params(num_nodes, num_replicas, atomic_bsz, accum_time, step_time, tol=FIT_TOL)


class SiaGoodput:
    """Goodput of a job from its fitted step-time model and its current gradient statistics."""

    def __init__(self, perf: PerfParams, grad: tuple[float, float], init_batch_size: int) -> None:
        self.perf = perf
        self.sqr, self.var = grad
        self.init_batch_size = init_batch_size

    def throughput(self, nodes: np.ndarray, reps: np.ndarray, atomic: np.ndarray, accum: np.ndarray) -> np.ndarray:
        """Samples/s: ``accum`` non-synchronising micro-batches, then one synchronising step."""
        p = self.perf
        a = p.alpha_c + p.beta_c * atomic
        net = network_time(p, nodes, reps)
        optim = np.exp(np.log(a ** p.gamma + net ** p.gamma) / p.gamma)
        return (reps * atomic * (accum + 1)) / (accum * a + optim)

    def efficiency(self, batch_size: np.ndarray) -> np.ndarray:
        """Progress per sample relative to the base batch size: gain / scale."""
        scale = batch_size / self.init_batch_size
        denom = self.var / scale + self.sqr
        gain = np.where(denom > 0, (self.var + self.sqr) / denom, 1.0)
        return gain / scale

    def optimize(self, num_nodes: np.ndarray | int, num_replicas: np.ndarray | int, max_batch_size: int,
                 bsz_range: tuple[int, int], tune_bsz: bool = True) -> tuple[Any, Any, Any]:
        """(goodput, atomic batch, accumulation steps) at the best of 50 geometric batch sizes per config.

        Scalar ``num_nodes``/``num_replicas`` give scalars. Arrays are float32 (the policy's), and the
        candidates are then computed in float32 as the artifact's were. Without ``tune_bsz`` the only
        candidate is ``max_batch_size`` (the job's fixed batch)."""
        scalar = np.isscalar(num_nodes) or np.isscalar(num_replicas)
        shape = np.broadcast(num_nodes, num_replicas).shape
        nodes = np.broadcast_to(num_nodes, shape).flatten()
        reps = np.broadcast_to(num_replicas, shape).flatten()
        f32 = reps.dtype == np.float32
        min_atomic, max_atomic = bsz_range
        if not tune_bsz:
            lo = np.asarray([max_batch_size], dtype=np.float32 if f32 else float)
        else:
            lo = np.maximum(self.init_batch_size, (np.float32(min_atomic) if f32 else min_atomic) * reps)
        hi = np.float32(max_batch_size) if f32 else max_batch_size
        batch = np.geomspace(lo, hi)
        local = batch / reps
        if f32:
            local = local.astype(np.float32)
        accum = np.ceil(local / max_atomic - TINY) - 1
        accum = np.where((reps == 1) & (local > self.init_batch_size + TINY), np.maximum(accum, 1),
                         accum).astype(int)
        atomic = np.ceil(local / (accum + 1) - TINY).astype(int)
        gp = self.throughput(nodes, reps, atomic, accum) * self.efficiency(reps * atomic * (accum + 1))
        gp = np.where((min_atomic <= atomic) & (atomic <= max_atomic), gp, 0.0)
        idx = np.argmax(gp, axis=0), np.arange(gp.shape[1])
        out = gp[idx].reshape(shape), atomic[idx].reshape(shape), accum[idx].reshape(shape)
        if scalar:
            return out[0].item(), out[1].item(), out[2].item()
        return out
