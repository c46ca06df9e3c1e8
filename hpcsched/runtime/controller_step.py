"""The controller's scheduling step: read what changed, plan outside the lock (``scheduler.plan``, or Gavel's
rounds), apply the plan only if what it decided on is unchanged. A part of ``Controller`` (its state is set in
``Controller.__init__``)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from itertools import islice

from hpcsched.model import ResourceProfile, ScalingCurve
from hpcsched.runtime import scheduler
from hpcsched.runtime.diskspace import is_disk_full
from hpcsched.runtime.inplace_resize import agent_endpoints
from hpcsched.runtime.launch import in_place_capable, slot_use
from hpcsched.runtime.listing import MAX_MESSAGE_CHARS
from hpcsched.runtime.ratelimit import cause
from hpcsched.runtime.store_rows import JobRow, WorkerRow
from hpcsched.runtime.waiting import with_note

log = logging.getLogger("hpcsched.runtime.controller")

_MAX_STALE = 3  # plans dropped in a row (state changed while planning) before one is made under the lock
_MIN_STEP_GAP_S = 0.05  # between two scheduling steps (see run_forever)
_START_BATCH = 16  # job starts applied per lock hold (a start is ~0.3-0.6 ms: bounded heartbeat waits)
_REPLAN_S = 5.0  # a step plans at least this often even when nothing it knows of changed (a safety net)
_ACCRUE_S = 1.0  # service is accrued (one UPDATE of the running jobs) at most this often
_WORKERS_STEP_S = 1.0  # a change of the live workers alone makes a step plan at most this often (registration storms)
_NOTES_S = 0.025  # wall time a step spends writing waiting notes at most (the rest by the next steps: ``_write_notes``)
_NOTES_CHUNK = 128  # ... checked every this many notes (at least one chunk a step: progress on a loaded machine)
_WORKERS_HOLD_FROM = 1000  # ... in a fleet of at least this many workers (below it a step's pass over them is cheap)
_REAP_S = 0.5  # silent workers are looked for at most this often (a pass over every worker)
_STEP_DUTY = 1.0  # after a step, wait at least this many times its duration: steps take at most half the time


class Stepping:
    """The scheduling loop and one step of it: the part of ``Controller`` that decides."""

    # ----------------------------------------------------------------------------------- scheduling
    def tick(self) -> scheduler.Plan:
        """Detect dead workers, account service, run one scheduling step and apply it.

        The step is planned OUTSIDE the lock: heartbeats (which take the lock) must not queue behind a
        policy run of tens of ms, and behind the OS descheduling the planner on a loaded node. The plan is
        applied only if what it decided on is unchanged when the lock is taken again: every job it starts
        still pending, every job it stops still running the same attempt, every worker it places on still
        alive and not leaving. Only this thread starts jobs, so slots free in the snapshot are still free.
        A plan that fails the check is dropped and the step re-runs; after ``_MAX_STALE`` drops in a row the
        step runs entirely under the lock, so a storm of changes cannot starve scheduling."""
        if self._hold_for_arrivals():
            return scheduler.Plan()
        if self._stale >= _MAX_STALE:
            with self.lock.first(), self.store.tx():
                seen = self._read()
                if seen is None:
                    return scheduler.Plan()
                state, jobs, workers = self._cluster_state(*seen)
                plan = self._plan(state)
                self.resizer.apply(plan.resizes, workers, self.agent_port, state.now)
                for jid in plan.resizes:
                    self._nudge_job(jid, "resize")
                self._apply(plan, state, workers, plan.stops, list(plan.starts))
                self._own = {*plan.starts, *plan.stops, *plan.resizes}
                self._set_expiry()
            self._stale = 0
            self._replan = False
            return plan
        with self.lock.first(), self.store.tx():
            seen = self._read()
        if seen is None:
            return scheduler.Plan()
        state, jobs, workers = self._cluster_state(*seen)
        plan = self._plan(state)
        starts = list(plan.starts)
        endpoints: tuple[dict[str, str], dict[str, str]] | None = None  # hosts and agents: once per step, not batch
        for k in range(0, max(1, len(starts)), _START_BATCH):  # bounded lock holds, even for 128 starts at once
            batch = starts[k:k + _START_BATCH]
            stops = plan.stops if k == 0 else {}
            resizes = plan.resizes if k == 0 else {}
            with self.lock.first(), self.store.tx():
                if not self._still_valid(stops | dict.fromkeys(resizes, "resize"),
                                         {j: plan.starts[j] for j in batch}, jobs):
                    self._stale += 1
                    self._replan = True
                    self.wakeup.set()  # re-plan at once from the new state
                    if k == 0:
                        return scheduler.Plan()
                    return dataclasses.replace(plan, starts={j: plan.starts[j] for j in starts[:k]})
                self.resizer.apply(resizes, workers, self.agent_port, state.now)
                for jid in resizes:
                    self._nudge_job(jid, "resize")
                if endpoints is None and batch:  # under the lock: the agent ports change with heartbeats
                    endpoints = self._endpoints(plan.starts)
                self._apply(plan, state, workers, stops, batch, endpoints)
                self._own.update(batch, stops, resizes)
        with self.lock.first():
            self._set_expiry()
        self._stale = 0
        self._replan = False
        return plan

    def _set_expiry(self) -> None:
        """When the earliest running attempt's ``min_runtime_s`` protection ends (after this step's starts and in-place
        resizes, which restart it): a reason to plan again then (``_needs_plan``). Under the lock."""
        self._wanted |= self.resizer.wanted_agents  # a heartbeat bringing one of their agent ports re-plans
        self.resizer.wanted_agents.clear()
        if self.cfg.min_runtime_s <= 0:
            return
        now = time.time()
        ends = (self.attempt_start[j] + self.cfg.min_runtime_s for j in self.store.active_ids("running")
                if j in self.attempt_start)
        self._next_expiry = min((e for e in ends if e > now), default=float("inf"))

    def _hold_for_arrivals(self) -> bool:
        """Whether this step waits for pilots' workers about to register (node_source slurm; each waited for at
        most the pilots' ``settle_s``): a plan made between their registrations is undone by the next one, at a
        relaunch of every elastic job it sized. Said in the log when a hold starts and ends, and counted."""
        waiting = self.arriving(set(self.last_seen)) if self.arriving is not None else []
        if waiting != self._holding:
            if waiting:
                log.info("scheduling waits for %d pilot worker(s) about to register: %s", len(waiting),
                         ", ".join(waiting))
            elif self._holding:
                log.info("scheduling resumes: the pilot workers registered (or their settle_s passed)")
            self._holding = waiting
        if waiting:
            self.held_steps += 1
        return bool(waiting)

    def _read(self) -> tuple | None:
        """Read what a step needs (under the lock), or None when it need not plan (``_needs_plan``); building the
        scheduler's view of it is left to ``_cluster_state``, which needs no lock.

        The step sees the running jobs and a bounded head of the pending queue in the policy's order
        (``plan_set``): what it costs grows with the free slots and the running jobs, not with the queue."""
        now, mono = time.time(), self.mono()
        if mono - self._reaped_at >= min(_REAP_S, self.cfg.worker_timeout_s / 10):
            previous, self._reaped_at = self._reaped_at, mono
            self._reap_dead_workers(mono, previous)
        # In a large fleet a change of the live workers alone is planned on at most every _WORKERS_STEP_S (kept for
        # a later step until then): 10,000 registrations in 20 s made 400 steps of a pass over every worker each.
        hold = (self._workers_changed and mono - self._workers_step_at < _WORKERS_STEP_S
                and len(self.last_seen) >= _WORKERS_HOLD_FROM)
        if self._workers_changed and not hold:  # the only time the live set is read again (``live_pool``)
            self.pool.rebuild(w for w in self.store.workers() if w.id in self.last_seen and w.id not in self.leaving)
        if hold:
            self._workers_changed = False
        if self.retry_at:  # a failed job waiting for its retry's time is not planned until then (see the head below)
            waiting = {j: t for j, t in self.retry_at.items() if t > now}
            self._replan |= len(waiting) < len(self.retry_at)  # a retry's time came: plan it
            self.retry_at = waiting
        if mono - self._accrued >= _ACCRUE_S:
            self.store.accrue_service(mono - self._accrued)
            self._accrued = mono
        self._last_tick = mono
        workers = self.pool.rows
        moved, freed = self.store.drain()
        self._requeue(moved, workers)
        if self.rounds is not None:
            self.rounds.flush(self.store)  # the round the last step decided: its event and the jobs' notes
        own, self._own = self._own, set()
        workers_changed = self._workers_changed
        need = self._needs_plan(moved - own, freed, now)
        if hold:
            self._workers_changed = True  # not planned on yet: a step after _WORKERS_STEP_S does
        elif workers_changed:
            self._workers_step_at = mono
        if not need:
            self.quiet_steps += 1
            return None
        self.plans += 1
        self._last_plan = now
        used, groups, where = self._slot_use()
        free = self.pool.free_slots(used)
        head = [self.store.job(j.id) for j in self.queue.head(free, self.notes.blocked()) if j.id not in self.retry_at]
        running = [self.store.job(j) for j in self.store.active_ids("running")]
        jobs = sorted((j for j in running + head if j is not None), key=lambda j: j.seq)
        starts = {j.id: self.attempt_start[j.id] for j in running if j is not None and j.id in self.attempt_start}
        curves = {j.id: c for j in jobs if (c := self.batches.curve(j)) is not None}  # goodput, once fitted
        if self._bounded_pool():  # the most processes this step's jobs could take: pending at their largest size,
            # running ones by their growth
            demand = sum(j.spec.max_procs - (j.procs if j.state == "running" else 0) for j in jobs)
            views = self.pool.for_step(used, max(0, demand))
        else:
            views = self.pool.everyone()
        return (now, jobs, workers, views, used, groups, where, starts, curves)

    def _bounded_pool(self) -> bool:
        """Whether a step may plan over a bounded set of the idle workers (``live_pool``): with the consolidated
        placement, admission of every job, running jobs kept where they are and a policy whose order depends only on
        each job's own view (an order key: the cluster's size is not part of it), which is when it decides the same."""
        return (self.rounds is None and self.queue.bounded and self.cfg.placement == "consolidated"
                and self.cfg.admission == "accept-all" and self.cfg.regroup == "keep")

    def _needs_plan(self, moved: set[str], freed: bool, now: float) -> bool:
        """Whether a step must call the planner: a job moved (submitted, started, stopped, ended), slots came free,
        the live workers changed, the last plan did something (a start may wait for a worker's port), a running
        attempt's ``min_runtime_s`` protection ended, the policy's order moves with time, or ``_REPLAN_S`` passed."""
        need = (bool(moved) or freed or self._workers_changed or self._replan or self._every_step
                or now >= self._next_expiry or now - self._last_plan >= _REPLAN_S)
        self._workers_changed = False
        return need

    def _requeue(self, moved: set[str], workers: list[WorkerRow]) -> None:
        """Keep the pending queue and the waiting notes up to date with the jobs that moved and the live workers."""
        if self._workers_changed:  # first: a job entering now gets its note from the workers as they are
            for jid, note in self.notes.workers_changed(workers):
                self._notes_due[jid] = note
        entering = []
        for jid in moved:
            self.notes.leave(jid)
            j = self.store.job(jid)
            if j is None or j.state not in ("running", "stopping"):
                self.attempt_start.pop(jid, None)  # only a running attempt's start is read: not one per job ever
            if j is None or j.state in ("completed", "failed", "cancelled"):
                self.batches.forget(jid)  # its fit stays in the store
            if j is not None and j.state == "pending":
                cls = (j.spec.launcher, j.spec.min_procs, j.spec.gpu_types)
                entering.append((j.seq, job_state(j), cls))
                self._notes_due[jid] = self.notes.enter(jid, cls)
        self.queue.update(moved, entering)
        self._write_notes()

    def _write_notes(self) -> None:
        """Write the waiting notes due (a job's latest note wins) for at most ``_NOTES_S`` a step, the rest at the next
        steps, woken at once: the first worker of a fleet changed the note of 100,000 queued jobs, and writing them
        all in one step held the lock 10 s while the registration storm's calls timed out behind it; a bound by count
        (4,096 a step) still made those steps ~0.5 s each, the decision's p99."""
        end = time.perf_counter() + _NOTES_S
        due = self._notes_due
        while due:
            for jid in list(islice(due, _NOTES_CHUNK)):
                note = due.pop(jid)
                j = self.store.job(jid)
                if j is not None and j.state == "pending":
                    self._set_note(j, note)
            if time.perf_counter() >= end:
                break
        if due:
            self.notes_deferred += 1
            self.wakeup.set()

    def _set_note(self, j: JobRow, note: str) -> None:
        """Say why a pending job cannot start whatever the policy does (``waiting``); written only when it changes."""
        message = with_note(j.message, note, MAX_MESSAGE_CHARS)
        if message != j.message:
            self.store.update_job(j.id, message=message)

    @staticmethod
    def _cluster_state(now: float, jobs: list[JobRow], workers: list[WorkerRow],
                       views: tuple[scheduler.WorkerState, ...], used: dict[str, int],
                       groups: dict[str, str], where: dict[str, list[tuple[str, int]]],
                       attempt_start: dict[str, float], curves: dict[str, ScalingCurve] | None = None
                       ) -> tuple[scheduler.ClusterState, dict[str, JobRow], list[WorkerRow]]:
        state = scheduler.ClusterState(
            now=now,
            jobs=tuple(job_state(j, groups.get(j.id), tuple(where.get(j.id, ())), attempt_start.get(j.id),
                                 (curves or {}).get(j.id)) for j in jobs if j.state in ("pending", "running")),
            workers=views,
            used=used,
        )
        return state, {j.id: j for j in jobs}, workers

    def _plan(self, state: scheduler.ClusterState) -> scheduler.Plan:
        if self.rounds is not None:
            return self.rounds.plan(state)
        plan = scheduler.plan(state, self.cfg.policy, self.cfg.min_runtime_s, self.cfg.milp_tfwd_s,
                              admission=self.cfg.admission, load_threshold=self.cfg.load_threshold,
                              placement=self.cfg.placement, regroup=self.cfg.regroup)
        if plan.sizing:
            self._note_sizing(plan.sizing)
        if plan.grow_waits or self.grow_waits:
            self._note_grow_waits(plan.grow_waits)
        return plan

    def _note_grow_waits(self, waits: dict[str, int]) -> None:
        """Say (once per job and size, not at every step while it waits) an elastic job kept at its size until the
        slots of stopping jobs are free, to grow in place then (``Plan.grow_waits``), and count it."""
        for jid, size in waits.items():
            if self.grow_waits.get(jid) != size:
                self.grows_waited += 1
                log.info("job %s grows in place to %d procs once slots that stopping jobs hold are free (kept "
                         "running meanwhile, not relaunched)", jid, size)
        self.grow_waits = dict(waits)

    def _note_sizing(self, sizing: dict[str, str]) -> None:
        """Count a step whose MILP sizing was not optimal, and log it when a job's sizing turns so (once, not
        at every tick while it stays so)."""
        bad = {j: how for j, how in sizing.items() if how != "optimal"}
        if bad:
            self.nonoptimal_decisions += 1
            changed = {j: how for j, how in bad.items() if self.sizing.get(j) != how}
            if changed:
                log.warning("MILP sizing not optimal for %s (%d such steps so far)",
                            ", ".join(f"{j}: {how}" for j, how in sorted(changed.items())), self.nonoptimal_decisions)
        self.sizing = self.sizing | sizing  # a new dict: list_jobs reads it from another thread

    def _still_valid(self, stops: dict[str, str], starts: dict[str, list[tuple[str, int]]],
                     jobs: dict[str, JobRow]) -> bool:
        """True when nothing these stops and starts act on changed since ``jobs`` was read (rules in ``tick``)."""
        if not starts and not stops:
            return True
        ids = list(stops) + list(starts)
        now = {j.id: j for j in self.store.jobs(("pending", "running"), ids=ids)}
        for jid in stops:
            j = now.get(jid)
            if j is None or j.state != "running" or j.generation != jobs[jid].generation:
                return False
        for jid in starts:
            j = now.get(jid)
            if j is None or j.state != "pending":
                return False
        placed = {wid for where in starts.values() for wid, _ in where}
        return all(wid in self.last_seen and wid not in self.leaving for wid in placed)

    def _apply(self, plan: scheduler.Plan, state: scheduler.ClusterState, workers: list[WorkerRow],
               stops: dict[str, str], starts: list[str],
               endpoints: tuple[dict[str, str], dict[str, str]] | None = None) -> None:
        """Write a plan's stops and these starts; ``endpoints``: the workers' hosts and agents, when the step has
        them already (they cost a pass over every worker)."""
        for jid, reason in stops.items():
            self.store.update_job(jid, state="stopping", stop_reason=reason, stop_time=state.now)
            self.store.event(jid, "stop", reason=reason, new_procs=plan.sizes.get(jid, 0))
            self._nudge_job(jid, "stop")
            log.info("job %s: %s (to %d procs)", jid, reason, plan.sizes.get(jid, 0))
        if not starts:
            return
        hosts, agents = endpoints or self._endpoints(plan.starts)
        for jid in starts:
            started = self._start(self.store.job(jid), plan.starts[jid], hosts, plan.groups.get(jid, jid),
                                  agents)  # its row now
            if started and jid in plan.shrunk_to_fit:  # nothing degrades silently: counted, and said once
                self.shrunk_to_fit += 1
                log.info("job %s starts at %d procs, below the %d it was sized to: no placement fits that "
                         "(shrink_to_fit; %d such starts so far)", jid, plan.sizes[jid], plan.shrunk_to_fit[jid],
                         self.shrunk_to_fit)

    def _endpoints(self, starts: dict[str, list[tuple[str, int]]]) -> tuple[dict[str, str], dict[str, str]]:
        """The hosts and agents of the workers these starts go to (a launch names only its own workers): not a map of
        every worker, which at 10,000 workers cost a step milliseconds."""
        rows = [w for w in (self.store.worker(wid) for wid in {wid for where in starts.values() for wid, _ in where})
                if w is not None]
        return {w.id: w.host for w in rows}, agent_endpoints(rows, self.agent_port)

    def _nudge_job(self, job_id: str, reason: str) -> None:
        """Tell the workers of a job's tasks that they have orders (a stop, a resize) without their next heartbeat."""
        if self.nudge is not None:
            self.nudge({a.worker_id for a in self.store.allocations(job_id=job_id)}, reason)

    def _slot_use(self) -> tuple[dict[str, int], dict[str, str], dict[str, list[tuple[str, int]]]]:
        """Slots held per worker (a co-located group counts once: its largest member), each job's
        co-location key and its placement (node-rank order), from the live allocations (``launch.slot_use``)."""
        allocs = self.store.live_allocations()
        return slot_use(allocs, self.store.groups({a.job_id for a in allocs}))

    def run_forever(self, stop: threading.Event) -> None:
        """The scheduling loop: every ``schedule_interval_s``, or soon when something changed. Steps are at
        least ``_MIN_STEP_GAP_S`` apart: in a burst of changes (256 workers registering at once) back-to-back
        steps held the lock most of the time and every heartbeat queued behind one."""
        while not stop.is_set():
            self.wakeup.wait(self.cfg.schedule_interval_s)
            self.wakeup.clear()
            t0, plans = time.perf_counter(), self.plans
            try:
                self.tick()
            except Exception as e:  # a bug in one step must not kill the controller: logged, once per cause and
                # interval (a step failing at every tick, on a full disk, wrote a traceback each time)
                self.step_errors.log(logging.ERROR, cause(e), "scheduling step failed: %s", cause(e),
                                     exc_info=not is_disk_full(e))
            took = time.perf_counter() - t0
            if self.on_step is not None:  # a decision's time is a figure the scale targets are set on
                self.on_step("scheduling_step" if self.plans > plans else "quiet_step", took)
            # at least the gap, and as long as the step took: changes arriving meanwhile are planned together, and
            # steps that cost a pass over 10,000 workers take at most half the controller's time
            stop.wait(max(min(_MIN_STEP_GAP_S, self.cfg.schedule_interval_s), min(_STEP_DUTY * took, 1.0)))


def job_state(j: JobRow, group: str | None = None, placement: tuple[tuple[str, int], ...] = (),
               attempt_start: float | None = None, curve: ScalingCurve | None = None) -> scheduler.JobState:
    """The scheduler's view of a job; ``curve``: its value by size when not the declared one (an adaptive-batch
    job's goodput, ``batch_tracker``)."""
    profile, iteration_s = None, j.iteration_s
    if j.data_s is not None:
        profile = ResourceProfile(j.data_s or 0.0, j.compute_s or 0.0, j.comm_s or 0.0)
    elif j.spec.profile is not None:  # declared, until the job measures its own
        profile = ResourceProfile(*j.spec.profile)
        iteration_s = iteration_s if iteration_s is not None else profile.total_s
    return scheduler.JobState(
        id=j.id, submit=j.submit_time, running=j.state == "running", procs=j.procs, min_procs=j.spec.min_procs,
        max_procs=j.spec.max_procs, launcher=j.spec.launcher, steps_total=j.spec.steps, steps_done=j.steps_done,
        iteration_s=iteration_s, profile=profile, attained_s=j.attained_s, executed_s=j.executed_s,
        first_start=j.start_time, group=group if j.state == "running" else None,
        placement=placement if j.state == "running" else (),
        attempt_start=attempt_start if j.state == "running" else None,
        curve=curve or (ScalingCurve(j.spec.curve_procs, j.spec.curve_rates) if j.spec.curve_procs else None),
        resize_s=j.spec.resize_s,  # a rigid job is never resized: the launcher's registry is not asked (an import each)
        in_place=j.state == "running" and j.spec.min_procs < j.spec.max_procs and in_place_capable(j.spec),
        gpu_types=j.spec.gpu_types, model=j.spec.model,
    )


