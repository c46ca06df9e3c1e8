"""The controller's state machine: jobs move pending -> running -> (stopping ->) completed / pending / failed.

Workers are reconciled declaratively on every heartbeat: the database says which tasks should exist
(allocations of running jobs) and which must go (allocations of stopping jobs, anything unknown); the
reply carries the difference. Nothing else is queued in memory, so a controller restarted after
``kill -9`` resends what a worker never confirmed and kills what it no longer wants, from the tables alone.

A job attempt ends when every task of its generation has exited: all exit codes 0 (and, for a job that
declares ``steps``, that step reported, or the program's ``done``) means completed; a non-zero exit, a task
that could not start, an exit 0 short of the declared steps or a dead worker fails the attempt, with the
reason in the job's message, and it is retried (from the last checkpoint, by the program itself) until
``max_restarts``. Preempt and resize stop a job with SIGTERM so it checkpoints;
a resized job is placed again at its new size and the time from the stop to its first progress report
at the new size is recorded as ``last_resize_s``.

An elastic Horovod job (``horovodrun``, ``min_procs < max_procs``) is resized in place instead, across workers
too, and a worker that leaves or is lost shrinks it in place onto the rest: the rules and the writes are in
``inplace_resize`` (``InPlaceResizer``, which this class calls under its lock).

The rules live beside it, named for what they are, as functions this class calls: ``lifecycle`` (the job state
machine as a transition table), ``reconcile`` (what a heartbeat's tasks mean against the store), ``launch``
(LaunchTasks from a placement, co-location accounting), ``inplace_resize`` (elastic Horovod resized in place),
``listing`` (the read-only ListJobs / ListWorkers pages). This class keeps the lock, the store, liveness and the
scheduling tick (``scheduler.plan``), and does every write and log line.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable, Container, Iterable

from hpcsched.allocator import hints_of
from hpcsched.errors import InputError
from hpcsched.model import ResourceProfile, ScalingCurve
from hpcsched.runtime import reconcile, scheduler
from hpcsched.runtime.config import GPU_TYPE, ControllerConfig, parse_job_spec
from hpcsched.runtime.diskspace import is_disk_full
from hpcsched.runtime.inplace_resize import InPlaceResizer, agent_endpoints
from hpcsched.runtime.launch import AGENT_LAUNCHERS, JOB_UID_ENV, in_place_capable, launch_tasks, slot_use
from hpcsched.runtime.lifecycle import (
    IN_PLACE,
    IN_PLACE_TIMEOUT_S,
    Action,
    Event,
    attempt_end,
    exit_event,
    next_state,
    retry_delay,
)
from hpcsched.runtime.listing import MAX_MESSAGE_CHARS, MAX_REPLY_BYTES, JobFilter, Listing, every_page, wall
from hpcsched.runtime.liveness import heartbeat_problem, interval_s
from hpcsched.runtime.memstore import MemStore
from hpcsched.runtime.plan_set import PendingQueue
from hpcsched.runtime.ratelimit import LogThrottle, cause
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.store import MAX_REQUEST_ID_CHARS, AllocRow, JobRow, WorkerRow
from hpcsched.runtime.submission import Item, LimitExceeded, PendingCounts, parse_items, pending_refusal, store_items
from hpcsched.runtime.waiting import WaitingNotes, with_note

log = logging.getLogger("hpcsched.runtime.controller")

_MAX_STALE = 3  # plans dropped in a row (state changed while planning) before one is made under the lock
_MIN_STEP_GAP_S = 0.05  # between two scheduling steps (see run_forever)
_START_BATCH = 16  # job starts applied per lock hold (a start is ~0.3-0.6 ms: bounded heartbeat waits)
_UNCHANGED = pb.TaskStatus(running=True)  # a confirmed task a partial heartbeat left out: it runs, no news
_REPLAN_S = 5.0  # a step plans at least this often even when nothing it knows of changed (a safety net)
_ACCRUE_S = 1.0  # service is accrued (one UPDATE of the running jobs) at most this often

# Registration bounds (issue 15: 2^31-1, -5 and 0 slots and a 100 KB id were accepted).
MAX_WORKER_ID_CHARS = 128
MAX_SLOTS = 4096  # processes one node runs at once: far above any node, far below int32
_WORKER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]*")


class Refused(Exception):
    """A worker's request the controller will not carry out, with why (gRPC FAILED_PRECONDITION): another live
    daemon holds its name. The message is for the worker's log and its operator."""


class Controller:
    """All decisions and state; the gRPC layer (``server.py``) only translates messages."""

    def __init__(self, cfg: ControllerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: the monotonic clock liveness and service accrual run on (injectable for tests): a step of
        the wall clock (NTP, an operator) must neither declare healthy workers lost nor add service."""
        self.cfg = cfg
        self.mono = clock
        self.store = MemStore(cfg.state)  # one controller per state file; its state in memory, written through
        self.lock = threading.RLock()
        self.wakeup = threading.Event()
        policy = scheduler.resolve_policy(cfg.policy)  # an unknown policy fails at start-up, not at the first job
        self.queue = PendingQueue(policy)  # the pending jobs in the policy's order: a step plans over its head
        self.notes = WaitingNotes()
        # A step plans only when something it decides on changed (``_needs_plan``), except for a policy whose order
        # moves with time (LAS, SRTF: service and progress change priorities), the rounds executor and an admission
        # rule (load-based), which plan at every step as before.
        self._every_step = (not hints_of(policy).order_key_static or cfg.executor == "rounds"
                            or cfg.admission != "accept-all")
        self._workers_changed = True  # the live worker set changed since the last step (register, leave, lost)
        self._replan = True  # plan at the next step: the last plan was dropped, or a start waited for what came now
        self._own: set[str] = set()  # jobs the last plan started, stopped or resized: no news to plan on
        self._full_wanted: set[str] = set()  # workers asked for a full report (HeartbeatReply.full_report)
        self._wanted: set[str] = set()  # workers a start waits on for a free port or an agent port (``_start``)
        self._last_plan = float("-inf")
        self._next_expiry = float("inf")  # the earliest end of a running attempt's min_runtime_s protection
        self._accrued = self.mono()
        self.plans = 0  # steps that called the planner
        self.refused_reports = 0  # task reports refused: not placed on the reporting worker, or another job's
        self.refused_heartbeats = 0  # heartbeats refused unprocessed: more entries than the worker's slots allow
        self._rate_warned = False
        self.on_step: Callable[[str, float], None] | None = None  # (kind, seconds) of each step: the server's timings
        # (workers, reason): tell these workers they have new orders now (the server's OrdersHub, watch.py); their
        # heartbeat replies carry the orders either way
        self.nudge: Callable[[Iterable[str], str], None] | None = None
        self.quiet_steps = 0  # steps that did not (nothing changed)
        self.last_seen: dict[str, float] = {}  # worker -> its last heartbeat, on the monotonic clock
        self.spare_port: dict[str, int] = {}
        self.agent_port: dict[str, int] = {}  # worker -> its WorkerAgent port (every heartbeat says it: no state)
        self.leaving: set[str] = set()  # workers draining after a Leave: they get no new tasks
        self.attempt_start: dict[str, float] = {}  # job -> when its current attempt was placed (hysteresis)
        # job -> wall time before which its retry is not placed (lifecycle.retry_delay; in memory: a restarted
        # controller retries at once)
        self.retry_at: dict[str, float] = {}
        self._last_tick = self.mono()
        self._stale = 0  # consecutive plans dropped by tick()'s check
        self._groups: dict[str, str] = {}  # task -> co-location key (parsed once from its LaunchTask)
        self.sizing: dict[str, str] = {}  # job -> how the MILP sized it last (shown by `hpcsched jobs`)
        self.nonoptimal_decisions = 0  # scheduling steps whose MILP sizing was not optimal
        self.instance: dict[str, str] = {}  # worker -> the daemon (RegisterRequest.instance) that holds the name
        # node_source slurm: the workers of pilots about to register (PilotManager.arriving); decisions wait for them
        self.arriving: Callable[[Container[str]], list[str]] | None = None
        self.held_steps = 0  # scheduling steps held for arriving pilots' workers
        self.step_errors = LogThrottle(log)
        self._holding: list[str] = []
        self.listing = Listing(self.store)  # the read-only views, on reader connections of their own
        self.pending = PendingCounts()  # per-user pending counts for max_pending_per_user (submission.py)
        self.resizer = InPlaceResizer(self.store, self.attempt_start, self._task_exited)
        self.rounds = None  # executor: rounds: Gavel's round mechanism plans instead (hpcsched.runtime.round_planner)
        if cfg.executor == "rounds":
            from hpcsched.runtime.round_planner import RoundPlanner

            self.rounds = RoundPlanner(cfg, self.store.reader())

    def started(self) -> None:
        """Called once the server listens. Liveness is in memory only: after a restart every worker
        the database knows gets one timeout of grace to come back before its tasks count as lost."""
        with self.lock:
            now, mono = time.time(), self.mono()
            self._accrued = mono
            for w in self.store.workers():
                if w.alive:
                    self.last_seen.setdefault(w.id, mono)
                    self._full_wanted.add(w.id)  # what runs there is only in the tables: ask for every task
            for j in self.store.jobs(("running",)):  # not durable: a restart counts as the attempt's start
                self.attempt_start.setdefault(j.id, now)
            self._last_tick = mono

    # ---------------------------------------------------------------------------------------- workers
    def register(self, req: pb.RegisterRequest) -> pb.RegisterReply:
        """Admit a worker daemon. Its id, slots and host are bounded (``registration_problem``: InputError), and a
        name is held by one live daemon at a time: a second daemon with a live holder's name is ``Refused``
        (two such daemons flapped, each re-registering over the other, and a job ended at 115 of 400 steps).
        A holder silent for ``worker_timeout_s`` is lost, and then the name is free again."""
        problem = registration_problem(req)
        if problem:
            raise InputError(f"worker {_clip(req.worker_id, 60)!r}", problem)
        with self.lock, self.store.tx():
            holder = self.instance.get(req.worker_id)
            if req.worker_id in self.last_seen and holder is not None and holder != req.instance:
                silent = self.mono() - self.last_seen[req.worker_id]
                log.warning("refused a second daemon for worker %s (the holder was heard %.1f s ago)",
                            req.worker_id, silent)
                raise Refused(f"worker name {req.worker_id!r} is held by another live daemon; give this one "
                              "another --name, or stop the other one (its name is free "
                              f"{self.cfg.worker_timeout_s:g} s after it goes silent)")
            self.instance[req.worker_id] = req.instance
            w = WorkerRow(req.worker_id, req.host, req.slots, req.gpus, req.cpus, tuple(req.launchers),
                          time.time(), True, req.gpu_type.lower())
            self.store.upsert_worker(w)
            self.leaving.discard(w.id)
            self._workers_changed = True
            if req.agent_port:  # a job placed on it at once may need it (mpirun's daemons, horovodrun's ranks)
                self.agent_port[w.id] = req.agent_port
            else:  # a new daemon's agent listens elsewhere: known at its first heartbeat
                self.agent_port.pop(w.id, None)
            self.store.event(None, "register", worker=w.id, host=w.host, slots=w.slots, gpu_type=w.gpu_type)
            self.last_seen[w.id] = self.mono()
        log.info("worker %s registered (%s, %d slots, %d GPUs of type %s)", req.worker_id, req.host, req.slots,
                 req.gpus, req.gpu_type.lower() or "(not advertised)")
        self.wakeup.set()
        return pb.RegisterReply(heartbeat_interval_s=self.heartbeat_interval(),
                                worker_timeout_s=self.cfg.worker_timeout_s)

    def heartbeat_interval(self) -> float:
        """The interval workers are told to beat at now (``liveness.interval_s``: it grows with the fleet so the
        controller's heartbeat rate stays near ``heartbeat_rate``); said once when the timeout caps it."""
        interval, capped = interval_s(len(self.last_seen), self.cfg.heartbeat_interval_s, self.cfg.heartbeat_rate,
                                      self.cfg.worker_timeout_s)
        if capped and not self._rate_warned:
            self._rate_warned = True
            log.warning("%d workers at heartbeat_rate %g/s would beat every %.1f s, but worker_timeout_s %g caps the "
                        "interval at %.1f s (a third of it): the controller gets %.0f heartbeats a second; raise "
                        "worker_timeout_s (or heartbeat_rate on a bigger host)", len(self.last_seen),
                        self.cfg.heartbeat_rate, len(self.last_seen) / self.cfg.heartbeat_rate,
                        self.cfg.worker_timeout_s, interval, len(self.last_seen) / interval)
        return interval

    def heartbeat(self, req: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        """Reconcile one worker's report (``reconcile``). Its size is checked before the lock is taken
        (``liveness.heartbeat_problem``: InputError), and a task it reports that is not placed on it, or names
        another job or attempt than its placement, is refused and counted and changes nothing. A ``partial``
        report lists only tasks with news: a confirmed task it leaves out runs on unchanged, and a task the worker
        lost is found at its next full report (every ``liveness.FULL_EVERY`` beats, and after registering)."""
        w = self.store.worker(req.worker_id)  # one dict read, no lock: the slots of a registered worker never shrink
        problem = heartbeat_problem(req, w.slots if w is not None else 0)
        if problem:
            self.refused_heartbeats += 1
            log.warning("refused a heartbeat of worker %s unprocessed: %s (%d such so far)",
                        _clip(req.worker_id, 60), problem, self.refused_heartbeats)
            raise InputError(f"heartbeat of worker {_clip(req.worker_id, 60)!r}", problem)
        reply = pb.HeartbeatReply()
        with self.lock:
            wid = req.worker_id
            if wid not in self.last_seen:
                reply.reregister = True
                return reply
            holder = self.instance.setdefault(wid, req.instance)  # after a restart: the first daemon heard
            if holder != req.instance:
                raise Refused(f"worker name {wid!r} is held by another live daemon; this one is not registered")
            self.last_seen[wid] = self.mono()
            if req.spare_port:
                self.spare_port[wid] = req.spare_port
            if req.agent_port:
                self.agent_port[wid] = req.agent_port
            if wid in self._wanted and (req.spare_port or req.agent_port):  # a start waited for this: plan again
                self._wanted.discard(wid)
                self._replan = True
                self.wakeup.set()
            reported = {t.task_id: t for t in req.tasks}
            if wid in self._full_wanted:
                if req.partial:
                    reply.full_report = True
                else:
                    self._full_wanted.discard(wid)
            changed = False
            with self.store.tx():
                for t in req.tasks:
                    changed |= self._reconcile_reported(wid, t, reply)
                for a in self.store.allocations(worker_id=wid):
                    seen = reported.get(a.task_id)
                    if seen is None and req.partial and a.state == "running":
                        seen = _UNCHANGED  # confirmed earlier, no news: it runs on
                    changed |= self._reconcile_expected(a, seen, reply)
            reply.heartbeat_interval_s = self.heartbeat_interval()
        if changed:
            self.wakeup.set()
        return reply

    def leave(self, req: pb.LeaveRequest) -> pb.LeaveReply:
        """A worker stopping on purpose. Draining: its jobs stop with a checkpoint (preempt, so no restart is
        counted) and the next step places them elsewhere. Final: it is gone now; whatever it did not report
        as exited counts as lost. Only the daemon that holds the name may say so."""
        wid = req.worker_id
        stopping = 0
        if not _WORKER_ID.fullmatch(wid) or len(wid) > MAX_WORKER_ID_CHARS:  # it is logged: no forged lines
            raise InputError("worker id", "not a worker id (1 to 128 letters, digits and _.:@-)")
        with self.lock:
            if self.instance.get(wid, req.instance) != req.instance:
                raise Refused(f"worker name {wid!r} is held by another live daemon; this one cannot leave for it")
        with self.lock, self.store.tx():
            now = time.time()
            self.leaving.add(wid)
            self._workers_changed = True
            for a in self.store.allocations(worker_id=wid):
                job = self.store.job(a.job_id)
                if a.nprocs == 0 or self.resizer.shrink_away(job, wid, f"worker {wid} left", now):
                    continue  # released, or shrunk in place onto the job's other workers: it keeps running
                if next_state(job.state, Event.STOP)[1] is Action.STOP:
                    self.store.update_job(job.id, state="stopping", stop_reason="preempt", stop_time=now,
                                          message=f"worker {wid} left")
                    self.store.event(job.id, "stop", reason="preempt", worker_left=wid)
                    self._nudge_job(job.id, "stop")
                    stopping += 1
            if req.final:
                self.last_seen.pop(wid, None)
                self.instance.pop(wid, None)
                self.spare_port.pop(wid, None)
                self.store.set_worker_alive(wid, False)
                for a in self.store.allocations(worker_id=wid):
                    job = self.store.job(a.job_id)
                    if a.nprocs == 0 and job.state == "running":
                        self.resizer.release_exited(job, a, f"went with worker {wid}")
                        continue
                    self.store.set_alloc_state(a.task_id, "exited", -9)
                    self._task_exited(job, a, -9, f"lost: worker {wid} left while it ran", lost=True)
            self.store.event(None, "worker_left" if req.final else "worker_draining", worker=wid)
        log.info("worker %s %s (%d jobs stopping)", wid, "left" if req.final else "is leaving", stopping)
        self.wakeup.set()
        return pb.LeaveReply(stopping_jobs=stopping)

    def _reconcile_reported(self, wid: str, t: pb.TaskStatus, reply: pb.HeartbeatReply) -> bool:
        """Act on one reported task (``reconcile.reported``); True when a job's state may have changed. A task
        placed on another worker, or whose job or attempt is not its placement's, is refused: counted, logged
        (the first few), and nothing changes (a forged report marked another user's job completed)."""
        a = self.store.alloc(t.task_id)
        if a is not None and (a.worker_id != wid or a.job_id != t.job_id or a.generation != t.generation):
            self.refused_reports += 1
            if self.refused_reports <= 10 or self.refused_reports % 1000 == 0:
                log.warning("worker %s reported task %s (job %s, generation %d), placed on %s as job %s generation %d: "
                            "refused (%d such reports so far)", wid, _clip(t.task_id, 60), _clip(t.job_id, 40),
                            t.generation, a.worker_id, a.job_id, a.generation, self.refused_reports)
            return False
        job = self.store.job(a.job_id if a is not None else t.job_id)
        if reconcile.is_current(a, job):
            for p in t.progress:
                self._apply_progress(job, p)
                job = self.store.job(t.job_id)  # the next report must see what this one changed
        verdict = reconcile.reported(t.running, a, job)
        if verdict in (reconcile.Reported.EXITED, reconcile.Reported.FORGET):
            reply.forget.append(t.task_id)
        if verdict is reconcile.Reported.EXITED and a.nprocs == 0 and job is not None and job.state == "running":
            self.resizer.release_exited(job, a, f"exited with {t.exit_code}")
            return True
        if verdict is reconcile.Reported.EXITED:
            self.store.set_alloc_state(a.task_id, "exited", t.exit_code)
            self._task_exited(self.store.job(a.job_id), a, t.exit_code, t.reason)
            return True
        if verdict is reconcile.Reported.STALE:
            reply.kill.append(pb.KillTask(task_id=t.task_id, checkpoint=False))  # stale: nobody wants it
        elif verdict is reconcile.Reported.CONFIRMED:
            self.store.set_alloc_state(a.task_id, "running")
        return False

    def _reconcile_expected(self, a: AllocRow, seen: pb.TaskStatus | None, reply: pb.HeartbeatReply) -> bool:
        """Act on one live allocation of the reporting worker (``reconcile.expected``); True when a job's state
        may have changed."""
        job = self.store.job(a.job_id)
        verdict = reconcile.expected(a, job, seen, time.time(), IN_PLACE_TIMEOUT_S)
        if verdict is reconcile.Expected.STOP:
            reply.kill.append(pb.KillTask(task_id=a.task_id, checkpoint=job.stop_reason != "failed",
                                          grace_s=self.cfg.stop_grace_s))
        elif verdict is reconcile.Expected.NEVER_STARTED:  # never started: nothing to stop
            self.store.set_alloc_state(a.task_id, "exited", -1)
            self._check_stopped(self.store.job(a.job_id))
            return True
        elif verdict is reconcile.Expected.RELEASE:  # Horovod removes its ranks; it exits when they are gone
            reply.kill.append(pb.KillTask(task_id=a.task_id, checkpoint=True, grace_s=self.cfg.stop_grace_s))
        elif verdict is reconcile.Expected.RELEASED:
            self.resizer.release_exited(job, a, "released before it started")
            return True
        elif verdict is reconcile.Expected.RESIZE_TIMED_OUT:
            # The worker could not resize it in place (it logged why): stop it and relaunch it at the new
            # size, counting the resize from the original decision.
            self.store.update_job(job.id, state="stopping", stop_reason="resize")
            self.store.event(job.id, "resize", resize_kind="relaunch", reason="in-place resize timed out")
            reply.kill.append(pb.KillTask(task_id=a.task_id, checkpoint=True, grace_s=self.cfg.stop_grace_s))
        elif verdict in (reconcile.Expected.RESEND_RESIZE, reconcile.Expected.LAUNCH):
            # Resent on every heartbeat until the worker reports the task (a resize: at the new size), so a launch
            # left out of a reply that is already MAX_REPLY_BYTES long goes in the next one: every reply is bounded
            # (a launch holds up to 32 KB of command and env; 100 of them on one worker passed 3 MB).
            if reply.launch and reply.ByteSize() + len(a.launch) + 8 > MAX_REPLY_BYTES:
                return False
            reply.launch.append(pb.LaunchTask.FromString(a.launch))
        elif verdict is reconcile.Expected.LOST and a.nprocs == 0:  # released: its ranks had left the job
            self.resizer.release_exited(job, a, f"gone from worker {a.worker_id}")
            return True
        elif verdict is reconcile.Expected.LOST:
            # It was running and the worker no longer knows it (the worker restarted): the attempt is lost.
            self.store.set_alloc_state(a.task_id, "exited", -1)
            self._task_exited(job, a, -1, f"lost: worker {a.worker_id} no longer runs it (restarted?)", lost=True)
            return True
        return False

    def _apply_progress(self, job: JobRow, p: pb.Progress) -> None:
        """Write one progress report of the job's current attempt (``reconcile.progress_update``)."""
        u = reconcile.progress_update(job, p, time.time())
        self.store.add_progress(job.id, job.generation, u.row)
        for kind, detail in u.events:
            self.store.event(job.id, kind, **detail)
        self.store.update_job(job.id, **u.fields)

    # ------------------------------------------------------------------------------------ job state
    def _task_exited(self, job: JobRow, a: AllocRow, code: int, reason: str = "", lost: bool = False) -> None:
        """A task ended. A non-zero code (a rank's exit, a signal, a task that could not start, a lost worker)
        fails the attempt, with the worker's ``reason`` (or the code) as the job's message (``lifecycle``)."""
        if a.node_rank == 0 and job.spec.launcher in ("mpirun", "horovodrun"):
            # One launcher on node 0 ran every rank; the other nodes only held slots: they end with it.
            for hold in self.store.allocations(job_id=job.id):
                if hold.generation == a.generation:
                    self.store.set_alloc_state(hold.task_id, "exited", code)
        if next_state(job.state, exit_event(code, lost))[1] is Action.STOP_FAILED:
            log.warning("job %s task %s exited with %d: stopping the attempt", job.id, a.task_id, code)
            why = _clip(reason or f"exited with {code}", 400)  # room for the retry count after it, within 500
            self.store.update_job(job.id, state="stopping", stop_reason="failed", stop_time=time.time(),
                                  message=f"task {a.task_id} {why}")
            self.store.event(job.id, "task_failed", task=a.task_id, exit_code=code, reason=_clip(reason))
            self._nudge_job(job.id, "stop")
        self._check_stopped(self.store.job(job.id))

    def _check_stopped(self, job: JobRow) -> None:
        """Finish a job attempt once none of its tasks is left: ``lifecycle.attempt_end`` says how it ended,
        ``lifecycle.next_state`` what follows."""
        if job.state not in ("running", "stopping") or self.store.allocations(job_id=job.id):
            return
        codes = [a.exit_code for a in self.store.allocations(job_id=job.id, live_only=False)
                 if a.generation == job.generation]
        now = time.time()
        event, short = attempt_end(job.state, job.stop_reason, codes, bool(job.done), job.spec.steps, job.steps_done,
                                   job.restarts, self.cfg.max_restarts)
        _, action = next_state(job.state, event)
        if action is Action.COMPLETE:
            self.store.update_job(job.id, state="completed", procs=0, end_time=now, message="done")
            # a job that ended before its last in-place resize reached rank 0 (a grow ordered ~1 s before its last
            # step) says so: its ``resize`` event then has no ``resized``, and that is not lost
            unseen = {"resize_unseen_procs": job.procs} if job.stop_reason == IN_PLACE else {}
            self.store.event(job.id, "completed", steps=job.steps_done, **unseen)
            log.info("job %s completed at step %d%s", job.id, job.steps_done,
                     f" before its in-place resize to {job.procs} procs was seen" if unseen else "")
            return
        reason = job.stop_reason
        message = job.message
        if short:
            reason = "failed"
            message = f"exited 0 at step {job.steps_done} of {job.spec.steps}"
            self.store.event(job.id, "task_failed", exit_code=0, reason=message)
            log.warning("job %s: %s", job.id, message)
        restarts = job.restarts + 1
        if action is Action.END_CANCELLED:
            self.store.update_job(job.id, state="cancelled", procs=0, end_time=now)
        elif action is Action.GIVE_UP:
            message = _clip(f"{message}; failed {restarts} attempt{'s' if restarts > 1 else ''}, no retries left")
            self.store.update_job(job.id, state="failed", procs=0, end_time=now, restarts=restarts,
                                  message=message)
            log.warning("job %s failed: %s", job.id, message)
        elif action is Action.RETRY:
            wait = retry_delay(restarts, self.cfg.retry_backoff_s, self.cfg.retry_backoff_max_s)
            if wait:
                self.retry_at[job.id] = now + wait
            when = f" at {time.strftime('%H:%M:%S', time.gmtime(now + wait))} UTC (in {wait:g} s)" if wait else ""
            message = _clip(f"{message}; retry {restarts} of {self.cfg.max_restarts}{when}")
            self.store.update_job(job.id, state="pending", procs=0, restarts=restarts, stop_reason=None,
                                  message=message)
        else:  # REQUEUE after a preempt or resize: back to the queue, resumes from its checkpoint
            keep = {"stop_reason": reason, "stop_time": job.stop_time} if reason == "resize" else \
                {"stop_reason": None}
            self.store.update_job(job.id, state="pending", procs=0, **keep)
        self.store.event(job.id, "stopped", reason=reason)

    def submit(self, spec_yaml: str, source: str, request_id: str = "", owner: str = "") -> str:
        """The new (or, for a retried ``request_id``, the earlier) job's id; ``submit_once`` says which."""
        return self.submit_once(spec_yaml, source, request_id, owner)[0]

    def submit_once(self, spec_yaml: str, source: str, request_id: str = "", owner: str = "") -> tuple[str, bool]:
        """Validate a job file completely (``config.parse_job_spec``: types, ranges, lengths, names, encodings)
        before anything is stored: the client checked it too, but a controller trusts no client. ``request_id``
        is the client's key for this submit, the same on its retries: a submit whose reply was lost (a timeout)
        and is retried returns the job the first one made, with True (a duplicate), instead of a second job."""
        src = _clip(source or "<submitted job>", 200)
        if len(request_id) > MAX_REQUEST_ID_CHARS or not request_id.isprintable():
            raise InputError(src, f"request id: at most {MAX_REQUEST_ID_CHARS} printable characters")
        spec = parse_job_spec(spec_yaml, src)
        if spec.array is not None:  # N jobs cannot answer as one id: a client that sends arrays uses SubmitMany
            raise InputError(src, "array: a job array is submitted with SubmitMany (`hpcsched submit` does)")
        with self.lock:
            earlier = self.store.job_for_request(request_id) if request_id else None
            if earlier is not None:
                log.info("job %s: submit retried (request %s): not stored again", earlier, request_id)
                return earlier, True
            limit = self.cfg.max_pending_per_user
            if limit and (pending := self.pending.get(self.store, owner, 1, limit)) + 1 > limit:
                raise LimitExceeded(pending_refusal(owner, pending, limit, 1))
            job_id = self.store.add_job(spec, time.time(), request_id or None, owner)
            self.pending.add(owner, 1)
        log.info("job %s submitted (%s, %d procs)", job_id, spec.name, spec.procs)
        self.wakeup.set()
        return job_id, False

    def submit_many(self, requests: list, owner: str = "") -> list[Item]:
        """Many job files in one call (``submission``): each validated and answered on its own, the valid ones
        stored in one transaction under the lock; parsing (the costly part) is done before taking it."""
        items = parse_items(requests, self.cfg.max_submit_batch)
        stored = 0
        if any(not i.error for i in items):
            with self.lock:
                stored = store_items(self.store, items, owner, self.cfg.max_pending_per_user, time.time(),
                                     self.pending)
            if stored:
                self.wakeup.set()
        bad = sum(1 for i in items if i.error)
        log.info("%d jobs submitted in one batch of %d files%s", stored, len(items),
                 f"; {bad} of them refused" if bad else "")
        return items

    def cancel(self, job_id: str, owner: str | None = None) -> tuple[bool, str]:
        """Cancel a job; with ``owner``, only a job that user submitted (``own_jobs_only``: others' are not
        theirs to cancel, and are answered as if they did not exist)."""
        with self.lock, self.store.tx():
            job = self.store.job(job_id)
            if job is None or (owner is not None and job.owner != owner):
                return False, f"no job {_clip(job_id, 40)!r}" + (" of yours" if owner is not None else "")
            _, action = next_state(job.state, Event.CANCEL)
            if action is Action.DROP:
                self.store.update_job(job_id, state="cancelled", end_time=time.time())
            elif action is Action.STOP:  # a running job is cancelled through stopping: its tasks exit first
                self.store.update_job(job_id, state="stopping", stop_reason="cancel", stop_time=time.time())
                self._nudge_job(job_id, "stop")
            elif action is Action.RETARGET:
                self.store.update_job(job_id, stop_reason="cancel")
            else:
                return False, f"job {job_id} is already {job.state}"
            self.store.event(job_id, "cancel")
        self.wakeup.set()
        return True, "cancelling"

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
            with self.lock, self.store.tx():
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
        with self.lock, self.store.tx():
            seen = self._read()
        if seen is None:
            return scheduler.Plan()
        state, jobs, workers = self._cluster_state(*seen)
        plan = self._plan(state)
        starts = list(plan.starts)
        for k in range(0, max(1, len(starts)), _START_BATCH):  # bounded lock holds, even for 128 starts at once
            batch = starts[k:k + _START_BATCH]
            stops = plan.stops if k == 0 else {}
            resizes = plan.resizes if k == 0 else {}
            with self.lock, self.store.tx():
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
                self._apply(plan, state, workers, stops, batch)
                self._own.update(batch, stops, resizes)
        with self.lock:
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
        self._reap_dead_workers(mono)
        if self.retry_at:  # a failed job waiting for its retry's time is not planned until then (see the head below)
            waiting = {j: t for j, t in self.retry_at.items() if t > now}
            self._replan |= len(waiting) < len(self.retry_at)  # a retry's time came: plan it
            self.retry_at = waiting
        if mono - self._accrued >= _ACCRUE_S:
            self.store.accrue_service(mono - self._accrued)
            self._accrued = mono
        self._last_tick = mono
        workers = [w for w in self.store.workers() if w.id in self.last_seen and w.id not in self.leaving]
        moved, freed = self.store.drain()
        self._requeue(moved, workers)
        if self.rounds is not None:
            self.rounds.flush(self.store)  # the round the last step decided: its event and the jobs' notes
        own, self._own = self._own, set()
        if not self._needs_plan(moved - own, freed, now):
            self.quiet_steps += 1
            return None
        self.plans += 1
        self._last_plan = now
        used, groups, where = self._slot_use()
        free = sum(max(0, w.slots - used.get(w.id, 0)) for w in workers)
        head = [self.store.job(j.id) for j in self.queue.head(free, self.notes.blocked()) if j.id not in self.retry_at]
        running = [self.store.job(j) for j in self.store.active_ids("running")]
        jobs = sorted((j for j in running + head if j is not None), key=lambda j: j.seq)
        starts = {j.id: self.attempt_start[j.id] for j in running if j is not None and j.id in self.attempt_start}
        return (now, jobs, workers, used, groups, where, starts)

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
                j = self.store.job(jid)
                if j is not None and j.state == "pending":
                    self._set_note(j, note)
        entering = []
        for jid in moved:
            self.notes.leave(jid)
            j = self.store.job(jid)
            if j is None or j.state not in ("running", "stopping"):
                self.attempt_start.pop(jid, None)  # only a running attempt's start is read: not one per job ever
            if j is not None and j.state == "pending":
                cls = (j.spec.launcher, j.spec.min_procs, j.spec.gpu_types)
                entering.append((j.seq, _job_state(j), cls))
                self._set_note(j, self.notes.enter(jid, cls))
        self.queue.update(moved, entering)

    def _set_note(self, j: JobRow, note: str) -> None:
        """Say why a pending job cannot start whatever the policy does (``waiting``); written only when it changes."""
        message = with_note(j.message, note, MAX_MESSAGE_CHARS)
        if message != j.message:
            self.store.update_job(j.id, message=message)

    @staticmethod
    def _cluster_state(now: float, jobs: list[JobRow], workers: list[WorkerRow], used: dict[str, int],
                       groups: dict[str, str], where: dict[str, list[tuple[str, int]]],
                       attempt_start: dict[str, float]
                       ) -> tuple[scheduler.ClusterState, dict[str, JobRow], list[WorkerRow]]:
        state = scheduler.ClusterState(
            now=now,
            jobs=tuple(_job_state(j, groups.get(j.id), tuple(where.get(j.id, ())), attempt_start.get(j.id))
                       for j in jobs if j.state in ("pending", "running")),
            workers=tuple(scheduler.WorkerState(w.id, w.slots, w.launchers, gpu_type=w.gpu_type) for w in workers),
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
        return plan

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
               stops: dict[str, str], starts: list[str]) -> None:
        for jid, reason in stops.items():
            self.store.update_job(jid, state="stopping", stop_reason=reason, stop_time=state.now)
            self.store.event(jid, "stop", reason=reason, new_procs=plan.sizes.get(jid, 0))
            self._nudge_job(jid, "stop")
            log.info("job %s: %s (to %d procs)", jid, reason, plan.sizes.get(jid, 0))
        hosts = {w.id: w.host for w in workers}
        agents = agent_endpoints(workers, self.agent_port)
        for jid in starts:
            self._start(self.store.job(jid), plan.starts[jid], hosts, plan.groups.get(jid, jid), agents)  # its row now

    def _nudge_job(self, job_id: str, reason: str) -> None:
        """Tell the workers of a job's tasks that they have orders (a stop, a resize) without their next heartbeat."""
        if self.nudge is not None:
            self.nudge({a.worker_id for a in self.store.allocations(job_id=job_id)}, reason)

    def _slot_use(self) -> tuple[dict[str, int], dict[str, str], dict[str, list[tuple[str, int]]]]:
        """Slots held per worker (a co-located group counts once: its largest member), each job's
        co-location key and its placement (node-rank order), from the live allocations (``launch.slot_use``)."""
        used, groups, where, self._groups = slot_use(self.store.live_allocations(), self._groups)
        return used, groups, where

    def _reap_dead_workers(self, now: float) -> None:
        for wid, seen in list(self.last_seen.items()):
            if now - seen <= self.cfg.worker_timeout_s:
                continue
            del self.last_seen[wid]
            self.instance.pop(wid, None)  # the name is free for the next daemon
            self.spare_port.pop(wid, None)
            self.store.set_worker_alive(wid, False)
            self._workers_changed = True
            self.store.event(None, "worker_lost", worker=wid, silent_s=now - seen)
            log.warning("worker %s silent for %.1f s: lost", wid, now - seen)
            for a in self.store.allocations(worker_id=wid):
                job = self.store.job(a.job_id)
                if a.nprocs > 0:  # an elastic Horovod job carries on without it (its other ranks re-form): shrink it
                    self.resizer.shrink_away(job, wid, f"worker {wid} lost", time.time())
                    a = self.store.alloc(a.task_id) or a
                    job = self.store.job(a.job_id)
                if a.nprocs == 0 and job.state == "running":
                    self.resizer.release_exited(job, a, f"went with worker {wid}")
                    continue
                self.store.set_alloc_state(a.task_id, "exited", -9)
                # what was observed, not an exit code: a worker past its lease stops its tasks itself
                self._task_exited(job, a, -9, f"lost: worker {wid} silent for {now - seen:.0f} s, past its lease "
                                              f"({self.cfg.worker_timeout_s:g} s): its tasks are stopped by the worker "
                                              "itself (fenced)", lost=True)

    def _start(self, job: JobRow, placement: list[tuple[str, int]], hosts: dict[str, str], group: str,
               agents: dict[str, str] | None = None) -> None:
        master = placement[0][0]
        port = self.spare_port.pop(master, 0)
        if not port:  # no fresh free port from that node yet: start at the next heartbeat, which it sends now
            self._wanted.add(master)
            if self.nudge is not None:
                self.nudge([master], "port")
            return
        if (job.spec.launcher in AGENT_LAUNCHERS and len(placement) > 1 and agents is not None
                and any(w not in agents for w, _ in placement)):
            # a worker whose agent's port is not known yet (it comes with its registration or first heartbeat): the
            # launch would reach that host without it (mpirun's daemon, horovodrun's rank) and fail; start with the
            # next heartbeat instead
            log.info("job %s waits for the agent port of %s", job.id,
                     ", ".join(w for w, _ in placement if w not in agents))
            self.spare_port[master] = port
            self._wanted.update(w for w, _ in placement if w not in agents)
            if self.nudge is not None:
                self.nudge([w for w, _ in placement if w not in agents], "port")
            return
        gen = job.generation + 1
        size = sum(k for _, k in placement)
        ckpt = self.cfg.checkpoint_root.resolve() / job.id
        for wid, msg in launch_tasks(job.id, gen, job.spec, placement, hosts, port, ckpt, group, agents):
            if job.uid:  # the worker binds the checkpoint folder to it (a lost state's j0001 is not this one)
                msg.env[JOB_UID_ENV] = job.uid
            msg.owner = job.owner or ""  # a root worker runs the task as the local user this maps to
            self.store.add_allocation(AllocRow(msg.task_id, job.id, gen, wid, msg.node_rank, msg.nprocs, "launching",
                                               None, msg.SerializeToString()))
        self.attempt_start[job.id] = time.time()
        self.store.update_job(job.id, state="running", procs=size, generation=gen, target_procs=size,
                              start_time=job.start_time or time.time(), done=0)
        self.store.event(job.id, "start", generation=gen, procs=size, workers=[w for w, _ in placement],
                         group=group)
        if self.nudge is not None:
            self.nudge([w for w, _ in placement], "launch")
        log.info("job %s generation %d on %s", job.id, gen, placement)

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
            if self.on_step is not None:  # a decision's time is a figure the scale targets are set on
                self.on_step("scheduling_step" if self.plans > plans else "quiet_step", time.perf_counter() - t0)
            stop.wait(min(_MIN_STEP_GAP_S, self.cfg.schedule_interval_s))

    # ------------------------------------------------------------------------------------- queries
    def counters(self) -> dict[str, float]:
        """What the controller refused and how its steps went, for its summary (logged at stop, ``rpc_stats_file``)."""
        return {"refused_task_reports": self.refused_reports, "refused_heartbeats": self.refused_heartbeats,
                "planned_steps": self.plans, "quiet_steps": self.quiet_steps, "workers": len(self.last_seen),
                "heartbeat_interval_s": self.heartbeat_interval(), "pending_jobs": len(self.queue)}

    def list_jobs(self) -> list[pb.JobInfo]:
        """Every job (all pages of ``jobs_page``): for callers in this process; the RPC serves one page."""
        return every_page(lambda token: self.jobs_page(page_token=token))

    def list_workers(self) -> list[pb.WorkerInfo]:
        """Every worker (all pages of ``workers_page``)."""
        return every_page(lambda token: self.workers_page(page_token=token))

    def jobs_page(self, page_size: int = 0, page_token: str = "", owner: str | None = None,
                  filters: pb.ListJobsRequest | None = None) -> tuple[list[pb.JobInfo], str]:
        """One page of jobs (``listing.Listing.jobs_page``), read beside the lock: heartbeats never wait for it.
        ``sizing`` and the group cache are replaced whole by the scheduling thread, never changed in place.
        ``filters``: a request's states / owner / name (``listing.JobFilter``)."""
        return self.listing.jobs_page(page_size, page_token, owner, self.sizing, self._groups,
                                      JobFilter.of(filters) if filters is not None else None)

    def workers_page(self, page_size: int = 0, page_token: str = "") -> tuple[list[pb.WorkerInfo], str]:
        """One page of workers (``listing.Listing.workers_page``); the lock is held only to copy who is alive."""
        return self.listing.workers_page(page_size, page_token, self._groups, self._last_heard)

    def _last_heard(self, ids: list[str]) -> dict[str, float]:
        """The live workers among ``ids`` -> when each was last heard (wall clock, for display)."""
        with self.lock:
            now = self.mono()
            return {w: wall(now, self.last_seen[w]) for w in ids if w in self.last_seen}


def registration_problem(req: pb.RegisterRequest) -> str:
    """Why a RegisterRequest is refused ('' when it is not): an id that is not a short printable name, slots
    outside 1..MAX_SLOTS, negative GPUs or CPUs, an empty or long host, a GPU type that is not one short word."""
    if not req.worker_id or len(req.worker_id) > MAX_WORKER_ID_CHARS or not _WORKER_ID.fullmatch(req.worker_id):
        return (f"worker id: 1 to {MAX_WORKER_ID_CHARS} characters of letters, digits and _.:@- (starting with a "
                "letter or digit)")
    if not 1 <= req.slots <= MAX_SLOTS:
        return f"slots: must be 1 to {MAX_SLOTS}, got {req.slots}"
    if req.gpus < 0 or req.cpus < 0:
        return f"gpus and cpus must be >= 0, got {req.gpus} and {req.cpus}"
    if not req.host or len(req.host) > 255 or not req.host.isprintable() or " " in req.host:
        return "host: 1 to 255 printable characters, no spaces"
    if len(req.launchers) > 16 or any(len(x) > 32 or not x.isprintable() for x in req.launchers):
        return "launchers: at most 16 short names"
    if len(req.instance) > 64 or not req.instance.isprintable():
        return "instance: at most 64 printable characters"
    if req.gpu_type and not GPU_TYPE.fullmatch(req.gpu_type.lower()):
        return "gpu_type: 1 to 32 letters, digits and _.+- (e.g. v100), or empty"
    return ""


def _job_state(j: JobRow, group: str | None = None, placement: tuple[tuple[str, int], ...] = (),
               attempt_start: float | None = None) -> scheduler.JobState:
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
        curve=ScalingCurve(j.spec.curve_procs, j.spec.curve_rates) if j.spec.curve_procs else None,
        resize_s=j.spec.resize_s, in_place=j.state == "running" and in_place_capable(j.spec),
        gpu_types=j.spec.gpu_types, model=j.spec.model,
    )


def _clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """One printable line of at most ``limit`` characters: a reason comes from a worker, and from a program's
    output before that, so it may be long or hold control codes (a forged log line, ANSI escapes)."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
