"""The DL engine's run: one event loop over arrivals, completions and service crossings, the policy asked at
each event (or its shortcuts), and its answer placed and applied. The rules it keeps are the contract in
``hpcsched.sim.engine``, whose ``simulate`` runs it.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from hpcsched.allocator import JobView, Policy, Snapshot, hints_of
from hpcsched.compat.muri import CompatRules
from hpcsched.core.replan import Planned, Planner
from hpcsched.model import ClusterSpec, Job
from hpcsched.primitives import placement as pl
from hpcsched.primitives.speed import SOLO_FACTOR, group_factor, restart_cost
from hpcsched.sim.accounting import LazyAccounting
from hpcsched.sim.events import ARRIVAL, END, EventQueue
from hpcsched.sim.jobrun import EngineJob
from hpcsched.sim.orders import COLS, LiveView, merge_order, vector_order

if TYPE_CHECKING:
    from hpcsched.sim.core_decisions import AsController, CoreDecider

_INF = math.inf


class DLEngine(Planner):
    """One run, a strategy of the simulators' event core (``sim.events`` over ``primitives.event_core``: one
    heap of arrivals, completions and crossings), an accounting strategy (``sim.accounting``, lazy: a job is
    settled when looked at; or, under ``--compat muri``, ``compat.accounting``: every running job settled and
    charged at every event), and the decisions
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
        self.jobs = [EngineJob(jobs[i], k, self.compat, restart_s, slowdown) for k, i in enumerate(order)]
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
        self.jkey: Callable[[EngineJob], Any] | None = None  # order_key policies: a job's sort key (contract item 9)
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
        self.active: dict[int, EngineJob] = {}  # arrival order
        self.running: dict[int, EngineJob] = {}
        self.free = [self.gpn] * cluster.nodes  # GPUs not held by running placements
        self.busy = 0.0
        self.active_gpus = 0
        self.now = 0.0
        self.events = 0
        self.timeline: list[float] = []
        self.by_id: dict[str, EngineJob] = {}
        self.finished = 0
        # vector_keys policies only (numpy is imported for them alone: a baseline run starts faster without):
        self.vmask: Any = None  # active jobs, a bool per job
        self.cols: dict[str, Any] = {}  # one row per column, one entry per job
        self.table: Any = None  # ... the same rows as one array (one gather)
        if self.vorder is not None:
            import numpy as np

            self.vmask = np.zeros(len(self.jobs), dtype=bool)
            self.table = np.zeros((len(COLS), len(self.jobs)))
            js = self.jobs
            self.cols = dict(zip(COLS, self.table, strict=True))
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

    # -- main loop: a strategy of the event core -------------------------------------------------
    def run(self) -> None:
        """Run to the last event on the event core (``self.queue.core``), each instant handled once."""
        self._arm_arrival()
        self.acct.before_step()
        self.queue.core.run(self, by_instant=True)
        if self.progress is not None:
            self.progress(self.finished, len(self.jobs))

    def handle(self, t: float, event: None) -> None:
        """One instant: every live entry due at ``t`` (the core found the first; completions within the
        accounting's tolerance too) is taken, then one decision."""
        queue, acct = self.queue, self.acct
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
            self.progress(self.finished, len(self.jobs))
        acct.before_step()  # what the reference accounting arms before the next instant is looked for

    def next_round(self, t: float) -> float | None:
        """No rounds: every event is an arrival, a completion or a crossing."""
        return None

    def done(self) -> bool:
        """The run ends when the heap holds no live entry."""
        return False

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

    def _wait(self, j: EngineJob) -> None:
        """Book-keep a job that starts waiting (arrived or preempted): its GPU demand, and its key."""
        self.wsizes[j.gpus] = self.wsizes.get(j.gpus, 0) + 1
        if self.jkey is not None:
            j.wkey = (self.jkey(j), j.idx)
            insort(self.wsorted.setdefault(j.gpus, []), j.wkey)

    def _unwait(self, j: EngineJob) -> None:
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

    def _release(self, j: EngineJob, finished: bool = False) -> None:
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

    def _view(self, j: EngineJob) -> JobView:
        v = j.view
        if v is None:
            remaining = self.acct.remaining(j)
            v = JobView(  # positional (JobView's field order): this runs for every running job at every event
                j.id, j.submit, j.gpus, int(round(j.total)), j.done, j.it, j.attained, j.executed, remaining,
                j.job.profile, j.running, j.first_start, j.model, j.hint,
            )
            j.view = v
        return v

    def _live(self, j: EngineJob) -> LiveView:
        """The job's ``LiveView`` (made once): what an order key reads, without building a JobView."""
        j.live = LiveView(j, self.acct)
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
            plan = None if self.compat else self.place_in_place(merge_order(self.jobs, run, self.wsorted, dead), dead)
            if plan is None:
                dead = set()
                plan = self.place_fresh(merge_order(self.jobs, run, self.wsorted, dead), dead)
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

    def _vector_order(self, t: float) -> Callable[[], Iterator[int]]:
        """``vector_keys`` policies: the order (``sim.orders.vector_order``), the columns of every running job
        refreshed first (a waiting job's cannot change), so an event costs O(running) in Python."""
        for j in self.running.values():
            self._fill(j)
        return vector_order(self.vorder, t, self.cluster, self.mode, self.table, self.vmask)

    def _fill(self, j: EngineJob) -> None:
        """Write one job's changing columns (the numbers its JobView would show), without the view."""
        i, cols = j.idx, self.cols
        cols["remaining_s"][i] = self.acct.remaining(j)
        cols["iterations_done"][i] = j.done
        cols["executed_s"][i] = j.executed

    def _start(self, m: EngineJob, t: float) -> None:
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

        Runs at every decision over every running job, so the common case is kept cheap (it was the largest cost
        of a congested run): a solo job that keeps its GPUs and stays solo keeps every field as it is; GPUs are
        counted per placement without a call (a group's shared placement once); completions are re-armed inline.
        Each shortcut gives exactly the numbers of the general path."""
        compat = self.compat
        now_running: list[EngineJob] = []
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
