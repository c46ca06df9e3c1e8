"""The rules of Gavel's round mechanism that its one loop (``hetero.rounds``) and the runtime's round executor
(``hetero.round_executor``) share: the job and result records, the clock between rounds, Gavel's reset, priority
queue and greedy pass, a micro-task's failure, and the policy's input. The rules are written out in
``hetero.rounds``' docstring.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from hpcsched.primitives.hetero_cluster import HeteroCluster

if TYPE_CHECKING:
    from hpcsched.hetero.policies import AllocationInput, GavelPolicy
    from hpcsched.hetero.throughputs import ThroughputTable

ROUND_S = 360.0
"""Gavel's ``--time_per_iteration`` default and the figures' setting."""
RESET_S = 1920.0
"""Gavel's ``minimum_time_between_allocation_resets``."""
MAX_FAILED_ATTEMPTS = 5
"""Consecutive failed micro-tasks after which Gavel drops a job."""
MECHANISM_ORDER = ("v100", "p100", "k80")
"""Gavel's hard-coded order of GPU types in the greedy pass; other types follow in the cluster's order."""


@dataclass(frozen=True, slots=True)
class RoundJob:
    """What the mechanism needs of a job: Gavel's trace fields, with the job's index as its id."""

    id: int
    job_type: str
    total_steps: int
    scale_factor: int
    arrival: float
    priority_weight: float = 1.0
    slo: float | None = None  # Gavel's SLO field (None when the trace has a negative one): min-cost's SLOs
    entity: str | None = None  # the user or project the job belongs to (hierarchical fairness)


@dataclass(slots=True)
class RoundsResult:
    """Per-job ends (None: dropped after repeated failures) and the run's counters."""

    jobs: list[RoundJob]
    end: list[float | None]
    first_start: list[float | None]
    makespan: float
    rounds: int
    allocations: int
    gpu_seconds: list[float]
    wall_s: float
    solver: dict[str, int] = field(default_factory=dict)

    @property
    def avg_jct(self) -> float | None:
        """Gavel's ``get_average_jct``: the mean over jobs that completed (numpy's summation order)."""
        import numpy as np

        jct = [e - j.arrival for j, e in zip(self.jobs, self.end, strict=True) if e is not None]
        return float(np.mean(jct)) if jct else None


class RoundState(Protocol):
    """What the rules below read and write of one active job (``rounds.SingleJobs`` keeps one per job; the
    runtime's executor, ``hpcsched.hetero.round_executor``, keeps its own): times and deficits per mechanism
    type index."""

    job: RoundJob
    thr: list[float]  # steps/s per mechanism type index
    steps_left: int
    time: list[float]  # time received per type since the last reset (+ half a round)
    deficit: list[float]
    alloc: list[float] | None  # None: not in the current allocation
    deadline: float


class PeriodState(Protocol):
    """What a reset reads and writes: a job's (or, with space sharing, a pair's) accounting per type."""

    time: list[float]
    deficit: list[float]
    alloc: list[float] | None




def slo_deadline(job: RoundJob, thr: Sequence[float]) -> float:
    """Gavel's SLO deadline: arrival + SLO x the job's duration, which its generator defines on a V100 (the
    fastest type); here on the fastest type the job has (``thr``: its isolated steps/s per type). inf: none."""
    best = max(thr) if thr else 0.0
    return job.arrival + job.slo * job.total_steps / best if job.slo is not None and best > 0 else float("inf")


class RoundRun:
    """What the round loop sets up and reports, whatever it schedules (single jobs or pairs): the GPU types in
    mechanism order, the policies' type order, the type totals, each job's first start, end and GPU time,
    the clock and the counters; ``result`` makes the run's ``RoundsResult``."""

    __slots__ = ("jobs", "order", "n_types", "gpus", "lp_types", "lp_to_mech", "half", "worker_time", "end",
                 "first_start", "gpu_seconds", "clock", "rounds", "allocations", "t0", "next_job", "remaining")

    def __init__(self, jobs: Sequence[RoundJob], cluster: HeteroCluster, table: ThroughputTable,
                 round_s: float) -> None:
        self.t0 = time.perf_counter()
        self.jobs = jobs
        self.next_job = 0  # the first job not yet arrived
        self.remaining = len(jobs)  # jobs neither ended nor dropped
        self.order = mechanism_order(cluster.types)
        self.n_types = len(self.order)
        self.gpus = [cluster.gpus(t) for t in self.order]
        self.lp_types, self.lp_to_mech = lp_layout(self.order)
        check_jobs(jobs, cluster, table, self.order, self.gpus)
        self.half = round_s / 2.0  # every job starts an accounting period with half a round per type
        self.worker_time = [0.0] * self.n_types
        self.end: list[float | None] = [None] * len(jobs)
        self.first_start: list[float | None] = [None] * len(jobs)
        self.gpu_seconds = [0.0] * len(jobs)
        self.clock = RoundClock(jobs[0].arrival if jobs else 0.0)
        self.rounds = self.allocations = 0

    def next_arrival(self) -> float | None:
        """When the next job arrives; None when every job has."""
        return self.jobs[self.next_job].arrival if self.next_job < len(self.jobs) else None

    def arrivals(self) -> list[RoundJob]:
        """The jobs that arrived by the clock's time and were not yet taken (arrival order)."""
        jobs, i, t = self.jobs, self.next_job, self.clock.t
        while i < len(jobs) and jobs[i].arrival <= t:
            i += 1
        out, self.next_job = list(jobs[self.next_job:i]), i
        return out

    def gone(self, jid: int, finish: float | None) -> None:
        """Job ``jid`` ended at ``finish`` (None: dropped after repeated failures)."""
        if finish is not None:
            self.end[jid] = finish
        self.remaining -= 1

    def result(self, policy: GavelPolicy) -> RoundsResult:
        return RoundsResult(list(self.jobs), self.end, self.first_start, self.clock.t, self.rounds, self.allocations,
                            self.gpu_seconds, time.perf_counter() - self.t0, dict(policy.stats))


class RoundClock:
    """Gavel's clock between rounds.

    ``t`` is the start of the round about to be scheduled; ``round_start`` the start of the round whose
    micro-tasks end now (what their time is charged from: the previous round that ran anything, so an idle
    gap is charged too); ``last_reset`` the time of the last reset (0: none yet, or one forced)."""

    __slots__ = ("t", "round_start", "prev_end", "last_reset")

    def __init__(self, t: float) -> None:
        self.t = t
        self.round_start = 0.0
        self.prev_end: float | None = None
        self.last_reset = 0.0

    def advance(self, latest_finish: float | None, next_arrival: float | None) -> None:
        """The next round starts when the latest running micro-task ends (``latest_finish``; None: nothing
        runs), or, with nothing running, at the next arrival. Gavel forces a reset when nothing runs and
        nothing is queued."""
        if next_arrival is None and latest_finish is None:
            self.last_reset = 0.0
        if latest_finish is not None and latest_finish > 0:
            if self.prev_end is not None:
                self.round_start = self.prev_end
            self.prev_end = latest_finish
            self.t = latest_finish
        elif next_arrival is not None:
            self.t = next_arrival

    def reset_due(self, need_update: bool, reset_s: float) -> bool:
        """A new allocation is due: a job arrived or ended since the last one, and ``reset_s`` passed since
        the last reset (or none happened yet)."""
        return need_update and (self.t - self.last_reset >= reset_s or self.last_reset == 0)


def micro_task_fails(steps: int, sf: int) -> bool:
    """Gavel splits a micro-task's steps over its ``sf`` GPUs (``steps // sf`` each, the rest on the last); a
    GPU given no step fails the whole micro-task (so does a round of no time, which the caller checks)."""
    per = steps // sf
    return (sf > 1 and per <= 0) or steps - per * (sf - 1) <= 0


def lp_layout(order: Sequence[str]) -> tuple[list[str], list[int]]:
    """The policies' type order (sorted by name, as Gavel's matrices) and each one's mechanism index."""
    lp_types = sorted(order)
    return lp_types, [order.index(t) for t in lp_types]


def alloc_rows(x: object, lp_to_mech: Sequence[int]) -> list[list[float]]:
    """The policy's allocation matrix (rows x types in ``lp_layout`` order) as per-row lists indexed by
    mechanism type, as Python floats."""
    import numpy as np

    mech_to_lp = [0] * len(lp_to_mech)
    for c, k in enumerate(lp_to_mech):
        mech_to_lp[k] = c
    return np.asarray(x, dtype=float)[:, mech_to_lp].tolist()


def check_jobs(jobs: Sequence[RoundJob], cluster: HeteroCluster, table: ThroughputTable, order: Sequence[str],
               gpus: Sequence[int]) -> None:
    """ValueError unless arrivals are sorted (Gavel asserts it) and every job fits a GPU type with a rate > 0
    (a job that fits none would make Gavel's loop spin forever)."""
    for a, b in zip(jobs, jobs[1:], strict=False):
        if b.arrival < a.arrival:
            raise ValueError(f"job {b.id}: arrivals must be sorted (Gavel asserts it), {b.arrival} < {a.arrival}")
    for j in jobs:
        thr = [table.isolated(j.job_type, t, j.scale_factor) for t in order]
        if not any(r > 0 and j.scale_factor <= g for r, g in zip(thr, gpus, strict=True)):
            raise ValueError(f"job {j.id} ({j.job_type!r}, {j.scale_factor} GPUs) fits no GPU type of "
                             f"{cluster} with a throughput > 0; Gavel never splits a job across types")


def stuck_error(active: Iterable[int]) -> ValueError:
    """The error for a round where no job can run and none will arrive (Gavel's loop spins forever there)."""
    stuck = ", ".join(str(j) for j in sorted(active))
    return ValueError(f"no job can run and none will arrive (jobs {stuck}): Gavel's loop spins forever here")


def mechanism_order(types: Iterable[str]) -> list[str]:
    """The order of GPU types in the greedy pass: Gavel's ``MECHANISM_ORDER`` first, then the others as given."""
    types = list(types)
    return [t for t in MECHANISM_ORDER if t in types] + [t for t in types if t not in MECHANISM_ORDER]


def reset_period(states: Iterable[PeriodState], worker_time: list[float], elapsed: float, half: float) -> None:
    """Gavel's reset (``_reset_time_run_so_far``): each job's deficit gains ``allocation x elapsed - time
    received`` per type, and a new accounting period starts with half a round per job and type (the type's
    total: half a round per job). ``worker_time`` (per type) is rewritten in place."""
    sts = list(states)
    for k in range(len(worker_time)):
        worker_time[k] = 0.0
        for st in sts:
            should = st.alloc[k] * elapsed if st.alloc is not None else 0
            st.deficit[k] += should - (st.time[k] - half)
            st.time[k] = half
            worker_time[k] += half


def round_queue(items: Sequence[tuple[int, RoundState]], types: Sequence[int], worker_time: Sequence[float],
                skip_zero: bool) -> list[tuple[float, float, float, int, int]]:
    """Gavel's priority queue of one round: per type (in ``types``' order), the entries (priority, deficit,
    allocation, -job id, type index), highest first, ties in arrival order; priority = allocation / (job's
    time / type's time), 0 where the allocation or the throughput is 0 (``skip_zero``, FIFO: such entries are
    left out, as they are never placed)."""
    rows = _queue_rows(items)
    queue: list[tuple[float, float, float, int, int]] = []
    for k in types:
        queue += _type_entries(rows, k, worker_time[k], skip_zero)
    return queue


def round_picks(queue: Sequence[tuple[float, float, float, int, int]], states: Mapping[int, RoundState],
                gpus: Sequence[int], skip_zero: bool) -> list[tuple[int, int]]:
    """Gavel's greedy pass over ``round_queue``: each job gets the first type in the queue with room for its
    scale factor and a throughput > 0 there (FIFO: and a priority > 0); (job id, type index) in pass order. A
    job outside the allocation (``alloc`` None) is picked too: Gavel then leaves its GPUs idle for the round."""
    left = list(gpus)
    picks: list[tuple[int, int]] = []
    _take(queue, states, left, set(), picks, skip_zero, sum(left), False)
    return picks


def round_schedule(states: Mapping[int, RoundState], types: Sequence[int], worker_time: Sequence[float],
                   gpus: Sequence[int], skip_zero: bool) -> list[tuple[int, int]]:
    """``round_picks(round_queue(...))``, the same picks with less work: the pass takes one type's entries after
    the other, and a type's entries can only place jobs on that type, so its pass stops once the type is full,
    and the types after the cluster is full are never queued or sorted."""
    rows = _queue_rows(states.items())
    left = list(gpus)
    free = sum(left)
    taken: set[int] = set()
    picks: list[tuple[int, int]] = []
    for k in types:
        if not free:
            break
        if left[k]:
            free = _take(_type_entries(rows, k, worker_time[k], skip_zero), states, left, taken, picks, skip_zero,
                         free, True)
    return picks


_Row = tuple[int, "list[float] | None", list[float], list[float], list[float]]


def _queue_rows(items: Iterable[tuple[int, RoundState]]) -> list[_Row]:
    """(-id, allocation, time, deficit, throughputs) per job: fetched once per round, not once per type."""
    return [(-jid, st.alloc, st.time, st.deficit, st.thr) for jid, st in items]


def _type_entries(rows: Sequence[_Row], k: int, wt: float,
                  skip_zero: bool) -> list[tuple[float, float, float, int, int]]:
    """One type's part of ``round_queue``, sorted. The entries carry -id last, so one plain descending tuple sort
    (no key function) gives the order, ties in arrival order (ids follow arrivals). Comprehensions: this runs
    every round for every job and type, the largest part of the loop's own time."""
    if skip_zero:  # entries of priority 0 are never placed: FIFO's queue, most of the jobs, costs nothing
        entries = [(a[k] * 1e9 if wt == 0.0 else a[k] / (tm[k] / wt), d[k], a[k], neg, k)
                   for neg, a, tm, d, thr in rows if a is not None and a[k] != 0.0 and thr[k] != 0]
    else:
        entries = [(0.0, d[k], 0.0, neg, k) if a is None else
                   (0.0 if a[k] == 0.0 or thr[k] == 0 else a[k] * 1e9 if wt == 0.0 else a[k] / (tm[k] / wt),
                    d[k], a[k], neg, k)
                   for neg, a, tm, d, thr in rows]
    entries.sort(reverse=True)
    return entries


def _take(entries: Sequence[tuple[float, float, float, int, int]], states: Mapping[int, RoundState], left: list[int],
          taken: set[int], picks: list[tuple[int, int]], skip_zero: bool, free: int, one_type: bool) -> int:
    """The greedy pass over ``entries`` (``left``, ``taken`` and ``picks`` updated in place); returns the GPUs
    still free. ``one_type``: every entry is of one type, so the pass ends when that type is full."""
    for p, _, _, neg, k in entries:
        if not free:
            break  # every GPU is given: nothing later in the queue can be placed
        if not left[k]:
            if one_type:
                break
            continue
        jid = -neg
        if jid in taken:
            continue
        st = states[jid]
        if st.thr[k] <= 0 or (skip_zero and p <= 0.0):
            continue
        sf = st.job.scale_factor
        if sf > left[k]:
            continue
        left[k] -= sf
        free -= sf
        taken.add(jid)
        picks.append((jid, k))
    return free


def allocation_input(ids: list[int], active: Mapping[int, RoundState], lp_types: list[str], lp_to_mech: list[int],
                     gpus: list[int], order: list[str], now: float,
                     cluster: HeteroCluster | None = None) -> AllocationInput:
    """The policy's input for the jobs ``ids`` (sorted) over the types ``lp_types`` (sorted by name, Gavel's
    matrix order; ``lp_to_mech`` maps them to mechanism indices); prices from ``cluster`` where given."""
    import numpy as np

    from hpcsched.hetero.policies import AllocationInput

    sts = [active[i] for i in ids]
    thr = np.array([[st.thr[k] for k in lp_to_mech] for st in sts], dtype=float)
    return AllocationInput(
        job_ids=tuple(ids), types=tuple(lp_types), throughputs=thr,
        scale_factors=np.array([st.job.scale_factor for st in sts], dtype=float),
        priority_weights=np.array([st.job.priority_weight for st in sts], dtype=float),
        steps_remaining=np.array([st.steps_left for st in sts], dtype=float),
        times_since_start=np.array([now - st.job.arrival for st in sts], dtype=float),
        gpus=np.array([gpus[order.index(t)] for t in lp_types], dtype=float),
        job_types=tuple(st.job.job_type for st in sts),
        prices=np.array([cluster.price(t) or 1.0 for t in lp_types], dtype=float) if cluster is not None else None,
        slo_left=np.array([st.deadline - now for st in sts], dtype=float),
        entities=tuple(st.job.entity for st in sts),
    )
