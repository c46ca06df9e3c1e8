"""Event-driven DL-cluster simulator: the clock jumps from event to event, the policy decides at each.

Events are arrivals, predicted completions and, for policies that declare
``service_thresholds`` (GPU-seconds, e.g. Tiresias' queue limits), the moment a running job's
attained service crosses one. At every event the engine advances every running job, retires the
finished ones, admits the arrivals, asks the policy for groups and (re)places the cluster.

How a policy's groups are executed (the contract the interleaving policies rely on)
-------------------------------------------------------------------------------------
1. The policy returns ``list[Group]``, highest priority first. A job may appear in at most one
   group; jobs it leaves out do not run. Single-job groups are ordinary jobs.
2. A group needs ``max(member gpus)`` GPUs, placed once for the whole group with consolidated
   placement (``hpcsched.core.placement.place_consolidated``); all members share those GPUs.
3. Groups are taken in the returned order; one that does not fit the GPUs left is skipped and the
   engine goes on with the next (backfilling), so the order is a priority, not a queue.
   In ``compat="muri"`` for Themis and Muri-S/L, groups are first CHOSEN in order and then placed
   largest first (the reference's two passes); a chosen group that no longer fits does not run.
4. Speed: a solo job runs one iteration per ``iteration_time x 1.015``. A group of k >= 2 members
   runs ONE iteration of EVERY member per ``period_s x GROUP_FACTOR[k]`` (1.33/1.015, 1.5/1.015,
   1.37/1.015 for k = 2, 3, 4; ``hpcsched.core.speed``), so ``period_s`` is the raw interleaved
   period the policy computed from the stage profiles; a multi-job group without ``period_s`` is an
   error. A solo group with ``period_s`` runs at ``period_s x 1.015``.
5. Restart cost (``hpcsched.core.speed.restart_cost``, per model and GPU count; in default mode
   ``simulate(..., restart_s=S)`` gives every job ``S`` instead, e.g. a testbed's measured start-up +
   tear-down per launch). Default mode: a member pays its OWN cost once, as wall-clock time in which it
   makes no progress, whenever its GPUs change (first start, resume after preemption, migration);
   joining or leaving a group on the same GPUs is free. ``compat="muri"``: at every event every
   running member loses the SUM of its group's members' costs from that interval's progress.
6. Accounting: a member's ``gpu_seconds`` is the group's GPUs x time / k; attained service
   (``JobView.attained_gpu_s``, LAS/Tiresias/Muri-L) is the job's own GPUs x wall time running.
7. Default mode, placement: first an in-place pass (unchanged running groups keep their GPUs, new
   groups take first fit among the free GPUs). If that could differ from a fresh plan (a group
   changed members, a group did not fit while a lower-priority running group could have yielded,
   or the policy left a running job out), the engine plans afresh: it chooses groups in priority
   order on an empty cluster, then keeps chosen running groups on their old GPUs where they are
   free and places the rest first fit (or, if fragmentation forbids, uses the fresh placement).
   Whoever ends up on other GPUs pays the restart cost. Compat mode always re-places from scratch.
8. Policies whose ``PolicyHints`` (``hpcsched.allocator``) promise ``runs_every_job`` (the baselines) are not
   asked at all in default mode while every active job fits beside the running ones: any order would run
   them all.
9. Policies that declare an ``order_key`` hint (``hpcsched.policies.ordering.ordered_by``: every active job as a
   solo group, sorted by that key of its view, ties in arrival order, and a WAITING job's key depends
   only on its own view) are not called in default mode either: the engine keeps the waiting jobs
   sorted by (key, arrival) as they start and stop, sorts only the running ones at each event and
   merges the two lazily, which is exactly the policy's answer without the O(active jobs) sort.
   In compat mode the same holds, except for a policy whose hints say ``compat_rank_order`` (Tiresias): its
   compat answer is the order of the reference's queue lists, which the engine keeps as (queue, seq)
   keys that never change while a job waits.
10. Policies that declare a ``vector_keys(now, cluster, columns, compat) -> [key arrays]`` hint (Themis)
   are one numpy function over per-job columns (``_COLS``, active jobs in arrival order) giving sort
   keys, most significant first, lowest first, ties in arrival order. The engine keeps those columns
   in arrays, refreshes only the running jobs' rows at each event, calls that function instead of
   building a snapshot of every active job, and sorts only the head of the order that placement can
   use (the rest on demand); the policy called on a snapshot builds the same columns from the views,
   calls the same function and sorts fully.
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpcsched.allocator import Group, JobView, Policy, Snapshot, hints_of, policy_name
from hpcsched.compat import MODES as COMPAT_MODES
from hpcsched.compat.muri import CompatRules
from hpcsched.core import placement as pl
from hpcsched.core.replan import Planned, Planner
from hpcsched.core.speed import SOLO_FACTOR, group_factor, restart_cost
from hpcsched.model import ClusterSpec, Job
from hpcsched.results import JobResult
from hpcsched.sim.accounting import LazyAccounting
from hpcsched.sim.events import ARRIVAL, END, EventQueue
from hpcsched.sim.jobrun import JobRun

if TYPE_CHECKING:
    import pandas as pd

    from hpcsched.sim.core_decisions import AsController, CoreDecider, Decision

_INF = math.inf

_COLS = ("submit", "gpus", "iterations_total", "iteration_time", "remaining_s", "iterations_done", "executed_s")
"""The per-job columns a ``vector_keys`` policy reads (contract item 10)."""


TIMELINE_COLUMNS = ("time", "busy_gpus", "running_jobs", "queued_jobs")
"""The timeline's columns, one row per event."""


@dataclass
class SimResult:
    """What one simulation produced: per-job results, the cluster timeline and run statistics.

    The timeline is kept as plain numbers (``timeline_values``, ``timeline_rows``); ``timeline`` builds the
    DataFrame on first use, so that a run that only writes its files (``hpcsched simulate``) never imports
    pandas (issue 14: its import was the largest part of the command's start-up).
    """

    results: list[JobResult]
    timeline_values: list[float]  # TIMELINE_COLUMNS of every event, row after row (flat: what the engine appends)
    meta: dict[str, Any]
    iterations_done: dict[str, float]
    iterations_total: dict[str, float]
    events: int
    wall_s: float
    rejected: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)  # as_controller runs: every start and stop decided
    _timeline: pd.DataFrame | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def timeline(self) -> pd.DataFrame:
        """time, busy_gpus, running_jobs, queued_jobs (floats), one row per event; built once, on first use."""
        if self._timeline is None:
            import numpy as np
            import pandas as pd

            values = np.array(self.timeline_values, dtype=float).reshape(-1, len(TIMELINE_COLUMNS))
            self._timeline = pd.DataFrame(values, columns=list(TIMELINE_COLUMNS))
        return self._timeline

    def timeline_rows(self) -> list[tuple[float, ...]]:
        """The timeline as one tuple per event (``TIMELINE_COLUMNS``), without pandas."""
        it = iter(self.timeline_values)
        return list(zip(*[it] * len(TIMELINE_COLUMNS), strict=True))

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([_row(r) for r in self.results], columns=list(JobResult.__slots__))

    def summary(self) -> dict[str, Any]:
        """``hpcsched.metrics.summarize`` of ``frame()``, computed from the records (no pandas)."""
        from hpcsched.metrics import summarize_results

        return summarize_results(self.results, self.meta)


class _LiveView:
    """A job's ``JobView`` fields read live from its run state, for ``order_key`` policies (contract item 9).

    Why: the engine keys every running job at every event; building a frozen ``JobView`` for each was the
    largest single cost of a congested run (issue 17). Each field is computed exactly as ``_Engine._view`` does,
    so a key sees the same numbers; a key must read fields, not keep the view (``ordered_by``'s contract)."""

    __slots__ = ("_j", "_e")

    def __init__(self, j: JobRun, engine: _Engine) -> None:
        self._j, self._e = j, engine

    id = property(lambda self: self._j.id)
    submit = property(lambda self: self._j.submit)
    gpus = property(lambda self: self._j.gpus)
    iterations_total = property(lambda self: int(round(self._j.total)))
    iterations_done = property(lambda self: self._j.done)
    iteration_time = property(lambda self: self._j.it)
    attained_gpu_s = property(lambda self: self._j.attained)
    executed_s = property(lambda self: self._j.executed)
    remaining_s = property(lambda self: self._e.acct.remaining(self._j))
    profile = property(lambda self: self._j.job.profile)
    running = property(lambda self: self._j.running)
    first_start = property(lambda self: self._j.first_start)
    model = property(lambda self: self._j.model)
    rank_hint = property(lambda self: self._j.hint)


def _row(r: JobResult) -> dict[str, Any]:
    return {k: getattr(r, k) for k in JobResult.__slots__}


def simulate(
    jobs: Sequence[Job],
    cluster: ClusterSpec,
    policy: str | Policy,
    compat: str | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    trace: str = "",
    group_factors: Mapping[int, float] | None = None,
    restart_s: float | None = None,
    as_controller: AsController | None = None,
    slowdown: float | None = None,
) -> SimResult:
    """Run ``jobs`` on ``cluster`` under ``policy`` (a registry name or a Policy function).

    ``compat="muri"`` reproduces the reference simulator's accounting (see ``hpcsched.compat.muri``).
    ``group_factors`` ({member count: factor}) replaces ``group_factor(k)`` where a running group's speed
    is computed (a size without a factor of its own takes 4's), and nowhere else: factors measured on a
    testbed change how fast groups run, not which groups the policy forms (the real controller decides with
    the default factors too).
    ``restart_s`` (default mode only; compat keeps the reference's table) is every job's restart cost in
    seconds instead of the per-model table: a measured start-up + tear-down per launch is a property of the
    machine, not of the model, and must be paid as wall-clock time, not as iterations at a group's pace.
    ``as_controller`` (default mode only) takes every decision through the shared decision core as the
    runtime's controller does (``hpcsched.sim.core_decisions``): what it knows of jobs, its hysteresis, its
    rule that running jobs are never moved to form groups; the decisions are returned (``SimResult.decisions``).
    ``slowdown`` (default mode only) is a solo job's period over its iteration time (the solo factor,
    1.015 unless given): the speed model's measured overhead of a training step, a named option so that a
    comparison with a simulator that has none (Blox) can turn it off (1.0).
    ``progress(completed, total)`` is called now and then for a progress bar.
    Raises ValueError for jobs that cannot be simulated (no size or length) or a bad policy answer.
    """
    if compat is not None and compat not in COMPAT_MODES:
        raise ValueError(f"unknown compat mode {compat!r}; known: {', '.join(COMPAT_MODES)}")
    if compat in ("gavel", "blox"):  # their own loops, not this engine's rules
        raise ValueError(f"compat {compat!r} is its own round loop: hpcsched.hetero.simulate.run_gavel / "
                         "hpcsched.compat.blox.simulate_blox")
    if as_controller is not None and compat is not None:
        raise ValueError("as_controller runs the controller's rules; compat modes run the reference's: pick one")
    if restart_s is not None and not (restart_s >= 0 and math.isfinite(restart_s)):
        raise ValueError(f"restart_s must be a finite number of seconds >= 0, got {restart_s}")
    if slowdown is not None and (compat is not None or not (slowdown > 0 and math.isfinite(slowdown))):
        raise ValueError(f"slowdown must be a finite factor > 0 and only without compat, got {slowdown}")
    if isinstance(policy, str):
        from hpcsched.policies import get_policy

        fn = get_policy(policy)
    else:
        fn = policy
    name = policy_name(fn)
    t0 = time.perf_counter()
    eng = _Engine(jobs, cluster, fn, name, compat, progress, restart_s, as_controller,
                  SOLO_FACTOR if slowdown is None else slowdown)
    if group_factors:
        eng.gf |= {int(k): float(f) for k, f in group_factors.items() if int(k) >= 2}
    eng.run()
    meta = {
        "tool": "simulate",
        "policy": name,
        "trace": trace,
        "cluster": cluster.name,
        "capacity_gpus": cluster.gpus,
        "capacity_nodes": cluster.nodes,
        "compat": compat,
        "events": eng.events,
    }
    if restart_s is not None and compat is None:  # every job's restart cost (the per-model table otherwise)
        meta["restart_s"] = restart_s
    if compat is None:  # the speed model's two named costs, as this run used them
        meta["slowdown_factor"] = SOLO_FACTOR if slowdown is None else slowdown
        meta["restart_cost"] = "per-model table" if restart_s is None else restart_s
    if group_factors:  # the factors groups ran at (a size not listed takes 4's)
        meta["group_factors"] = {str(k): v for k, v in eng.gf.items()}
    if as_controller is not None:
        meta["executor"] = "controller"
        meta["min_runtime_s"] = as_controller.options.min_runtime_s
        meta["declared_profiles"] = len(as_controller.declared)
        # co-located jobs with no stage profile, run at a compute-only pipeline period: a guess, so counted
        meta["untimed_colocated_jobs"] = len(eng.core.untimed) if eng.core is not None else 0
        meta["admission"] = as_controller.options.admission
        meta["placement"] = as_controller.options.placement
        if as_controller.options.admission != "accept-all":
            meta["load_threshold"] = as_controller.options.load_threshold
    return SimResult(
        results=[_result(j) for j in eng.jobs],
        timeline_values=eng.timeline,
        meta=meta,
        iterations_done={j.id: j.done for j in eng.jobs},
        iterations_total={j.id: j.total for j in eng.jobs},
        events=eng.events,
        wall_s=time.perf_counter() - t0,
        rejected=[j.id for j in eng.jobs if j.status == "rejected"],
        decisions=eng.core.log if eng.core is not None else [],
    )


def _result(j: JobRun) -> JobResult:
    status = "completed" if j.end is not None else ("rejected" if j.status == "rejected" else "unfinished")
    return JobResult(j.id, j.submit, j.first_start, j.end, j.gpus, 0, j.gpu_s, 0.0, status)


class _Engine(Planner):
    """One run: the event core (``sim.events``: one queue of arrivals, completions and crossings), an
    accounting strategy (``sim.accounting``, lazy: a job is settled when looked at; or, under ``--compat
    muri``, ``compat.accounting``: every running job settled and charged at every event), and the decisions
    (the policy, its shortcuts, re-planning from ``core.replan`` or the core itself, ``_apply``). The policy
    is skipped when every active job already runs or fits beside the running ones (``runs_every_job``), so
    an event costs O(jobs that change) on a lightly loaded cluster."""

    def __init__(
        self,
        jobs: Sequence[Job],
        cluster: ClusterSpec,
        policy: Policy,
        name: str,
        compat: str | None,
        progress: Callable[[int, int], None] | None,
        restart_s: float | None = None,
        as_controller: AsController | None = None,
        slowdown: float = SOLO_FACTOR,
    ) -> None:
        self.compat = compat is not None
        self.gf = {k: group_factor(k) for k in range(2, 5)}  # a group's period multiplier by member count
        self.mode = compat  # told to policies (Snapshot.compat): interleaving follows the speed model
        hints = hints_of(policy)
        self.rules: CompatRules = hints.compat.get(compat, CompatRules()) if compat else CompatRules()
        self.cluster, self.policy, self.name, self.progress = cluster, policy, name, progress
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].submit)  # stable: file order on ties
        self.jobs = [JobRun(jobs[i], k, self.compat, restart_s, slowdown) for k, i in enumerate(order)]
        self.gpn = cluster.gpus_per_node
        self.capacity = [self.gpn] * cluster.nodes  # re-planning's view of the nodes (``core.replan``)
        self.total = cluster.gpus
        self.nps = cluster.nodes_per_switch if cluster.switches > 1 else None
        self.thresholds = tuple(sorted(hints.service_thresholds))
        self.fast = not self.compat and hints.runs_every_job
        # compat + service thresholds (Tiresias): the reference's per-queue lists, whose order is history
        self.queued = self.compat and bool(self.thresholds)
        self.lists: Any = None
        if self.queued:
            from hpcsched.compat.accounting import ReferenceLists  # compat only: a default run skips its import

            self.lists = ReferenceLists(self)
        # the event core (one heap) and how progress is settled: the simulator's lazy accounting, or the
        # reference's per-event one (``hpcsched.compat.accounting``)
        self.queue = EventQueue(self._live_entry)
        self.acct: Any = LazyAccounting(self)
        if self.compat:
            from hpcsched.compat.accounting import ReferenceAccounting

            self.acct = ReferenceAccounting(self, self.rules)
        self.next_arrival = 0  # the arrival cursor: jobs in submit order, one ARRIVAL entry ahead
        okey = hints.order_key
        self.jkey: Callable[[JobRun], Any] | None = None  # order_key policies: a job's sort key (contract item 9)
        if okey is not None and (not self.compat or not hints.compat_rank_order):
            self.jkey = lambda j: okey(j.live or self._live(j))
        elif okey is not None and self.queued:  # compat Tiresias: its answer is the lists' order
            from hpcsched.compat.accounting import list_position

            self.jkey = list_position
        # static order keys (FIFO): the running jobs' (key, idx), kept sorted as they start and stop (item 9)
        self.rsorted: list[tuple[Any, int]] | None = [] if self.jkey is not None and hints.order_key_static and \
            not self.queued else None
        self.vorder: Callable[..., Any] | None = hints.vector_keys  # contract item 10
        self.wsorted: dict[int, list[tuple[Any, int]]] = {}  # order_key policies: GPU demand -> waiting
        # jobs of that demand by (order key, idx); split by demand so a full cluster skips whole sizes
        self.wsizes: dict[int, int] = {}  # GPU demand -> number of waiting jobs asking that many
        self.active: dict[int, JobRun] = {}  # arrival order
        self.running: dict[int, JobRun] = {}
        self.free = [self.gpn] * cluster.nodes  # GPUs not held by running placements
        self.busy = 0.0
        self.active_gpus = 0
        self.now = 0.0
        self.events = 0
        self.timeline: list[float] = []
        self.by_id: dict[str, JobRun] = {}
        self.finished = 0
        # vector_keys policies only (numpy is imported for them alone: a baseline run starts faster without):
        self.vmask: Any = None  # active jobs, a bool per job
        self.cols: dict[str, Any] = {}  # one row per column, one entry per job
        self.table: Any = None  # ... the same rows as one array (one gather)
        if self.vorder is not None:
            import numpy as np

            self.vmask = np.zeros(len(self.jobs), dtype=bool)
            self.table = np.zeros((len(_COLS), len(self.jobs)))
            js = self.jobs
            self.cols = dict(zip(_COLS, self.table, strict=True))
            self.cols["submit"][:] = [j.submit for j in js]
            self.cols["gpus"][:] = [j.gpus for j in js]
            self.cols["iterations_total"][:] = [round(j.total) for j in js]
            self.cols["iteration_time"][:] = [j.it for j in js]
        for j in self.jobs:
            if j.gpus <= 0 or j.gpus > cluster.gpus:
                j.status = "rejected"  # cannot ever run here; reported, not dropped
        self.core: CoreDecider | None = None
        if as_controller is not None:  # every decision through the core: none of the planner's shortcuts
            from hpcsched.sim.core_decisions import CoreDecider  # imported here: the core needs numpy

            self.core = CoreDecider(as_controller, policy, cluster.nodes, self.gpn)
            self.fast, self.jkey, self.vorder, self.rsorted = False, None, None, None

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> None:
        n = len(self.jobs)
        queue, acct = self.queue, self.acct
        self._arm_arrival()
        while True:
            acct.before_step()
            t = queue.peek()
            if t == _INF:
                break
            acct.advance(t)
            self.now = t
            self.events += 1
            ends, arrivals, woke = queue.due(t, acct.end_tol(t))
            changed = self._complete(ends, t) if ends else False
            arrived = self._arrive(t) if arrivals else False
            if woke:
                changed = True
                acct.wake_up(t)
            if not self.fast or not self._fits_all(t, changed or arrived):
                self._reschedule(t)
            self.timeline += (t, self.busy, len(self.running), len(self.active) - len(self.running))
            if self.progress is not None and self.events % 256 == 0:
                self.progress(self.finished, n)
        if self.progress is not None:
            self.progress(self.finished, n)

    def _live_entry(self, t: float, kind: int, idx: int) -> bool:
        """Whether an event entry still holds: an arrival always; a completion or a crossing while its job
        runs and is still armed for that time; the reference accounting's wake-up (job -1) while armed."""
        if kind == ARRIVAL:
            return True
        if idx < 0:
            return t == self.acct.cwake
        j = self.jobs[idx]
        return j.running and (j.predicted if kind == END else j.wake) == t

    def _arm_arrival(self) -> None:
        """One ARRIVAL entry ahead: the next job (in submit order) that can run here."""
        jobs, k = self.jobs, self.next_arrival
        while k < len(jobs) and jobs[k].status == "rejected":
            k += 1
        self.next_arrival = k
        if k < len(jobs):
            self.queue.schedule(jobs[k].submit, ARRIVAL, k)

    def _arrive(self, t: float) -> bool:
        """Admit every job submitted by ``t``; True if any arrived."""
        jobs, n = self.jobs, len(self.jobs)
        k, arrived = self.next_arrival, False
        while k < n and jobs[k].submit <= t:
            j = jobs[k]
            k += 1
            if j.status == "rejected":
                continue
            self.active[j.idx] = j
            if self.lists is not None:
                self.lists.arrive(j)
            self.by_id[j.id] = j
            self.active_gpus += j.gpus
            if self.vorder is not None:
                self.vmask[j.idx] = True
                self._fill(j)
            self._wait(j)
            arrived = True
        self.next_arrival = k
        self._arm_arrival()
        return arrived

    def _complete(self, ends: list[int], t: float) -> bool:
        """Retire the jobs whose completion is due (``ends``, from the event queue)."""
        for idx in ends:
            j = self.jobs[idx]
            self.acct.ended(j, t)
            self._release(j, finished=True)
            j.end = t
            j.status = "completed"
            del self.by_id[j.id]
            del self.active[j.idx]
            if self.vorder is not None:
                self.vmask[j.idx] = False
            self.active_gpus -= j.gpus
        self.finished += len(ends)
        return bool(ends)

    def _wait(self, j: JobRun) -> None:
        """Book-keep a job that starts waiting (arrived or preempted): its GPU demand, and its key."""
        self.wsizes[j.gpus] = self.wsizes.get(j.gpus, 0) + 1
        if self.jkey is not None:
            j.wkey = (self.jkey(j), j.idx)
            insort(self.wsorted.setdefault(j.gpus, []), j.wkey)

    def _unwait(self, j: JobRun) -> None:
        """Undo ``_wait`` for a job that starts running."""
        c = self.wsizes[j.gpus] - 1
        if c:
            self.wsizes[j.gpus] = c
        else:
            del self.wsizes[j.gpus]
        if j.wkey is not None:
            lst = self.wsorted[j.gpus]
            del lst[bisect_left(lst, j.wkey)]
            j.wkey = None

    def _release(self, j: JobRun, finished: bool = False) -> None:
        """Stop a job; its GPUs go back unless another member of its group still runs on them."""
        j.running = False
        if self.rsorted is not None:
            rs = self.rsorted
            del rs[bisect_left(rs, (self.jkey(j), j.idx))]  # type: ignore[misc]
        j.status = "pending"
        j.view = None
        j.warm = 0.0
        j.predicted = j.wake = _INF
        del self.running[j.idx]
        if j.place is not None:
            shared = j.group and any(m.place is j.place for m in self.running.values() if m.id in j.group)
            if not shared:
                pl.apply(self.free, j.place, +1)
        j.place = None
        self.busy -= j.share
        if not finished:
            self._wait(j)

    # -- decisions ---------------------------------------------------------------------------
    def _fits_all(self, t: float, changed: bool) -> bool:
        """Default-mode shortcut for work-conserving solo policies: True if every active job runs now.

        When the active jobs' GPUs fit the cluster and each waiting job finds room beside the running
        ones (first fit, arrival order), any priority order would run them all on these GPUs, so the
        policy need not be asked. Otherwise nothing is changed and the caller asks the policy.
        """
        if not changed:
            return True
        if self.active_gpus > self.cluster.gpus:
            return False
        waiting = [j for j in self.active.values() if not j.running] if len(self.active) > len(self.running) else []
        placed = []
        for j in waiting:
            got = pl.place_consolidated(self.free, j.gpus, self.gpn, self.nps)
            if got is None:
                for _j, p in placed:
                    pl.apply(self.free, p, +1)
                return False
            pl.apply(self.free, got)
            placed.append((j, tuple(got)))
        for j, p in placed:
            j.warm = j.restart
            j.period = j.it * j.slow
            j.share = float(j.gpus)
            j.group = ()
            j.since = t
            self._start(j, t)
            j.place = p
            self.running[j.idx] = j
            self.busy += j.share
            self.acct.arm_started(j, t)
        return True

    def _view(self, j: JobRun) -> JobView:
        v = j.view
        if v is None:
            remaining = self.acct.remaining(j)
            v = JobView(  # positional (JobView's field order): this runs for every running job at every event
                j.id, j.submit, j.gpus, int(round(j.total)), j.done, j.it, j.attained, j.executed, remaining,
                j.job.profile, j.running, j.first_start, j.model, j.hint,
            )
            j.view = v
        return v

    def _live(self, j: JobRun) -> _LiveView:
        """The job's ``_LiveView`` (made once): what an order key reads, without building a JobView."""
        j.live = _LiveView(j, self)
        return j.live

    def _reschedule(self, t: float) -> None:
        if not self.active:
            return
        self.acct.settle_running(t)
        if self.core is not None:
            self._decide_core(t)
            return
        if self.lists is not None:
            self.lists.demote()
        if self.jkey is not None:
            key = self.jkey
            run = self.rsorted if self.rsorted is not None else sorted([(key(j), j.idx) for j in self.running.values()])
            dead: set[int] = set()
            plan = None if self.compat else self.place_in_place(self._ordered(run, dead), dead)
            if plan is None:
                dead = set()
                plan = self.place_fresh(self._ordered(run, dead), dead)
            self._apply(plan, t)
            return
        if self.lists is not None:
            self.lists.rank()
        if self.vorder is not None:
            order = self._vector_order(t)
            jobs = self.jobs
            plan = None if self.compat else self.place_in_place(jobs[i].solo for i in order())
            self._apply(plan if plan is not None else self.place_fresh(jobs[i].solo for i in order()), t)
            return
        snap = Snapshot(
            now=t,
            jobs=tuple([j.view or self._view(j) for j in self.active.values()]),
            cluster=self.cluster,
            free_gpus=int(round(self.cluster.gpus - self.busy)),
            compat=self.mode,
        )
        groups = self.policy(snap)
        plan = None if self.compat else self.place_in_place(groups)
        self._apply(plan if plan is not None else self.place_fresh(groups), t)

    def _decide_core(self, t: float) -> None:
        """Decide through the shared core until a decision stops nothing (rules in ``sim.core_decisions``)."""
        from hpcsched.sim.core_decisions import MAX_ROUNDS

        core = self.core
        assert core is not None
        for _ in range(MAX_ROUNDS):
            active = list(self.active.values())
            plan = core.plan(core.state(active, self.free, t))
            self._apply(core.apply(plan, active, t), t)
            if not plan.stops:
                return
        raise RuntimeError(f"policy {self.name!r}: the decision core kept stopping jobs at t={t:g} "
                           f"({MAX_ROUNDS} decisions with no time passing)")

    def _ordered(self, run: list[tuple[Any, int]], dead: set[int]) -> Iterator[Group]:
        """An ``order_key`` policy's answer, lazily: the running jobs keyed now (``run``, sorted),
        merged with the waiting ones (whose keys cannot have changed since they stopped), ties in
        arrival order. The consumer adds to ``dead`` the GPU demands that can no longer fit (free
        GPUs only shrink while it places): the rest of the waiting jobs of that demand are left out,
        which changes nothing since the consumer would skip each of them."""
        jobs = self.jobs
        heads: list[tuple[Any, int, int, list[tuple[Any, int]], int]] = [
            (lst[0][0], lst[0][1], g, lst, 0) for g, lst in ((0, run), *self.wsorted.items()) if lst
        ]  # (key, idx, demand (0: running), source, position); idx is unique, so nothing else compares
        heapq.heapify(heads)
        while heads:
            _k, idx, g, lst, pos = heads[0]
            if g == 0:  # the running jobs: yield them in a run up to the next other head, without heap work
                n = len(lst)
                if len(heads) == 1:
                    bound = None
                else:
                    other = heads[1] if len(heads) == 2 or heads[1] < heads[2] else heads[2]
                    bound = (other[0], other[1])
                while pos < n and (bound is None or lst[pos] < bound):
                    yield jobs[lst[pos][1]].solo
                    pos += 1
                if pos < n:
                    heapq.heapreplace(heads, (lst[pos][0], lst[pos][1], 0, lst, pos))
                else:
                    heapq.heappop(heads)
                continue
            yield jobs[idx].solo
            pos += 1
            if pos < len(lst) and g not in dead:
                heapq.heapreplace(heads, (lst[pos][0], lst[pos][1], g, lst, pos))
            else:
                heapq.heappop(heads)

    def _vector_order(self, t: float) -> Callable[[], Iterator[int]]:
        """``vector_keys`` policies: the active jobs' columns (arrival order) keyed by the policy's own
        array function; returns a re-iterable source of job indices in priority order. The columns of
        every running job are refreshed here (a waiting job's cannot change), so an event costs
        O(running) in Python; only the head of the order is sorted (placement rarely looks further),
        the rest when a consumer reaches it."""
        import numpy as np

        for j in self.running.values():
            self._fill(j)
        act = np.flatnonzero(self.vmask)
        keys = self.vorder(t, self.cluster, dict(zip(_COLS, self.table[:, act], strict=True)), self.mode)
        head_n = 4 * self.cluster.gpus
        if len(act) <= 2 * head_n:
            full = act[np.lexsort(keys[::-1])].tolist()
            return lambda: iter(full)
        first = keys[0]
        kth = np.partition(first, head_n)[head_n]
        head = np.flatnonzero(first <= kth)  # every job tied with the cut stays in the head: exact order
        top = act[head[np.lexsort([k[head] for k in keys[::-1]])]].tolist()
        rest: list[int] = []

        def order() -> Iterator[int]:
            yield from top
            if not rest:
                tail = np.flatnonzero(first > kth)
                rest.extend(act[tail[np.lexsort([k[tail] for k in keys[::-1]])]].tolist())
            yield from rest

        return order

    def _fill(self, j: JobRun) -> None:
        """Write one job's changing columns (the numbers its JobView would show), without the view."""
        i, cols = j.idx, self.cols
        cols["remaining_s"][i] = self.acct.remaining(j)
        cols["iterations_done"][i] = j.done
        cols["executed_s"][i] = j.executed

    def _start(self, m: JobRun, t: float) -> None:
        if not m.running:
            self._unwait(m)
            if self.rsorted is not None:
                insort(self.rsorted, (self.jkey(m), m.idx))  # type: ignore[misc]
            m.running = True
            m.status = "running"
            m.ever_ran = True
            m.view = None
            if m.first_start is None:
                m.first_start = t

    def _apply(self, plan: list[Planned], t: float) -> None:
        """Run ``plan`` from ``t``: every group it holds runs (on its placement), every other running job stops.

        Runs at every decision over every running job, so the common case is kept cheap (issue 17): a solo job
        that keeps its GPUs and stays solo keeps every field as it is; GPUs are counted per placement without a
        call (a group's shared placement once); completions are re-armed inline. Each shortcut gives exactly the
        numbers of the general path."""
        compat = self.compat
        now_running: list[JobRun] = []
        append = now_running.append
        for g, members, need, p in plan:
            k = len(members)
            if k == 1:
                m = members[0]
                if m.running and m.place is p and not m.group and g.period_s is None:
                    append(m)  # unchanged solo job: period, share, charge and group are what this would set
                    continue
                if not compat and (not m.running or m.place != p):
                    m.warm = m.restart
                m.period = m.it * m.slow if g.period_s is None else g.period_s * m.slow
                m.share = float(need)
                m.charge = m.restart
                m.group = ()
                self._start(m, t)
                m.place = p
                append(m)
                continue
            period = g.period_s * (self.gf[k] if k in self.gf else self.gf[4])
            charge = sum(restart_cost(m.model, m.gpus) for m in members) if self.rules.group_restart else None
            ids = tuple(m.id for m in members)
            for m in members:
                if not compat and (not m.running or m.place != p):
                    m.warm = m.restart
                m.period = period
                m.share = need / k
                m.group = ids
                m.charge = charge if charge is not None else m.restart
                self._start(m, t)
                m.place = p
                append(m)
        keep = {m.idx for m in now_running}
        before = self.running
        for j in [j for j in before.values() if j.idx not in keep]:  # preempted: progress kept, GPUs released
            self._release(j)
        self.running = {m.idx: m for m in now_running}
        if self.lists is not None:
            self.lists.reseq()
        self.busy = sum(m.share for m in now_running)
        free = list(self.capacity)
        seen_places: set[int] = set()
        for m in now_running:
            place = m.place
            if place is None:
                continue
            if m.group:  # co-located members share one placement: count it once
                if id(place) in seen_places:
                    continue
                seen_places.add(id(place))
            for n, c in place:
                free[n] -= c
        self.free = free
        self.acct.arm(now_running, before, t)
