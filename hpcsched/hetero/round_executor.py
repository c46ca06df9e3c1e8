"""Gavel's round mechanism as an executor of live jobs: the decision of one round, for the runtime controller.

The simulator (``hpcsched.hetero.rounds.simulate_rounds``) owns a clock and runs jobs itself; a controller has
neither: it knows which jobs are active now, which GPU types its live workers offer, and how long each job
actually ran on each type (from its store's start and stop events). This module turns that into the round's
decision with the SAME rules, by calling the functions the simulator's loop calls (``rounds.reset_period``,
``rounds.allocation_input`` and the policy's ``allocate``, ``rounds.round_queue``, ``rounds.round_picks``);
it adds only what a live system must map: string job ids to Gavel's arrival-ordered integers, type sets that
change as workers come and go, and the reasons a job cannot take part (no model in the throughput table,
a size the table does not list).

What one call of ``RoundExecutor.decide`` does, as Gavel's ``_schedule_jobs_on_workers``:

- **Time received.** Each job's time on a type is ``half a round + the seconds it ran there since the
  accounting period began`` (``RoundJobView.received``, charged once per job whatever its GPUs); a type's total is
  ``half a round x the jobs active at the period's start + every job's seconds there since`` (jobs that
  ended since still count, as in Gavel).
- **Allocation** (re-solved, a *reset*, only when the set of active jobs or the GPUs per type changed since
  the last solve AND ``reset_s`` passed since the last reset, or no reset happened yet): the deficits gain
  ``allocation x elapsed - time received`` (``rounds.reset_period``), a new period starts now, and the policy
  solves for the active jobs. Jobs that arrive between two resets are outside the allocation: priority 0,
  and if the greedy pass still picks one, its GPUs idle for the round (``RoundDecision.idle``), as Gavel.
- **Priorities and the greedy pass**: ``allocation / (time / type's total)`` per type, types in Gavel's order
  (shuffled each round for the heterogeneity-agnostic policies by ``Random(seed + 5)``), each job the first
  type with room for its scale factor (its procs).

The decision is a pure function of the executor's memory (allocation, deficits, last reset, round count,
the shuffler) and the call's arguments; no clock, no I/O.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hpcsched.hetero.round_rules import (
    RESET_S,
    ROUND_S,
    RoundJob,
    allocation_input,
    mechanism_order,
    reset_period,
    round_picks,
    round_queue,
)

if TYPE_CHECKING:
    from hpcsched.hetero.policies import GavelPolicy
    from hpcsched.hetero.throughputs import ThroughputTable

NEEDS_STEPS = ("finish-time-fairness-perf", "min-total-duration-perf")
"""Policies whose program reads each job's remaining steps: a job without ``steps:`` cannot take part."""
UNKNOWN_STEPS = 2**62
"""Remaining steps of a job that does not declare them, for the policies that do not read them."""


@dataclass(frozen=True, slots=True)
class RoundJobView:
    """One active job as the executor needs it (the controller builds these from its store)."""

    id: str
    model: str | None  # Gavel's job type (the job file's ``model:``), matched ignoring case and spacing
    procs: int  # its scale factor: the GPUs it holds when it runs
    submit: float  # arrival (wall-clock s): the order ties are broken in
    steps_left: int | None = None  # None: the job declares no steps
    gpu_types: tuple[str, ...] = ()  # the types it accepts (empty: any); 0 throughput elsewhere
    received: Mapping[str, float] = field(default_factory=dict)  # s run per type since the period began


@dataclass(frozen=True, slots=True)
class RoundDecision:
    """One round: ``assignment`` (job -> type) is what runs; the rest says why, for events and listings."""

    round: int
    assignment: dict[str, str]
    idle: dict[str, str]  # picked by the greedy pass but outside the allocation: these GPUs idle (Gavel)
    priorities: dict[str, dict[str, float]]  # job -> type -> priority this round
    allocation: dict[str, dict[str, float]]  # job -> type -> share of time (the current allocation)
    reset: bool  # the allocation was re-solved at this round
    excluded: dict[str, str]  # job -> why it cannot take part (it is in neither the allocation nor the pass)
    period_start: float  # when the current accounting period began (charges are counted from there)


class _Active:
    """The per-round view of one job that the rules in ``hpcsched.hetero.rounds`` read (``RoundState``)."""

    __slots__ = ("job", "thr", "steps_left", "time", "deficit", "alloc", "deadline")

    def __init__(self, job: RoundJob, thr: list[float], time: list[float], deficit: list[float],
                 alloc: list[float] | None) -> None:
        self.job = job
        self.thr = thr
        self.steps_left = job.total_steps
        self.time = time
        self.deficit = deficit
        self.alloc = alloc
        self.deadline = float("inf")  # no SLOs at runtime


def _norm(name: str) -> str:
    return re.sub(r"\s+", " ", name).strip().lower()


def model_names(table: ThroughputTable) -> dict[str, str]:
    """{normalised name: the table's name} of every job type in ``table``."""
    return {_norm(t): t for gt in table.gpu_types for t, _ in table.isolated_rates[gt]}


def throughputs(job: RoundJobView, types: Sequence[str], table: ThroughputTable,
                names: Mapping[str, str] | None = None) -> list[float] | str:
    """Steps/s of ``job`` at its procs on each of ``types`` (0 where the table lacks the type or the job does not
    accept it), or why it has none: the policies' programs need the job's rate on every type. ``names``:
    ``model_names(table)``, when the caller keeps it."""
    if not job.model:
        return "no model: in its job file (Gavel's policies need its throughput per GPU type)"
    name = (names if names is not None else model_names(table)).get(_norm(job.model))
    if name is None:
        return f"model {job.model!r} is not in the throughput table {table.source}"
    out = []
    for t in types:
        rate = table.isolated_rates.get(t, {}).get((name, job.procs), 0.0)
        out.append(rate if not job.gpu_types or t in job.gpu_types else 0.0)
    if not any(r > 0 for r in out):
        sizes = sorted({s for gt in table.gpu_types for n, s in table.isolated_rates[gt] if n == name})
        return (f"no throughput for {name!r} at {job.procs} procs on the live GPU types ({', '.join(types) or 'none'}"
                f"{'; it accepts ' + '/'.join(job.gpu_types) if job.gpu_types else ''}); the table has sizes "
                f"{', '.join(map(str, sizes))}")
    return out


class RoundExecutor:
    """Gavel's mechanism over live jobs: the memory one round leaves to the next, and ``decide``."""

    def __init__(self, policy: str | GavelPolicy, table: ThroughputTable, *, round_s: float = ROUND_S,
                 reset_s: float = RESET_S, seed: int = 0) -> None:
        from hpcsched.hetero.policies import make_policy

        self.policy = make_policy(policy, seed) if isinstance(policy, str) else policy
        if self.policy.space_sharing:
            raise ValueError(f"{self.policy.name}: space sharing (pairs of jobs on one GPU) is not run by the "
                             "round executor; use it in the simulator (hpcsched simulate --compat gavel)")
        self.table = table
        self._names = model_names(table)
        self.round_s = round_s
        self.reset_s = reset_s
        self.rounds = 0
        self.resets = 0
        self.period_start: float | None = None  # None: no reset yet (the next change resets at once)
        self._shuffler = random.Random(seed + 5) if not self.policy.heterogeneity_aware else None
        self._ids: dict[str, int] = {}  # job -> Gavel's integer id (arrival order)
        self._alloc: dict[str, dict[str, float]] = {}  # job -> type -> share, for the jobs of the last solve
        self._solved_for: tuple[frozenset[str], tuple[tuple[str, int], ...]] | None = None
        self._deficit: dict[str, dict[str, float]] = {}
        self._n_at_reset = 0

    def _int_id(self, job: RoundJobView) -> int:
        i = self._ids.get(job.id)
        if i is None:
            i = self._ids[job.id] = len(self._ids)
        return i

    def decide(self, now: float, jobs: Sequence[RoundJobView], gpus: Mapping[str, int],
               totals: Mapping[str, float] | None = None) -> RoundDecision:
        """The round starting at ``now``: ``jobs`` are the active ones, ``gpus`` the GPUs (slots) per live type,
        ``totals`` each type's seconds run by every job since ``period_start`` (default: the sum over ``jobs``;
        pass it to count jobs that ended since, as Gavel does)."""
        half = self.round_s / 2.0
        order = mechanism_order(sorted(t for t, g in gpus.items() if g > 0))
        counts = [int(gpus[t]) for t in order]
        lp_types = sorted(order)
        lp_to_mech = [order.index(t) for t in lp_types]
        excluded: dict[str, str] = {}
        states: dict[int, _Active] = {}
        by_int: dict[int, RoundJobView] = {}
        for j in sorted(jobs, key=lambda j: (j.submit, j.id)):
            jid = self._int_id(j)
            thr = throughputs(j, order, self.table, self._names)
            if isinstance(thr, str):
                excluded[j.id] = thr
                continue
            if j.steps_left is None and self.policy.name in NEEDS_STEPS:
                excluded[j.id] = f"{self.policy.name} needs each job's steps: (its remaining work)"
                continue
            if not any(r > 0 and j.procs <= g for r, g in zip(thr, counts, strict=True)):
                excluded[j.id] = (f"needs {j.procs} GPUs of one type it runs on; the live types have "
                                  f"{', '.join(f'{t}={g}' for t, g in zip(order, counts, strict=True))}")
                continue
            alloc = self._alloc.get(j.id)
            deficit = self._deficit.setdefault(j.id, {})
            steps = j.steps_left if j.steps_left is not None else UNKNOWN_STEPS
            states[jid] = _Active(RoundJob(jid, j.model or "", steps, j.procs, j.submit), thr,
                                  [half + j.received.get(t, 0.0) for t in order],
                                  [deficit.get(t, 0.0) for t in order],
                                  None if alloc is None else [alloc.get(t, 0.0) for t in order])
            by_int[jid] = j
        if totals is None:
            totals = {t: sum(j.received.get(t, 0.0) for j in jobs) for t in order}
        worker_time = [half * self._n_at_reset + totals.get(t, 0.0) for t in order]

        key = (frozenset(j.id for j in by_int.values()), tuple(zip(order, counts, strict=True)))
        reset = False
        if key != self._solved_for and (self.period_start is None or now - self.period_start >= self.reset_s):
            elapsed = now - self.period_start if self.period_start is not None else 0.0
            reset_period(states.values(), worker_time, elapsed, half)
            self.period_start = now
            self._n_at_reset = len(states)
            self._solved_for = key
            self.resets += 1
            reset = True
            for jid, st in states.items():  # deficits carried to the next period (per type name: types may change)
                self._deficit[by_int[jid].id] = dict(zip(order, st.deficit, strict=True))
            self._alloc = {}
            ids = sorted(states)
            if ids:
                x = self.policy.allocate(allocation_input(ids, states, lp_types, lp_to_mech, counts, order, now))
                for row, jid in zip(x, ids, strict=True):
                    a = [0.0] * len(order)
                    for c, k in enumerate(lp_to_mech):
                        a[k] = float(row[c])
                    states[jid].alloc = a
                    self._alloc[by_int[jid].id] = dict(zip(order, a, strict=True))
        if not by_int:
            self.period_start = None  # nothing active: the next arrival resets at once (nothing to be fair to)
            self._solved_for = None
        live = {j.id for j in jobs}
        for gone in [k for k in self._deficit if k not in live]:
            del self._deficit[gone]

        types = list(range(len(order)))
        if self._shuffler is not None:
            self._shuffler.shuffle(types)
        queue = round_queue(list(states.items()), types, worker_time, self.policy.skip_zero_priority)
        assignment: dict[str, str] = {}
        idle: dict[str, str] = {}
        for jid, k in round_picks(queue, states, counts, self.policy.skip_zero_priority):
            (assignment if states[jid].alloc is not None else idle)[by_int[jid].id] = order[k]
        priorities: dict[str, dict[str, float]] = {}
        for p, _, _, neg, k in queue:
            priorities.setdefault(by_int[-neg].id, {})[order[k]] = p
        self.rounds += 1
        return RoundDecision(self.rounds, assignment, idle, priorities,
                             {j: dict(a) for j, a in self._alloc.items() if j in live}, reset, excluded,
                             self.period_start if self.period_start is not None else now)
