"""Replay an idle-pool timeline with elastic jobs harvesting it, one allocator decision per event.

Semantics follow BFTrainer's replayer so figures are comparable, in this order at every event:
progress every job at its rate for the elapsed time (minus the rescale loss of the last decision);
charge preemption (a job losing nodes loses ``Tdw x rate`` samples, once per event); complete jobs
that reached Pmax (detected at events, as the reference does); add the joined nodes; admit submitted
jobs FCFS up to ``max_jobs``; stop once every job is done; otherwise re-solve.
Utilisation = sum(nodes held x dt) / sum(idle nodes x dt) up to that stop.

Differences from the reference, all deliberate: no randomness (its first allocation is random and
unseeded; ours is the allocator's, like every later one), and two optional extensions:

- ``accounting="restart"``: a job that is resized, started or preempted at an event restarts once
  and stalls for Tup (growth or start) or Tdw (shrink or preemption), losing that much time at its
  new rate. The reference instead charges ``T x old rate``, so starting a job is free and a job
  preempted and then regrown pays twice. Pair it with ``Objective.WINDOW``, which optimises this.
- ``predict_tfwd``: the look-ahead is the median length of the idle stretches seen so far (causal,
  from the replay's own history) instead of a fixed Tfwd.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hpcsched.milp import JobState, Objective, Problem, solve_counts
from hpcsched.milp.mapping import map_nodes
from hpcsched.milp.problem import check_job, job_rate
from hpcsched.model import ElasticJob
from hpcsched.results import JobResult
from hpcsched.sim.replay_events import PoolTimeline

ACCOUNTING = ("reference", "restart")
EVENT_COLUMNS = (
    "time", "dt", "pool", "joined", "left", "used", "active", "done", "preempted_jobs", "preempt_loss",
    "rescales", "rescale_loss", "rate", "tfwd", "solve_s", "status",
)


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    tfwd: float = 10.0
    solver: str = "highs"
    objective: Objective = Objective.REFERENCE
    accounting: str = "reference"
    max_jobs: int = 10  # the reference's maxJ: jobs admitted at once
    time_limit: float = 10.0  # per decision, seconds
    predict_tfwd: bool = False
    history: int = 1000  # idle stretches the predictor remembers

    def __post_init__(self) -> None:
        if self.accounting not in ACCOUNTING:
            raise ValueError(f"accounting must be one of {ACCOUNTING}, got {self.accounting!r}")
        if self.max_jobs < 1:
            raise ValueError("max_jobs must be >= 1")


@dataclass(slots=True)
class _Run:
    job: ElasticJob
    held: tuple[str, ...] = ()
    samples: float = 0.0
    rate: float = 0.0
    pending_loss: float = 0.0  # samples lost to the last decision's restart, charged at the next event
    start: float | None = None
    end: float | None = None
    node_seconds: float = 0.0
    max_nodes: int = 0
    rescales: int = 0
    preemptions: int = 0


@dataclass(slots=True)
class ReplayResult:
    summary: dict[str, object]
    events: list[tuple[object, ...]]
    jobs: list[JobResult]
    per_job: list[dict[str, object]] = field(default_factory=list)


class _MedianWindow:
    """Median of the last ``size`` idle-stretch lengths: the causal Tfwd predictor."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.order: deque[float] = deque()
        self.sorted: list[float] = []

    def add(self, x: float) -> None:
        self.order.append(x)
        bisect.insort(self.sorted, x)
        if len(self.order) > self.size:
            old = self.order.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]

    def median(self) -> float | None:
        return self.sorted[len(self.sorted) // 2] if len(self.sorted) >= 10 else None


def replay(
    timeline: PoolTimeline,
    jobs: Sequence[ElasticJob],
    config: ReplayConfig,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Run the replay; ``progress(done, total)`` is called every few hundred events."""
    for j in jobs:
        check_job(j)
    queue = sorted(jobs, key=lambda j: j.submit)  # stable: file order among equal submits
    runs = {j.id: _Run(j) for j in queue}
    pool: dict[str, None] = dict.fromkeys(timeline.initial)  # insertion order: longest idle first
    joined_at: dict[str, float] = {}
    history = _MedianWindow(config.history)
    active: list[_Run] = []
    admitted = 0
    cache: dict[tuple[object, ...], tuple[list[int], str]] = {}
    events: list[tuple[object, ...]] = []
    used_ns = idle_ns = 0.0
    total_rescales = total_preempt = 0
    solve_s = 0.0
    overshoot = 0.0
    hits = 0
    t_prev = timeline.start
    stopped_at: float | None = None
    n_events = len(timeline.events)

    def admit(now: float) -> None:
        nonlocal admitted
        while len(active) < config.max_jobs and admitted < len(queue) and queue[admitted].submit <= now:
            active.append(runs[queue[admitted].id])
            admitted += 1

    def decide(now: float, lost: dict[str, set[str]], first: bool) -> tuple[int, float, float, str, float]:
        nonlocal solve_s, hits
        tfwd = config.tfwd
        if config.predict_tfwd:
            tfwd = history.median() or config.tfwd
        states = tuple(JobState(r.job, r.held, frozenset(lost.get(r.job.id, ()))) for r in active)
        problem = Problem(states, tuple(pool), tfwd, config.objective)
        key = (tuple((s.job.id, s.count, s.preempted) for s in states), len(pool), tfwd)
        t0 = time.perf_counter()
        hit = cache.get(key)
        if hit is None:
            counts, status, _ = solve_counts(problem, config.solver, config.time_limit)
            if len(cache) > 100_000:
                cache.clear()
            cache[key] = (counts, status)
        else:
            counts, status = hit
            hits += 1
        nodes = map_nodes(states, problem.pool, counts)
        dt_solve = time.perf_counter() - t0
        solve_s += dt_solve
        rescales, loss = 0, 0.0
        for r, s in zip(active, states, strict=True):
            new = nodes[r.job.id]
            c, n = s.count, len(new)
            new_rate = job_rate(r.job, n)
            if n != c:
                rescales += 1
                r.rescales += 1
            if config.accounting == "reference":
                if first and n > 0:  # the reference charges the first allocation's start-up
                    r.pending_loss = r.job.scale_up_s * new_rate
                elif n > c:
                    r.pending_loss = r.job.scale_up_s * job_rate(r.job, c)
                elif n < c:
                    r.pending_loss = r.job.scale_down_s * job_rate(r.job, c)
            elif n > 0 and (s.preempted or n != c):
                stall = r.job.scale_down_s if s.preempted or n < c else r.job.scale_up_s
                r.pending_loss = stall * new_rate
            loss += r.pending_loss
            r.held = new
            r.rate = new_rate
            r.max_nodes = max(r.max_nodes, n)
            if n > 0 and r.start is None:
                r.start = now
        return rescales, loss, tfwd, status, dt_solve

    admit(timeline.start)
    rescales, loss, tfwd, status, dts = decide(timeline.start, {}, True)
    total_rescales += rescales
    events.append((timeline.start, 0.0, len(pool), len(pool), 0, sum(len(r.held) for r in active), len(active),
                   0, 0, 0.0, rescales, loss, sum(r.rate for r in active), tfwd, dts, status))
    done = 0
    for k, ev in enumerate(timeline.events):
        now = ev.time
        dt = now - t_prev
        idle_ns += dt * len(pool)
        for r in active:  # progress at the last decision's rates, minus its restart losses
            r.samples += dt * r.rate - r.pending_loss
            r.pending_loss = 0.0
            r.node_seconds += dt * len(r.held)
            used_ns += dt * len(r.held)
        owner = {x: r for r in active for x in r.held} if ev.left else {}
        lost: dict[str, set[str]] = {}
        preempt_loss = 0.0
        for x in ev.left:  # preemption: the batch scheduler takes nodes back
            pool.pop(x, None)
            if x in joined_at:
                history.add(now - joined_at.pop(x))
            r = owner.get(x)
            if r is None:
                continue
            if r.job.id not in lost:
                lost[r.job.id] = set()
                r.preemptions += 1
                if config.accounting == "reference":
                    r.samples -= r.job.scale_down_s * r.rate
                    preempt_loss += r.job.scale_down_s * r.rate
            lost[r.job.id].add(x)
        for r in active:
            if r.job.id in lost:
                r.held = tuple(x for x in r.held if x not in lost[r.job.id])
        total_preempt += len(lost)
        finished = [r for r in active if r.samples >= r.job.total_samples]
        for r in finished:
            overshoot += r.samples - r.job.total_samples  # work done past Pmax before the event saw it
            r.samples = r.job.total_samples
            r.end = now
            r.held, r.rate = (), 0.0
            lost.pop(r.job.id, None)
        done += len(finished)
        if finished:
            active[:] = [r for r in active if r.end is None]
        for x in ev.joined:
            pool[x] = None
            joined_at[x] = now
        admit(now)
        if not active and admitted == len(queue):
            stopped_at = now
            events.append((now, dt, len(pool), len(ev.joined), len(ev.left), 0, 0, done, len(lost), preempt_loss,
                           0, 0.0, 0.0, 0.0, 0.0, "finished"))
            break
        rescales, loss, tfwd, status, dts = decide(now, lost, False)
        total_rescales += rescales
        events.append((now, dt, len(pool), len(ev.joined), len(ev.left), sum(len(r.held) for r in active),
                       len(active), done, len(lost), preempt_loss, rescales, loss, sum(r.rate for r in active),
                       tfwd, dts, status))
        t_prev = now
        if progress is not None and k % 200 == 0:
            progress(k, n_events)
    if progress is not None:
        progress(n_events, n_events)
    end_time = stopped_at if stopped_at is not None else (timeline.events[-1].time if timeline.events else t_prev)
    results = []
    for j in queue:
        r = runs[j.id]
        status_j = "completed" if r.end is not None else ("unfinished" if r.start is not None else "not_started")
        results.append(JobResult(j.id, j.submit, r.start, r.end, 0, r.max_nodes, 0.0, r.node_seconds, status_j))
    samples = sum(r.samples for r in runs.values())
    summary: dict[str, object] = {
        "events": len(events) - 1,
        "jobs": len(queue),
        "jobs_done": done,
        "idle_node_hours": idle_ns / 3600.0,
        "used_node_hours": used_ns / 3600.0,
        "utilization": used_ns / idle_ns if idle_ns > 0 else 0.0,
        "rescales": total_rescales,
        "preemptions": total_preempt,
        "samples": samples,
        "samples_past_pmax": overshoot,
        "start": timeline.start,
        "end": end_time,
        "finished": stopped_at is not None,
        "solve_seconds": solve_s,
        "decisions_cached": hits,
    }
    per_job = [
        {"job_id": r.job.id, "samples": r.samples, "rescales": r.rescales, "preemptions": r.preemptions}
        for r in (runs[j.id] for j in queue)
    ]
    return ReplayResult(summary, events, results, per_job)
