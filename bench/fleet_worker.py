"""Simulated worker daemons for the fleet harness: the real worker's gRPC protocol, none of its process launching.

Each ``SimWorker`` behaves on the wire as ``hpcsched.runtime.worker.Worker`` does: it registers with a random
``instance``, heartbeats at the interval the controller gives it (``RegisterReply.heartbeat_interval_s``, and
``HeartbeatReply`` field 5 when the controller sends one), and at once when a task has news (its first report, its
exit), with a follow-up ``FOLLOW_UP_S`` after a beat that carried news; it honours ``reregister``, treats every
failed call as the real worker does (register again, except after a Heartbeat a busy controller did not answer in
time: ``liveness.keeps_registration``; a refused name waits ``REFUSED_RETRY_S``), forgets what it is
told to forget, and on shutdown drains (Leave final=false, its tasks stop with a checkpoint and are reported) and
says goodbye (Leave final=true). The tasks it is sent are simulated: a ``startup_s`` start, then one step per
``iteration_s`` up to the job's ``HPCSCHED_STEPS``; the first report has ``first``, the last ``done`` and the task
exits 0; a checkpointing KillTask makes it write its step to ``<checkpoint_dir>/fleet-sim.step`` (read back as
``resumed_from`` by the next attempt, as a training program restores its checkpoint) and exit 0; a plain one exits
-9. Only node rank 0 reports progress, as the ``direct`` launcher's rank 0 does.

Orders pushed: where the controller's registration reply names a lease server and the protocol has
``RenewRequest.push``, a worker opens its lease connection right after registering, subscribes it, and hears of its
orders there (a pushed ``RenewReply``), opening no ``Orders.Watch`` stream, as the real worker does (``lease_link``);
``--no-lease`` workers watch as before, ``--no-watch`` ones neither watch nor subscribe (older workers).

Many workers share one asyncio loop (``grpc.aio``), and a few such loops run in separate processes
(``worker_process``) so that the harness's own CPU is visible per process and spread over the cores. Everything
measured is kept in ``ProcStats`` and sent back to the orchestrator (``fleet.py``) at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import resource
import time
import uuid
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from hpcsched.runtime.auth import CHANNEL_OPTIONS, metadata
from hpcsched.runtime.credentials import credential_metadata
from hpcsched.runtime.rpc import pb, pb_grpc

try:  # the lease server's frames (a checkout from before lease servers: its controller offers none)
    from hpcsched.runtime.lease_wire import LeaseError, frame, frame_length
except ImportError:
    LeaseError = frame = frame_length = None

FOLLOW_UP_S = 0.1  # as the real worker: a beat that carried news is followed up to fetch the controller's reaction
REFUSED_RETRY_S = 3.0  # as the real worker: a daemon refused its name asks again this often
RPC_TIMEOUT_S = 10.0  # the real worker's deadline on Register and Heartbeat
LEAVE_TIMEOUT_S = 5.0
LEAVE_BUDGET_S = 90.0  # all of one process's workers leaving, at most
CLOSE_BUDGET_S = 20.0  # closing one process's channels after the figures are sent, at most
CKPT_FILE = "fleet-sim.step"
# The controller's per-beat interval, when its HeartbeatReply carries one (field 5; absent from older controllers).
_HB_INTERVAL = pb.HeartbeatReply.DESCRIPTOR.fields_by_number.get(5)
# Partial heartbeats (only the tasks with news; every FULL_EVERY-th beat, and one the controller asks for, full), as
# the real worker sends them where the protocol has them; a controller from before gets full reports every beat.
_PARTIAL = "partial" in pb.HeartbeatRequest.DESCRIPTOR.fields_by_name
_FULL_REPORT = "full_report" in pb.HeartbeatReply.DESCRIPTOR.fields_by_name
# Orders pushed (RegisterReply.watch_port, the Orders service): a worker watches and heartbeats at once on an event,
# as the real worker does (worker_watch.py); without it (an older controller, or --no-watch) it waits for its beat.
_WATCH = "watch_port" in pb.RegisterReply.DESCRIPTOR.fields_by_name
# Lease renewals (RegisterReply.lease_port, lease_wire frames): a worker with no task renews at the controller's lease
# server instead of heartbeating the controller, as the real worker does (worker_link.py); a failed renewal goes to the
# controller and the lease server is tried again LEASE_RETRY_S later.
_LEASE = "lease_port" in pb.RegisterReply.DESCRIPTOR.fields_by_name and frame is not None
RENEW_TIMEOUT_S = 5.0  # as the real worker
LEASE_RETRY_S = 60.0
WATCH_BACKOFF_S = (1.0, 10.0)  # as the real worker's stream (and lease connection): a broken one is opened again
# Orders pushed on the lease connection (RenewRequest.push): a worker subscribes there and opens no Watch stream
_PUSH = _LEASE and "push" in pb.RenewRequest.DESCRIPTOR.fields_by_name
try:
    from hpcsched.runtime.liveness import FULL_EVERY
except ImportError:  # a controller from before partial reports: every beat is full
    FULL_EVERY = 1
try:  # as the real worker: jittered, and longer while the controller is busy
    from hpcsched.runtime.liveness import retry_after
except ImportError:  # a checkout from before: doubling up to two intervals
    def retry_after(backoff: float, code: str, interval: float, rng: random.Random) -> tuple[float, float]:
        return backoff, min(backoff * 2, interval * 2)
try:  # as the real worker: a shed call comes back when the controller says (a checkout from before: its back-off)
    from hpcsched.runtime.liveness import told_retry_after
except ImportError:
    told_retry_after = None
try:  # as the real worker: a heartbeat the controller shed renewed the lease all the same
    from hpcsched.runtime.liveness import shed_renewed
except ImportError:  # a checkout from before: it did not say so
    def shed_renewed(method: str, code: str, details: str | None) -> bool:
        return False
try:  # as the real worker: a heartbeat that timed out on a busy controller does not register again
    from hpcsched.runtime.liveness import keeps_registration
except ImportError:  # a checkout from before: every failed call registers again
    def keeps_registration(method: str, code: str) -> bool:
        return False


@dataclass(slots=True)
class SimOptions:
    """How the simulated workers and their tasks behave (the same in every harness process)."""

    address: str
    token: str
    base_dir: str  # the controller's working directory: relative checkpoint dirs are relative to it
    slots: int = 4
    iteration_s: float = 0.1
    startup_s: float = 0.5
    gpu_type: str = "cpu"
    ramp_s: float = 0.0  # workers start spread over this long (0: all at once, a registration storm)
    connect_ms: int = 0  # > 0: grpc.min_reconnect_backoff_ms instead of the real worker's (``channel_options``)
    typed_workers: int = 0  # workers w00000.. below this advertise ``typed_gpu`` instead of ``gpu_type``
    typed_gpu: str = ""
    watch_share: int = 50  # workers whose Watch streams share one channel (0: a connection each, as real workers)
    watch: bool = True  # open Orders.Watch where the controller offers it (False: an older worker, heartbeats only)
    lease: bool = True  # renew at the lease server where the controller offers one (False: heartbeats only)


@dataclass(slots=True)
class SimTask:
    launch: pb.LaunchTask
    steps: int
    resumed: int  # checkpoint step restored (-1: fresh)
    train_at: float  # monotonic time of its first report
    reported_first: bool = False
    exit_code: int | None = None
    pending: list = field(default_factory=list)
    last_step: int = -1

    def step_at(self, now: float, iteration_s: float) -> int:
        done = int(max(0.0, now - self.train_at) / iteration_s)
        return min(self.steps, max(self.resumed, 0) + done)

    def end_at(self, iteration_s: float) -> float:
        return self.train_at + (self.steps - max(self.resumed, 0)) * iteration_s


@dataclass(slots=True)
class ProcStats:
    """What one harness process measured; times are seconds, ``*_at`` unix seconds."""

    hb_lat: array = field(default_factory=lambda: array("d"))
    hb_at: array = field(default_factory=lambda: array("d"))
    hb_renewal: array = field(default_factory=lambda: array("b"))  # 1: that beat was a renewal at the lease server
    lease_fallbacks: int = 0  # renewals that failed and went to the controller instead
    lease_connect: array = field(default_factory=lambda: array("d"))  # opening a connection to the lease server
    lease_subscriptions: int = 0  # lease connections subscribed to pushes (one per worker, again after a break)
    lease_pushes: int = 0  # pushed frames received on them (each: heartbeat now)
    reg_lat: array = field(default_factory=lambda: array("d"))
    first_registered_at: dict = field(default_factory=dict)  # worker -> unix time of its first registration
    registrations: int = 0
    reregister_replies: int = 0  # heartbeat replies saying reregister
    errors: dict = field(default_factory=dict)  # "Method CODE" -> count
    launch_seen_at: dict = field(default_factory=dict)  # job id -> first reply carrying one of its LaunchTasks
    launches: int = 0
    tasks_done: int = 0  # exited 0 at their last step
    job_done_at: dict = field(default_factory=dict)  # job id -> when its node-0 task reached its last step
    tasks_checkpointed: int = 0  # stopped by a checkpointing KillTask
    tasks_killed: int = 0  # stopped by a plain KillTask
    lease_lapses: int = 0  # a worker went longer than its lease (worker_timeout_s) without an answered heartbeat
    intervals_seen: dict = field(default_factory=dict)  # heartbeat interval -> workers that last used it
    leave_s: float = 0.0
    leaves_said: int = 0
    loop_lag: array = field(default_factory=lambda: array("d"))
    watch_opened: int = 0  # Watch streams opened (one per worker, again after a re-registration or a break)
    watch_events: int = 0  # events received on them (each: heartbeat now)
    retry_after_told: int = 0  # failed calls whose controller said when to come back (a shed Register)

    error_examples: dict = field(default_factory=dict)  # "Method CODE" -> the first such error's details

    def error(self, method: str, e: grpc.RpcError) -> None:
        key = f"{method} {e.code().name}"
        self.errors[key] = self.errors.get(key, 0) + 1
        if key not in self.error_examples:  # the core's own account too: 'CANCELLED' alone says not who cancelled
            debug = getattr(e, "debug_error_string", None)
            self.error_examples[key] = ((e.details() or "") + (f" [{debug()}]" if debug else ""))[:600]


class SimWorker:
    def __init__(self, name: str, index: int, stub: pb_grpc.ControllerStub, opts: SimOptions, stats: ProcStats,
                 md: tuple) -> None:
        self.name, self.index, self.stub, self.opts, self.stats, self.md = name, index, stub, opts, stats, md
        self.join_md = md  # the worker token: Register only; Heartbeat and Leave carry the credential it returns
        self.instance = uuid.uuid4().hex
        self.tasks: dict[str, SimTask] = {}
        self.interval = 1.0
        self.lease = 0.0
        self.registered = False
        self.jitter = random.Random(self.instance)  # as the real worker: a storm's first beats spread over an interval
        self.told: set[str] = set()  # tasks the controller has heard running: a partial heartbeat leaves them out
        self.beats = 0  # heartbeats since the last full one
        self.watch_port = 0  # the controller's Orders service (RegisterReply.watch_port); 0: none
        self.registrations = 0  # bumped at each registration: a watch stream opened before it is opened again
        self.nudge = asyncio.Event()  # set by a watch event: heartbeat now
        self.reg_changed = asyncio.Event()
        self.watch_call = None
        self.watch_channels: WatchChannels | None = None  # set by run_workers
        self.lease_port, self.lease_slot, self.lease_retry_at, self.credential = 0, 0, 0.0, ""
        self.beat_owed = False
        self.lease_proto: _LeaseProto | None = None  # the connection to the lease server
        self.lease_lock = asyncio.Lock()  # one connect at a time (the link's and a renewal's)
        self.lease_changed = asyncio.Event()  # a registration: the lease link connects again
        self.push_sub = False  # this registration's lease connection is subscribed to pushes (no Watch stream)
        self.reg_watch_port = 0  # the registration's Orders service (watched when the lease server does not push)
        self.position = 0  # among this process's workers (which Watch channel it shares)

    # ------------------------------------------------------------------ the real worker's loop, on asyncio
    async def run(self, delay: float) -> None:
        """Until cancelled (the orchestrator's stop): what ``Worker.run`` does, one coroutine per worker."""
        if delay > 0:
            await asyncio.sleep(delay)
        backoff = 0.2
        due = 0.0
        reached = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                news = self._news(now)
                if not news and now < due and not self.nudge.is_set():
                    with contextlib.suppress(asyncio.TimeoutError):  # woken early by a watch event
                        await asyncio.wait_for(self.nudge.wait(), max(0.0, min(due, self._next_news()) - now))
                    continue
                self.beat_owed |= self.nudge.is_set()  # as the real worker: pushed orders, beat the controller
                self.nudge.clear()  # this heartbeat's reply carries the orders it was woken for
                method = "Register"
                try:
                    if not self.registered:
                        await self._register()
                        reached = time.monotonic()  # the lease runs from the registration, as the real worker's
                        self.beats = 0  # the first heartbeat after registering is full
                        if self.interval > 1.0:  # a big fleet registering at once: first beats over one interval
                            due = time.monotonic() + self.jitter.uniform(0, self.interval)
                            continue
                    method = "Heartbeat"
                    req = self._heartbeat(time.monotonic(), partial=_PARTIAL and self.beats % FULL_EVERY != 0)
                    reply = None
                    if self.lease_port and req.partial and not self.tasks and not self.beat_owed \
                            and time.monotonic() >= self.lease_retry_at:
                        reply = await self._renew()
                    if reply is None:
                        sent = time.perf_counter()
                        self.beat_owed = True  # as the real worker: a failed beat is retried at the controller
                        reply = await self.stub.Heartbeat(req, timeout=RPC_TIMEOUT_S, metadata=self.md)
                        self.beat_owed = False
                        self.stats.hb_lat.append(time.perf_counter() - sent)
                        self.stats.hb_at.append(time.time())
                        self.stats.hb_renewal.append(0)
                    for t in self.tasks.values():
                        t.pending.clear()  # delivered
                    self.told = {t.task_id for t in req.tasks if t.running} | (self.told & set(self.tasks))
                    self.beats = 0 if _FULL_REPORT and reply.full_report else self.beats + 1
                    if reply.reregister:
                        self.stats.reregister_replies += 1
                        self.registered = False
                    if self.lease and time.monotonic() - reached > self.lease:
                        self.stats.lease_lapses += 1
                    reached = time.monotonic()
                    if _HB_INTERVAL is not None:
                        told = getattr(reply, _HB_INTERVAL.name)
                        if told > 0:
                            self.interval = told
                    self._apply(reply)
                    backoff = 0.2
                    due = time.monotonic() + (FOLLOW_UP_S if news else self.interval)
                except grpc.RpcError as e:
                    self.registered = self.registered and keeps_registration(method, e.code().name)
                    self.stats.error(method, e)
                    due = 0.0  # as the real worker: tried again after the back-off, not at the next interval
                    if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                        await asyncio.sleep(REFUSED_RETRY_S)
                        continue
                    wait, backoff = retry_after(backoff, e.code().name, self.interval, self.jitter)
                    told = told_retry_after(e.trailing_metadata() if isinstance(e, grpc.aio.AioRpcError)
                                            else None) if told_retry_after is not None else None
                    if told is not None:  # as the real worker: a shed Register comes back when the controller said
                        wait = told
                        self.stats.retry_after_told += 1
                    if shed_renewed(method, e.code().name, e.details()):  # as the real worker: the lease was renewed
                        reached = time.monotonic()
                    if self.lease:  # as the real worker: at least three tries within the lease
                        wait = min(wait, self.lease / 3)
                    await asyncio.sleep(wait)
        finally:
            self.stats.intervals_seen[self.interval] = self.stats.intervals_seen.get(self.interval, 0) + 1

    async def _register(self) -> None:
        req = pb.RegisterRequest(worker_id=self.name, host="127.0.0.1", slots=self.opts.slots, gpus=0,
                                 cpus=self.opts.slots, launchers=["direct"], instance=self.instance,
                                 gpu_type=self.opts.typed_gpu if self.index < self.opts.typed_workers
                                 else self.opts.gpu_type, agent_port=0)
        sent = time.perf_counter()
        reply = await self.stub.Register(req, timeout=RPC_TIMEOUT_S, metadata=self.join_md)
        self.md = tuple(self.join_md) + credential_metadata(reply.credential)  # as worker.py: this worker's own
        self.stats.reg_lat.append(time.perf_counter() - sent)
        self.stats.registrations += 1
        self.stats.first_registered_at.setdefault(self.name, time.time())
        self.interval = reply.heartbeat_interval_s or 1.0
        self.lease = reply.worker_timeout_s
        self.registered = True
        self.lease_port = reply.lease_port if _LEASE and self.opts.lease else 0
        self.push_sub = bool(self.lease_port and _PUSH and self.opts.watch and reply.credential)
        self.reg_watch_port = reply.watch_port if _WATCH and self.opts.watch else 0
        self.watch_port = 0 if self.push_sub else self.reg_watch_port
        self.lease_slot, self.lease_retry_at = (reply.lease_slot if self.lease_port else 0), 0.0
        self.credential = reply.credential
        self.close_lease()  # a new registration: a new lease server, perhaps
        self.registrations += 1
        self.reg_changed.set()
        self.lease_changed.set()
        if self.watch_call is not None:
            self.watch_call.cancel()  # opened again with the new credential

    async def _renew(self) -> pb.HeartbeatReply | None:
        """A renewal at the lease server, as the real worker's ``_renew`` (one frame each way on a connection of its
        own, ``lease_wire``): the reply as a heartbeat's, or None when the beat must go to the controller (it has
        orders: ``heartbeat_now``, or the renewal failed)."""
        req = self._renewal()
        try:
            proto = await self._lease_connect()  # timed apart: a heartbeat's latency has no connection set-up either
            sent = time.perf_counter()
            r = await proto.call(req, RENEW_TIMEOUT_S)
            if r.refused:
                raise LeaseError("REFUSED", r.refused)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, LeaseError) as e:
            code = e.code if isinstance(e, LeaseError) else "DEADLINE_EXCEEDED" \
                if isinstance(e, asyncio.TimeoutError) else "UNAVAILABLE"
            key = f"Renew {code}"
            self.stats.errors[key] = self.stats.errors.get(key, 0) + 1
            self.stats.error_examples.setdefault(key, str(e)[:600])
            self.stats.lease_fallbacks += 1
            self.lease_retry_at = time.monotonic() + LEASE_RETRY_S
            self.close_lease()
            return None
        self.stats.hb_lat.append(time.perf_counter() - sent)
        self.stats.hb_at.append(time.time())
        self.stats.hb_renewal.append(1)
        return None if r.heartbeat_now else pb.HeartbeatReply(heartbeat_interval_s=r.heartbeat_interval_s)

    def _renewal(self) -> pb.RenewRequest:
        req = pb.RenewRequest(worker_id=self.name, instance=self.instance, slot=self.lease_slot,
                              credential=self.credential)
        if self.push_sub:
            req.push = True  # every renewal keeps the subscription, as the real worker's
        return req

    async def _lease_connect(self) -> _LeaseProto:
        """The open lease connection, or a new one (subscribed to pushes when this registration does: a push may
        already be due, said by the answer's ``heartbeat_now``)."""
        async with self.lease_lock:
            if self.lease_proto is not None and not self.lease_proto.closed.done():
                return self.lease_proto
            sent = time.perf_counter()
            _, proto = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                lambda: _LeaseProto(self), self.opts.address.rpartition(":")[0], self.lease_port), RENEW_TIMEOUT_S)
            self.stats.lease_connect.append(time.perf_counter() - sent)
            self.lease_proto = proto
            if self.push_sub:
                try:
                    r = await proto.call(self._renewal(), RENEW_TIMEOUT_S)
                except BaseException:
                    proto.close()
                    raise
                if r.refused:
                    proto.close()
                    raise LeaseError("REFUSED", r.refused)
                if not r.subscribed:  # a lease server from before pushes: renewals only, watch as the real worker
                    self.push_sub, self.watch_port = False, self.reg_watch_port
                    self.reg_changed.set()
                    return proto
                self.stats.lease_subscriptions += 1
                if r.heartbeat_now:
                    self.nudge.set()
            return proto

    async def lease_link(self) -> None:
        """Until cancelled: with a registration whose orders are pushed, keep its lease connection open and
        subscribed (the real worker's ``lease_link``); a broken one is opened again after a back-off."""
        backoff = WATCH_BACKOFF_S[0]
        while True:
            if not (self.registered and self.push_sub):
                self.lease_changed.clear()
                await self.lease_changed.wait()
                continue
            seen = self.registrations
            try:
                proto = await self._lease_connect()
                backoff = WATCH_BACKOFF_S[0]
                await proto.closed
            except (TimeoutError, OSError, LeaseError) as e:
                code = e.code if isinstance(e, LeaseError) else "DEADLINE_EXCEEDED" \
                    if isinstance(e, asyncio.TimeoutError) else "UNAVAILABLE"
                key = f"Subscribe {code}"
                self.stats.errors[key] = self.stats.errors.get(key, 0) + 1
                self.stats.error_examples.setdefault(key, str(e)[:600])
            if seen == self.registrations:  # broken, not replaced by a new registration
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, WATCH_BACKOFF_S[1])

    def close_lease(self) -> None:
        if self.lease_proto is not None:
            self.lease_proto.close()
            self.lease_proto = None

    async def watch(self) -> None:
        """Until cancelled: keep one Orders.Watch stream open once registered, and wake the heartbeat loop on each
        event (the real worker's ``worker_watch``); a broken stream is opened again after a back-off."""
        backoff = WATCH_BACKOFF_S[0]
        while True:
            if not (self.registered and self.watch_port):
                self.reg_changed.clear()
                await self.reg_changed.wait()
                continue
            assert self.watch_channels is not None
            channel = self.watch_channels.get(self.position, self.watch_port)
            seen = self.registrations
            try:
                self.watch_call = pb_grpc.OrdersStub(channel).Watch(
                    pb.WatchRequest(worker_id=self.name, instance=self.instance), metadata=self.md)
                self.stats.watch_opened += 1
                async for _ in self.watch_call:
                    self.stats.watch_events += 1
                    self.nudge.set()
                    backoff = WATCH_BACKOFF_S[0]
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.CANCELLED or seen == self.registrations:
                    self.stats.error("Watch", e)
            except asyncio.CancelledError:
                # grpc.aio raises CancelledError, not an RpcError, when the call itself was cancelled here (by
                # ``_register``, to reopen it with the new credential): only the task's own cancel ends the loop.
                # Ending it on the call's cancel left every re-registered worker unwatched: its orders waited for
                # its next beat (up to the 20 s interval at 10,000 workers: the quiet run's submit -> launch tail)
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    if self.watch_call is not None:
                        self.watch_call.cancel()
                    raise
            finally:
                self.watch_call = None
            if seen == self.registrations:  # broken, not replaced by a new registration
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, WATCH_BACKOFF_S[1])

    def _heartbeat(self, now: float, partial: bool = False) -> pb.HeartbeatRequest:
        """Every task, or (``partial``) only those with news: not yet heard running, exited, or with progress."""
        req = pb.HeartbeatRequest(worker_id=self.name, instance=self.instance, spare_port=20000 + self.index % 40000)
        if partial:
            req.partial = True
        it = self.opts.iteration_s
        for tid, t in self.tasks.items():
            if t.exit_code is None:
                self._progress(t, now, it)
            if partial and tid in self.told and t.exit_code is None and not t.pending:
                continue
            req.tasks.append(pb.TaskStatus(task_id=tid, job_id=t.launch.job_id, generation=t.launch.generation,
                                           running=t.exit_code is None, exit_code=t.exit_code or 0,
                                           progress=t.pending,
                                           reason="killed by SIGKILL" if t.exit_code == -9 else ""))
        return req

    def _progress(self, t: SimTask, now: float, it: float) -> None:
        """New reports of a running task up to ``now``; at its last step it reports done and exits 0."""
        if now < t.train_at:
            return
        rank0 = t.launch.node_rank == 0
        if not t.reported_first:
            t.reported_first = True
            t.last_step = max(t.resumed, 0)
            if rank0:
                t.pending.append(pb.Progress(step=t.last_step, world_size=t.launch.world_size, time=time.time(),
                                             resumed_from=t.resumed, first=True))
        step = t.step_at(now, it)
        if step > t.last_step:
            t.last_step = step
            done = step >= t.steps
            if rank0:
                t.pending.append(pb.Progress(step=step, loss=1.0 / (1 + step), samples_per_s=64 / it,
                                             data_s=it * 0.2, compute_s=it * 0.6, comm_s=it * 0.2,
                                             world_size=t.launch.world_size, time=time.time(), done=done))
            if done:
                t.exit_code = 0
                self.stats.tasks_done += 1
                if rank0:
                    self.stats.job_done_at.setdefault(t.launch.job_id, time.time())

    def _news(self, now: float) -> bool:
        """A task has news the controller should hear now (a first report or an exit), as the real worker's poll."""
        it = self.opts.iteration_s
        return any(t.exit_code is None and ((not t.reported_first and now >= t.train_at) or now >= t.end_at(it))
                   for t in self.tasks.values())

    def _next_news(self) -> float:
        it = self.opts.iteration_s
        times = [t.train_at if not t.reported_first else t.end_at(it)
                 for t in self.tasks.values() if t.exit_code is None]
        return min(times, default=float("inf"))

    def _apply(self, reply: pb.HeartbeatReply) -> None:
        for tid in reply.forget:
            self.tasks.pop(tid, None)
        for k in reply.kill:
            self._kill(k.task_id, k.checkpoint)
        now = time.monotonic()
        for launch in reply.launch:
            if launch.job_id not in self.stats.launch_seen_at:
                self.stats.launch_seen_at[launch.job_id] = time.time()
            if launch.task_id in self.tasks:
                continue  # resent until reported: the real worker ignores it too (no in-place resize here)
            try:
                steps = int(launch.env.get("HPCSCHED_STEPS", "1"))
            except ValueError:
                steps = 1
            self.tasks[launch.task_id] = SimTask(launch, steps, self._restore(launch), now + self.opts.startup_s)
            self.stats.launches += 1

    def _ckpt(self, launch: pb.LaunchTask) -> Path:
        d = Path(launch.checkpoint_dir)
        return (d if d.is_absolute() else Path(self.opts.base_dir) / d) / CKPT_FILE

    def _restore(self, launch: pb.LaunchTask) -> int:
        try:
            return int(self._ckpt(launch).read_text())
        except (OSError, ValueError):
            return -1

    def _kill(self, task_id: str, checkpoint: bool) -> None:
        t = self.tasks.get(task_id)
        if t is None or t.exit_code is not None:
            return
        if checkpoint:
            step = t.step_at(time.monotonic(), self.opts.iteration_s) if t.reported_first else max(t.resumed, 0)
            path = ""
            if t.launch.node_rank == 0 and step > 0:
                f = self._ckpt(t.launch)
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text(f"{step}\n")
                path = str(f)
                t.pending.append(pb.Progress(step=step, world_size=t.launch.world_size, time=time.time(),
                                             checkpoint=path))
            t.exit_code = 0
            self.stats.tasks_checkpointed += 1
        else:
            t.exit_code = -9
            self.stats.tasks_killed += 1

    # ------------------------------------------------------------------------------------------ shutdown
    async def leave(self) -> None:
        """The real worker's graceful stop: draining notice, tasks stopped with a checkpoint and reported, goodbye.
        Said by every worker that ever registered (its last heartbeat may have failed: the controller still holds
        it); a call that fails is counted and the next step is still tried, as the real worker does."""
        if self.name not in self.stats.first_registered_at:
            return
        await self._say_leave(final=False)
        for tid in list(self.tasks):
            self._kill(tid, checkpoint=True)
        if self.tasks:
            try:
                reply = await self.stub.Heartbeat(self._heartbeat(time.monotonic()), timeout=LEAVE_TIMEOUT_S,
                                                  metadata=self.md)
                for tid in reply.forget:
                    self.tasks.pop(tid, None)
            except grpc.RpcError as e:
                self.stats.error("Heartbeat (leaving)", e)
        if await self._say_leave(final=True):
            self.stats.leaves_said += 1

    async def _say_leave(self, final: bool, again: bool = True, shed_tries: int = 5) -> bool:
        """One Leave; refused as UNAUTHENTICATED (the controller dropped this worker, and its credential with it, while
        it was unreachable), it registers again and repeats once, as the real worker's ``_say_leave``; shed
        (RESOURCE_EXHAUSTED: enough calls waited for the controller's lock), it is sent again after a jittered pause,
        ``shed_tries`` times at most, as the real worker's."""
        try:
            await self.stub.Leave(pb.LeaveRequest(worker_id=self.name, final=final, instance=self.instance),
                                  timeout=LEAVE_TIMEOUT_S, metadata=self.md)
            return True
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and shed_tries > 0:  # the controller counts it
                await asyncio.sleep(self.jitter.uniform(0.05, 0.5))
                return await self._say_leave(final, again, shed_tries - 1)
            if e.code() != grpc.StatusCode.UNAUTHENTICATED or not again:
                self.stats.error("Leave", e)
                return False
        try:
            await self._register()
        except grpc.RpcError as e:
            self.stats.error("Register (leaving)", e)
            return False
        return await self._say_leave(final, again=False)


class _LeaseProto(asyncio.Protocol):
    """One worker's lease connection: answers go to the renewal waiting for one, pushed frames wake the worker."""

    def __init__(self, worker: SimWorker) -> None:
        self.worker = worker
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future | None = None
        self.closed: asyncio.Future = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 4:
            try:
                n = frame_length(bytes(self.buf[:4]))
                if len(self.buf) < 4 + n:
                    return
                reply = pb.RenewReply.FromString(bytes(self.buf[4:4 + n]))
            except Exception as e:  # not the protocol: as a broken connection
                self._fail(LeaseError("PROTOCOL", str(e)))
                return
            del self.buf[:4 + n]
            if reply.pushed:
                self.worker.stats.lease_pushes += 1
                self.worker.nudge.set()
            elif self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionResetError("the lease server closed the connection"))
        if not self.closed.done():
            self.closed.set_result(None)

    def _fail(self, e: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(e)
        self.close()

    async def call(self, req: pb.RenewRequest, timeout: float) -> pb.RenewReply:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the lease connection is closed")
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(frame(req))
        try:
            return await asyncio.wait_for(self.waiter, timeout)
        except TimeoutError:
            self.close()  # as the real worker: an unanswered renewal drops the connection
            raise

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def _loop_lag(lags: array, period: float = 0.05) -> None:
    """How late this process's event loop wakes a timer: the harness's own share of every latency it measures."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(period)
        lags.append(time.perf_counter() - t - period)


def raise_nofile(want: int) -> int:
    """Raise this process's open-file limit towards ``want`` (one descriptor per connection); the limit got."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, max(soft, want)) if hard != resource.RLIM_INFINITY else max(soft, want)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class WatchChannels:
    """The Orders.Watch channels of one harness process: one per ``share`` workers (by index), so that an idle
    stream per worker does not cost a second connection each (10,000 workers: 20,000 descriptors in the
    controller, past this machine's hard limit of 20,000); ``share`` 0: one per worker, as real workers have."""

    def __init__(self, opts: SimOptions, first_k: int) -> None:
        self.host, self.share, self.connect_ms, self.first_k = opts.address.rpartition(":")[0], opts.watch_share, \
            opts.connect_ms, first_k
        self._chans: dict[tuple[int, int], grpc.aio.Channel] = {}

    def get(self, position: int, port: int) -> grpc.aio.Channel:
        """The channel of the worker at ``position`` in this process, to the Orders service at ``port``."""
        k = (position // self.share if self.share > 0 else position, port)
        c = self._chans.get(k)
        if c is None:
            c = self._chans[k] = grpc.aio.insecure_channel(
                f"{self.host}:{port}", options=channel_options(self.first_k + len(self._chans), self.connect_ms))
        return c

    async def close(self) -> None:
        for c in self._chans.values():
            await c.close()


def channel_options(k: int, connect_ms: int = 0) -> tuple:
    """Each channel its own TCP connection, as separate daemons have: gRPC otherwise shares one subchannel between
    channels with the same arguments (the ``fleet_channel`` argument only makes them differ). The real worker's
    options (``auth.CHANNEL_OPTIONS``), unless ``connect_ms`` > 0 sets ``grpc.min_reconnect_backoff_ms``, which gRPC
    also takes as its minimum connect timeout (an experiment: at 200 ms a registration storm's connections failed)."""
    base = tuple(o for o in CHANNEL_OPTIONS if not (connect_ms > 0 and o[0] == "grpc.min_reconnect_backoff_ms"))
    extra = (("grpc.min_reconnect_backoff_ms", connect_ms),) if connect_ms > 0 else ()
    return (*base, *extra, ("grpc.use_local_subchannel_pool", 1), ("fleet_channel", k))


async def run_workers(opts: SimOptions, ids: list[int], n_total: int, channels: int, stop_at: asyncio.Future,
                      stats: ProcStats, progress=None, left=None) -> None:
    """Run the workers ``ids`` (names ``w00000``...) on this loop until ``stop_at`` resolves, then make them leave.
    ``channels``: gRPC channels for them (0: one per worker). ``left()``: called once the goodbyes are said, before
    the channels close: the figures are complete then, and closing thousands of channels is not waited for."""
    md = metadata(opts.token)
    n_ch = len(ids) if channels <= 0 else max(1, min(channels, len(ids)))
    chans = [grpc.aio.insecure_channel(opts.address, options=channel_options(k, opts.connect_ms)) for k in range(n_ch)]
    stubs = [pb_grpc.ControllerStub(c) for c in chans]
    workers = [SimWorker(f"w{i:05d}", i, stubs[k % n_ch], opts, stats, md) for k, i in enumerate(ids)]
    spread = opts.ramp_s / max(1, n_total)
    runs = [asyncio.create_task(w.run(w.index * spread)) for w in workers]
    watch_channels = WatchChannels(opts, len(chans))
    for k, w in enumerate(workers):
        w.watch_channels, w.position = watch_channels, k
    runs += [asyncio.create_task(w.watch()) for w in workers]
    runs += [asyncio.create_task(w.lease_link()) for w in workers]
    runs.append(asyncio.create_task(_loop_lag(stats.loop_lag)))
    if progress is not None:
        runs.append(asyncio.create_task(progress()))
    await stop_at
    pending = set(runs)
    while pending:  # Python 3.11's wait_for can swallow a cancel that lands as its inner wait ends (fixed in 3.12):
        for r in pending:  # such a worker loops on; it is cancelled again until every task has ended
            r.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)
    t = time.perf_counter()
    sem = asyncio.Semaphore(256)  # a bounded number of leaves in flight: the others queue here, not in gRPC

    async def one(w: SimWorker) -> None:
        async with sem:
            await w.leave()

    with contextlib.suppress(asyncio.TimeoutError):  # the count of goodbyes said shows the ones cut off
        await asyncio.wait_for(asyncio.gather(*(one(w) for w in workers), return_exceptions=True), LEAVE_BUDGET_S)
    stats.leave_s = time.perf_counter() - t
    if left is not None:
        left()
    for w in workers:
        w.close_lease()

    async def close_all() -> None:
        for c in chans:
            await c.close()
        await watch_channels.close()

    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(close_all(), CLOSE_BUDGET_S)


def worker_process(opts: SimOptions, ids: list[int], n_total: int, channels: int, out, go, stop) -> None:
    """One harness process (``multiprocessing`` spawn target): wait for ``go``, run until ``stop``, send a progress
    line every second and the ``ProcStats`` (as a dict) at the end."""
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1` a harness process: its stacks on stderr
    per_worker = 1 + (opts.watch and opts.watch_share <= 0) + opts.lease
    raise_nofile(len(ids) * per_worker + 1024)
    out.put(("ready", os.getpid(), None))
    go.wait()
    stats = ProcStats()
    cpu0 = time.process_time()

    async def progress() -> None:
        while True:
            out.put(("progress", os.getpid(), {
                "registered": len(stats.first_registered_at), "heartbeats": len(stats.hb_lat),
                "launched_jobs": len(stats.launch_seen_at), "tasks_done": stats.tasks_done,
                "jobs_done": len(stats.job_done_at),
                "errors": sum(stats.errors.values()), "reregister": stats.reregister_replies,
                "watch_events": stats.watch_events,
                "cpu_s": time.process_time() - cpu0}))
            await asyncio.sleep(1.0)

    def left() -> None:
        d = {f: getattr(stats, f) for f in ProcStats.__dataclass_fields__}
        d["cpu_s"] = time.process_time() - cpu0
        out.put(("stats", os.getpid(), d))

    async def main() -> None:
        stop_at = asyncio.get_running_loop().run_in_executor(None, stop.wait)
        await run_workers(opts, ids, n_total, channels, stop_at, stats, progress, left)

    asyncio.run(main())
