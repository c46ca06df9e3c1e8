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
    t0 = time.perf_counter()
    order = mechanism_order(cluster.types)
    n_types = len(order)
    gpus = [cluster.gpus(t) for t in order]
    lp_types = sorted(order)  # the policies see types sorted by name, as Gavel's do
    lp_to_mech = [order.index(t) for t in lp_types]
    for a, b in zip(jobs, jobs[1:], strict=False):
        if b.arrival < a.arrival:
            raise ValueError(f"job {b.id}: arrivals must be sorted (Gavel asserts it), {b.arrival} < {a.arrival}")
    for j in jobs:
        thr = [table.isolated(j.job_type, t, j.scale_factor) for t in order]
        if not any(r > 0 and j.scale_factor <= g for r, g in zip(thr, gpus, strict=True)):
            raise ValueError(f"job {j.id} ({j.job_type!r}, {j.scale_factor} GPUs) fits no GPU type of "
                             f"{cluster} with a throughput > 0; Gavel never splits a job across types")
    half = round_s / 2.0
    shuffler = random.Random(seed + 5) if not policy.heterogeneity_aware else None
    skip_zero = policy.skip_zero_priority

    active: dict[int, _Job] = {}  # insertion order = arrival order, as Gavel's dicts
    worker_time = [0.0] * n_types
    end: list[float | None] = [None] * len(jobs)
    first_start: list[float | None] = [None] * len(jobs)
    gpu_seconds = [0.0] * len(jobs)
    ptr = 0
    remaining = len(jobs)
    t = jobs[0].arrival if jobs else 0.0
    round_start = 0.0
    prev_round_end: float | None = None
    last_reset = 0.0
    need_update = False
    running: list[tuple[float, int, int, int]] = []  # (finish, job id, mechanism type, steps)
    rounds = allocations = 0

    while remaining:
        next_arrival = jobs[ptr].arrival if ptr < len(jobs) else None
        if next_arrival is None and not running:
            last_reset = 0.0  # Gavel forces a reset when nothing runs and nothing is queued
        mx = max(r[0] for r in running) if running else 0.0
        if mx > 0:
            if prev_round_end is not None:
                round_start = prev_round_end
            prev_round_end = mx
            t = mx
        elif next_arrival is not None:
            t = next_arrival

        # Micro-tasks end (Gavel pops them latest-first, ties by job id).
        running.sort(key=lambda r: (-r[0], r[1]))
        for finish, jid, k, steps in running:
            st = active[jid]
            sf = st.job.scale_factor
            exec_s = finish - round_start
            per = steps // sf
            if exec_s <= 0 or (sf > 1 and per <= 0) or steps - per * (sf - 1) <= 0:
                st.failures += 1
                need_update = True
                if st.failures >= MAX_FAILED_ATTEMPTS:
                    del active[jid]
                    remaining -= 1
                continue
            st.failures = 0
            st.steps_left -= steps
            st.time[k] += exec_s
            worker_time[k] += exec_s
            gpu_seconds[jid] += exec_s * sf
            if st.steps_left <= 0:
                end[jid] = finish
                del active[jid]
                remaining -= 1
                need_update = True
        running = []
        if not remaining:
            break

        while ptr < len(jobs) and jobs[ptr].arrival <= t:
            j = jobs[ptr]
            active[j.id] = _Job(j, [table.isolated(j.job_type, ty, j.scale_factor) for ty in order], n_types, half)
            need_update = True
            ptr += 1

        # Priorities (and, when due, a reset and a new allocation).
        if need_update and (t - last_reset >= reset_s or last_reset == 0):
            reset_period(active.values(), worker_time, t - last_reset, half)
            last_reset = t
            ids = sorted(active)
            if ids:
                inp = allocation_input(ids, active, lp_types, lp_to_mech, gpus, order, t, cluster)
                x = policy.allocate(inp)
                allocations += 1
                for row, jid in zip(x, ids, strict=True):
                    a = [0.0] * n_types
                    for c, k in enumerate(lp_to_mech):
                        a[k] = float(row[c])
                    active[jid].alloc = a
            need_update = False

        types = list(range(n_types))
        if shuffler is not None:
            shuffler.shuffle(types)
        queue = round_queue(list(active.items()), types, worker_time, skip_zero)
        scheduled: dict[int, str] = {}
        for jid, k in round_picks(queue, active, gpus, skip_zero):
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
            rounds += 1
        elif ptr >= len(jobs) and not need_update:
            stuck = ", ".join(str(j) for j in sorted(active))
            raise ValueError(f"no job can run and none will arrive (jobs {stuck}): Gavel's loop spins forever here")
    return RoundsResult(list(jobs), end, first_start, t, rounds, allocations, gpu_seconds,
                        time.perf_counter() - t0, dict(policy.stats))


def mechanism_order(types: Iterable[str]) -> list[str]:
    """The order of GPU types in the greedy pass: Gavel's ``MECHANISM_ORDER`` first, then the others as given."""
    types = list(types)
    return [t for t in MECHANISM_ORDER if t in types] + [t for t in types if t not in MECHANISM_ORDER]


def reset_period(states: Iterable[RoundState], worker_time: list[float], elapsed: float, half: float) -> None:
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
    # The entries carry -id last, so one plain descending tuple sort (no key function) gives that order (ids
    # follow arrivals).
    queue: list[tuple[float, float, float, int, int]] = []
    for k in types:
        wt = worker_time[k]
        entries = []
        add = entries.append
        for jid, st in items:
            a = st.alloc
            if a is None:
                if not skip_zero:
                    add((0.0, st.deficit[k], 0.0, -jid, k))
                continue
            ak = a[k]
            if ak == 0.0 or st.thr[k] == 0:
                if skip_zero:
                    continue  # never placed (below): FIFO's queue, most of the jobs, costs nothing
                p = 0.0
            elif wt == 0.0:
                p = ak * 1e9
            else:
                p = ak / (st.time[k] / wt)
            add((p, st.deficit[k], ak, -jid, k))
        entries.sort(reverse=True)
        queue += entries
    return queue


def round_picks(queue: Sequence[tuple[float, float, float, int, int]], states: Mapping[int, RoundState],
                gpus: Sequence[int], skip_zero: bool) -> list[tuple[int, int]]:
    """Gavel's greedy pass over ``round_queue``: each job gets the first type in the queue with room for its
    scale factor and a throughput > 0 there (FIFO: and a priority > 0); (job id, type index) in pass order. A
    job outside the allocation (``alloc`` None) is picked too: Gavel then leaves its GPUs idle for the round."""
    left = list(gpus)
    free = sum(left)
    taken: set[int] = set()
    picks: list[tuple[int, int]] = []
    for p, _, _, neg, k in queue:
        if not free:
            break  # every GPU is given: nothing later in the queue can be placed
        jid = -neg
        if not left[k] or jid in taken:
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
    return picks


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
