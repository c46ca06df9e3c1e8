"""Pollux's 7-parameter model of the time of one data-parallel SGD step, and its least-squares fit.

The step is compute (linear in the per-GPU batch) overlapped with an all-reduce whose cost depends on whether
the replicas span nodes; the overlap is a gamma-norm, so gamma = 1 is "no overlap" (times add) and gamma -> 10
approaches "perfect overlap" (the max). Written from the semantics of the Pollux OSDI'21 artifact
(petuum/adaptdl osdi21-artifact, simulator/goodput.py, Apache-2.0); the fit minimises the same objective with the
same bounds and start, with an analytic gradient in place of autograd so no extra dependency is needed.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

TINY = 1e-8
"""The artifact's floor for an absent link (single replica) and its lower bound for every parameter."""


class PerfParams(NamedTuple):
    """T_compute = alpha_c + beta_c * atomic_bsz; T_net = alpha + beta * max(replicas - 2, 0) with the inter-node
    (``_n``) pair when the job spans nodes, else the intra-node (``_r``) pair; T_step = (T_c^g + T_net^g)^(1/g)."""

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float


class GradParams(NamedTuple):
    """Gradient statistics: squared norm of the true gradient and the per-sample variance, at the base batch."""

    sqr: float
    var: float


def accum_time(p: PerfParams, atomic_bsz: ArrayLike) -> np.ndarray:
    """Forward + backward time of one micro-batch (no synchronisation)."""
    return p.alpha_c + p.beta_c * np.asarray(atomic_bsz)


def network_time(p: PerfParams, num_nodes: ArrayLike, num_replicas: ArrayLike) -> np.ndarray:
    """All-reduce time: the slowest link (inter-node if any) plus a retrogression per replica beyond two."""
    nodes, reps = np.asarray(num_nodes), np.asarray(num_replicas)
    conds = [nodes > 1, reps > 1]
    bottleneck = np.select(conds, [p.alpha_n, p.alpha_r], TINY)
    retrogress = np.select(conds, [p.beta_n, p.beta_r], TINY)
    return bottleneck + retrogress * np.maximum(reps - 2, TINY)


def log_optim_time(p: PerfParams, accum: ArrayLike, network: ArrayLike) -> np.ndarray:
    """log of the synchronising step's time: the gamma-norm of compute and network."""
    g = p.gamma
    return np.log(np.asarray(accum) ** g + np.asarray(network) ** g) / g


def step_time(p: PerfParams, num_nodes: ArrayLike, num_replicas: ArrayLike, atomic_bsz: ArrayLike,
              accum_steps: ArrayLike = 0) -> np.ndarray:
    """Seconds per optimizer step: ``accum_steps`` non-synchronising micro-batches then one synchronising one."""
    a = accum_time(p, atomic_bsz)
    opt = np.exp(log_optim_time(p, a, network_time(p, num_nodes, num_replicas)))
    return np.asarray(accum_steps) * a + opt


def _objective(x: np.ndarray, nodes: np.ndarray, reps: np.ndarray, bsz: np.ndarray, log_acc: np.ndarray,
               log_opt: np.ndarray) -> tuple[float, np.ndarray]:
    """RMS log error of compute and step times + 1e-3 (gamma-1)^2 + 1e-2 ((b_n/a_n)^2 + (b_r/a_r)^2), with its
    gradient. The regularisers prefer little overlap (easier to fit) and little retrogression (optimistic)."""
    ac, bc, an, bn, ar, br, g = (float(v) for v in x)
    n = len(bsz)
    a = ac + bc * bsz
    inter, intra = nodes > 1, (nodes <= 1) & (reps > 1)
    extra = np.maximum(reps - 2, TINY)
    net = np.where(inter, an + bn * extra, np.where(intra, ar + br * extra, TINY + TINY * extra))
    s = a ** g + net ** g
    lopt = np.log(s) / g
    e1 = np.log(a) - log_acc
    e2 = lopt - log_opt
    err1 = float(np.sqrt(np.mean(e1 ** 2)))
    err2 = float(np.sqrt(np.mean(e2 ** 2)))
    f = err1 + err2 + 1e-3 * (g - 1) ** 2 + 1e-2 * ((bn / an) ** 2 + (br / ar) ** 2)
    grad = np.zeros(7)
    w1 = e1 / (n * err1) if err1 > 0 else np.zeros(n)
    w2 = e2 / (n * err2) if err2 > 0 else np.zeros(n)
    d_a = a ** (g - 1) / s  # d lopt / d a
    d_net = net ** (g - 1) / s
    d_g = (a ** g * np.log(a) + net ** g * np.log(net)) / (s * g) - lopt / g
    grad[0] = np.sum(w1 / a) + np.sum(w2 * d_a)
    grad[1] = np.sum(w1 * bsz / a) + np.sum(w2 * d_a * bsz)
    grad[2] = np.sum(w2 * d_net * inter)
    grad[3] = np.sum(w2 * d_net * inter * extra)
    grad[4] = np.sum(w2 * d_net * intra)
    grad[5] = np.sum(w2 * d_net * intra * extra)
    grad[6] = np.sum(w2 * d_g) + 2e-3 * (g - 1)
    grad[2] += -2e-2 * bn ** 2 / an ** 3
    grad[3] += 2e-2 * bn / an ** 2
    grad[4] += -2e-2 * br ** 2 / ar ** 3
    grad[5] += 2e-2 * br / ar ** 2
    return f, grad


def fit_perf_params(num_nodes: ArrayLike, num_replicas: ArrayLike, atomic_bsz: ArrayLike,
                    accum_step_time: ArrayLike, optim_step_time: ArrayLike, tol: float | None = None) -> PerfParams:
    """Fit :class:`PerfParams` to observed (nodes, replicas, per-GPU batch) -> (compute time, step time).

    Parameters the observations cannot identify are pinned, as Pollux does: alpha_c to half the mean compute time
    when only one batch size was seen (optimistic about larger batches), the inter-node pair without multi-node
    observations, the intra-node pair without single-node multi-GPU ones, the betas without > 2 replicas. Without
    multi-node observations the inter-node pair is raised to at least 1.1x the intra-node pair (a prior: crossing
    nodes is never cheaper). Needs scipy (L-BFGS-B); ``tol`` is its tolerance (None: scipy's default, as Pollux;
    the Sia artifact loosened it for speed).
    """
    import scipy.optimize

    nodes = np.asarray(num_nodes, dtype=float)
    reps = np.asarray(num_replicas, dtype=float)
    bsz = np.asarray(atomic_bsz, dtype=float)
    acc = np.asarray(accum_step_time, dtype=float)
    opt = np.asarray(optim_step_time, dtype=float)
    if not (len(nodes) == len(reps) == len(bsz) == len(acc) == len(opt)) or len(nodes) == 0:
        raise ValueError("fit_perf_params: the five observation arrays must be non-empty and of equal length")
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
                                     jac=True, bounds=bounds, method="L-BFGS-B", tol=tol)
    x = [float(v) for v in result.x]
    if not np.any(nodes > 1):
        x[2] = max(x[2], x[4] * 1.1)
        x[3] = max(x[3], x[5] * 1.1)
    return PerfParams(*x)
