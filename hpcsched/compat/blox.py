"""``--compat blox``: the round loop of Blox's simulator (msr-fiddle/blox ``blox_new_flow_multi_run.py``).

Written from Blox's semantics (its code is not copied). Every ``round_s`` seconds, at ``t``:

1. metrics: each job that was running during the round is credited the FULL round (``round_s`` of wall-clock
   attained service; ``round_s / iteration_time`` iterations, times Optimus' speed-up); a job whose iterations
   reach its total finishes at ``t`` (so a job always ends on a boundary), and the first metering after a job's
   first launch is its "responsiveness" time;
2. admission: every job whose submit is ``<= t`` joins the active jobs (accept-all), in stream order;
3. scheduling: a STABLE sort of the active jobs (in admission order) by ``(priority, key)``: fifo = submit,
   srtf / optimus = ``iteration_time x iterations - attained``, las / tiresias = attained (Blox's Tiresias is
   its LAS). ``priority`` is 999, and becomes 1 for good once a job has waited ``PROMOTE_S`` (1000 h) unscheduled;
4. placement (Blox's ``Place``): walk the order; a running job keeps its GPUs; a waiting one takes free GPUs node
   by node (taking up to its GPU count from EACH node and succeeding only when the running total equals the
   count exactly: Blox's scattered placement), else preempts running jobs from the lowest-priority end of the
   order (only below itself) until it fits; the first job that does not fit ends the walk (no backfill);
5. preemptions of the round are counted; waiting jobs' time since last scheduled grows by ``round_s``.

Each round is an event of the simulators' event core (``hpcsched.primitives.event_core``; ``BloxRounds``).
No restart cost, no slowdown factor. With a window ``A-B`` the run stops at the first boundary where every job
with id in ``A..B`` has finished (Blox's ``--start-id-track/--stop-id-track``).

Optimus' speed-up: Blox scales each round's progress by ``SPEEDUP[str(jobs_per_hour)]`` -- a table meant by
GPU count but looked up by the experiment's LOAD (a bug, e.g. 5x at 1 job/h, 1.0 at 6-9 jobs/h). Reproduced
only when ``optimus_load`` is given (``--blox-optimus-load``); otherwise the factor is 1.0.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from hpcsched.model import ClusterSpec, Job
from hpcsched.primitives.event_core import EventCore
from hpcsched.results import JobResult
from hpcsched.window import in_window_id

MODE = "blox"
POLICIES = ("fifo", "srtf", "optimus", "las", "tiresias")
ROUND_S = 300.0
PROMOTE_S = 3600.0 * 1000
"""Blox's ``priority_thresh``: a job waiting this long unscheduled is promoted to priority 1."""
DEFAULT_PRIORITY, PROMOTED_PRIORITY = 999, 1
OPTIMUS_SPEEDUP = {1: 5.0, 2: 3.0, 3: 1.4, 4: 1.2, 5: 1.1, 6: 1.0, 7: 1.0, 8: 1.0, 9: 1.0}
"""Blox's ``optimus_scale_by_gpus`` table, keyed "1.0".."9.0"; its Optimus looks it up by the load."""


@dataclass(slots=True)
class _Run:
    """One admitted job's state, as Blox's active-job dict holds it."""

    k: int  # index in the trace (the GPUs' holder mark)
    job: Job
    total: float  # iterations (Blox: the duration, at 1 s per iteration)
    it: float
    submit: float
    remaining: float  # srtf/optimus's key, ``it x total - attained``, kept with ``attained``
    attained: float = 0.0
    executed: float = 0.0
    running: bool = False
    metered: bool = False
    priority: int = DEFAULT_PRIORITY
    waited: float = 0.0  # time since last scheduled
    gpus_held: list[int] = field(default_factory=list)
    first_start: float | None = None
    first_metered: float | None = None
    end: float | None = None
    preemptions: int = 0
    rounds_run: int = 0
    nodes: int = 0


@dataclass(slots=True)
class BloxResult:
    """A ``--compat blox`` run: the results schema's records plus Blox's own metrics."""

    results: list[JobResult]
    meta: dict[str, Any]
    rounds: list[tuple[float, int, int, int, int]]  # time, preemptions, busy GPUs, running jobs, queued jobs
    responsiveness: dict[str, float]  # job id -> first metering after first launch - submit
    window_ids: list[str]
    wall_s: float
    events: int


# The sort key of each policy, after the priority: the field of ``_Run`` it reads (read in C by attrgetter: the sort
# is the loop's largest cost, every round over every active job)
SORT_FIELD = {"fifo": "submit", "srtf": "remaining", "optimus": "remaining", "las": "attained", "tiresias": "attained"}


def iterations(job: Job) -> tuple[float, float]:
    """(iterations, seconds per iteration): Blox's jobs run duration-many 1-second iterations."""
    if job.duration is not None:
        return float(job.duration), 1
    if job.iterations is not None and job.iteration_time is not None:
        return float(job.iterations), float(job.iteration_time)
    raise ValueError(f"job {job.id}: neither a duration nor iterations with an iteration time")


class _GpuHolders:
    """GPU ids 0..N-1, node by node, as Blox registers its nodes; which job holds each, and the free count of each
    node and in all (kept by ``take`` and ``release``, so a placement that cannot succeed costs nothing)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.per_node = spec.gpus_per_node
        self.holder: list[int | None] = [None] * spec.gpus
        nodes = len(self.holder) // self.per_node if self.per_node else 0
        self.free_n = [self.per_node] * nodes
        self.free = self.per_node * nodes

    def take(self, gpus: list[int], k: int) -> None:
        for g in gpus:
            self.holder[g] = k
            self.free_n[g // self.per_node] -= 1
        self.free -= len(gpus)

    def release(self, gpus: list[int]) -> None:
        for g in gpus:
            self.holder[g] = None
            self.free_n[g // self.per_node] += 1
        self.free += len(gpus)

    def scattered(self, need: int) -> list[int] | None:
        """Blox's walk: up to ``need`` free GPUs from EACH node in order, succeeding only when the running total
        equals ``need`` exactly (it can overshoot and then never succeed). Fewer free GPUs than ``need`` in all
        can never sum to it."""
        if need > self.free:
            return None
        taken: list[int] = []
        holder, per = self.holder, self.per_node
        for n, count in enumerate(self.free_n):
            if count:
                taken.extend([g for g in range(n * per, (n + 1) * per) if holder[g] is None][:need])
                if len(taken) == need:
                    return taken
        return None


class BloxRounds:
    """Blox's loop as a strategy of the event core (``hpcsched.primitives.event_core``): one round event every
    ``round_s`` (steps 1-5 of this module's docstring at each); done when the window's jobs finished, or the
    trace ran out and nothing is active."""

    def __init__(self, jobs: Sequence[Job], stream: list[int], tracked: set[str] | None, gpus: _GpuHolders,
                 policy: str, round_s: float, speedup: float) -> None:
        self.jobs, self.stream, self.tracked, self.gpus = jobs, stream, tracked, gpus
        self.policy, self.round_s, self.speedup = policy, round_s, speedup
        self.sort_key = attrgetter("priority", SORT_FIELD[policy])
        self.runs: dict[int, _Run] = {}  # admission order = Blox's job_counter order
        self.active: dict[int, _Run] = {}
        self.finished: set[str] = set()
        self.rounds: list[tuple[float, int, int, int, int]] = []
        self.next_arrival = 0
        self.n_rounds = 0
        self.stopped_on_window = False
        self.over = False

    def next_round(self, t: float) -> float | None:
        return None if self.over else t + self.round_s

    def done(self) -> bool:
        return self.over

    def handle(self, t: float, event: object) -> None:
        jobs, stream, tracked, gpus = self.jobs, self.stream, self.tracked, self.gpus
        round_s, speedup, active, finished = self.round_s, self.speedup, self.active, self.finished
        # 1. metrics and completions (Blox's update_metrics)
        done = []
        for k, r in active.items():
            if not r.running:
                continue
            if not r.metered:
                r.metered, r.first_metered = True, t
            r.attained += round_s
            r.remaining = r.it * r.total - r.attained
            r.rounds_run += 1
            r.executed = (round_s / r.it) * speedup + r.executed
            if r.executed >= r.total:
                done.append(k)
        for k in done:
            r = active.pop(k)
            r.end, r.running = t, False
            gpus.release(r.gpus_held)
            r.gpus_held = []
            finished.add(r.job.id)
        if tracked is not None and tracked <= finished:
            self.stopped_on_window = self.over = True
            return
        if self.next_arrival == len(stream) and not active:
            # the trace ran out (with a window: before the window finished, said in the meta and by the caller)
            self.over = True
            return
        # 2. admission
        while self.next_arrival < len(stream) and jobs[stream[self.next_arrival]].submit <= t:
            i = stream[self.next_arrival]
            job = jobs[i]
            total, it = iterations(job)
            self.runs[i] = active[i] = _Run(i, job, total, it, job.submit, it * total)
            self.next_arrival += 1
        # 3. scheduling: a stable sort over admission order
        order = sorted(active.values(), key=self.sort_key)
        # 4. placement
        preempted, launched = _place(order, gpus)
        # 5. launch / preempt, waiting time
        for r in preempted:
            r.preemptions += 1
        for r, placement in launched:
            r.running, r.gpus_held = True, placement  # its GPUs were marked by the walk
            if r.first_start is None:
                r.first_start = t
            r.nodes = len({g // gpus.per_node for g in placement})
        reset = {id(r) for r in preempted} | {id(r) for r, _ in launched}
        running = 0
        for r in active.values():
            if r.running:
                running += 1
                r.waited = 0.0
            elif id(r) in reset:
                r.waited = 0.0
            else:
                r.waited += round_s
                if r.waited >= PROMOTE_S:
                    r.priority = PROMOTED_PRIORITY
        self.rounds.append((t, len(preempted), len(gpus.holder) - gpus.free, running, len(active) - running))
        self.n_rounds += 1


def simulate_blox(
    jobs: Sequence[Job],
    cluster: ClusterSpec,
    policy: str,
    round_s: float = ROUND_S,
    window: tuple[int, int] | None = None,
    optimus_load: float | None = None,
) -> BloxResult:
    """Run ``jobs`` through Blox's loop; ``window`` = (A, B) job ids, inclusive (ids must be integers)."""
    if policy not in POLICIES:
        raise KeyError(f"unknown policy {policy!r} for --compat blox; known: {', '.join(POLICIES)}")
    if not round_s > 0:
        raise ValueError(f"the round must be > 0 s, got {round_s}")
    speedup = 1.0
    if policy == "optimus" and optimus_load is not None:
        if optimus_load not in OPTIMUS_SPEEDUP:
            raise ValueError(f"Blox's Optimus table has loads 1-9 only (it raises KeyError otherwise), got "
                             f"{optimus_load:g}")
        speedup = OPTIMUS_SPEEDUP[int(optimus_load)]
    t0 = time.perf_counter()
    stream = sorted(range(len(jobs)), key=lambda i: (jobs[i].submit, i))
    tracked = _window_ids(jobs, window)
    too_big = [j.id for j in jobs if j.gpus > cluster.gpus]
    if too_big:
        raise ValueError(f"{len(too_big)} jobs need more GPUs than the cluster's {cluster.gpus} (e.g. job "
                         f"{too_big[0]}): Blox would wait on them forever")
    loop = BloxRounds(jobs, stream, tracked, _GpuHolders(cluster), policy, round_s, speedup)
    core = EventCore()
    core.start_rounds(0.0)
    core.run(loop)
    runs, rounds, next_arrival, n_rounds = loop.runs, loop.rounds, loop.next_arrival, loop.n_rounds
    stopped_on_window = loop.stopped_on_window
    results = [_result(r, round_s) for r in runs.values()]
    responsiveness = {r.job.id: r.first_metered - r.job.submit for r in runs.values()
                      if r.first_metered is not None}
    meta: dict[str, Any] = {
        "policy": policy, "compat": MODE, "round_s": round_s, "jobs": len(jobs), "jobs_admitted": len(runs),
        "jobs_not_arrived": len(jobs) - len(runs), "rounds": n_rounds, "slowdown_factor": 1.0,
        "restart_cost_s": 0.0, "preemptions": sum(p for _, p, *_ in rounds),
        "optimus_speedup": speedup if policy == "optimus" else None,
        "optimus_load": optimus_load if policy == "optimus" else None,
    }
    window_ids: list[str] = []
    if tracked is not None:
        window_ids = [j.id for j in jobs if j.id in tracked]
        meta |= {"window": [window[0], window[1]] if window else None, "window_jobs": len(window_ids),
                 "window_finished": stopped_on_window,
                 "trace_exhausted": next_arrival == len(stream)}
    return BloxResult(results, meta, rounds, responsiveness, window_ids, time.perf_counter() - t0, n_rounds)


def _place(order: list[_Run], gpus: _GpuHolders) -> tuple[list[_Run], list[tuple[_Run, list[int]]]]:
    """Blox's ``Place`` walk; returns (preempted, launched with their GPUs). Preempted jobs stop at once, so a later
    waiting job may use their GPUs (and a preempted job may be placed again further down the order, or be
    preempted twice in one round: each counts)."""
    preempted: list[_Run] = []
    launched: list[tuple[_Run, list[int]]] = []
    n = len(order)
    for idx, r in enumerate(order):
        if r.running:
            continue
        placement = gpus.scattered(r.job.gpus)
        if placement is None:
            for rev in range(1, n - idx):
                victim = order[-rev]
                if victim.running:
                    preempted.append(victim)
                    victim.running = False
                    gpus.release(victim.gpus_held)
                    victim.gpus_held = []
                    placement = gpus.scattered(r.job.gpus)
                    if placement is not None:
                        break
        if placement is None:
            break
        launched.append((r, placement))
        gpus.take(placement, r.k)
    return preempted, launched


def _window_ids(jobs: Sequence[Job], window: tuple[int, int] | None) -> set[str] | None:
    if window is None:
        return None
    a, b = window
    ids = {j.id for j in jobs if in_window_id(j.id, window)}
    if not ids:
        raise ValueError(f"--window {a}-{b}: no job of the trace has an id in {a}..{b}")
    return ids


def _result(r: _Run, round_s: float) -> JobResult:
    g = r.job.gpus
    return JobResult(r.job.id, r.job.submit, r.first_start, r.end, g, r.nodes,
                     r.rounds_run * round_s * g, r.rounds_run * round_s * r.nodes,
                     "completed" if r.end is not None else "unfinished")
