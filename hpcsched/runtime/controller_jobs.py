"""The controller's job side: submissions and cancels from clients, a job attempt's start on its placement, and
its end when its tasks exit (``lifecycle`` says what follows). A part of ``Controller`` (its state is set in
``Controller.__init__``)."""

from __future__ import annotations

import logging
import time

from hpcsched.errors import InputError
from hpcsched.runtime import launchers
from hpcsched.runtime.controller_members import shed_call
from hpcsched.runtime.jobfile import JobSpec, parse_job_spec
from hpcsched.runtime.launch import JOB_UID_ENV, launch_tasks
from hpcsched.runtime.lifecycle import (
    IN_PLACE,
    Action,
    Event,
    attempt_end,
    exit_event,
    next_state,
    retry_delay,
)
from hpcsched.runtime.listing import MAX_MESSAGE_CHARS
from hpcsched.runtime.store import MAX_REQUEST_ID_CHARS
from hpcsched.runtime.store_rows import AllocRow, JobRow
from hpcsched.runtime.submission import (
    Item,
    LimitExceeded,
    clip,
    parse_items,
    pending_refusal,
    store_items,
)

log = logging.getLogger("hpcsched.runtime.controller")

# Jobs a SubmitMany stores per hold of the lock: 10,000 in one hold kept the scheduling step waiting for seconds.
SUBMIT_CHUNK_JOBS = 500


class JobLifecycle:
    """Jobs submitted, cancelled, started and ended: the part of ``Controller`` that writes a job's state."""

    # ------------------------------------------------------------------------------------ job state
    def _task_exited(self, job: JobRow, a: AllocRow, code: int, reason: str = "", lost: bool = False) -> None:
        """A task ended. A non-zero code (a rank's exit, a signal, a task that could not start, a lost worker)
        fails the attempt, with the worker's ``reason`` (or the code) as the job's message (``lifecycle``)."""
        if a.node_rank == 0 and launchers.get(job.spec.launcher).one_command:
            # One launcher on node 0 ran every rank; the other nodes only held slots: they end with it.
            for hold in self.store.allocations(job_id=job.id):
                if hold.generation == a.generation:
                    self.store.set_alloc_state(hold.task_id, "exited", code)
        if next_state(job.state, exit_event(code, lost))[1] is Action.STOP_FAILED:
            log.warning("job %s task %s exited with %d: stopping the attempt", job.id, a.task_id, code)
            why = clip(reason or f"exited with {code}", 400)  # room for the retry count after it, within 500
            self.store.update_job(job.id, state="stopping", stop_reason="failed", stop_time=time.time(),
                                  message=f"task {a.task_id} {why}")
            self.store.event(job.id, "task_failed", task=a.task_id, exit_code=code,
                             reason=clip(reason, MAX_MESSAGE_CHARS))
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
            message = clip(f"{message}; failed {restarts} attempt{'s' if restarts > 1 else ''}, no retries left",
                           MAX_MESSAGE_CHARS)
            self.store.update_job(job.id, state="failed", procs=0, end_time=now, restarts=restarts,
                                  message=message)
            log.warning("job %s failed: %s", job.id, message)
        elif action is Action.RETRY:
            wait = retry_delay(restarts, self.cfg.retry_backoff_s, self.cfg.retry_backoff_max_s)
            if wait:
                self.retry_at[job.id] = now + wait
            when = f" at {time.strftime('%H:%M:%S', time.gmtime(now + wait))} UTC (in {wait:g} s)" if wait else ""
            message = clip(f"{message}; retry {restarts} of {self.cfg.max_restarts}{when}", MAX_MESSAGE_CHARS)
            self.store.update_job(job.id, state="pending", procs=0, restarts=restarts, stop_reason=None,
                                  message=message)
        else:  # REQUEUE after a preempt or resize: back to the queue, resumes from its checkpoint
            keep = {"stop_reason": reason, "stop_time": job.stop_time} if reason == "resize" else \
                {"stop_reason": None}
            self.store.update_job(job.id, state="pending", procs=0, **keep)
        self.store.event(job.id, "stopped", reason=reason)

    def submit(self, spec_yaml: str | JobSpec, source: str, request_id: str = "", owner: str = "") -> str:
        """The new (or, for a retried ``request_id``, the earlier) job's id; ``submit_once`` says which."""
        return self.submit_once(spec_yaml, source, request_id, owner)[0]

    def submit_once(self, spec_yaml: str | JobSpec, source: str, request_id: str = "", owner: str = ""
                    ) -> tuple[str, bool]:
        """Validate a job file completely (``jobfile.parse_job_spec``: types, ranges, lengths, names, encodings)
        before anything is stored: the client checked it too, but a controller trusts no client. A ``JobSpec``
        (built from a Submit's job record, ``jobrecord.submitted_spec``) was checked by its builder. ``request_id``
        is the client's key for this submit, the same on its retries: a submit whose reply was lost (a timeout)
        and is retried returns the job the first one made, with True (a duplicate), instead of a second job."""
        src = clip(source or "<submitted job>", 200)
        if len(request_id) > MAX_REQUEST_ID_CHARS or not request_id.isprintable():
            raise InputError(src, f"request id: at most {MAX_REQUEST_ID_CHARS} printable characters")
        spec = parse_job_spec(spec_yaml, src) if isinstance(spec_yaml, str) else spec_yaml
        if spec.array is not None:  # N jobs cannot answer as one id: a client that sends arrays uses SubmitMany
            raise InputError(src, "array: a job array is submitted with SubmitMany (`hpcsched submit` does)")
        if not self.call_waiters.try_enter():
            raise shed_call("the submit")
        try:
            return self._submit_locked(spec, request_id, owner)
        finally:
            self.call_waiters.leave()

    def _submit_locked(self, spec: JobSpec, request_id: str, owner: str) -> tuple[str, bool]:
        """``submit_once``'s store under the lock, once admitted by ``call_waiters``."""
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
        if self.call_waiters.refuse_if_full():  # shed before parsing: its parse (the costly part) would be wasted
            raise shed_call("this batch")
        items = parse_items(requests, self.cfg.max_submit_batch)
        stored = 0
        if any(not i.error for i in items):
            if not self.call_waiters.try_enter():
                raise shed_call("this batch")
            try:
                stored = self._store_chunks(items, owner)
            finally:
                self.call_waiters.leave()
            if stored:
                self.wakeup.set()
        bad = sum(1 for i in items if i.error)
        log.info("%d jobs submitted in one batch of %d files%s", stored, len(items),
                 f"; {bad} of them refused" if bad else "")
        return items

    def _store_chunks(self, items: list[Item], owner: str) -> int:
        """Store the valid items in chunks of about ``SUBMIT_CHUNK_JOBS`` jobs, one hold of the lock (and one
        transaction) each, so a scheduling step waiting for the lock gets it between chunks. A request id repeated in
        the call is refused here, over the whole call (``store_items`` sees one chunk)."""
        seen: set[str] = set()
        for item in items:
            if not item.error and item.request_id:
                if item.request_id in seen:
                    item.error = f"{item.source}: request id {item.request_id[:40]!r} repeated in this call"
                seen.add(item.request_id)
        valid = [i for i in items if not i.error]
        stored = 0
        k = 0
        while k < len(valid):
            chunk, jobs = [], 0
            while k < len(valid) and (not chunk or jobs + len(valid[k].specs) <= SUBMIT_CHUNK_JOBS):
                chunk.append(valid[k])
                jobs += len(valid[k].specs)
                k += 1
            with self.lock:
                stored += store_items(self.store, chunk, owner, self.cfg.max_pending_per_user, time.time(),
                                      self.pending)
        return stored

    def cancel(self, job_id: str, owner: str | None = None) -> tuple[bool, str]:
        """Cancel a job; with ``owner``, only a job that user submitted (``own_jobs_only``: others' are not
        theirs to cancel, and are answered as if they did not exist)."""
        with self.lock, self.store.tx():
            job = self.store.job(job_id)
            if job is None or (owner is not None and job.owner != owner):
                return False, f"no job {clip(job_id, 40)!r}" + (" of yours" if owner is not None else "")
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

    def _start(self, job: JobRow, placement: list[tuple[str, int]], hosts: dict[str, str], group: str,
               agents: dict[str, str] | None = None) -> bool:
        """Launch an attempt of ``job`` on ``placement``; False when it waits for a worker's port (a later step
        starts it)."""
        master = placement[0][0]
        port = self.spare_port.pop(master, 0)
        if not port:  # no fresh free port from that node yet: start at the next heartbeat, which it sends now
            self._wanted.add(master)
            if self.nudge is not None:
                self.nudge([master], "port")
            return False
        if (launchers.get(job.spec.launcher).via_agents and len(placement) > 1 and agents is not None
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
            return False
        gen = job.generation + 1
        size = sum(k for _, k in placement)
        ckpt = self.checkpoint_root / job.id
        batch = self.batches.choose(job, size)  # 0: not an adaptive-batch job
        for wid, msg in launch_tasks(job.id, gen, job.spec, placement, hosts, port, ckpt, group, agents, batch):
            if job.uid:  # the worker binds the checkpoint folder to it (a lost state's j0001 is not this one)
                msg.env[JOB_UID_ENV] = job.uid
            msg.owner = job.owner or ""  # a root worker runs the task as the local user this maps to
            self.store.add_allocation(AllocRow(msg.task_id, job.id, gen, wid, msg.node_rank, msg.nprocs, "launching",
                                               None, msg.SerializeToString()))
        self.attempt_start[job.id] = time.time()
        self.store.update_job(job.id, state="running", procs=size, generation=gen, target_procs=size,
                              start_time=job.start_time or time.time(), done=0, group=group)
        self.store.event(job.id, "start", generation=gen, procs=size, workers=[w for w, _ in placement],
                         group=group)
        if self.nudge is not None:
            self.nudge([w for w, _ in placement], "launch")
        log.info("job %s generation %d on %s", job.id, gen, placement)
        return True

