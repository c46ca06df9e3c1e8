"""Finish-time fairness (Themis's metric, heterogeneity-aware): minimise the worst finish-time ratio rho."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hpcsched.hetero.policies.base import AllocationInput, GavelPolicy
from hpcsched.hetero.policies.lp import MaxMinValue, isolated, max_min_allocation
from hpcsched.hetero.policies.registry import GavelOptions, register

if TYPE_CHECKING:
    import numpy as np


@dataclass
class FinishTimeFairnessPerf(GavelPolicy):
    """Minimise the worst rho = (time since arrival + remaining steps / throughput under x) / (the job's
    finish time on its isolated share, counting progress so far at the isolated speed) (Gavel's
    ``finish_time_fairness_perf``).

    Gavel states it with ``inv_pos`` (a second-order cone program); for a fixed rho the constraints are
    linear (each job needs throughput ``rem / (rho E - elapsed)``), so rho* is found by a Dinkelbach-style
    iteration of max-min LPs, each lowering rho to what its allocation achieves, until it stops moving.
    """

    _cum_iso: dict[int, float] = field(init=False, repr=False, default_factory=dict)
    _prev_rem: dict[int, float] = field(init=False, repr=False, default_factory=dict)
    _prev_iso: dict[int, float] = field(init=False, repr=False, default_factory=dict)

    def isolated_finish(self, inp: AllocationInput, iso: np.ndarray) -> np.ndarray:
        """Each job's finish time on its isolated share ``iso`` (steps/s): the progress since the previous call
        counted at the isolated speed it had then (Gavel keeps this sum across calls), plus what remains at
        today's. Called once per allocation: it advances the bookkeeping."""
        import numpy as np

        rem = inp.steps_remaining
        for r, j in enumerate(inp.job_ids):
            c = self._cum_iso.setdefault(j, 0.0)
            if j in self._prev_rem:
                self._cum_iso[j] = c + (self._prev_rem[j] - rem[r]) / self._prev_iso[j]
        e_iso = np.array([self._cum_iso[j] for j in inp.job_ids]) + rem / iso
        self._prev_rem = dict(zip(inp.job_ids, rem, strict=True))
        self._prev_iso = dict(zip(inp.job_ids, iso, strict=True))
        return e_iso

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        thr, sf, rem, since = inp.throughputs, inp.scale_factors, inp.steps_remaining, inp.times_since_start
        iso = isolated(thr, sf, inp.gpus)
        e_iso = self.isolated_finish(inp, iso)

        def rho_of(x: np.ndarray) -> float:
            y = (thr * x).sum(axis=1)
            with np.errstate(divide="ignore"):
                return float(np.max((since + np.where(y > 0, rem / np.where(y > 0, y, 1), np.inf)) / e_iso))

        m, n = thr.shape
        x_iso = np.tile(inp.gpus / m, (m, 1)) / sf[:, None]
        x = x_iso / np.maximum(x_iso.sum(axis=1), 1.0)[:, None]
        hi = rho_of(x)  # the isolated share is feasible: an upper bound
        best_alone = (thr * np.minimum(1.0, inp.gpus[None, :] / sf[:, None])).max(axis=1)
        lo = float(np.max((since + rem / best_alone) / e_iso))  # each job alone on its best type: a lower bound
        feasible = None
        if hi - lo > 1e-9 * hi:
            feasible = self._search(MaxMinValue(self, thr, sf, inp.gpus), rem, since, e_iso, lo, hi)
        if feasible is not None:  # the allocation: the interior point at the last feasible rho
            x = np.clip(max_min_allocation(self, thr / feasible[:, None], sf, inp.gpus), 0.0, 1.0)
        return x

    def _search(self, value: MaxMinValue, rem: np.ndarray, since: np.ndarray, e_iso: np.ndarray, lo: float,
                hi: float) -> np.ndarray | None:
        """The steps/s each job needs at the smallest rho (to 1e-9) with lambda(rho) >= 1, or None.

        lambda(rho) (how far the needs at rho can be exceeded) is increasing, smooth between kinks where
        the binding jobs change. The root is bracketed by ``lo`` (infeasible) and ``hi`` (feasible) and
        found by regula falsi with the Illinois rule (an end kept twice has its value halved, so kinks
        cannot stall it): superlinear, 3-6 LPs where plain bisection needs 30.
        """
        def f(rho: float) -> tuple[float, np.ndarray]:
            need = rem / (rho * e_iso - since)  # steps/s each job needs to finish by rho
            return value(need)[0] - 1.0, need

        f_hi, feasible = f(hi)
        if f_hi < 0:  # the isolated share itself only within the solver's tolerance: keep it
            return None
        # lo is often rho* itself (the worst job alone on its best type): try just above it first
        probe = lo * (1.0 + 5e-10)
        if (probe * e_iso - since).min() > 0:
            f_lo, need = f(probe)
            if f_lo >= 0:
                return need
            lo = probe
        else:
            f_lo = -1.0
        side = 0
        for _ in range(60):
            if hi - lo <= 1e-9 * hi:
                return feasible
            cand = hi - f_hi * (hi - lo) / (f_hi - f_lo) if f_hi != f_lo else 0.5 * (lo + hi)
            if not lo < cand < hi:
                cand = 0.5 * (lo + hi)
            f_c, need = f(cand)
            if f_c >= 0:
                hi, f_hi, feasible = cand, f_c, need
                if f_c <= 1e-9:  # lambda = 1 to 1e-9: rho* to about as much (lambda's slope is ~1 / rho)
                    return feasible
                if side == 1:
                    f_lo *= 0.5
                side = 1
            else:
                lo, f_lo = cand, f_c
                if side == -1:
                    f_hi *= 0.5
                side = -1
        self._count("ftf_not_converged", "finish-time fairness: rho not within 1e-9 after 60 LPs")
        return feasible



@register("finish-time-fairness-perf",
          "minimise the worst finish-time ratio rho (Themis's metric, "
          "heterogeneity-aware)")
def _ftf(opts: GavelOptions) -> GavelPolicy:
    return FinishTimeFairnessPerf(name="finish-time-fairness-perf")
