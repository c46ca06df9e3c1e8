"""Max-min fairness by water filling, optionally hierarchical over users or projects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hpcsched.hetero.policies.base import AllocationInput, GavelPolicy
from hpcsched.hetero.policies.lp import infeasible_status, lp_program, proportional, solve_ipm
from hpcsched.hetero.policies.registry import GavelOptions, register

if TYPE_CHECKING:
    import numpy as np


@dataclass
class WaterFilling(GavelPolicy):
    """Max-min fairness by water filling, optionally hierarchical (Gavel's ``max_min_fairness_water_filling``
    and ``..._perf``; with ``entity_weights``, its hierarchical policy with the 'fairness' reweighting).

    Plain max-min fairness fixes only the worst job's share; water filling keeps raising the others: it
    solves the weighted max-min program, freezes the jobs that cannot get more without taking from a
    frozen one (the bottlenecks), and repeats on the rest, each job never below the level it reached.
    Normalised throughput is ``sum_j T_ij x_ij / P_i`` (P_i: the job's throughput on an equal share of every
    type; all throughputs 1 when agnostic). Bottlenecks are found as Gavel finds them, by a MILP that
    makes as many unfrozen jobs as possible exceed ``1.0001 x`` their level (by 1e-5); a job it cannot
    lift is frozen.

    Hierarchical: each entity (user or project, ``AllocationInput.entities``) has a weight; its unfrozen
    jobs share it in proportion to their own priority weights, so an entity's share does not grow with
    its number of jobs. Jobs with no entity, or an entity with no weight, keep their own weight.
    """

    agnostic: bool = False
    entity_weights: dict[str, float] = field(default_factory=dict)

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        import numpy as np

        thr = np.ones_like(inp.throughputs) if self.agnostic else inp.throughputs
        sf, gpus, m = inp.scale_factors, inp.gpus, len(inp.job_ids)
        prop = proportional(thr, gpus)
        norm = thr / prop[:, None]  # normalised throughput per unit of x
        level = np.zeros(m)  # each job's normalised throughput reached so far
        frozen = np.zeros(m, dtype=bool)
        x = np.zeros_like(thr)
        big = float(np.max(norm * sf[:, None])) if m else 0.0  # Gavel's M
        for _ in range(m):
            w = self._weights(inp, frozen)
            live = ~frozen & (w > 0)
            if not live.any():
                break
            x_new, t = self._raise(norm, sf, gpus, level, frozen, w, live)
            if x_new is None:
                break
            x = x_new
            level = np.where(live, level + t * w / sf, level)
            liftable = self._liftable(norm, sf, gpus, level, frozen | ~live, big)
            newly = live & ~liftable
            if not newly.any():
                break
            frozen |= newly
            if frozen.all():
                break
        return np.clip(x, 0.0, 1.0)

    def _weights(self, inp: AllocationInput, frozen: np.ndarray) -> np.ndarray:
        """Each job's weight this round: its own, or its entity's weight shared by the entity's unfrozen jobs."""
        import numpy as np

        w = np.array(inp.priority_weights, dtype=float)
        if not self.entity_weights or not inp.entities:
            return np.where(frozen, 0.0, w)
        out = np.where(frozen, 0.0, w)
        for e, ew in self.entity_weights.items():
            members = np.array([x == e for x in inp.entities]) & ~frozen
            total = w[members].sum()
            if total > 0:
                out[members] = ew * w[members] / total
        return out

    def _raise(self, norm: np.ndarray, sf: np.ndarray, gpus: np.ndarray, level: np.ndarray, frozen: np.ndarray,
               w: np.ndarray, live: np.ndarray) -> tuple[np.ndarray | None, float]:
        """max t: every live job's ``sf_i / w_i (normalised throughput - level_i) >= t``, every job >= its level."""
        import numpy as np

        m, n = norm.shape
        mult = np.where(live, sf / np.where(live, w, 1.0), 0.0)  # Gavel's: a larger weight, a larger raise
        # rows: sum_j norm_ij x_ij - t / mult_i >= level_i for live jobs; >= level_i (no t) for the others
        t_coef = np.where(live, -1.0 / np.where(live, mult, 1.0), 0.0)
        v = solve_ipm(self, lp_program(norm, sf, gpus, t_coef=t_coef, lo=level))
        h = self._solvers["ipm"]
        if h.getModelStatus() == infeasible_status():
            return None, 0.0
        return v[:-1].reshape(m, n), float(max(v[-1], 0.0))

    def _liftable(self, norm: np.ndarray, sf: np.ndarray, gpus: np.ndarray, level: np.ndarray,
                  fixed: np.ndarray, big: float) -> np.ndarray:
        """Which jobs can exceed 1.0001 x their level together, every job kept at its level (Gavel's MILP)."""
        import highspy
        import numpy as np

        from hpcsched.solvers.highs import new_highs, run

        m, n = norm.shape
        nx = m * n
        slack, eps = 1.0001, 1e-5
        # columns: x (m x n), z (m, binary); maximise sum z. Rows: base; y_i >= level_i; Gavel's big-M pair:
        # y_i - big z_i <= slack level_i - eps (z_i = 0 keeps y_i at its level) and y_i - big z_i >= slack
        # level_i - big (z_i = 1 needs y_i >= slack level_i).
        lp = lp_program(norm, sf, gpus, lo=level, cost=np.zeros(nx))
        h = new_highs()
        h.passModel(lp)
        inf = highspy.kHighsInf
        h.addVars(m, np.zeros(m), np.where(fixed, 0.0, 1.0))
        h.changeColsCost(m, np.arange(nx, nx + m, dtype=np.int32), -np.ones(m))
        h.changeColsIntegrality(m, np.arange(nx, nx + m, dtype=np.int32),
                                np.full(m, highspy.HighsVarType.kInteger))
        for i in range(m):
            cols = np.append(np.arange(i * n, i * n + n), nx + i).astype(np.int32)
            # y_i - slack level_i + eps <= big z_i
            h.addRow(-inf, slack * level[i] - eps, n + 1, cols, np.append(norm[i], -big))
            # slack level_i - y_i <= big (1 - z_i)  <=>  y_i - big z_i >= slack level_i - big
            h.addRow(slack * level[i] - big, inf, n + 1, cols, np.append(norm[i], -big))
        status = run(h)
        self._count("milp_solves")
        if status != highspy.HighsModelStatus.kOptimal:
            self._count("milp_not_optimal", f"water filling: the bottleneck MILP returned "
                                            f"{h.modelStatusToString(status)}; every job is taken as a bottleneck")
            return np.zeros(m, dtype=bool)
        z = np.asarray(h.getSolution().col_value)[nx:]
        return z > 0.5


@register("max-min-fairness-water-filling",
          "max-min fairness by water filling (every job raised as far as it can go), "
          "heterogeneity-agnostic")
def _agnostic(opts: GavelOptions) -> GavelPolicy:
    return WaterFilling(name="max-min-fairness-water-filling", heterogeneity_aware=False, agnostic=True,
                        entity_weights=dict(opts.entity_weights))


@register("max-min-fairness-water-filling-perf",
          "water-filling max-min fairness, heterogeneity-aware; hierarchical "
          "with entity weights")
def _perf(opts: GavelOptions) -> GavelPolicy:
    return WaterFilling(name="max-min-fairness-water-filling-perf", entity_weights=dict(opts.entity_weights))
