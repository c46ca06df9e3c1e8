"""Sia's scheduling policy: one integer program per round over (job x GPU type x nodes x GPUs).

Each job may take one configuration (GPU type, nodes, GPUs) from a fixed menu per type: 1, 2, 4 (and 8 on
8-GPU nodes) GPUs on one node, then whole nodes. The value of a configuration is the job's best goodput
there (batch size re-optimised for it), normalised by the job's smallest non-zero goodput anywhere, so a
row is the job's speed-up over its slowest useful configuration. A GPU type the job has not run on yet is
valued by projecting its model from a type it has run on, scaled by the ratio of the two types' 1-GPU
speeds (``project_throughputs``); a job that has run nowhere is offered 1 GPU of each type at value 1.
Changing a job's configuration costs the restart factor ``max(age - restarts x P, 0) / (age + P)`` (P: the
job's measured restart penalty), and a job in its checkpoint-restore pause keeps its configuration.

The program (p < 0, a minimisation): ``min sum(X * A) + lambda_n * (jobs - sum(X))`` with ``A = value^p``
rounded to 2 decimals and clipped at 3000, at most one configuration per job, GPUs per type within
capacity. The artifact solves it with CBC (0.01% gap); here HiGHS, whose choice between equally good
configurations may differ (counted nowhere because it is not knowable; the figures are compared instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hpcsched.sia.job import SiaJob

CONFIGS_4GPU = (np.asarray([1, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]),
                np.asarray([1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64]))
CONFIGS_8GPU = (np.asarray([1, 1, 1, 1, 2, 3, 4, 5, 6, 7, 8]),
                np.asarray([1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]))

ZERO_ALLOC_GAIN = 0.0001
"""The value of a configuration a job cannot use (so its power p < 0 makes it prohibitively costly)."""

GOODPUT_CLIP = 3000.0

RESTART_PENALTY_S = (("deepspeech", 25), ("imagenet", 250), ("cifar", 30), ("bert", 120), ("yolov3", 45))
"""Restart penalties measured on the real cluster, by job-name prefix; 30 s for any other job."""


def restart_penalty(job_name: str) -> int:
    for prefix, seconds in RESTART_PENALTY_S:
        if prefix in job_name:
            return seconds
    return 30


@dataclass
class SiaPolicy:
    """Sia with the artifact's defaults (``p = -0.5``, ``lambda_n = 1.1``, projection and shared maximum
    replicas on). ``nodes``/``gpus_per_node``: per GPU type, in the cluster's order."""

    nodes: dict[str, int]
    gpus_per_node: dict[str, int]
    max_physical_nodes: dict[str, int]
    p: float = -0.5
    lambda_n: float = 1.1
    tie_break: str = "prev-high"
    tie_seed: int = 0
    prev_config: dict[str, int | None] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.p >= 0:
            raise ValueError("Sia's program here is its p < 0 form (a minimisation): use p < 0")
        self.types = list(self.nodes)
        self.configs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.config_list: list[tuple[str, int, int]] = []
        for t in self.types:
            n = min(self.nodes[t], self.max_physical_nodes.get(t, self.nodes[t]))
            base = CONFIGS_4GPU if self.gpus_per_node[t] == 4 else CONFIGS_8GPU
            keep = base[0] <= n
            self.configs[t] = (base[0][keep], base[1][keep])
            self.config_list += [(t, int(a), int(b)) for a, b in zip(*self.configs[t], strict=True)]
        self._rng = np.random.default_rng(self.tie_seed)
        self.capacity = np.asarray([self.nodes[t] * self.gpus_per_node[t] for t in self.types], dtype=float)

    # ---- the value matrix --------------------------------------------------------------------------------
    def _goodputs(self, job: SiaJob, t: str, nnodes: np.ndarray, ngpus: np.ndarray,
                  one_gpu_rate: dict[str, float]) -> np.ndarray | None:
        fn = self._speedup(job, t)
        if fn is not None:
            return np.asarray(fn(nnodes.astype(np.float32), ngpus.astype(np.float32)), dtype=np.float32)
        src = next((s for s in self.types if self._speedup(job, s) is not None), None)
        if src is None:
            return None
        tr_nodes = np.ceil(ngpus / self.gpus_per_node[src]).astype(np.uint32)
        mult = one_gpu_rate[t] / one_gpu_rate[src]
        got = np.asarray(self._speedup(job, src)(tr_nodes.astype(np.float32), ngpus.astype(np.float32)),
                         dtype=np.float32)
        return got * mult

    @staticmethod
    def _speedup(job: SiaJob, t: str):  # noqa: ANN205 (a closure over the job's current model)
        fn = job.goodput_fn(t)
        if fn is None:
            return None
        app = job.apps[t]
        max_bsz = job.target_batch_size
        rng = (app.min_local_bsz, app.max_local_bsz)
        return lambda nodes, reps: fn.optimize(nodes, reps, max_bsz, rng, tune_bsz=job.tune_bsz)[0]

    def value_matrix(self, jobs: list[SiaJob], now: float) -> tuple[np.ndarray, list[float]]:
        """Normalised goodput per (job, configuration), float32 as the artifact's, and restart factors."""
        rows, factors = [], []
        for job in jobs:
            apps = job.apps
            one_gpu = {t: apps[t].one_gpu_rate() for t in self.types}
            max_reps = max(min(max(2 * job.max_profiled_replicas(t), 1), 64,
                               apps[t].max_batch_size // apps[t].min_local_bsz) for t in self.types)
            max_reps = max(1, max_reps)
            mats, missing = {}, set()
            for t in self.types:
                mats[t] = np.zeros(len(self.configs[t][0]), dtype=np.float32) + ZERO_ALLOC_GAIN
                if self._speedup(job, t) is None and all(self._speedup(job, s) is None for s in self.types):
                    missing.add(t)
                    continue
                nn, ng = self.configs[t]
                valid = (ng <= max_reps) & (ng >= 1)
                vals = self._goodputs(job, t, nn[valid], ng[valid], one_gpu)
                mats[t][valid] = vals
                if not valid.any():
                    missing.add(t)
            mins = [np.min(mats[t][mats[t] > ZERO_ALLOC_GAIN]) for t in self.types if t not in missing]
            min_goodput = np.min(np.asarray(mins)) if mins else 1
            scale = 1.0 / min_goodput
            for t in self.types:
                mats[t] *= scale
                if t in missing:
                    mats[t][self.configs[t][1] == 1] = 1
                mats[t][mats[t] <= ZERO_ALLOC_GAIN] = ZERO_ALLOC_GAIN
            rows.append(np.concatenate([mats[t] for t in self.types]))
            pen = restart_penalty(job.name)
            age = now - job.submission_time
            factor = max(age - (job.num_restarts or 0) * pen, 0) / (age + pen)
            factors.append(1.0 if age < pen else factor)
        mat = np.vstack(rows) if rows else np.zeros((0, len(self.config_list)), dtype=np.float32)
        return mat, factors

    # ---- the program ---------------------------------------------------------------------------------------
    def optimize(self, jobs: list[SiaJob], now: float) -> dict[str, tuple[str | None, list[int]]]:
        """{job: (GPU type, node index per GPU)} for the active ``jobs`` (in submission order); (None, [])
        for a job left without GPUs."""
        if not jobs:
            return {}
        mat, factors = self.value_matrix(jobs, now)
        for i, job in enumerate(jobs):
            prev = self.prev_config.get(job.name)
            if prev is not None:
                keep = mat[i, prev]
                mat[i, :] *= factors[i]
                mat[i, prev] = keep
        a = np.power(mat, self.p)
        a = np.round(a, decimals=2)
        a[a > GOODPUT_CLIP] = GOODPUT_CLIP
        fixed: dict[int, int] = {}
        for i, j in enumerate(jobs):
            kept = self.prev_config.get(j.name)
            if j.rescale_time > 0 and kept is not None:
                fixed[i] = kept
        chosen = self._solve(a.astype(float), fixed, [self.prev_config.get(j.name) for j in jobs])
        self.prev_config = {j.name: chosen[i] for i, j in enumerate(jobs)}
        per_type: dict[str, dict[str, tuple[int, int]]] = {}
        for i, job in enumerate(jobs):
            c = chosen[i]
            if c is not None:
                t, nn, ng = self.config_list[c]
                per_type.setdefault(t, {})[job.name] = (nn, ng)
        out: dict[str, tuple[str | None, list[int]]] = {j.name: (None, []) for j in jobs}
        for t in self.types:
            if t in per_type:
                for name, nodes in self.place(t, per_type[t]).items():
                    out[name] = (t, nodes)
        return out

    def _integer_costs(self, a: np.ndarray, prev: list[int | None] | None = None) -> np.ndarray:
        """Costs in hundredths (the values are rounded to 2 decimals, so exact integers) times a weight that
        leaves room below for a tie-break among equally good solutions: the rank of each column in the
        artifact's variable order (cvxpy's column-major X: configuration first, then job), lowest first
        (``tie_break="low"``) or highest (``"high"``); ``"prev-high"`` (the default) first keeps each job's
        previous configuration, then highest; ``"random"``: a fresh seeded order per solve (``tie_seed``). Which
        optimum CBC returns follows its search, which no rule reproduces; "prev-high" came closest on the saturn
        cuts (docs/sia.md)."""
        m, k = a.shape
        cents = np.rint(a * 100.0) - round(self.lambda_n * 100)
        rank = (np.arange(k)[None, :] * m + np.arange(m)[:, None]).astype(float)
        if self.tie_break == "high":
            rank = m * k - 1 - rank
        elif self.tie_break.startswith("prev-"):
            if self.tie_break in ("prev-high", "prev-high-newlow"):
                rank = m * k - rank
            else:
                rank = rank + 1
            for i, c in enumerate(prev or []):
                if c is not None:
                    rank[i, c] = 0
                elif self.tie_break == "prev-high-newlow":  # a job never placed: lowest column first
                    rank[i] = np.arange(k) * m + i + 1
        elif self.tie_break == "random":
            rank = self._rng.permutation(m * k).reshape(m, k).astype(float)
        elif self.tie_break == "none":
            rank = np.zeros_like(rank)
        big = float(m * m * k + 1)
        return (cents * big + rank).ravel()

    def _solve(self, a: np.ndarray, fixed: dict[int, int], prev: list[int | None]) -> list[int | None]:
        import time

        import highspy

        from hpcsched.solvers.highs import new_highs, run

        m, k = a.shape
        h = new_highs()
        h.setOptionValue("mip_rel_gap", 0.0)
        h.setOptionValue("mip_abs_gap", 0.5)
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = m * k, m + len(self.types)
        lp.col_cost_ = self._integer_costs(a, prev)
        lower = np.zeros(m * k)
        for i, c in fixed.items():
            lower[i * k + c] = 1.0
        lp.col_lower_, lp.col_upper_ = lower, np.ones(m * k)
        gpus = np.asarray([c[2] for c in self.config_list], dtype=float)
        tidx = np.asarray([self.types.index(c[0]) for c in self.config_list])
        starts, index, value = [0], [], []
        for i in range(m):
            for c in range(k):
                index += [i, m + int(tidx[c])]
                value += [1.0, float(gpus[c])]
                starts.append(len(index))
        lp.row_lower_ = np.full(m + len(self.types), -highspy.kHighsInf)
        lp.row_upper_ = np.concatenate([np.ones(m), self.capacity])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = starts, index, value
        lp.integrality_ = [highspy.HighsVarType.kInteger] * (m * k)
        h.passModel(lp)
        t0 = time.perf_counter()
        run(h)
        self.stats["solve_s"] = self.stats.get("solve_s", 0.0) + time.perf_counter() - t0
        self.stats["solves"] = self.stats.get("solves", 0) + 1
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            raise RuntimeError(f"Sia's program: HiGHS ended with {h.modelStatusToString(h.getModelStatus())}")
        x = np.round(np.asarray(h.getSolution().col_value).reshape(m, k))
        return [int(np.argmax(x[i])) if x[i].sum() > 0 else None for i in range(m)]

    # ---- placement -----------------------------------------------------------------------------------------
    def place(self, t: str, allocs: dict[str, tuple[int, int]]) -> dict[str, list[int]]:
        """Pack GPU counts onto one type's nodes (the artifact's fast packing: largest jobs first, whole nodes
        for multi-node jobs, one node pointer carried from job to job)."""
        free = [self.gpus_per_node[t]] * self.nodes[t]
        per_node, n = self.gpus_per_node[t], self.nodes[t]
        cur, out = 0, {}
        for name, (_, gpus) in sorted(allocs.items(), key=lambda kv: kv[1][1], reverse=True):
            node, full = cur, gpus // per_node
            placed: list[int] = []
            if gpus == 0:
                out[name] = placed
                continue
            checked = 0
            while full > 0 and checked < n:
                if free[node] == per_node:
                    free[node] = 0
                    gpus -= per_node
                    placed += [node] * per_node
                    full -= 1
                node = (node + 1) % n
                checked += 1
            while gpus > 0:
                if free[node]:
                    take = min(gpus, free[node])
                    gpus -= take
                    free[node] -= take
                    placed += [node] * take
                node = (node + 1) % n
            out[name] = placed
            cur = node
        return out
