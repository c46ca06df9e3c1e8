"""Replay an idle-pool timeline with elastic jobs harvesting it, one allocator decision per event.

Semantics follow BFTrainer's replayer so figures are comparable, in this order at every event:
progress every job at its rate for the elapsed time (minus the rescale loss of the last decision);
charge preemption (a job losing nodes loses ``Tdw x rate`` samples, once per event); complete jobs
that reached Pmax (detected at events, as the reference does); add the joined nodes; admit submitted
jobs FCFS up to ``max_jobs``; stop once every job is done; otherwise re-solve.
Utilisation = sum(nodes held x dt) / sum(idle nodes x dt) up to that stop.

That is BFTrainer's figure, kept so ours compare with its published ones, but under its event rule
it is not all work: a job that reaches Pmax between pool changes keeps its nodes, and they count as
held ("used"), until the next pool change notices. Where pool changes are sparse (a quiet batch log)
that dominates: the same work showed 37,221 node-hours "used" against 19,513 with ``exact_events``,
both at utilisation ~0.998, with more samples computed past Pmax than the jobs' total. So the
replayer splits the held node-time: ``held_past_pmax_node_hours`` is what jobs held after reaching
Pmax (from the crossing instant within the step), ``useful_node_hours`` the rest, and
``useful_utilization`` = useful / idle. ``useful_node_hours`` is what ``exact_events`` reports as
used, where the two runs make the same decisions (e.g. one job on a fixed pool).

Differences from the reference, all deliberate: no randomness (its first allocation is random and
unseeded; ours is the allocator's, like every later one), and three optional extensions:

- ``accounting="restart"``: a job that is resized, started or preempted at an event restarts once
  and stalls for Tup (growth or start) or Tdw (shrink or preemption), losing that much time at its
  new rate. The reference instead charges ``T x old rate``, so starting a job is free and a job
  preempted and then regrown pays twice. Pair it with ``Objective.WINDOW``, which optimises this.
- ``predict_tfwd``: the look-ahead is the median length of the idle stretches seen so far (causal,
  from the replay's own history) instead of a fixed Tfwd.
- ``exact_events``: a job completes the moment it reaches Pmax and is admitted the moment it is
  submitted, each with a re-solve, instead of waiting for the next pool change (where the reference
  keeps a finished job's nodes busy and counts them as used).

Node identity matters only where nodes leave (whose job loses them) and where a decision maps counts to
nodes, so the pool and every job's nodes are runs of node indices (``harvest.idle_runs``, ``hpcsched.milp.mapping``),
counts go to ``solve_counts_sized`` and ``map_runs`` hands out the same nodes the node-by-node replayer did:
no step's cost grows with the machine's node count, and results are bit for bit those of that replayer
(tests/test_replay_scale.py).
"""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence

from hpcsched.harvest.decision import solve_decision
from hpcsched.harvest.event_rows import EventRows
from hpcsched.harvest.idle_runs import IdleRuns
from hpcsched.harvest.median_window import MedianWindow
from hpcsched.harvest.pool import NumberedNodes, PoolEvent, PoolTimeline, RangeEvents
from hpcsched.harvest.quiet_gap import empty_answers, quiet_end, replay_quiet, tally
from hpcsched.harvest.replay_config import (
    ACCOUNTING,
    EVENT_COLUMNS,
    EVENT_KINDS,
    NONOPTIMAL,
    ReplayConfig,
    ReplayResult,
    Valuation,
)
from hpcsched.harvest.replay_job import JobRun
from hpcsched.harvest.replay_progress import ReplayProgress
from hpcsched.milp import MilpJob, Objective
from hpcsched.milp.formulation import PER_JOB_UP_TO
from hpcsched.milp.mapping import NodeRuns, Run, Spans, map_runs, runs_len, runs_of, split_runs
from hpcsched.milp.problem import check_job
from hpcsched.model import ElasticJob
from hpcsched.primitives.event_core import EventCore
from hpcsched.results import JobResult

CACHE_LIMIT = 100_000  # decisions remembered; past it the cache starts afresh

__all__ = ["ACCOUNTING", "EVENT_COLUMNS", "NONOPTIMAL", "ReplayConfig", "ReplayResult", "Valuation", "replay"]


class PoolWalk:
    """The replayer as a strategy of the event core: a pool event at a time (the replay's state decides)."""

    def __init__(self, state: _Replay) -> None:
        self.state = state
        self.handle = state.handle

    def next_round(self, t: float) -> float | None:
        """No rounds: the replayer decides at pool events (and, with ``exact_events``, the ones between)."""
        return None

    def done(self) -> bool:
        """Every job done: the rest of the log is not replayed."""
        return self.state.stopped_at is not None


class _Replay:
    """One replay's mutable state; ``run`` walks the events in the reference's per-event order, as a strategy
    of the simulators' event core (``hpcsched.primitives.event_core``: each pool event an event of its heap)."""

    def __init__(self, timeline: PoolTimeline, jobs: Sequence[ElasticJob], config: ReplayConfig,
                 valuation: Valuation | None = None) -> None:
        ids = [j.id for j in jobs]
        if len(set(ids)) != len(ids):
            raise ValueError("job ids must be unique")
        for j in jobs:
            check_job(j)
        self.tl, self.cfg, self.valuation = timeline, config, valuation
        self.names = timeline.nodes
        self._index: dict[str, int] | None = None
        self.queue = sorted(jobs, key=lambda j: j.submit)  # stable: file order among equal submits
        self.runs = {j.id: JobRun(j) for j in self.queue}
        self.pool = IdleRuns()
        self.pool.add(self._runs_of(timeline.initial), None, self.names)
        self.history = MedianWindow(config.history)
        self.active: list[JobRun] = []
        self.admitted = self.done = self.rescales = self.preemptions = self.hits = 0
        self.held_at_minimum = 0  # no_pause: jobs the allocator would have paused, held at their minimum (per decision)
        self.cache: dict[tuple[object, ...], tuple[list[int], str, int]] = {}
        self.events = EventRows(EVENT_KINDS)
        self.used_ns = self.idle_ns = self.solve_s = self.overshoot = self.past_pmax_ns = 0.0
        self.lost_preempt = self.lost_restart = 0.0
        self.statuses: Counter[str] = Counter()  # status of every decision applied (cached ones included)
        # the walk (``run``): the event core, the pool event read ahead, the last decision's time, the stop
        self.core = EventCore(start=-math.inf)
        self.ahead: tuple[list[Run], list[Run]] = ([], [])
        self.t_prev = timeline.start
        self.stopped_at: float | None = None
        self.report: Callable[[int], None] = lambda k: None

    def _runs_of(self, nodes: Sequence[str]) -> list[Run]:
        """Node names as index runs in their order: free for ``NodeRuns`` of this machine; named nodes
        (a hand-made timeline) are looked up in ``timeline.nodes``."""
        if isinstance(nodes, NodeRuns) and nodes.names is self.names:
            return list(nodes.runs)
        if isinstance(self.names, NumberedNodes):
            return runs_of(self.names.index(x) for x in nodes)
        if self._index is None:
            self._index = {x: k for k, x in enumerate(self.names)}
        try:
            return runs_of(self._index[x] for x in nodes)
        except KeyError as e:
            raise ValueError(f"node {e.args[0]} is not in the timeline's node list") from None

    def _event(self, k: int) -> tuple[float, list[Run], list[Run]]:
        """Event k as (time, joined runs, left runs); a ``RangeEvents`` of this machine gives them as stored."""
        events = self.tl.events
        if isinstance(events, RangeEvents) and events.names is self.names:
            return events.runs(k)
        ev: PoolEvent = events[k]
        return ev.time, self._runs_of(ev.joined), self._runs_of(ev.left)

    def admit(self, now: float) -> None:
        """FCFS up to max_jobs: the reference's maxJ queue limit."""
        q = self.queue
        while len(self.active) < self.cfg.max_jobs and self.admitted < len(q) and q[self.admitted].submit <= now:
            self.active.append(self.runs[q[self.admitted].id])
            self.admitted += 1

    def progress(self, dt: float) -> None:
        """Work at the last decision's rates, minus that decision's restart losses."""
        self.idle_ns += dt * self.pool.size
        for r in self.active:
            gained = dt * r.rate - r.pending_loss
            r.step_past_ns = 0.0
            if r.n and r.rate > 0 and r.samples + gained - r.job.total_samples > 1e-9 * r.job.total_samples:
                # Pmax was reached inside this step (beyond rounding); the nodes held after that did no work
                reached = (r.job.total_samples - r.samples + r.pending_loss) / r.rate
                r.step_past_ns = r.n * (dt - min(max(reached, 0.0), dt))
            r.samples += gained
            self.lost_restart += r.pending_loss
            r.pending_loss = 0.0
            r.node_seconds += dt * r.n
            self.used_ns += dt * r.n

    def preempt(self, now: float, left: Sequence[Run]) -> tuple[dict[str, list[Run]], float]:
        """The batch scheduler takes ``left`` back; jobs on them lose those nodes (charged once each).

        Charged in the order of each job's first lost node in ``left``, as the node-by-node replay did,
        so float sums come out bit for bit the same.
        """
        lost: dict[str, list[Run]] = {}
        if not left:
            return lost, 0.0
        gone, predict = 0, self.cfg.predict_tfwd  # idle stretches are remembered only for the Tfwd predictor
        for a, b in left:
            for lo, hi, joined in self.pool.remove(a, b):
                gone += hi - lo
                if predict and joined is not None:
                    self.history.add(now - joined, hi - lo)
        if gone != runs_len(left):
            raise ValueError(f"{runs_len(left) - gone} node(s) leave the idle pool at {now} but were not in it")
        where = Spans(left)
        order, pos = [], 0  # (first index, position in the event's order) of each left run
        for a, b in left:
            order.append((a, pos))
            pos += b - a
        order.sort()
        firsts = [a for a, _ in order]

        def position(x: int) -> int:
            a, p = order[bisect.bisect_right(firsts, x) - 1]
            return p + x - a

        hit: list[tuple[int, JobRun, list[Run]]] = []
        for r in self.active:
            mine = [p for lo, hi in r.held for p in where.intersect(lo, hi)]
            if mine:
                hit.append((min(position(lo) for lo, _ in mine), r, mine))
        loss = 0.0
        for _, r, mine in sorted(hit, key=lambda h: h[0]):
            lost[r.job.id] = mine
            r.preemptions += 1
            if self.cfg.accounting == "reference":
                r.samples -= r.job.scale_down_s * r.rate
                loss += r.job.scale_down_s * r.rate
        for r in self.active:
            if r.job.id in lost:
                r.held = [p for lo, hi in r.held for p in where.minus(lo, hi)]
                r.n = runs_len(r.held)
        self.preemptions += len(lost)
        self.lost_preempt += loss
        return lost, loss

    def complete(self, now: float, lost: dict[str, list[Run]]) -> None:
        # a relative tolerance: an exact completion event lands on Pmax only up to rounding (epoch-second
        # times carry ~1e-7 s of error, i.e. a few samples at these rates); and what is left takes less than the
        # clock's resolution at ``now`` (a small Pmax on epoch times: no later event could be told apart from
        # ``now``, so the job would wait, holding its nodes, for the next pool change)
        finished = [r for r in self.active if r.samples >= r.job.total_samples * (1 - 1e-9)
                    or r.job.total_samples - r.samples <= 4 * math.ulp(now) * r.rate]
        for r in finished:
            self.overshoot += r.samples - r.job.total_samples  # work past Pmax before an event saw it
            r.past_pmax_ns += r.step_past_ns
            self.past_pmax_ns += r.step_past_ns
            r.samples = r.job.total_samples
            r.end = now
            r.held, r.n, r.rate = [], 0, 0.0
            lost.pop(r.job.id, None)
        self.done += len(finished)
        if finished:
            self.active[:] = [r for r in self.active if r.end is None]

    def decide(self, now: float, lost: dict[str, list[Run]], first: bool) -> tuple[int, float, float, str, float]:
        """Re-solve and apply: (rescales, restart loss, Tfwd used, solver status, seconds).

        The seconds cover the whole decision (states, counts or their cache, node mapping): what one
        decision costs the replay.
        """
        cfg = self.cfg
        t0 = time.perf_counter()
        tfwd = (self.history.median() or cfg.tfwd) if cfg.predict_tfwd else cfg.tfwd
        # counts depend only on who holds how many, who was preempted, the pool size and Tfwd (and, for jobs a
        # valuation revalues as they progress, on the phase each is in). Who was preempted reaches the model only
        # through the window objective's values and the job classes of a large decision (milp.formulation): left
        # out otherwise, a replay on a busy log sees ~40% fewer distinct decisions, with the same answers
        jobs_key: tuple[tuple[object, ...], ...]
        if cfg.objective is Objective.REFERENCE and len(self.active) <= PER_JOB_UP_TO:
            jobs_key = tuple((r.job.id, r.n) for r in self.active)
        else:
            jobs_key = tuple((r.job.id, r.n, r.job.id in lost) for r in self.active)
        key = (jobs_key, self.pool.size, tfwd, self._revalue())
        hit = self.cache.get(key)
        if hit is None:
            for r in self.active:  # what Problem checked per node, here per run, at every solve (and below for the
                self._check_idle(r, r.held, now)  # runs a decision hands out): held nodes are idle nodes
            states = tuple(MilpJob(r.valued or r.job, NodeRuns(r.held, self.names),
                                    NodeRuns(lost.get(r.job.id, ()), self.names)) for r in self.active)
            counts, status, held = solve_decision(states, self.pool.size, tfwd, cfg)
            if len(self.cache) > CACHE_LIMIT:
                self.cache.clear()
            self.cache[key] = (counts, status, held)
        else:
            counts, status, held = hit
            self.hits += 1
        self.held_at_minimum += held
        if all(c <= r.n for c, r in zip(counts, self.active, strict=True)):
            # no job grows: map_runs would only keep each job's oldest nodes, without walking the pool
            new_runs = [r.held if c == r.n else split_runs(r.held, c)[0]
                        for c, r in zip(counts, self.active, strict=True)]
        else:
            new_runs = map_runs([r.held for r in self.active], [lost.get(r.job.id, []) for r in self.active],
                                [r.job.jmin for r in self.active], counts, self.pool.walk())
        secs = time.perf_counter() - t0
        self.statuses[status] += 1
        self.solve_s += secs
        rescales, loss = 0, 0.0
        for r, new in zip(self.active, new_runs, strict=True):
            if new is r.held:
                c = n = r.n
            else:
                self._check_idle(r, new, now)
                c, n = r.n, runs_len(new)
            new_rate = r.rate_at(n)
            if n != c:
                rescales += 1
                r.rescales += 1
            r.pending_loss = r.restart_loss(cfg.accounting, r.job.id in lost, c, n, new_rate, first)
            loss += r.pending_loss
            r.held, r.n, r.rate, r.max_nodes = new, n, new_rate, max(r.max_nodes, n)
            if n > 0 and r.start is None:
                r.start = now
        self.rescales += rescales
        return rescales, loss, tfwd, status, secs

    def _revalue(self) -> tuple[tuple[str, int], ...]:
        """Profiled jobs' curves for the progress each has made (``goodput``): their phases, for the cache key."""
        v = self.valuation
        if v is None:
            return ()
        phases = []
        for r in self.active:
            if r.job.id in v.profiles:
                r.job, r.valued, phase = v.at(r.job, r.samples)
                phases.append((r.job.id, phase))
        return tuple(phases)

    def _check_idle(self, r: JobRun, runs: list[Run], now: float) -> None:
        if not all(self.pool.covers(lo, hi) for lo, hi in runs):
            raise RuntimeError(f"replay state broken: job {r.job.id} holds nodes that are not idle at {now}")

    def _held(self) -> int:
        return sum(r.n for r in self.active)

    def run(self, progress: Callable[[int, int], None] | None) -> float | None:
        """Walk the events; the time every job was done, or None if the data ran out first."""
        tl = self.tl
        self.admit(tl.start)
        resc, loss, tfwd, status, secs = self.decide(tl.start, {}, True)
        size = self.pool.size
        self.events.append((tl.start, 0.0, size, size, 0, self._held(), len(self.active), 0, 0,
                            0.0, resc, loss, sum(r.rate for r in self.active), tfwd, secs, status))
        self.t_prev = tl.start
        self.report = ReplayProgress(progress, len(tl.events), sum(j.total_samples for j in self.queue),
                                     lambda: sum(r.samples for r in self.runs.values()))
        # the pool's events on the event core, one read ahead (a 10^7-event log is never held at once); a
        # timeline out of time order stops with the core's error (a clock does not go back)
        self._arm(0)
        self.core.run(PoolWalk(self))
        return self.stopped_at

    def _arm(self, k: int) -> None:
        """Read pool event ``k`` (if any) and put it on the core's heap."""
        if k < len(self.tl.events):
            now, joined, left = self._event(k)
            self.ahead = (joined, left)
            self.core.schedule(now, k)

    def handle(self, now: float, k: int) -> None:
        """Pool event ``k``: the completions and submits before it (``exact_events``), then its nodes leave and
        join, the jobs progress to it, and the allocator decides."""
        nxt = self.quiet(k)
        if nxt > k:
            self._arm(nxt)
            return
        joined, left = self.ahead
        if self.cfg.exact_events:
            self.t_prev, done_at = self.internal_events(self.t_prev, now)
            if done_at is not None:
                self.stopped_at = done_at
                return
        dt = now - self.t_prev
        self.progress(dt)
        lost, preempt_loss = self.preempt(now, left)
        self.complete(now, lost)
        self.pool.add(joined, now, self.names)
        self.admit(now)
        head = (now, dt, self.pool.size, runs_len(joined), runs_len(left))
        if not self.active and self.admitted == len(self.queue):
            self.events.append((*head, 0, 0, self.done, len(lost), preempt_loss, 0, 0.0, 0.0, 0.0, 0.0,
                                "finished"))
            self.stopped_at = now
            return
        resc, loss, tfwd, status, secs = self.decide(now, lost, False)
        self.events.append((*head, self._held(), len(self.active), self.done, len(lost), preempt_loss, resc,
                            loss, sum(r.rate for r in self.active), tfwd, secs, status))
        self.t_prev = now
        self.report(k)
        self._arm(k + 1)

    def quiet(self, k: int) -> int:
        """Events from ``k`` with no job active and none admissible before them (``harvest.quiet_gap``), replayed in
        bulk: the next event to handle (``k`` where there are too few or the walk must check them one by one)."""
        events, cfg = self.tl.events, self.cfg
        if (self.active or self.admitted >= len(self.queue) or cfg.predict_tfwd
                or not isinstance(events, RangeEvents) or events.names is not self.names):
            return k
        t0 = time.perf_counter()
        end = quiet_end(events, k, self.queue[self.admitted].submit)
        gap = replay_quiet(events, k, end, self.t_prev, self.idle_ns, self.pool, len(self.names))
        if gap is None:
            return k
        n = len(gap.times)
        hits, answers, at = empty_answers(self.cache, gap.size, lambda size: ((), size, cfg.tfwd, ()),
                                          lambda size: solve_decision((), size, cfg.tfwd, cfg), CACHE_LIMIT)
        status, held = tally(answers, at, self.statuses)
        self.hits += hits
        self.held_at_minimum += held
        self.idle_ns = gap.idle_ns
        secs = (time.perf_counter() - t0) / n
        self.solve_s += secs * n
        self.events.extend((gap.times, gap.dt, gap.size, gap.joined, gap.left, 0, 0, self.done, 0, 0.0, 0, 0.0, 0,
                            cfg.tfwd, secs, status), n)
        self.t_prev = float(gap.times[-1])
        self.report(k + n - 1)
        return k + n

    def _next_internal(self, after: float, before: float) -> float | None:
        """The first completion or admissible submit strictly between two pool events, if any."""
        times = []
        for r in self.active:
            if r.rate > 0:
                times.append(after + (r.job.total_samples - r.samples + r.pending_loss) / r.rate)
        if len(self.active) < self.cfg.max_jobs and self.admitted < len(self.queue):
            times.append(self.queue[self.admitted].submit)
        t = min((x for x in times if after < x < before), default=None)
        return t

    def internal_events(self, t_prev: float, until: float) -> tuple[float, float | None]:
        """Completions and submits before the next pool event, each with a re-solve (``exact_events``)."""
        while (now := self._next_internal(t_prev, until)) is not None:
            dt = now - t_prev
            self.progress(dt)
            self.complete(now, {})
            self.admit(now)
            head = (now, dt, self.pool.size, 0, 0)
            if not self.active and self.admitted == len(self.queue):
                self.events.append((*head, 0, 0, self.done, 0, 0.0, 0, 0.0, 0.0, 0.0, 0.0, "finished"))
                return now, now
            resc, loss, tfwd, status, secs = self.decide(now, {}, False)
            self.events.append((*head, self._held(), len(self.active), self.done, 0, 0.0, resc, loss,
                                sum(r.rate for r in self.active), tfwd, secs, status))
            t_prev = now
        return t_prev, None

    def result(self, stopped_at: float | None) -> ReplayResult:
        tl = self.tl
        end = stopped_at if stopped_at is not None else (tl.events[-1].time if tl.events else tl.start)
        jobs = []
        for j in self.queue:
            r = self.runs[j.id]
            status = "completed" if r.end is not None else ("unfinished" if r.start is not None else "not_started")
            jobs.append(JobResult(j.id, j.submit, r.start, r.end, 0, r.max_nodes, 0.0, r.node_seconds, status))
        held, past = self.used_ns / 3600.0, self.past_pmax_ns / 3600.0
        idle = self.idle_ns / 3600.0
        decisions = sum(n for st, n in self.statuses.items() if st != "empty")
        summary: dict[str, object] = {
            "events": len(self.events) - 1,
            "jobs": len(self.queue),
            "jobs_done": self.done,
            "idle_node_hours": idle,
            "used_node_hours": held,  # held by elastic jobs, as BFTrainer counts (see the module docstring)
            "utilization": self.used_ns / self.idle_ns if self.idle_ns > 0 else 0.0,
            "held_past_pmax_node_hours": past,
            "useful_node_hours": held - past,
            "useful_utilization": (held - past) / idle if idle > 0 else 0.0,
            "rescales": self.rescales,
            "preemptions": self.preemptions,
            "held_at_minimum": self.held_at_minimum,
            "samples": sum(r.samples for r in self.runs.values()),
            "samples_past_pmax": self.overshoot,
            "samples_lost_preemption": self.lost_preempt,
            "samples_lost_restart": self.lost_restart,
            "start": tl.start,
            "end": end,
            "finished": stopped_at is not None,
            "decisions": decisions,
            "nonoptimal_decisions": sum(self.statuses[st] for st in NONOPTIMAL),
            "solve_seconds": self.solve_s,
            "decisions_cached": self.hits,
        }
        per_job: list[dict[str, object]] = [
            {"job_id": r.job.id, "samples": r.samples, "rescales": r.rescales, "preemptions": r.preemptions,
             "node_seconds_past_pmax": r.past_pmax_ns}
            for r in (self.runs[j.id] for j in self.queue)
        ]
        return ReplayResult(summary, self.events, jobs, per_job,
                            {st: n for st, n in sorted(self.statuses.items()) if st in NONOPTIMAL})


def replay(
    timeline: PoolTimeline,
    jobs: Sequence[ElasticJob],
    config: ReplayConfig,
    progress: Callable[[int, int], None] | None = None,
    valuation: Valuation | None = None,
) -> ReplayResult:
    """Run the replay; ``progress(done, total)`` follows it in event units (``ReplayProgress``), ending at (total,
    total).
    ``valuation`` revalues the jobs it profiles at every decision (``hpcsched.harvest.goodput``); the jobs must be
    as its ``prepare`` returned them."""
    state = _Replay(timeline, jobs, config, valuation)
    stopped_at = state.run(progress)
    if progress is not None:
        progress(len(timeline.events), len(timeline.events))
    return state.result(stopped_at)
