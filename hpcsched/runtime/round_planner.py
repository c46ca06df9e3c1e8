"""The controller's ``executor: rounds``: Gavel's round mechanism driving live workers.

The round's decision is ``hpcsched.hetero.round_executor`` (the simulator's rules, shared); this module is
what a controller adds around it:

- **Boundaries.** A round starts when the last one has run ``round_s``, or earlier when every job it gave
  GPUs to has ended (Gavel's round ends with its slowest job), or, when the last round ran nothing, as soon
  as a job arrives. Between boundaries nothing is re-decided: a job that arrives waits for the next round.
- **Time received** is charged from what ran: each attempt from its ``start`` event to its ``stopped`` or
  ``completed`` event (now, while it runs), on the GPU type of the workers it started on, counted from the
  start of the executor's accounting period. The events are read incrementally from a reader connection of
  the store, beside the controller's lock, at boundaries only.
- **Plan, every tick.** A running job the round does not give its current type is preempted (a checkpoint
  stop); a job the round gives a type starts, when it is pending, on workers of that type that have its
  launcher, placed by the configured placement step over their free slots (slots a stopping job still
  holds free up when it has checkpointed, so starts follow a few ticks after the stops). A job that keeps its
  type keeps running, without a stop (Gavel's lease extension).
- **Said.** Each boundary writes a store event ``round`` (round, assignment, idle GPUs, reset, priorities,
  allocation, jobs that cannot take part and why) and a ``round N: ...`` part in each active job's message
  (``hpcsched jobs``): the type it got and its priority, or why it waits. They are written at the next
  scheduling step, under the controller's lock (``flush``), and that step makes the round's stops and starts, so
  in the store a round's event comes before them.

The executor's memory (allocation, deficits) is the controller process's: a restarted controller starts a
new accounting period at its first round.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from hpcsched.hetero.round_executor import RoundDecision, RoundExecutor, RoundJobView
from hpcsched.placements import PlacementView, get_placement
from hpcsched.primitives.state import ClusterState, Plan
from hpcsched.runtime.config import ControllerConfig
from hpcsched.runtime.store import Store

log = logging.getLogger("hpcsched.runtime.rounds")

_MESSAGE_CHARS = 500  # the controller's bound on a job's message


@dataclass(slots=True)
class _Attempt:
    job: str
    gpu_type: str
    start: float
    end: float | None = None


class RoundPlanner:
    """Gavel's rounds for one controller: ``plan`` each tick (outside the lock), ``flush`` under it."""

    def __init__(self, cfg: ControllerConfig, reader: Store) -> None:
        from hpcsched.hetero.throughputs import load_throughputs

        table = load_throughputs(cfg.throughputs) if cfg.throughputs is not None else load_throughputs()
        self.executor = RoundExecutor(cfg.hetero_policy, table, round_s=cfg.round_s, reset_s=cfg.round_reset_s)
        self.round_s = cfg.round_s
        self.reader = reader
        self.place = get_placement(cfg.placement)
        self.decision: RoundDecision | None = None
        self.round_end = 0.0
        self.round_jobs: frozenset[str] = frozenset()  # the active jobs when the round was decided
        self.sizes: dict[str, int] = {}  # job -> procs (its scale factor)
        self._ran: set[str] = set()  # jobs seen running on their type this round
        self._records: list[tuple[RoundDecision, dict[str, str]]] = []  # decided, not yet written
        self._cursor = 0  # rowid of the last event read
        self._attempts: dict[str, _Attempt] = {}  # job -> its open attempt
        self._closed: list[_Attempt] = []  # ended attempts that may overlap the accounting period
        self._types: dict[str, str] = {}  # worker -> GPU type

    # ------------------------------------------------------------------------------------------ plan
    def plan(self, state: ClusterState) -> Plan:
        """Stops and starts that make the workers run the current round; a new round first when one is due."""
        present = {j.id: j for j in state.jobs}  # pending and running
        if self._boundary(state.now, present):
            self._new_round(state)
            return Plan()  # acted on at the next step, after ``flush`` wrote the round: its event comes first
        d = self.decision
        plan = Plan()
        if d is None:
            return plan
        wtype = {w.id: w.gpu_type for w in state.workers}
        free = {w.id: w.slots - state.used.get(w.id, 0) for w in state.workers}
        for j in state.jobs:
            if j.running:
                want = d.assignment.get(j.id)
                if want is None or {wtype.get(w, "") for w, _ in j.placement} != {want}:
                    plan.stops[j.id] = "preempt"  # lost its turn, or its type: it checkpoints
                else:
                    self._ran.add(j.id)
        for jid, gpu_type in d.assignment.items():  # in the greedy pass's order
            j = present.get(jid)
            if j is None or j.running:
                continue
            need = self.sizes[jid]
            cands = [w for w in state.workers if w.gpu_type == gpu_type and j.launcher in w.launchers]
            got = None
            if cands:
                got = self.place(PlacementView(need, tuple(max(0, free[w.id]) for w in cands),
                                               max(w.slots for w in cands), gpu_types=tuple(w.gpu_type for w in cands),
                                               model=j.model))
            if got is None:
                plan.waiting[jid] = f"round {d.round}: needs {need} free slots of {gpu_type} with {j.launcher}"
                continue
            where = [(cands[i].id, k) for i, k in got]
            for wid, k in where:
                free[wid] -= k
            plan.starts[jid] = where
            plan.sizes[jid] = need
        return plan

    def _boundary(self, now: float, present: dict) -> bool:
        d = self.decision
        if d is None:
            return bool(present)
        if now >= self.round_end:
            return bool(present) or bool(d.assignment)
        if d.assignment:  # Gavel's round ends with its slowest job: every job it gave GPUs to ran and has ended
            return all(j in self._ran and j not in present for j in d.assignment)
        return bool(set(present) - self.round_jobs)  # the last round ran nothing: an arrival starts one

    def _new_round(self, state: ClusterState) -> None:
        now = state.now
        rows = [j for j in self.reader.jobs(("pending", "running", "stopping")) if j.stop_reason != "cancel"]
        charged, totals = self._charges(now)
        views = [RoundJobView(j.id, j.spec.model, j.spec.procs, j.submit_time,
                         max(0, j.spec.steps - j.steps_done) if j.spec.steps is not None else None,
                         j.spec.gpu_types, charged.get(j.id, {})) for j in rows]
        gpus: dict[str, int] = {}
        for w in state.workers:
            if w.gpu_type:
                gpus[w.gpu_type] = gpus.get(w.gpu_type, 0) + w.slots
        d = self.executor.decide(now, views, gpus, totals)
        self.decision = d
        self._ran = set()
        self.round_end = now + self.round_s
        self.round_jobs = frozenset(j.id for j in state.jobs)
        self.sizes = {j.id: j.spec.procs for j in rows}
        notes = {}
        launcher = {j.id: j.spec.launcher for j in rows}
        for v in views:
            p = d.priorities.get(v.id, {})
            if v.id in d.assignment:
                t = d.assignment[v.id]
                notes[v.id] = f"round {d.round}: on {t} (priority {p.get(t, 0.0):.3g})"
                if not any(w.gpu_type == t and launcher[v.id] in w.launchers for w in state.workers):
                    notes[v.id] += f", but no live {t} worker has its {launcher[v.id]} launcher: they idle this round"
            elif v.id in d.idle:
                notes[v.id] = (f"round {d.round}: not in the allocation yet (it arrived after the last one, "
                               f"re-solved at most every {self.executor.reset_s:g} s)")
            elif v.id in d.excluded:
                notes[v.id] = f"round {d.round}: not scheduled: {d.excluded[v.id]}"
            else:
                best = max(p.items(), key=lambda kv: kv[1], default=None)
                notes[v.id] = (f"round {d.round}: not this round (priority {best[1]:.3g} on {best[0]})" if best
                               else f"round {d.round}: not this round")
        self._records.append((d, notes))
        log.info("round %d%s: %s%s", d.round, " (allocation re-solved)" if d.reset else "",
                 ", ".join(f"{j} on {t}" for j, t in d.assignment.items()) or "nothing runs",
                 f"; not scheduled: {', '.join(d.excluded)}" if d.excluded else "")

    def _charges(self, now: float) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
        """Seconds each job ran per GPU type since the accounting period began, and each type's total (jobs that
        ended since included), from the store's start / stopped / completed events."""
        self._types |= {w.id: w.gpu_type for w in self.reader.workers()}
        rows = self.reader.db.execute(
            "SELECT rowid, time, job_id, kind, detail FROM events WHERE rowid > ? AND kind IN "
            "('start', 'stopped', 'completed') ORDER BY rowid", (self._cursor,)).fetchall()
        for rowid, t, job, kind, detail in rows:
            self._cursor = rowid
            if kind == "start":
                workers = json.loads(detail).get("workers") or [""]
                self._attempts[job] = _Attempt(job, self._types.get(workers[0], ""), t)
            elif job in self._attempts:
                a = self._attempts.pop(job)
                a.end = t
                self._closed.append(a)
        since = self.executor.period_start if self.executor.period_start is not None else now
        self._closed = [a for a in self._closed if a.end is not None and a.end > since]
        charged: dict[str, dict[str, float]] = {}
        totals: dict[str, float] = {}
        for a in [*self._closed, *self._attempts.values()]:
            s = max(0.0, min(a.end if a.end is not None else now, now) - max(a.start, since))
            if s > 0 and a.gpu_type:
                per = charged.setdefault(a.job, {})
                per[a.gpu_type] = per.get(a.gpu_type, 0.0) + s
                totals[a.gpu_type] = totals.get(a.gpu_type, 0.0) + s
        return charged, totals

    # ----------------------------------------------------------------------------------------- flush
    def flush(self, store: Store) -> None:
        """Write the rounds decided since the last call: an event each, and each job's ``round N`` note. Called by
        the controller under its lock, inside a transaction."""
        for d, notes in self._records:
            store.event(None, "round", round=d.round, assignment=d.assignment, idle=d.idle, reset=d.reset,
                        priorities={j: {t: round(p, 6) for t, p in ps.items()} for j, ps in d.priorities.items()},
                        allocation={j: {t: round(x, 6) for t, x in a.items()} for j, a in d.allocation.items()},
                        excluded=d.excluded, period_start=d.period_start)
            for job in store.jobs(ids=list(notes)):
                parts = [p for p in job.message.split("; ") if p and not p.startswith("round ")]
                message = "; ".join([notes[job.id], *parts])
                if len(message) > _MESSAGE_CHARS:
                    message = message[: _MESSAGE_CHARS - 3] + "..."
                if message != job.message:
                    store.update_job(job.id, message=message)
        self._records = []
