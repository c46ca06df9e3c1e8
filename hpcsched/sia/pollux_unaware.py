"""Pollux on a heterogeneous cluster, as the Sia paper ran it (its Table 3 baseline): heterogeneity-unaware.

The Sia artifact (``multi_simulator_unaware.py --policy pollux --policy_p_val -1 --interval 60``, its
``cluster_unaware.py``; read for semantics, none of it shipped) gives Pollux's own policy a cluster it cannot
tell apart: every node is cut into virtual nodes of the smallest node's GPU count (saturn: 6 x 4 T4, 2 x 8
A100, 3 x 8 RTX -> 16 virtual nodes of 4 GPUs), and each job keeps one throughput model for all GPU types.
Each 60 s round:

1. Pollux's search (:class:`hpcsched.compat.pollux_ga.PolluxGAPolicy`, seeded) allocates virtual nodes, each
   job's speedup from its one model, its batch limits those of the T4 (``aws``) profile, at most as many GPUs
   as the smallest GPU type has (``clusterwide_max_replicas``);
2. an allocation spanning GPU types keeps only its majority type (ties: the stronger type), dropping the rest;
3. virtual nodes map back to real nodes; the job trains on that type's real profile (a change of type is a
   migration), and what it sees goes into its one model.

The one difference from the artifact, said where figures are reported: the search is our seeded NSGA-II-like
one, not pymoo's (as for ``--compat pollux``). Its objective is the artifact's to the bit (its search scores
integer allocations in float64, as ours does) and both reach the same optimum on the rounds compared
(``bench/bench_sia_pollux_check.py``, docs/sia.md).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from hpcsched.sia.job import SiaJob

TYPE_PRIORITY = {"dgx-ext": 0, "azure": 1, "quad": 2, "rtx": 3, "aws": 4}
"""Which type a tied allocation keeps (lower first: the artifact keeps the more powerful GPUs)."""
BATCH_TYPE = "aws"
"""The GPU type whose batch limits an unaware job's speedup uses (the artifact reads ``applications['aws']``)."""


@dataclass(frozen=True)
class _AppLimits:
    name: str
    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int
    max_local_bsz: int


class UnawareJobView:
    """What Pollux's search reads of a job (``SimJob``'s fields), from an unaware :class:`SiaJob`."""

    def __init__(self, job: SiaJob) -> None:
        app = job.apps.get(BATCH_TYPE) or next(iter(job.apps.values()))
        # the artifact sets ncf's batch to Sia's fixed one; its speedup function then tops out there
        max_batch = job.target_batch_size if job.app == "ncf" else app.max_batch_size
        self.app = _AppLimits(job.app, app.init_batch_size, max_batch, app.min_local_bsz, app.max_local_bsz)
        self.perf_params = job.perf_params.get(job.model_key(BATCH_TYPE))
        self.grad_params = job.grad_params
        self.max_profiled_replicas = job.max_profiled_replicas(BATCH_TYPE)
        self.attained_service = job.attained_service
        self.submission_time = job.submission_time
        self.num_restarts = job.num_restarts


class UnawarePollux:
    """Pollux's policy over virtual nodes of a heterogeneous cluster; ``optimize`` gives each job
    (GPU type or None, real node index per GPU) as :class:`hpcsched.sia.policy.SiaPolicy` does."""

    def __init__(self, nodes: dict[str, int], gpus_per_node: dict[str, int], seed: int = 0,
                 pop_size: int = 100, n_gen: int = 100) -> None:
        from hpcsched.compat.pollux_ga import PolluxGAPolicy

        self.vnode_gpus = min(gpus_per_node.values())
        self.vnodes: list[tuple[str, int]] = []  # virtual node -> (GPU type, real node index)
        for t, n in nodes.items():
            per = gpus_per_node[t] // self.vnode_gpus
            self.vnodes += [(t, node) for node in range(n) for _ in range(per)]
        # the most GPUs a job may get: the smallest type's count (every type has all its nodes here)
        cap = min(nodes[t] * gpus_per_node[t] for t in nodes)
        self.ga = PolluxGAPolicy(nodes=len(self.vnodes), gpus_per_node=self.vnode_gpus, seed=seed,
                                 pop_size=pop_size, n_gen=n_gen, max_replicas_cap=cap)
        self.prev: dict[str, list[int]] = {}  # the last round's virtual allocations, after the repair
        self.stats: dict[str, Any] = {"rounds": 0, "gpus_dropped": 0, "allocations_repaired": 0}

    def optimize(self, jobs: list[SiaJob], now: float) -> dict[str, tuple[str | None, list[int]]]:
        views = {j.name: UnawareJobView(j) for j in jobs}
        prev = {k: v for k, v in self.prev.items() if k in views}
        raw = self.ga.optimize(views, prev, now)  # type: ignore[arg-type]  # duck-typed SimJob
        self.stats["rounds"] += 1
        repaired = {j.name: self._keep_majority(raw.get(j.name, [])) for j in jobs}
        self.prev = repaired
        out: dict[str, tuple[str | None, list[int]]] = {}
        for name, alloc in repaired.items():
            if not alloc:
                out[name] = (None, [])
                continue
            out[name] = (self.vnodes[alloc[0]][0], sorted(self.vnodes[v][1] for v in alloc))
        return out

    def _keep_majority(self, alloc: list[int]) -> list[int]:
        """An allocation over several GPU types keeps its most numerous type (ties: the stronger); GPUs of the
        other types are dropped for the round (counted in ``stats``)."""
        if not alloc:
            return []
        counts = Counter(self.vnodes[v][0] for v in alloc).most_common()
        if len(counts) == 1:
            return list(alloc)
        chosen = counts[0][0]
        if counts[0][1] == counts[1][1] and TYPE_PRIORITY.get(counts[1][0], 99) < TYPE_PRIORITY.get(chosen, 99):
            chosen = counts[1][0]
        kept = [v for v in alloc if self.vnodes[v][0] == chosen]
        self.stats["gpus_dropped"] += len(alloc) - len(kept)
        self.stats["allocations_repaired"] += 1
        return kept
