"""Goodput = throughput x statistical efficiency, and the batch size that maximises it for an allocation.

Statistical efficiency follows the gradient noise scale: training at batch B makes (var + sqr) / (var/s + sqr)
times the progress of the base batch B0 per step (s = B / B0), i.e. (PGNS + B0) / (PGNS + B) per sample, where
PGNS = var / sqr * B0. Written from the semantics of the Pollux OSDI'21 artifact (simulator/goodput.py and
speedup.py, Apache-2.0): the same 50 geometric batch-size candidates and gradient-accumulation rule, so the
choices equal Pollux's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from hpcsched.goodput.perf import GradParams, PerfParams, accum_time, log_optim_time, network_time

EPS = 1e-8
"""Tolerance of the floor/ceil operations on batch sizes (Pollux's)."""
CANDIDATES = 50
"""Batch sizes tried between the smallest allowed and the largest, geometrically spaced (Pollux's)."""


class BatchChoice(NamedTuple):
    """The best configuration found: goodput, per-GPU micro-batch, extra micro-batches accumulated per step."""

    goodput: float
    atomic_bsz: int
    accum_steps: int

    @property
    def local_bsz(self) -> int:
        return self.atomic_bsz * (self.accum_steps + 1)


class GoodputFunction:
    """A job's goodput as a function of (nodes, replicas, micro-batch, accumulation) from its fitted step-time
    model and its current gradient statistics; ``init_batch_size`` is B0, the batch the statistics are for."""

    def __init__(self, perf: Iterable[float], grad: Iterable[float], init_batch_size: float) -> None:
        """``perf`` and ``grad``: a ``PerfParams`` and ``GradParams``, or their values in that order."""
        self.perf = PerfParams(*perf)
        self.grad = GradParams(*grad)
        self.init_batch_size = init_batch_size

    def throughput(self, num_nodes: ArrayLike, num_replicas: ArrayLike, atomic_bsz: ArrayLike,
                   accum_steps: ArrayLike) -> np.ndarray:
        """Samples per second."""
        a = accum_time(self.perf, atomic_bsz)
        opt = np.exp(log_optim_time(self.perf, a, network_time(self.perf, num_nodes, num_replicas)))
        batch = np.asarray(num_replicas) * np.asarray(atomic_bsz) * (np.asarray(accum_steps) + 1)
        return batch / (np.asarray(accum_steps) * a + opt)

    def efficiency(self, batch_size: ArrayLike) -> np.ndarray:
        """Progress per sample at ``batch_size`` relative to B0 (1.0 at B0, falling as the batch grows)."""
        scale = np.asarray(batch_size) / self.init_batch_size
        denom = self.grad.var / scale + self.grad.sqr
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = np.where(denom > 0, (self.grad.var + self.grad.sqr) / denom, 1.0)
        return gain / scale

    def evaluate(self, num_nodes: ArrayLike, num_replicas: ArrayLike, atomic_bsz: ArrayLike,
                 accum_steps: ArrayLike) -> np.ndarray:
        """Goodput: B0-equivalent samples of progress per second."""
        batch = np.asarray(num_replicas) * np.asarray(atomic_bsz) * (np.asarray(accum_steps) + 1)
        if not np.all(self.init_batch_size <= batch):
            raise ValueError(f"goodput: a batch below the base batch {self.init_batch_size} has no efficiency "
                             "measurement")
        return self.throughput(num_nodes, num_replicas, atomic_bsz, accum_steps) * self.efficiency(batch)

    __call__ = evaluate

    def optimize(self, num_nodes: ArrayLike, num_replicas: ArrayLike, max_batch_size: float | None = None,
                 atomic_bsz_range: tuple[int | None, int | None] | None = None,
                 accumulation: bool = False) -> tuple[np.ndarray | float, np.ndarray | int, np.ndarray | int]:
        """(goodput, atomic_bsz, accum_steps) of the best of :data:`CANDIDATES` batch sizes per allocation.

        Vectorised over ``num_nodes`` / ``num_replicas`` (scalars give scalars). With ``accumulation`` a per-GPU
        batch over the micro-batch limit is split into accumulated micro-batches, and a single replica above B0
        accumulates at least once (its gradient statistics need two micro-batches). Configurations outside
        ``atomic_bsz_range`` score 0.
        """
        nodes_in, reps_in = num_nodes, num_replicas
        if not (np.all(np.less_equal(1, nodes_in)) and np.all(np.less_equal(nodes_in, reps_in))):
            raise ValueError("goodput: every allocation needs 1 <= nodes <= replicas")
        max_batch_size = self.init_batch_size if max_batch_size is None else max_batch_size
        if max_batch_size < self.init_batch_size:
            raise ValueError(f"goodput: max batch {max_batch_size} below the base batch {self.init_batch_size}")
        lo, hi = atomic_bsz_range or (None, None)
        min_atomic = lo or 1
        max_atomic = hi or max_batch_size
        shape = np.broadcast(nodes_in, reps_in).shape
        scalar = np.isscalar(nodes_in) or np.isscalar(reps_in)
        nodes = np.broadcast_to(nodes_in, shape).flatten()
        reps = np.broadcast_to(reps_in, shape).flatten()
        min_batch = np.maximum(self.init_batch_size, min_atomic * reps)
        batch = np.geomspace(min_batch, max_batch_size, CANDIDATES)
        local = batch / reps
        if accumulation:
            accum = np.ceil(local / max_atomic - EPS) - 1
            accum = np.where((reps == 1) & (local > self.init_batch_size + EPS), np.maximum(accum, 1), accum)
            accum = accum.astype(int)
        else:
            accum = np.zeros_like(local, dtype=int)
        atomic = np.ceil(local / (accum + 1) - EPS).astype(int)
        goodput = self.evaluate(nodes, reps, atomic, accum)
        goodput = np.where((min_atomic <= atomic) & (atomic <= max_atomic), goodput, 0.0)
        idx = np.argmax(goodput, axis=0), np.arange(goodput.shape[1])
        g, a, k = goodput[idx].reshape(shape), atomic[idx].reshape(shape), accum[idx].reshape(shape)
        if scalar:
            return g.item(), a.item(), k.item()
        return g, a, k


class SpeedupFunction:
    """Best goodput of (nodes, replicas) over a base allocation's best goodput, memoised for small allocations.

    The base is one GPU unless :meth:`rebase` sets another (Pollux's policy rebases to the fair share)."""

    def __init__(self, goodput_fn: GoodputFunction, max_batch_size: float | None = None,
                 atomic_bsz_range: tuple[int | None, int | None] | None = None, accumulation: bool = False,
                 mem_size: int = 32) -> None:
        self.goodput_fn = goodput_fn
        self.max_batch_size = max_batch_size
        self.atomic_bsz_range = atomic_bsz_range
        self.accumulation = accumulation
        self._mem_size = mem_size
        self.base_goodput = float(self._best(1, 1)[0])
        self._memo = -np.ones((mem_size, mem_size))
        self._memo[0, 0] = 0.0

    def _best(self, nodes: ArrayLike, reps: ArrayLike) -> tuple:
        return self.goodput_fn.optimize(nodes, reps, max_batch_size=self.max_batch_size,
                                        atomic_bsz_range=self.atomic_bsz_range, accumulation=self.accumulation)

    def rebase(self, num_nodes: float, num_replicas: float) -> None:
        """Measure speedups against the best goodput on this allocation instead (memo entries stay as they were
        computed, as Pollux's do: they are only ever filled after a rebase)."""
        self.base_goodput = float(self._best(num_nodes, num_replicas)[0])

    def __call__(self, num_nodes: ArrayLike, num_replicas: ArrayLike) -> np.ndarray | float:
        scalar = np.isscalar(num_nodes) and np.isscalar(num_replicas)
        shape = np.broadcast(num_nodes, num_replicas).shape
        nodes = np.broadcast_to(num_nodes, shape).flatten()
        reps = np.broadcast_to(num_replicas, shape).flatten()
        speedup = -np.ones(shape).flatten()
        small = reps < self._mem_size
        speedup[small] = self._memo[nodes[small], reps[small]]
        missing = speedup < 0
        if np.count_nonzero(missing):
            (un, ur), inverse = np.unique(np.stack([nodes[missing], reps[missing]]), axis=1, return_inverse=True)
            goodput = self._best(un, ur)[0]
            keep = ur < self._mem_size
            self._memo[un[keep], ur[keep]] = goodput[keep] / self.base_goodput
            speedup[missing] = goodput[np.ravel(inverse)] / self.base_goodput
        shaped = speedup.reshape(shape)
        return shaped.item() if scalar else shaped


def best_goodput(perf: np.ndarray, grad: np.ndarray, init_batch: np.ndarray, max_batch: np.ndarray,
                 min_atomic: np.ndarray, max_atomic: np.ndarray, num_nodes: np.ndarray,
                 num_replicas: np.ndarray) -> np.ndarray:
    """:meth:`GoodputFunction.optimize`'s goodput (accumulation on) for many jobs' allocations at once: row ``i``
    is allocation (``num_nodes[i]``, ``num_replicas[i]``) of a job with parameters ``perf[i]`` (7), ``grad[i]``
    (sqr, var), B0 ``init_batch[i]``, largest batch ``max_batch[i]`` and micro-batch range. A scheduler scoring
    thousands of candidate allocations per round pays one numpy pass instead of one per job."""
    p = [perf[:, i] for i in range(7)]
    sqr, var = grad[:, 0], grad[:, 1]
    nodes = num_nodes.astype(float)
    reps = num_replicas.astype(float)
    min_batch = np.maximum(init_batch, min_atomic * reps)
    batch = np.geomspace(min_batch, max_batch, CANDIDATES)  # (CANDIDATES, k)
    local = batch / reps
    accum = np.ceil(local / max_atomic - EPS) - 1
    accum = np.where((reps == 1) & (local > init_batch + EPS), np.maximum(accum, 1), accum).astype(int)
    atomic = np.ceil(local / (accum + 1) - EPS).astype(int)
    a = p[0] + p[1] * atomic
    conds = [nodes > 1, reps > 1]
    net = np.select(conds, [p[2], p[4]], 1e-8) + np.select(conds, [p[3], p[5]], 1e-8) * np.maximum(reps - 2, 1e-8)
    gamma = p[6]
    optim = np.exp(np.log(a ** gamma + net ** gamma) / gamma)
    total = reps * atomic * (accum + 1)
    throughput = total / (accum * a + optim)
    scale = total / init_batch
    denom = var / scale + sqr
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(denom > 0, (var + sqr) / denom, 1.0)
    goodput = throughput * (gain / scale)
    goodput = np.where((min_atomic <= atomic) & (atomic <= max_atomic), goodput, 0.0)
    return goodput.max(axis=0)
