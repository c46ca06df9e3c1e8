"""Gavel's stateful FIFO: jobs in arrival order each get a whole GPU type."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hpcsched.hetero.policies.base import AllocationInput, GavelPolicy
from hpcsched.hetero.policies.registry import GavelOptions, register

if TYPE_CHECKING:
    import numpy as np


@dataclass
class FifoPolicy(GavelPolicy):
    """Gavel's FIFO (``policies/fifo.py``, base mode), kept bug for bug because its figures depend on it.

    Jobs keep the type they were given until they end; a finished job's type goes to the head of the
    queue if it fits; then queued jobs are given types while any type has free GPUs. Gavel draws a type at
    random among those with room (``Random(seed)``), but assigns the job to the *last* type with free
    GPUs in name order, so a type can be over-committed (the mechanism then runs the jobs of highest
    priority); the drawn index only decides which type leaves the list when the assigned one fills up
    exactly. The draw sequence is Gavel's, so ``--seed`` moves the figures slightly, as it moves Gavel's.
    """

    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)
    _given: dict[int, str] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        sf = {j: int(s) for j, s in zip(inp.job_ids, inp.scale_factors, strict=True)}
        thr = {j: dict(zip(inp.types, row, strict=True)) for j, row in zip(inp.job_ids, inp.throughputs, strict=True)}
        free = {t: int(g) for t, g in zip(inp.types, inp.gpus, strict=True)}
        queue = [j for j in inp.job_ids if j not in self._given]
        for j in sorted(self._given):
            wt = self._given[j]
            if j not in thr:  # ended: its type goes to the head of the queue if it fits there
                if queue and sf[queue[0]] <= free[wt] and thr[queue[0]][wt] > 0.0:
                    nxt = queue.pop(0)
                    self._given[nxt] = wt
                    free[wt] -= sf[nxt]
                del self._given[j]
            else:
                free[wt] -= sf[j]
        avail = sorted(t for t in free if free[t] > 0)
        while queue and avail:
            j = queue.pop(0)
            fits = [i for i, t in enumerate(avail) if free[t] >= sf[j]]
            if not fits:
                break
            drawn = self._rng.randrange(len(fits))
            wt = avail[-1]  # Gavel's assignment: the loop variable left over from scanning `avail`
            if thr[j][wt] > 0.0:
                self._given[j] = wt
                free[wt] -= sf[j]
                if free[wt] == 0:
                    avail.pop(fits[drawn])
        x = np.zeros((len(inp.job_ids), len(inp.types)))
        col = {t: c for c, t in enumerate(inp.types)}
        for r, j in enumerate(inp.job_ids):
            if j in self._given:
                x[r, col[self._given[j]]] = 1.0
        return x



@register("fifo", "FIFO: jobs in arrival order each get a whole GPU type (Gavel's stateful FIFO)", solves=False)
def _fifo(opts: GavelOptions) -> GavelPolicy:
    return FifoPolicy(name="fifo", heterogeneity_aware=False, skip_zero_priority=True, seed=opts.seed)
