"""The controller's membership: workers register, beat and leave, and a silent one is lost; each heartbeat is
reconciled declaratively against the store (``reconcile``). A part of ``Controller`` (its state is set in
``Controller.__init__``); every method here runs under its lock, but for the lease-only heartbeat and a Register's
checks and wait in the registration queue (``register_queue``: a group is committed under the lock).

Lease-only heartbeats: most heartbeats of a big fleet say nothing (an idle worker, or running tasks with no news in
a partial report), and the reconcile would change nothing. They waited for the controller's lock all the same, so
a scheduling step of 1.7 s held every server thread, and the heartbeats queued behind them waited as long (client
p99 1.4 s at 10,000 workers while the handler's own p99 was 117 ms). Such a heartbeat is now decided from memory
without the lock (``MemStore.worker_allocs_unlocked``: snapshots; every verdict must be ``Expected.OK``) and only
renews the lease in memory (``last_seen``, never written to the store: liveness is in memory only), under
``seen_lock``, which every removal of a worker from ``last_seen`` also takes. Anything else takes the lock as
before. A step's change the lock-free read missed (a stop, a launch placed meanwhile) is in the next reply: the
step nudges the worker (``watch``) after it, as it would after a heartbeat that had come just before the step."""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Sequence

from hpcsched.errors import InputError
from hpcsched.runtime import reconcile
from hpcsched.runtime.jobfile import GPU_TYPE
from hpcsched.runtime.lifecycle import (
    IN_PLACE_TIMEOUT_S,
    Action,
    Event,
    next_state,
)
from hpcsched.runtime.listing import MAX_REPLY_BYTES
from hpcsched.runtime.liveness import (
    LOCK_WAITING_BEATS,
    LOCK_WAITING_CALLS,
    RENEWED_PREFIX,
    SHED_PREFIX,
    heartbeat_problem,
    interval_s,
)
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.store_rows import AllocRow, JobRow, WorkerRow
from hpcsched.runtime.submission import (
    clip,
)

log = logging.getLogger("hpcsched.runtime.controller")

_UNCHANGED = pb.TaskStatus(running=True)  # a confirmed task a partial heartbeat left out: it runs, no news

# Registration bounds: without them 2^31-1, -5 and 0 slots and a 100 KB id were accepted.
MAX_WORKER_ID_CHARS = 128
MAX_SLOTS = 4096  # processes one node runs at once: far above any node, far below int32
_WORKER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]*")


class Refused(Exception):
    """A worker's request the controller will not carry out, with why (gRPC FAILED_PRECONDITION): another live
    daemon holds its name. The message is for the worker's log and its operator."""


class Shed(Exception):
    """A heartbeat with news refused at once because ``liveness.LOCK_WAITING_BEATS`` others already wait for the
    controller's lock (gRPC RESOURCE_EXHAUSTED): the worker's lease was renewed, and it sends its news again after
    its back-off, still registered (``liveness.keeps_registration``). Also a Leave or Submit refused because
    ``liveness.LOCK_WAITING_CALLS`` such calls already wait (``shed_call``), and a Register refused because the
    registration queue is full (``shed_register``): its caller retries, a worker's Register after
    ``retry_after_s`` (``pacing``: sent as ``liveness.RETRY_AFTER_HEADER``)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def shed_register(waiting: int, retry_after_s: float) -> Shed:
    """Refuse a Register: ``waiting`` others already wait for their group's commit (``register_queue``)."""
    return Shed(f"{SHED_PREFIX} {waiting} registrations already wait for the controller; the registration was not "
                f"carried out: retry in {retry_after_s:.1f} s", retry_after_s)


def shed_call(what: str, retry_after_s: float | None = None) -> Shed:
    """Refuse a Leave / Submit call: ``LOCK_WAITING_CALLS`` others already wait for the lock."""
    when = f"retry in {retry_after_s:.1f} s" if retry_after_s is not None else "retry after a back-off"
    return Shed(f"{SHED_PREFIX} {LOCK_WAITING_CALLS} calls already wait for the controller's lock; {what} was not "
                f"carried out: {when}", retry_after_s)


class Membership:
    """Workers joining, beating and leaving: the part of ``Controller`` the worker RPCs call."""

    # ---------------------------------------------------------------------------------------- workers
    def register(self, req: pb.RegisterRequest) -> pb.RegisterReply:
        """Admit a worker daemon. Its id, slots and host are bounded (``registration_problem``: InputError), and a
        name is held by one live daemon at a time: a second daemon with a live holder's name is ``Refused``
        (two such daemons flapped, each re-registering over the other, and a job ended at 115 of 400 steps).
        A holder silent for ``worker_timeout_s`` is lost, and then the name is free again. Committed with the
        Registers queued beside it in one lock hold and one transaction (``register_queue``), answered after the
        commit; refused at once with a retry-after when the queue is full (``pacing``)."""
        problem = registration_problem(req)
        if problem:
            raise InputError(f"worker {clip(req.worker_id, 60)!r}", problem)
        if self.lock.held():  # queued, it would wait for a leader that waits for this thread's lock: at once
            outcome = self._register_group([req])[0]
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        reply = self.registrations.submit(req)
        if reply is None:  # told when to come back: the storm is paced (``pacing``)
            raise shed_register(self.registrations.bound, self.register_pacer.retry_after(req.worker_id))
        return reply

    def _register_group(self, reqs: Sequence[pb.RegisterRequest]) -> list[pb.RegisterReply | Exception]:
        """Register a group of checked requests in one lock hold and one transaction (``register_queue``): each
        request's reply, or the ``Refused`` it is answered with. In order, so of two daemons of one name in one
        group the first holds it and the second is refused, as if they had come one after the other."""
        outcomes: list[pb.RegisterReply | Exception] = []
        done: list[pb.RegisterRequest] = []
        with self.lock, self.store.tx():
            now = time.time()
            for req in reqs:
                holder = self.instance.get(req.worker_id)
                if req.worker_id in self.last_seen and holder is not None and holder != req.instance:
                    silent = self.mono() - self.last_seen[req.worker_id]
                    log.warning("refused a second daemon for worker %s (the holder was heard %.1f s ago)",
                                req.worker_id, silent)
                    outcomes.append(Refused(f"worker name {req.worker_id!r} is held by another live daemon; give "
                                            "this one another --name, or stop the other one (its name is free "
                                            f"{self.cfg.worker_timeout_s:g} s after it goes silent)"))
                    continue
                with self.seen_lock:
                    self.instance[req.worker_id] = req.instance
                    self.last_seen[req.worker_id] = self.mono()
                w = WorkerRow(req.worker_id, req.host, req.slots, req.gpus, req.cpus, tuple(req.launchers), now,
                              True, req.gpu_type.lower())
                self.store.upsert_worker(w)
                self.leaving.discard(w.id)
                if req.agent_port:  # a job placed on it at once may need it (mpirun's daemons, horovodrun's ranks)
                    self.agent_port[w.id] = req.agent_port
                else:  # a new daemon's agent listens elsewhere: known at its first heartbeat
                    self.agent_port.pop(w.id, None)
                self.store.event(None, "register", worker=w.id, host=w.host, slots=w.slots, gpu_type=w.gpu_type)
                outcomes.append(None)  # replaced below, once the transaction has committed
                done.append(req)
            if done:
                self._workers_changed = True
            interval = self.heartbeat_interval()  # the group's: the fleet with all of them
        # committed: only now is any of them answered (a kill -9 before this loses none that was acknowledged)
        for k, outcome in enumerate(outcomes):
            if outcome is None:  # one message each: the server adds the worker's own fields to it
                outcomes[k] = pb.RegisterReply(heartbeat_interval_s=interval,
                                               worker_timeout_s=self.cfg.worker_timeout_s)
        if len(done) == 1:
            req = done[0]
            log.info("worker %s registered (%s, %d slots, %d GPUs of type %s)", req.worker_id, req.host, req.slots,
                     req.gpus, req.gpu_type.lower() or "(not advertised)")
        elif done:  # one line (one write) for the group: in a storm a line each was a write each
            log.info("%d workers registered in one commit: %s", len(done), "; ".join(
                f"worker {r.worker_id} ({r.host}, {r.slots} slots, {r.gpus} GPUs of type "
                f"{r.gpu_type.lower() or '(not advertised)'})" for r in done))
        if done:
            self.register_pacer.registered_many([r.worker_id for r in done])
            self.wakeup.set()
        return outcomes

    def heartbeat_interval(self) -> float:
        """The interval workers are told to beat at now (``liveness.interval_s``: it grows with the fleet so the
        controller's heartbeat rate stays near ``heartbeat_rate``); said once when the timeout caps it."""
        interval, capped = interval_s(len(self.last_seen), self.cfg.heartbeat_interval_s, self.cfg.heartbeat_rate,
                                      self.cfg.worker_timeout_s)
        if self.leases is not None:  # what the lease server's replies tell
            self.leases.set_interval(interval)
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
                        clip(req.worker_id, 60), problem, self.refused_heartbeats)
            raise InputError(f"heartbeat of worker {clip(req.worker_id, 60)!r}", problem)
        if self.leases is not None:  # this reply carries the orders its renewals were told to come for
            self.leases.clear_want(req.worker_id)
        reply = pb.HeartbeatReply()
        if self._lease_only(req):
            reply.heartbeat_interval_s = self.heartbeat_interval()
            return reply
        if not self.beat_waiters.acquire(blocking=False):
            if self._renew(req):  # it is alive; only its news waits
                if self.leases is not None:  # the orders it came for wait too: its renewals keep saying so
                    self.leases.want([req.worker_id])
                with self.seen_lock:
                    self.shed_beats += 1
                raise Shed(f"{RENEWED_PREFIX} {LOCK_WAITING_BEATS} heartbeats already wait for the controller's "
                           "lock (a scheduling step holds it): send this report again after a back-off")
            self.beat_waiters.acquire()  # not registered or another daemon: the lock's path says which
        try:
            return self._reconcile_beat(req, reply)
        finally:
            self.beat_waiters.release()

    def _reconcile_beat(self, req: pb.HeartbeatRequest, reply: pb.HeartbeatReply) -> pb.HeartbeatReply:
        """The heartbeat's reconcile under the lock (``heartbeat``)."""
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

    def _lease_only(self, req: pb.HeartbeatRequest) -> bool:
        """Renew the worker's lease without the lock when its heartbeat has nothing to reconcile (module docstring):
        it reports no task, the controller waits for nothing from it (a port, a full report), its agent port is
        the known one, and every allocation on it is as it should be. False: nothing was done, take the lock."""
        wid = req.worker_id
        if req.tasks or wid in self._wanted or wid in self._full_wanted:
            return False
        if req.agent_port and self.agent_port.get(wid) != req.agent_port:
            return False
        allocs = self.store.worker_allocs_unlocked(wid)
        if allocs is None:
            return False
        now = time.time()
        for a in allocs:
            if a.state == "exited":
                continue
            job = self.store.active_job_unlocked(a.job_id)
            seen = _UNCHANGED if req.partial and a.state == "running" else None
            if job is None or reconcile.expected(a, job, seen, now, IN_PLACE_TIMEOUT_S) is not reconcile.Expected.OK:
                return False
        if not self._renew(req):
            return False  # not registered (reregister), or another daemon's name (refused): the lock's path
        with self.seen_lock:
            self.lease_only_beats += 1
        if req.spare_port:  # one key's value replaced: no reader iterates this dict
            self.spare_port[wid] = req.spare_port
        return True

    def _renew(self, req: pb.HeartbeatRequest) -> bool:
        """Renew the lease of a registered worker's daemon without the lock; False (nothing done) for another."""
        with self.seen_lock:
            if req.worker_id not in self.last_seen or self.instance.get(req.worker_id) != req.instance:
                return False
            self.last_seen[req.worker_id] = self.mono()
        return True

    def leave(self, req: pb.LeaveRequest) -> pb.LeaveReply:
        """A worker stopping on purpose. Draining: its jobs stop with a checkpoint (preempt, so no restart is
        counted) and the next step places them elsewhere. Final: it is gone now; whatever it did not report
        as exited counts as lost. Only the daemon that holds the name may say so."""
        wid = req.worker_id
        if not _WORKER_ID.fullmatch(wid) or len(wid) > MAX_WORKER_ID_CHARS:  # it is logged: no forged lines
            raise InputError("worker id", "not a worker id (1 to 128 letters, digits and _.:@-)")
        if not self.call_waiters.try_enter():
            raise shed_call("the leave")
        try:
            return self._leave(req)
        finally:
            self.call_waiters.leave()

    def _leave(self, req: pb.LeaveRequest) -> pb.LeaveReply:
        """``leave`` under the lock, once admitted by ``call_waiters``."""
        wid = req.worker_id
        stopping = 0
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
                with self.seen_lock:
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
                            "refused (%d such reports so far)", wid, clip(t.task_id, 60), clip(t.job_id, 40),
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
        self.batches.observe(job, p)
        for kind, detail in u.events:
            self.store.event(job.id, kind, **detail)
        self.store.update_job(job.id, **u.fields)

    def _renewed(self, wid: str) -> float:
        """When the lease server last renewed the worker's lease (the controller's monotonic clock), -inf: never."""
        at = self.leases.renewed_at(wid) if self.leases is not None else None
        return at if at is not None else float("-inf")

    def _reap_dead_workers(self, now: float, previous: float = float("-inf")) -> None:
        """Declare lost every worker silent for ``worker_timeout_s``: neither a heartbeat here nor a renewal at the
        lease server (read only for those whose last heartbeat is that old: one table read each). ``previous``: when
        the last look was, said with a loss: a look long before means the controller itself was held up (stopped,
        starved, a long step), a recent one that the worker's heartbeats did not arrive."""
        if self.leases is not None:
            self.leases.server_up()  # an exit of the lease server is said, and no longer named to registrations
        for wid, seen in list(self.last_seen.items()):
            if now - seen <= self.cfg.worker_timeout_s:
                continue
            with self.seen_lock:  # a lease-only heartbeat may have renewed it since the copy
                seen = max(self.last_seen.get(wid, now), self._renewed(wid))
                if now - seen <= self.cfg.worker_timeout_s:
                    if wid in self.last_seen:
                        self.last_seen[wid] = seen  # renewed at the lease server: not looked at again until then
                    continue
                del self.last_seen[wid]
                self.instance.pop(wid, None)  # the name is free for the next daemon
            if self.leases is not None:
                self.leases.release(wid)
            self.spare_port.pop(wid, None)
            self.store.set_worker_alive(wid, False)
            self._workers_changed = True
            self.store.event(None, "worker_lost", worker=wid, silent_s=now - seen)
            log.warning("worker %s silent for %.1f s: lost (%s)", wid, now - seen,
                        f"the controller last looked for silent workers {now - previous:.1f} s before"
                        if math.isfinite(previous) else "the controller's first look since it started")
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


