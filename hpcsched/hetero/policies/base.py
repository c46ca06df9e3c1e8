"""The contract of Gavel's allocation policies: the input they see and the base class they share.

A policy maps the active jobs' throughputs to an allocation matrix ``x`` (jobs x types); Gavel's round
mechanism (``hpcsched.hetero.rounds``) turns it into per-round placements. The base class holds what every
policy needs from a run: its HiGHS objects, a memo of answers, and counters of solver trouble.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import highspy
    import numpy as np


@dataclass(frozen=True, slots=True)
class AllocationInput:
    """The active jobs, sorted by id, and the GPU types, sorted by name (Gavel's matrix order)."""

    job_ids: tuple[int, ...]
    types: tuple[str, ...]
    throughputs: np.ndarray  # jobs x types, steps/s
    scale_factors: np.ndarray  # GPUs per job
    priority_weights: np.ndarray
    steps_remaining: np.ndarray
    times_since_start: np.ndarray  # s since arrival
    gpus: np.ndarray  # GPUs per type
    job_types: tuple[str, ...] = ()
    prices: np.ndarray | None = None  # $ per GPU-hour per type (min cost); None: every type costs 1
    slo_left: np.ndarray | None = None  # s until each job's deadline (inf: none); min cost's SLOs
    entities: tuple[str | None, ...] = ()  # each job's user or project (hierarchical fairness)
    # space sharing: co-located pairs (ids, smaller first, sorted) and their steps/s, pairs x types x 2
    # (each member's rate while it shares the GPU(s) with the other); empty unless the policy shares space
    pairs: tuple[tuple[int, int], ...] = ()
    pair_throughputs: np.ndarray | None = None


@dataclass
class GavelPolicy:
    """Base: a name, how the mechanism treats it, and counters of solver trouble (reported per run)."""

    name: str = ""
    heterogeneity_aware: bool = True  # False: the mechanism shuffles the type order every round (as Gavel)
    skip_zero_priority: bool = False
    space_sharing: bool = False  # True: allocate() also rows for ``inp.pairs`` (after the single jobs)
    stats: dict[str, int] = field(default_factory=dict)
    _solvers: dict[str, highspy.Highs] = field(default_factory=dict, init=False, repr=False, compare=False)
    _answers: dict[tuple, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        raise NotImplementedError

    def _memo(self, inp: AllocationInput, solve: Callable[[], np.ndarray], program: tuple | None = None,
              ) -> np.ndarray:
        """``solve()``, or its earlier answer when the same jobs (throughputs, sizes, weights) on the same GPUs
        were allocated before in this run. For policies whose program depends on nothing else. ``program``:
        instead, the arrays the program is built from (the same arrays, the same program), a coarser key.

        Why: the mechanism re-allocates whenever a job arrives or ends, and a run comes back to a set of
        jobs it already solved for (a job arrives, another leaves: ~10% of Gavel's traces' allocations).
        The interior point is a deterministic function of the program, so the answer is the same.
        """
        key = (inp.throughputs.tobytes(), inp.scale_factors.tobytes(), inp.priority_weights.tobytes(),
               inp.gpus.tobytes(), inp.throughputs.shape, inp.pairs,
               inp.pair_throughputs.tobytes() if inp.pair_throughputs is not None else b"") if program is None \
            else tuple((a.tobytes(), a.shape) for a in program)
        x = self._answers.get(key)
        if x is None:
            x = solve()
            if len(self._answers) >= 512:  # bound the memory of a long run: forget the oldest
                del self._answers[next(iter(self._answers))]
            self._answers[key] = x
        else:
            self._count("lp_reused")
        return x.copy()

    def _count(self, key: str, message: str | None = None) -> None:
        """Count a solver event; the first of each kind is said on stderr (nothing degrades silently)."""
        first = key not in self.stats
        self.stats[key] = self.stats.get(key, 0) + 1
        if first and message:
            print(f"warning: {self.name}: {message} (counted in the output as solver.{key})", file=sys.stderr)

