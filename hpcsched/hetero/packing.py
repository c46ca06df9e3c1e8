"""Gavel's round mechanism with space sharing: pairs of jobs co-located on one GPU type (``--compat gavel``).

With space sharing the unit Gavel schedules is a *combination* (a job alone, or a pair of jobs of the same
scale factor sharing the same GPUs), and its bookkeeping differs from single jobs' in ways that move the
figures: ``PackedCombos`` is what ``rounds.simulate_rounds``' one loop schedules for such a policy, in place
of ``rounds.SingleJobs``. The rules, read from Gavel's ``scheduler.py`` (c4fa400:
``add_job``, ``_populate_job_combination_metadata``, ``_add_to_priorities``, ``_remove_job``,
``_update_priorities``, ``_reset_time_run_so_far``, ``_schedule_jobs_on_workers_helper``,
``_get_job_steps_and_finish_times``, ``_done_callback``) and written here anew, on top of the single-job
rules in ``rounds``' docstring:

- **Pairs.** When a job arrives, a pair is formed with every active job of the same scale factor. A pair has
  its own time received per type, deficit and allocation row; it starts with **0 s** on every type (a job
  starts with half a round), so until the next reset its time is 0 and at that reset it is charged
  ``-half`` received. A pair dies with the first of its jobs to end (or be dropped); the other job keeps
  only its own row of the allocation.
- **Order.** Per type, the combinations are taken in the order Gavel's priority dict holds them: a job,
  then its new pairs (with the older jobs, in arrival order), job by job in arrival order; the sort by
  (priority, deficit, allocation), highest first, is stable, so ties keep that order.
- **Greedy pass.** A pair is skipped when either job was already given GPUs this round, or either has no
  rate on the type; otherwise it takes ``sf`` GPUs once, for both jobs. A pair not in the current
  allocation (formed after it) is picked like a job outside it: its GPUs idle for the round.
- **A pair's micro-task.** Each job runs ``min(int(pair rate x round), its remaining steps)`` steps at its
  rate in the pair (the table's pair entry for the two job types, smaller id first); the pair ends when the
  slower of the two ends, and both jobs are charged that end. The pair (not its jobs) is charged the time,
  once; the type's total too. Each job is credited its own steps and ends (JCT) at the pair's end when it
  has no steps left.
- **Failures.** A pair's micro-task fails like a job's (a GPU given no steps of either job, or no time);
  nothing is credited, and the failure counts against neither job (Gavel counts single jobs' failures
  only), nor does a pair's success reset their counts.
- **Micro-tasks end** latest first, then single jobs before pairs, then by ids (Gavel's heap order).
- **FIFO** (``policy.skip_zero_priority``, ``fifo-packed``): a combination of priority 0 is never placed, as
  Gavel's scheduler skips them for its FIFO policies.

``gpu_seconds`` credits each job of a pair the GPUs it shared for the micro-task's time (the pair's GPU time
is counted for both jobs, as Gavel's utilisation counts it; its utilisation can exceed 1 with packing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hpcsched.hetero.round_rules import (
    MAX_FAILED_ATTEMPTS,
    RoundJob,
    RoundRun,
    alloc_rows,
    micro_task_fails,
    reset_period,
    slo_deadline,
)
from hpcsched.primitives.hetero_cluster import HeteroCluster

if TYPE_CHECKING:
    from hpcsched.hetero.policies import AllocationInput, GavelPolicy
    from hpcsched.hetero.throughputs import ThroughputTable

Task = tuple[float, tuple[int, ...], int, list[int]]  # a micro-task: (finish, members, type, steps per member)


class _State:
    """One active job's progress (its combinations' times live in ``_Combo``)."""

    __slots__ = ("job", "thr", "steps_left", "failures")

    def __init__(self, job: RoundJob, thr: list[float]) -> None:
        self.job = job
        self.thr = thr  # isolated steps/s per mechanism type index
        self.steps_left = job.total_steps
        self.failures = 0


class _Combo:
    """A job alone or a pair: what Gavel keys by ``JobIdPair``: time received, deficit, allocation, rates."""

    __slots__ = ("members", "thr", "time", "deficit", "alloc")

    def __init__(self, members: tuple[int, ...], thr: list[tuple[float, ...]], time0: float, n_types: int) -> None:
        self.members = members  # (id,) or (smaller id, larger id)
        self.thr = thr  # per mechanism type: each member's steps/s in this combination
        self.time = [time0] * n_types
        self.deficit = [0.0] * n_types
        self.alloc: list[float] | None = None  # None: not in the current allocation


class PackedCombos:
    """The combinations a space-sharing policy schedules (``rounds.RoundUnits``): each job alone and every pair."""

    def __init__(self, run: RoundRun, cluster: HeteroCluster, policy: GavelPolicy, table: ThroughputTable,
                 round_s: float) -> None:
        self.run, self.policy, self.table, self.round_s = run, policy, table, round_s
        self.prices = [cluster.price(t) or 1.0 for t in run.lp_types]
        self.active: dict[int, _State] = {}  # arrival order
        self.combos: dict[tuple[int, ...], _Combo] = {}  # Gavel's priority-dict order

    def _remove(self, jid: int) -> None:
        del self.active[jid]
        combos = self.combos
        for key in [k for k in combos if jid in k]:
            del combos[key]

    def latest(self, running: list[Task]) -> float | None:
        return max(r[0] for r in running) if running else None

    def end(self, running: list[Task], round_start: float) -> bool:
        run, active, combos = self.run, self.active, self.combos
        worker_time, gpu_seconds = run.worker_time, run.gpu_seconds
        changed = False
        running.sort(key=lambda r: (-r[0], len(r[1]), r[1]))
        for finish, members, k, steps in running:
            sf = active[members[0]].job.scale_factor
            exec_s = finish - round_start
            if exec_s <= 0 or any(micro_task_fails(s, sf) for s in steps):
                changed = True
                if len(members) == 1:
                    st = active[members[0]]
                    st.failures += 1
                    if st.failures >= MAX_FAILED_ATTEMPTS:
                        self._remove(members[0])
                        run.gone(members[0], None)
                continue
            if len(members) == 1:
                active[members[0]].failures = 0
            combo = combos[members]
            combo.time[k] += exec_s
            worker_time[k] += exec_s
            done = []
            for jid, s in zip(members, steps, strict=True):
                st = active[jid]
                st.steps_left -= s
                gpu_seconds[jid] += exec_s * sf
                if st.steps_left <= 0:
                    done.append(jid)
            for jid in done:
                self._remove(jid)
                run.gone(jid, finish)
                changed = True
        return changed

    def arrive(self, j: RoundJob) -> None:
        run, table, active, combos = self.run, self.table, self.active, self.combos
        order, n_types = run.order, run.n_types
        thr = [table.isolated(j.job_type, ty, j.scale_factor) for ty in order]
        combos[(j.id,)] = _Combo((j.id,), [(r,) for r in thr], run.half, n_types)
        for oid, other in active.items():
            if other.job.scale_factor != j.scale_factor:
                continue
            lo, hi = (oid, j.id) if oid < j.id else (j.id, oid)
            lo_t = other.job.job_type if lo == oid else j.job_type
            hi_t = j.job_type if lo == oid else other.job.job_type
            rates = [table.colocated(lo_t, hi_t, ty, j.scale_factor) for ty in order]
            combos[(lo, hi)] = _Combo((lo, hi), rates, 0.0, n_types)
        active[j.id] = _State(j, thr)

    def reset(self, elapsed: float) -> None:
        reset_period(self.combos.values(), self.run.worker_time, elapsed, self.run.half)

    def allocate(self, t: float) -> None:
        run, policy, combos = self.run, self.policy, self.combos
        if self.active:
            inp = _packed_input(self.active, combos, run.lp_types, run.lp_to_mech, run.gpus, run.order, t,
                                self.prices)
            x = policy.allocate(inp)
            run.allocations += 1
            keys = [(i,) for i in inp.job_ids] + list(inp.pairs)
            if x.shape[0] != len(keys):
                raise ValueError(f"{policy.name}: {x.shape[0]} allocation rows for {len(keys)} combinations")
            for a, key in zip(alloc_rows(x, run.lp_to_mech), keys, strict=True):
                combos[key].alloc = a

    def schedule(self, t: float, types: Sequence[int]) -> tuple[list[Task], dict[int, str]]:
        run, active, combos, round_s = self.run, self.active, self.combos, self.round_s
        worker_time, gpus, first_start, order = run.worker_time, run.gpus, run.first_start, run.order
        skip_zero = self.policy.skip_zero_priority
        queue: list[tuple[float, float, float, tuple[int, ...], int]] = []
        for k in types:
            wt = worker_time[k]
            entries = []
            for key, c in combos.items():
                a = c.alloc
                if a is None:
                    entries.append((0.0, c.deficit[k], 0.0, key, k))
                    continue
                ak = a[k]
                if ak == 0.0 or any(r == 0 for r in c.thr[k]):
                    p = 0.0
                else:
                    frac = c.time[k] / wt if wt != 0.0 else 0.0
                    p = ak / frac if frac > 0.0 else ak * 1e9
                entries.append((p, c.deficit[k], ak, key, k))
            entries.sort(key=lambda e: (e[0], e[1], e[2]), reverse=True)  # stable: ties keep the dict order
            queue += entries
        left = list(gpus)
        free = sum(left)
        taken: set[int] = set()
        running: list[Task] = []
        scheduled: dict[int, str] = {}
        for p, _, _, key, k in queue:
            if not free:
                break
            if not left[k] or any(m in taken for m in key):
                continue
            if skip_zero and p <= 0.0:  # FIFO (fifo-packed) never places a combination of priority 0
                continue
            c = combos[key]
            if any(r <= 0 for r in c.thr[k]):
                continue
            sf = active[key[0]].job.scale_factor
            if sf > left[k]:
                continue
            left[k] -= sf
            free -= sf
            taken.update(key)
            if c.alloc is None:
                continue  # picked, but outside the allocation: Gavel gives it no GPUs, they idle
            finish = t
            steps = []
            for jid, r in zip(key, c.thr[k], strict=True):
                s = min(int(r * round_s), active[jid].steps_left)
                steps.append(s)
                finish = max(finish, t + s / r)
                if first_start[jid] is None:
                    first_start[jid] = t
                scheduled[jid] = order[k]
            running.append((finish, key, k, steps))
        return running, scheduled


def _packed_input(active: dict[int, _State], combos: dict[tuple[int, ...], _Combo], lp_types: list[str],
                  lp_to_mech: list[int], gpus: list[int], order: list[str], now: float,
                  prices: list[float]) -> AllocationInput:
    """The policy's input: single jobs sorted by id, then the live pairs sorted by ids (Gavel's matrix order)."""
    import numpy as np

    from hpcsched.hetero.policies import AllocationInput

    ids = sorted(active)
    sts = [active[i] for i in ids]
    pairs = sorted(key for key in combos if len(key) == 2)
    pthr = np.array([[combos[p].thr[k] for k in lp_to_mech] for p in pairs], dtype=float).reshape(len(pairs),
                                                                                                 len(lp_types), 2)
    return AllocationInput(
        job_ids=tuple(ids), types=tuple(lp_types),
        throughputs=np.array([[st.thr[k] for k in lp_to_mech] for st in sts], dtype=float),
        scale_factors=np.array([st.job.scale_factor for st in sts], dtype=float),
        priority_weights=np.array([st.job.priority_weight for st in sts], dtype=float),
        steps_remaining=np.array([st.steps_left for st in sts], dtype=float),
        times_since_start=np.array([now - st.job.arrival for st in sts], dtype=float),
        gpus=np.array([gpus[order.index(t)] for t in lp_types], dtype=float),
        job_types=tuple(st.job.job_type for st in sts),
        prices=np.array(prices, dtype=float),
        slo_left=np.array([slo_deadline(st.job, st.thr) - now for st in sts], dtype=float),
        pairs=tuple(pairs), pair_throughputs=pthr,
    )
