"""Gavel's round-based mechanism, simulated with Gavel's own accounting (``--compat gavel``).

Why a loop of Gavel's own: its figures come out of its simulator's particular bookkeeping, and they are to be
reproduced, not approximated. The rules below were read from Gavel's scheduler
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

The rounds run on the simulators' event core (``hpcsched.primitives.event_core``) as a strategy
(``GavelRounds``: a round is an event, the next one due when this one's slowest micro-task ends). One round
mechanism runs both kinds of policy; what it schedules is a strategy (``RoundUnits``):
single jobs (``SingleJobs``, here) or, for a space-sharing policy, combinations of a job alone and pairs of
jobs sharing GPUs (``hetero.packing.PackedCombos``, whose docstring has the pair rules). The shared rules are
in ``hetero.round_rules``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Protocol

from hpcsched.hetero.round_rules import (
    MAX_FAILED_ATTEMPTS,
    MECHANISM_ORDER,
    RESET_S,
    ROUND_S,
    PeriodState,
    RoundClock,
    RoundJob,
    RoundRun,
    RoundsResult,
    RoundState,
    alloc_rows,
    allocation_input,
    micro_task_fails,
    reset_period,
    round_picks,
    round_queue,
    round_schedule,
    slo_deadline,
    stuck_error,
)
from hpcsched.primitives.event_core import EventCore
from hpcsched.primitives.hetero_cluster import HeteroCluster

if TYPE_CHECKING:
    from hpcsched.hetero.policies import GavelPolicy
    from hpcsched.hetero.throughputs import ThroughputTable

# the records and rules callers have always found here
__all__ = ["MAX_FAILED_ATTEMPTS", "MECHANISM_ORDER", "RESET_S", "ROUND_S", "GavelRounds", "PeriodState", "RoundClock",
           "RoundJob", "RoundRun", "RoundState", "RoundUnits", "RoundsResult", "SingleJobs", "round_picks",
           "round_queue", "round_schedule", "simulate_rounds", "slo_deadline"]

_FINISH, _JOB_ID = itemgetter(0), itemgetter(1)  # of a running micro-task (finish, job id, type, steps)


class RoundUnits(Protocol):
    """What the round loop schedules, and how their micro-tasks end: single jobs or combinations."""

    active: dict[int, Any]  # the active jobs, by id (arrival order)

    def latest(self, running: list[Any]) -> float | None:
        """When the latest of this round's micro-tasks ends (None: nothing runs)."""

    def end(self, running: list[Any], round_start: float) -> bool:
        """End this round's micro-tasks (charging time from ``round_start``); True if a job ended, was dropped
        or failed (a new allocation is wanted)."""

    def arrive(self, job: RoundJob) -> None:
        """A job arrived."""

    def reset(self, elapsed: float) -> None:
        """Gavel's reset after ``elapsed`` s of the accounting period."""

    def allocate(self, t: float) -> None:
        """Ask the policy for a new allocation of the active jobs (none: nothing to do)."""

    def schedule(self, t: float, types: Sequence[int]) -> tuple[list[Any], dict[int, str]]:
        """This round's micro-tasks from ``t`` (types in ``types``' order), and each scheduled job's type."""


class GavelRounds:
    """Gavel's round mechanism as a strategy of the event core (``hpcsched.primitives.event_core``): a round
    event ends the last round's micro-tasks, admits the arrivals, resets and re-allocates when due, and
    schedules the round's micro-tasks; the next round is due when the slowest of them ends or, with nothing
    running, at the next arrival (``RoundClock.advance``)."""

    def __init__(self, run: RoundRun, units: RoundUnits, policy: GavelPolicy, reset_s: float, seed: int,
                 on_round: Callable[[float, dict[int, str]], None] | None) -> None:
        self.run, self.units, self.reset_s, self.on_round = run, units, reset_s, on_round
        # Gavel shuffles the type order for heterogeneity-agnostic policies; its packed policies are all aware,
        # and its packed loop never shuffles
        self.shuffler = random.Random(seed + 5) if not policy.heterogeneity_aware and not policy.space_sharing \
            else None
        self.need_update = False
        self.running: list[Any] = []
        self.all_types = list(range(run.n_types))

    def next_round(self, t: float) -> float | None:
        run = self.run
        if not run.remaining:
            return None
        run.clock.advance(self.units.latest(self.running), run.next_arrival())
        return run.clock.t

    def done(self) -> bool:
        return not self.run.remaining

    def handle(self, t: float, event: object) -> None:
        run, units, clock = self.run, self.units, self.run.clock
        if units.end(self.running, clock.round_start):
            self.need_update = True
        self.running = []
        if not run.remaining:
            return

        for j in run.arrivals():
            units.arrive(j)
            self.need_update = True

        # Priorities (and, when due, a reset and a new allocation).
        if clock.reset_due(self.need_update, self.reset_s):
            units.reset(t - clock.last_reset)
            clock.last_reset = t
            units.allocate(t)
            self.need_update = False

        types = self.all_types
        if self.shuffler is not None:
            types = list(types)
            self.shuffler.shuffle(types)
        self.running, scheduled = units.schedule(t, types)
        if self.on_round is not None:
            self.on_round(t, scheduled)
        if self.running:
            run.rounds += 1
        elif run.next_arrival() is None and not self.need_update:
            raise stuck_error(units.active)


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


class SingleJobs:
    """Each job scheduled alone: its own time received, deficit and allocation row (the rules above)."""

    def __init__(self, run: RoundRun, cluster: HeteroCluster, policy: GavelPolicy, table: ThroughputTable,
                 round_s: float) -> None:
        self.run, self.cluster, self.policy, self.table, self.round_s = run, cluster, policy, table, round_s
        self.active: dict[int, _Job] = {}  # insertion order = arrival order, as Gavel's dicts

    def latest(self, running: list[tuple[float, int, int, int]]) -> float | None:
        return max(running)[0] if running else None

    def end(self, running: list[tuple[float, int, int, int]], round_start: float) -> bool:
        run, active = self.run, self.active
        worker_time, gpu_seconds = run.worker_time, run.gpu_seconds
        changed = False
        # Micro-tasks end (Gavel pops them latest-first, ties by job id): two stable C-level sorts.
        running.sort(key=_JOB_ID)
        running.sort(key=_FINISH, reverse=True)
        for finish, jid, k, steps in running:
            st = active[jid]
            sf = st.job.scale_factor
            exec_s = finish - round_start
            if exec_s <= 0 or steps <= 0 or (sf > 1 and micro_task_fails(steps, sf)):  # sf 1: fails iff no step
                st.failures += 1
                changed = True
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
                changed = True
        return changed

    def arrive(self, job: RoundJob) -> None:
        run = self.run
        thr = [self.table.isolated(job.job_type, ty, job.scale_factor) for ty in run.order]
        self.active[job.id] = _Job(job, thr, run.n_types, run.half)

    def reset(self, elapsed: float) -> None:
        reset_period(self.active.values(), self.run.worker_time, elapsed, self.run.half)

    def allocate(self, t: float) -> None:
        run, active = self.run, self.active
        ids = sorted(active)
        if ids:
            inp = allocation_input(ids, active, run.lp_types, run.lp_to_mech, run.gpus, run.order, t, self.cluster)
            x = self.policy.allocate(inp)
            run.allocations += 1
            for a, jid in zip(alloc_rows(x, run.lp_to_mech), ids, strict=True):
                active[jid].alloc = a

    def schedule(self, t: float, types: Sequence[int]) -> tuple[list[tuple[float, int, int, int]], dict[int, str]]:
        run, active, round_s = self.run, self.active, self.round_s
        first_start, order = run.first_start, run.order
        running: list[tuple[float, int, int, int]] = []  # (finish, job id, mechanism type, steps)
        scheduled: dict[int, str] = {}
        for jid, k in round_schedule(active, types, run.worker_time, run.gpus, self.policy.skip_zero_priority):
            st = active[jid]
            if st.alloc is None:
                continue  # picked, but Gavel assigns no GPUs to a job outside the allocation: they idle
            thr = st.thr[k]
            steps = min(int(thr * round_s), st.steps_left)
            running.append((t + steps / thr, jid, k, steps))
            if first_start[jid] is None:
                first_start[jid] = t
            scheduled[jid] = order[k]
        return running, scheduled


def simulate_rounds(jobs: Sequence[RoundJob], cluster: HeteroCluster, policy: GavelPolicy,
                    table: ThroughputTable, *, round_s: float = ROUND_S, reset_s: float = RESET_S,
                    seed: int = 0, on_round: Callable[[float, dict[int, str]], None] | None = None,
                    ) -> RoundsResult:
    """Run ``jobs`` (sorted by arrival) on ``cluster`` under ``policy`` with Gavel's round mechanism.

    ``cluster`` must have one GPU per server for Gavel's accounting (placement never changes a job's
    speed in Gavel's simulator either). Raises ValueError when a job can never run (it needs more GPUs
    than any type has, or has no throughput anywhere): Gavel's own loop spins forever on such a trace; and,
    for a space-sharing policy, KeyError (naming the job types) when the throughput table lacks a pair's
    rates, as Gavel's own lookup fails.
    """
    run = RoundRun(jobs, cluster, table, round_s)
    units: RoundUnits
    if policy.space_sharing:  # pairs of jobs share GPUs: Gavel's combination bookkeeping
        from hpcsched.hetero.packing import PackedCombos

        units = PackedCombos(run, cluster, policy, table, round_s)
    else:
        units = SingleJobs(run, cluster, policy, table, round_s)
    rounds = GavelRounds(run, units, policy, reset_s, seed, on_round)
    core = EventCore()
    core.start_rounds(rounds.next_round(0.0))
    core.run(rounds)
    return run.result(policy)
