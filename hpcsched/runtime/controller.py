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

Its methods are in three parts, one module each, joined here over the state ``__init__`` sets:
``controller_members`` (workers register, beat, leave, are lost), ``controller_step`` (the scheduling loop and
one step of it) and ``controller_jobs`` (submit, cancel, a job attempt's start and end).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Container, Iterable

from hpcsched.allocator import hints_of
from hpcsched.runtime import scheduler
from hpcsched.runtime.batch_tracker import BatchTracker
from hpcsched.runtime.config import ControllerConfig
from hpcsched.runtime.controller_jobs import JobLifecycle
from hpcsched.runtime.controller_members import Membership
from hpcsched.runtime.controller_step import Stepping
from hpcsched.runtime.inplace_resize import InPlaceResizer
from hpcsched.runtime.lease import LeaseTable
from hpcsched.runtime.listing import JobFilter, Listing, every_page, wall
from hpcsched.runtime.live_pool import LivePool
from hpcsched.runtime.liveness import LOCK_WAITING_BEATS, LOCK_WAITING_CALLS
from hpcsched.runtime.memstore import MemStore
from hpcsched.runtime.pacing import RegisterPacer
from hpcsched.runtime.plan_set import PendingQueue
from hpcsched.runtime.ratelimit import LogThrottle
from hpcsched.runtime.register_queue import GroupCommit
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.steplock import StepFirstLock, WaitBound
from hpcsched.runtime.submission import (
    PendingCounts,
)
from hpcsched.runtime.waiting import WaitingNotes

log = logging.getLogger("hpcsched.runtime.controller")


class Controller(Membership, Stepping, JobLifecycle):
    """All decisions and state; the gRPC layer (``server.py``) only translates messages."""

    def __init__(self, cfg: ControllerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: the monotonic clock liveness and service accrual run on (injectable for tests): a step of
        the wall clock (NTP, an operator) must neither declare healthy workers lost nor add service."""
        self.cfg = cfg
        self.checkpoint_root = cfg.checkpoint_root.resolve()  # once: a resolve per start was a step's syscalls
        self.mono = clock
        self.store = MemStore(cfg.state)  # one controller per state file; its state in memory, written through
        # reentrant; the scheduling step takes it before handlers that came earlier (``steplock``)
        self.lock = StepFirstLock()
        self.wakeup = threading.Event()
        policy = scheduler.resolve_policy(cfg.policy)  # an unknown policy fails at start-up, not at the first job
        self.queue = PendingQueue(policy)  # the pending jobs in the policy's order: a step plans over its head
        self.notes = WaitingNotes()
        self.pool = LivePool()  # the live workers as a step sees them, read again only when they change
        # A step plans only when something it decides on changed (``_needs_plan``), except for a policy whose order
        # moves with time (LAS, SRTF: service and progress change priorities), the rounds executor and an admission
        # rule (load-based), which plan at every step as before.
        self._every_step = (not hints_of(policy).order_key_static or cfg.executor == "rounds"
                            or cfg.admission != "accept-all")
        self._workers_changed = True  # the live worker set changed since the last step (register, leave, lost)
        self._workers_step_at = float("-inf")  # when a step last planned on a change of the live workers
        self._reaped_at = float("-inf")  # when silent workers were last looked for
        self._notes_due: dict[str, str] = {}  # pending job -> its waiting note, not written yet (``_write_notes``)
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
        self.notes_deferred = 0  # steps that left waiting notes for the next ones (their time bound, ``_write_notes``)
        self.last_seen: dict[str, float] = {}  # worker -> its last heartbeat, on the monotonic clock
        # renewals answered by the lease server (lease.py), set by the server when it runs one: liveness reads both
        self.leases: LeaseTable | None = None
        self.spare_port: dict[str, int] = {}
        self.agent_port: dict[str, int] = {}  # worker -> its WorkerAgent port (every heartbeat says it: no state)
        self.leaving: set[str] = set()  # workers draining after a Leave: they get no new tasks
        self.attempt_start: dict[str, float] = {}  # job -> when its current attempt was placed (hysteresis)
        # job -> wall time before which its retry is not placed (lifecycle.retry_delay; in memory: a restarted
        # controller retries at once)
        self.retry_at: dict[str, float] = {}
        self._last_tick = self.mono()
        self._stale = 0  # consecutive plans dropped by tick()'s check
        self.sizing: dict[str, str] = {}  # job -> how the MILP sized it last (shown by `hpcsched jobs`)
        self.batches = BatchTracker(self.store)  # adaptive-batch jobs: their fits, batches told, goodput curves
        self.nonoptimal_decisions = 0  # scheduling steps whose MILP sizing was not optimal
        self.shrunk_to_fit = 0  # elastic jobs started below the size they were given (no placement fitted it)
        self.grow_waits: dict[str, int] = {}  # job -> size its in-place grow waits for (stopping jobs' slots)
        self.grows_waited = 0  # in-place grows that waited for such slots instead of a stop and relaunch
        self.instance: dict[str, str] = {}  # worker -> the daemon (RegisterRequest.instance) that holds the name
        # Guards the check-and-renew of a lease-only heartbeat (``Membership.heartbeat``), which runs without
        # ``lock``, against the removal of a worker from ``last_seen``/``instance`` (reaped, left, registered anew)
        self.seen_lock = threading.Lock()
        self.lease_only_beats = 0  # heartbeats answered without the controller's lock (nothing to reconcile)
        # heartbeats with news waiting for the lock now (at most liveness.LOCK_WAITING_BEATS), and those refused
        # because that many already waited
        self.beat_waiters = threading.BoundedSemaphore(LOCK_WAITING_BEATS)
        self.shed_beats = 0
        # Register / Leave / Submit / SubmitMany calls waiting for (or holding) the lock now: the next is refused
        # RESOURCE_EXHAUSTED at once (``Shed``), so server threads stay free for lease-only heartbeats
        self.call_waiters = WaitBound(LOCK_WAITING_CALLS)
        self.register_pacer = RegisterPacer(random.Random(0))  # when a shed Register comes back (``pacing``)
        # Registers committed in groups, one lock hold and one transaction each; at most REGISTER_WAITING queued
        self.registrations = GroupCommit(self._register_group)
        # node_source slurm: the workers of pilots about to register (PilotManager.arriving); decisions wait for them
        self.arriving: Callable[[Container[str]], list[str]] | None = None
        self.held_steps = 0  # scheduling steps held for arriving pilots' workers
        self.step_errors = LogThrottle(log)
        self._holding: list[str] = []
        self.listing = Listing(self.store)  # the read-only views, on reader connections of their own
        self.pending = PendingCounts()  # per-user pending counts for max_pending_per_user (submission.py)
        self.resizer = InPlaceResizer(self.store, self.attempt_start, self._task_exited, self.batches.choose)
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

    # ------------------------------------------------------------------------------------- queries
    def counters(self) -> dict[str, float]:
        """What the controller refused and how its steps went, for its summary (logged at stop, ``rpc_stats_file``)."""
        return {"refused_task_reports": self.refused_reports, "refused_heartbeats": self.refused_heartbeats,
                "planned_steps": self.plans, "quiet_steps": self.quiet_steps, "workers": len(self.last_seen),
                "lease_only_heartbeats": self.lease_only_beats, "shed_heartbeats": self.shed_beats,
                "shed_calls": self.call_waiters.refused + self.registrations.refused,
                "register_retry_after_told": self.register_pacer.told,
                "register_groups": self.registrations.groups, "registers_grouped": self.registrations.committed,
                "register_largest_group": self.registrations.largest,
                "step_lock_wait_s": round(self.lock.first_wait_s, 3),
                "heartbeat_interval_s": self.heartbeat_interval(), "pending_jobs": len(self.queue),
                "notes_due": len(self._notes_due), "notes_deferred_steps": self.notes_deferred,
                "live_set_reads": self.pool.rebuilds, "shrunk_to_fit": self.shrunk_to_fit,
                "grows_waited": self.grows_waited}

    def list_jobs(self) -> list[pb.JobInfo]:
        """Every job (all pages of ``jobs_page``): for callers in this process; the RPC serves one page."""
        return every_page(lambda token: self.jobs_page(page_token=token))

    def list_workers(self) -> list[pb.WorkerInfo]:
        """Every worker (all pages of ``workers_page``)."""
        return every_page(lambda token: self.workers_page(page_token=token))

    def jobs_page(self, page_size: int = 0, page_token: str = "", owner: str | None = None,
                  filters: pb.ListJobsRequest | None = None) -> tuple[list[pb.JobInfo], str]:
        """One page of jobs (``listing.Listing.jobs_page``), read beside the lock: heartbeats never wait for it.
        ``sizing`` is replaced whole by the scheduling thread, never changed in place.
        ``filters``: a request's states / owner / name (``listing.JobFilter``)."""
        with self.lock:
            batches = self.batches.shown()
        return self.listing.jobs_page(page_size, page_token, owner, self.sizing,
                                      JobFilter.of(filters) if filters is not None else None, batches)

    def workers_page(self, page_size: int = 0, page_token: str = "") -> tuple[list[pb.WorkerInfo], str]:
        """One page of workers (``listing.Listing.workers_page``); the lock is held only to copy who is alive."""
        return self.listing.workers_page(page_size, page_token, self._last_heard)

    def _last_heard(self, ids: list[str]) -> dict[str, float]:
        """The live workers among ``ids`` -> when each was last heard (wall clock, for display)."""
        with self.lock:
            now = self.mono()
            return {w: wall(now, max(self.last_seen[w], self._renewed(w))) for w in ids if w in self.last_seen}


