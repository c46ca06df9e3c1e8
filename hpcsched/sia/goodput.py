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

from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

TINY = 1e-8
"""The model's floor for an absent link and the lower bound of every parameter."""

FIT_TOL = 1e-5
"""The Sia artifact's optimiser tolerance for the fit (it loosened Pollux's default for speed)."""


class PerfParams(NamedTuple):
    """T_c = alpha_c + beta_c * bsz; T_net = alpha + beta * max(r - 2, 0) (inter-node ``_n`` pair when the job
    spans nodes, else intra-node ``_r``); T_step = (T_c^gamma + T_net^gamma)^(1/gamma)."""

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float


def _network_time(p: PerfParams, nodes: np.ndarray, reps: np.ndarray) -> np.ndarray:
    conds = [nodes > 1, reps > 1]
    bottleneck = np.select(conds, [p.alpha_n, p.alpha_r], TINY)
    retrogress = np.select(conds, [p.beta_n, p.beta_r], TINY)
    return bottleneck + retrogress * np.maximum(reps - 2, TINY)


def _objective(x: np.ndarray, nodes: np.ndarray, reps: np.ndarray, bsz: np.ndarray, log_acc: np.ndarray,
               log_opt: np.ndarray) -> tuple[float, np.ndarray]:
    """RMS log error of compute and step time, + 1e-3 (gamma - 1)^2 (a smaller gamma is easier to fit)
    + 1e-2 ((beta_n/alpha_n)^2 + (beta_r/alpha_r)^2) (prefer an optimistic model), and its gradient."""
    ac, bc, an, bn, ar, br, g = (float(v) for v in x)
    n = len(bsz)
    a = ac + bc * bsz
    inter, intra = nodes > 1, (nodes <= 1) & (reps > 1)
    extra = np.maximum(reps - 2, TINY)
    net = np.where(inter, an + bn * extra, np.where(intra, ar + br * extra, TINY + TINY * extra))
    s = a ** g + net ** g
    lopt = np.log(s) / g
    e1, e2 = np.log(a) - log_acc, lopt - log_opt
    err1, err2 = float(np.sqrt(np.mean(e1 ** 2))), float(np.sqrt(np.mean(e2 ** 2)))
    f = err1 + err2 + 1e-3 * (g - 1) ** 2 + 1e-2 * ((bn / an) ** 2 + (br / ar) ** 2)
    w1 = e1 / (n * err1) if err1 > 0 else np.zeros(n)
    w2 = e2 / (n * err2) if err2 > 0 else np.zeros(n)
    d_a, d_net = a ** (g - 1) / s, net ** (g - 1) / s
    d_g = (a ** g * np.log(a) + net ** g * np.log(net)) / (s * g) - lopt / g
    grad = np.array([
        np.sum(w1 / a) + np.sum(w2 * d_a),
        np.sum(w1 * bsz / a) + np.sum(w2 * d_a * bsz),
        np.sum(w2 * d_net * inter) - 2e-2 * bn ** 2 / an ** 3,
        np.sum(w2 * d_net * inter * extra) + 2e-2 * bn / an ** 2,
        np.sum(w2 * d_net * intra) - 2e-2 * br ** 2 / ar ** 3,
        np.sum(w2 * d_net * intra * extra) + 2e-2 * br / ar ** 2,
        np.sum(w2 * d_g) + 2e-3 * (g - 1)])
    return f, grad


def fit_perf_params(num_nodes: ArrayLike, num_replicas: ArrayLike, atomic_bsz: ArrayLike,
                    accum_time: ArrayLike, step_time: ArrayLike) -> PerfParams:
    """Fit the model to observed (nodes, replicas, per-GPU batch) -> (compute time, step time), pinning what the
    observations cannot identify as Pollux does (alpha_c to half the mean compute time with one batch size
    seen; the inter-node pair without multi-node runs; the intra-node pair without single-node multi-GPU
    runs; the betas without > 2 replicas), then raising an unobserved inter-node pair to 1.1x the intra-node
    one (crossing nodes is never cheaper). L-BFGS-B with the artifact's start, bounds and tolerance."""
    import scipy.optimize

    nodes, reps = np.asarray(num_nodes, dtype=float), np.asarray(num_replicas, dtype=float)
    bsz = np.asarray(atomic_bsz, dtype=float)
    acc, opt = np.asarray(accum_time, dtype=float), np.asarray(step_time, dtype=float)
    params = [1e-1, 1e-2] * 3 + [1.0 + 1e-3]
    lower = [TINY, TINY] * 3 + [1.0]
    upper = [np.inf, np.inf] * 3 + [10.0]
    if len(np.unique(bsz)) == 1:
        params[0] = upper[0] = lower[0] = float(np.mean(acc)) / 2
    if not np.any(nodes > 1):
        for i in (2, 3):
            params[i] = upper[i] = lower[i]
    if not np.any((nodes == 1) & (reps > 1)):
        for i in (4, 5):
            params[i] = upper[i] = lower[i]
    if not np.any(reps > 2):
        for i in (3, 5):
            params[i] = upper[i] = lower[i]
    bounds = scipy.optimize.Bounds(lower, upper, keep_feasible=True)
    result = scipy.optimize.minimize(_objective, params, args=(nodes, reps, bsz, np.log(acc), np.log(opt)),
                                     jac=True, bounds=bounds, tol=FIT_TOL)
    x = [float(v) for v in result.x]
    if not np.any(nodes > 1):
        x[2] = max(x[2], x[4] * 1.1)
        x[3] = max(x[3], x[5] * 1.1)
    return PerfParams(*x)


class GoodputFunction:
    """Goodput of a job from its fitted step-time model and its current gradient statistics."""

    def __init__(self, perf: PerfParams, grad: tuple[float, float], init_batch_size: int) -> None:
        self.perf = perf
        self.sqr, self.var = grad
        self.init_batch_size = init_batch_size

    def throughput(self, nodes: np.ndarray, reps: np.ndarray, atomic: np.ndarray, accum: np.ndarray) -> np.ndarray:
        """Samples/s: ``accum`` non-synchronising micro-batches, then one synchronising step."""
        p = self.perf
        a = p.alpha_c + p.beta_c * atomic
        net = _network_time(p, nodes, reps)
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
