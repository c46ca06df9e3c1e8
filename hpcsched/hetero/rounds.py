"""Gavel's round-based mechanism, simulated with Gavel's own accounting (``--compat gavel``).

Why a separate loop: Gavel's figures come out of its simulator's particular bookkeeping, and the issue asks
that they be reproduced, not approximated. The rules below were read from Gavel's scheduler
(stanford-futuredata/gavel at c4fa400, ``scheduler.py`` ``simulate``, ``_update_priorities``,
``_reset_time_run_so_far``, ``_schedule_jobs_on_workers(_helper)``, ``_done_callback``) and are written
here in our own code:

- **Rounds.** Every scheduled job runs ``min(int(throughput x 360), remaining steps)`` steps on its GPU
  type; it ends after ``steps / throughput`` s. The next round starts when the slowest job of this one
  ends (so a round is at most 360 s), or, with nothing running, at the next arrival.
- **Time received.** A job's time on a type is charged ``its end - the previous round's end`` (the
  previous round that ran anything: after an idle gap the gap is charged too), once per job however many
  GPUs it holds; the type's total is the sum over jobs. Every job starts each accounting period with
  half a round (180 s) on every type, and the type's total with 180 s per job.
- **Allocation.** Recomputed only when a job arrived or ended since the last computation *and* at least
  1920 s passed since the last reset (or no reset happened yet at a time > 0; or nothing runs and
  nothing is queued). A reset adds ``allocation x elapsed - time received`` to each job's deficit and
  restarts the accounting period. Jobs that arrive between two computations are not in the allocation:
  they have priority 0 and, if the greedy pass still picks them, their GPUs stay idle for the round.
- **Priorities.** On each type, ``allocation / (job's time / type's time)``; 0 where the allocation or
  the throughput is 0. Per type (types in the order v100, p100, k80, shuffled each round by a
  ``Random(seed + 5)`` for the heterogeneity-agnostic policies), jobs sorted by (priority, deficit,
  allocation), highest first, ties in arrival order; one pass over the concatenated lists gives each job
  the first type with room for its scale factor. FIFO skips priority 0.
- **Failures.** A multi-GPU job's steps are split over its GPUs (``steps // scale`` each, the rest on the
  last); a GPU with no step, or a round of no time, fails the micro-task: its steps and time are not
  counted, and the fifth failure in a row drops the job (it has no completion time).

Job completion time is the end of the job's last micro-task minus its arrival; the makespan is Gavel's
"Total duration", the clock when the last job ended.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Protocol

from hpcsched.hetero.cluster import HeteroCluster

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
    """What the rules below read and write of one active job (``_Job`` here; the runtime's executor,
    ``hpcsched.hetero.round_executor``, keeps its own): times and deficits per mechanism type index."""

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


_FINISH, _JOB_ID = itemgetter(0), itemgetter(1)  # of a running micro-task (finish, job id, type, steps)


class _Job:
    """Mutable per-run state of one active job (kept apart from the frozen input)."""

    __slots__ = ("job", "thr", "steps_left", "time", "deficit", "failures", "alloc", "deadline")

    def __init__(self, job: RoundJob, thr: list[float], n_types: int, half: float) -> None:
        self.job = job
        self.thr = thr  # steps/s per mechanism type index
        self.steps_left = job.total_steps
        self.time = [half] * n_types  # time received per type since the last reset (+ half a round)
        self.deficit = [0.0] * n_types
        self.failures = 0
        self.alloc: list[float] | None = None  # per mechanism type; None: not in the current allocation
        self.deadline = slo_deadline(job, thr)


def slo_deadline(job: RoundJob, thr: Sequence[float]) -> float:
    """Gavel's SLO deadline: arrival + SLO x the job's duration, which its generator defines on a V100 (the
    fastest type); here on the fastest type the job has (``thr``: its isolated steps/s per type). inf: none."""
    best = max(thr) if thr else 0.0
    return job.arrival + job.slo * job.total_steps / best if job.slo is not None and best > 0 else float("inf")


def simulate_rounds(jobs: Sequence[RoundJob], cluster: HeteroCluster, policy: GavelPolicy,
                    table: ThroughputTable, *, round_s: float = ROUND_S, reset_s: float = RESET_S,
                    seed: int = 0, on_round: Callable[[float, dict[int, str]], None] | None = None,
                    ) -> RoundsResult:
    """Run ``jobs`` (sorted by arrival) on ``cluster`` under ``policy`` with Gavel's round mechanism.

    ``cluster`` must have one GPU per server for Gavel's accounting (placement never changes a job's
    speed in Gavel's simulator either). Raises ValueError when a job can never run (it needs more GPUs
    than any type has, or has no throughput anywhere): Gavel's own loop spins forever on such a trace.
    """
    if policy.space_sharing:  # pairs of jobs share GPUs: Gavel's combination bookkeeping (its own loop)
        from hpcsched.hetero.packing import simulate_packed_rounds

        return simulate_packed_rounds(jobs, cluster, policy, table, round_s=round_s, reset_s=reset_s, seed=seed,
                                      on_round=on_round)
    run = RoundRun(jobs, cluster, table, round_s)
    order, n_types, gpus, half, clock = run.order, run.n_types, run.gpus, run.half, run.clock
    worker_time, first_start, gpu_seconds = run.worker_time, run.first_start, run.gpu_seconds
    shuffler = random.Random(seed + 5) if not policy.heterogeneity_aware else None
    skip_zero = policy.skip_zero_priority
    active: dict[int, _Job] = {}  # insertion order = arrival order, as Gavel's dicts
    need_update = False
    running: list[tuple[float, int, int, int]] = []  # (finish, job id, mechanism type, steps)
    all_types = list(range(n_types))

    while run.remaining:
        clock.advance(max(running)[0] if running else None, run.next_arrival())
        t, round_start = clock.t, clock.round_start

        # Micro-tasks end (Gavel pops them latest-first, ties by job id): two stable C-level sorts.
        running.sort(key=_JOB_ID)
        running.sort(key=_FINISH, reverse=True)
        for finish, jid, k, steps in running:
            st = active[jid]
            sf = st.job.scale_factor
            exec_s = finish - round_start
            if exec_s <= 0 or steps <= 0 or (sf > 1 and micro_task_fails(steps, sf)):  # sf 1: fails iff no step
                st.failures += 1
                need_update = True
                if st.failures >= MAX_FAILED_ATTEMPTS:
                    del active[jid]
                    run.gone(jid, None)
                continue
            st.failures = 0
            st.steps_left -= steps
            st.time[k] += exec_s
            worker_time[k] += exec_s
            gpu_seconds[jid] += exec_s * sf
            if st.steps_left <= 0:
                del active[jid]
                run.gone(jid, finish)
                need_update = True
        running = []
        if not run.remaining:
            break

        for j in run.arrivals():
            active[j.id] = _Job(j, [table.isolated(j.job_type, ty, j.scale_factor) for ty in order], n_types, half)
            need_update = True

        # Priorities (and, when due, a reset and a new allocation).
        if clock.reset_due(need_update, reset_s):
            reset_period(active.values(), worker_time, t - clock.last_reset, half)
            clock.last_reset = t
            ids = sorted(active)
            if ids:
                inp = allocation_input(ids, active, run.lp_types, run.lp_to_mech, gpus, order, t, cluster)
                x = policy.allocate(inp)
                run.allocations += 1
                for a, jid in zip(alloc_rows(x, run.lp_to_mech), ids, strict=True):
                    active[jid].alloc = a
            need_update = False

        types = all_types
        if shuffler is not None:
            types = list(all_types)
            shuffler.shuffle(types)
        scheduled: dict[int, str] = {}
        for jid, k in round_schedule(active, types, worker_time, gpus, skip_zero):
            st = active[jid]
            if st.alloc is None:
                continue  # picked, but Gavel assigns no GPUs to a job outside the allocation: they idle
            thr = st.thr[k]
            steps = min(int(thr * round_s), st.steps_left)
            running.append((t + steps / thr, jid, k, steps))
            if first_start[jid] is None:
                first_start[jid] = t
            scheduled[jid] = order[k]
        if on_round is not None:
            on_round(t, scheduled)
        if running:
            run.rounds += 1
        elif run.next_arrival() is None and not need_update:
            raise stuck_error(active)
    return run.result(policy)


class RoundRun:
    """What both loops (single jobs here, pairs in ``hetero.packing``) set up and report: the GPU types in
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
    """Gavel's clock between rounds, for both loops (single jobs here, pairs in ``hetero.packing``).

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
