"""The worker daemon: one per node. Registers, heartbeats, launches and kills the node's tasks.

It never listens: every heartbeat carries the node's task statuses and new progress reports, and the
reply carries what to launch, kill or forget. When the controller is unreachable (restarting) the
worker keeps its tasks running and buffers their reports until a heartbeat goes through again.

Tasks report progress by appending JSON lines to ``$HPCSCHED_PROGRESS_FILE``; the worker forwards the
complete lines. A task is started under a task guard (``sandbox``, ``task_guard.py``): as its job's user where
the worker is root, in its own cgroup or process group, killed as a whole tree on a kill, on its end and on the
worker's death. Nothing written in Python runs between the worker's fork and exec: gRPC's threads hold locks and
epoll descriptors that a Python ``preexec_fn`` in the forked child could touch (seen: SIGABRT, "epoll_wait ... Bad
file descriptor"); the guard is exec'd and does the rest single-threaded. The node-rank-0 worker
writes the attempt's generation into the checkpoint directory before it launches: a program left over
from an older attempt sees a newer generation there and exits instead of overwriting checkpoints. It also binds
the folder to the job's uid (``bind_checkpoint_dir``): a folder another job left (the same id in a lost state) is
moved aside, never resumed.

Identity: each daemon sends a random ``instance`` with Register, Heartbeat and Leave; the controller
lets one live daemon hold a name, and a second one is refused (FAILED_PRECONDITION): it logs why, kills any task
it still runs (the controller no longer counts them as its), and asks again every few seconds, so it takes the
name only once the holder has been silent for the controller's worker timeout. Credentials never reach a task:
the worker's token variable (and any variable holding the token) is removed from what tasks inherit, and the CLI
re-executes the daemon without it (its ``/proc/PID/environ``). The lease: a worker that has had no heartbeat
answered for the controller's ``worker_timeout_s`` (RegisterReply) is lost to the controller, so it stops its tasks
itself, first thing on waking from a SIGSTOP too; a controller that is down (its port refuses) counts no one lost,
and a restarted one gives every worker a fresh timeout, so that silence does not count. With an
``address_file`` the worker re-reads it while the controller is unreachable, so it follows a controller restarted
on a new port (``listen: 127.0.0.1:0``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path

import grpc

from hpcsched.runtime import horovod_elastic, launchers, rsh_agent, worker_agent
from hpcsched.runtime.auth import metadata, open_channel
from hpcsched.runtime.checkpoint_quota import CheckpointQuota
from hpcsched.runtime.credentials import credential_metadata
from hpcsched.runtime.hostaddr import spare_port
from hpcsched.runtime.launch import JOB_UID_ENV
from hpcsched.runtime.launchers.common import torch_importable
from hpcsched.runtime.lease_link import LeaseLink
from hpcsched.runtime.liveness import FULL_EVERY, keeps_registration, retry_after, shed_renewed, told_retry_after
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.sandbox import Sandbox
from hpcsched.runtime.task_dirs import (
    CREDENTIAL_ENV,
    bind_checkpoint_dir,
    interleave_dir,
    private_checkpoint_dir,
    space_problem,
    task_base_env,
    task_run_dir,
    workdir_problem,
)
from hpcsched.runtime.task_report import CANNOT_START, MAX_PENDING, clip, launch_problem
from hpcsched.runtime.warm_ranks import WarmRanks
from hpcsched.runtime.worker_config import WorkerConfig
from hpcsched.runtime.worker_link import RENEW_TIMEOUT_S, ControllerLink
from hpcsched.runtime.worker_tasks import DEFAULT_GRACE_S, Task, TaskControl, spawn
from hpcsched.runtime.worker_watch import OrdersWatch

__all__ = ["CREDENTIAL_ENV", "MAX_PENDING", "Task", "WarmRanks", "Worker", "spawn"]

log = logging.getLogger("hpcsched.runtime.worker")

_POLL_S = 0.1  # how often tasks are checked between heartbeats (exits, first reports)
_FOLLOW_UP_S = 0.1  # a heartbeat after one that carried news: fetches the controller's reaction
_REFUSED_RETRY_S = 3.0  # a daemon refused its name asks again this often (the holder may go silent)


class Worker(TaskControl, ControllerLink):
    def __init__(self, cfg: WorkerConfig, python: str = sys.executable) -> None:
        # Absolute from the start: a task runs in its job's workdir, where a relative progress-file or
        # log path would name another file (or none).
        self.cfg = dataclasses.replace(cfg, work_dir=cfg.work_dir.resolve())
        self.python = str(cfg.task_python) if cfg.task_python else python  # what tasks run under
        self.tasks: dict[str, Task] = {}
        self.launchers = launchers.available()
        self.interval = 1.0
        self.instance = uuid.uuid4().hex  # this daemon, as against another started with the same name
        self._jitter = random.Random(self.instance)  # seeded per daemon: a storm of them spreads its first beats
        self._told: set[str] = set()  # tasks the controller has heard running: a partial heartbeat leaves them out
        self._beats = 0  # heartbeats since the last full one (every FULL_EVERY-th is full)
        self.base_env = task_base_env(os.environ, cfg.token)  # what tasks inherit: no credentials
        self._refused_logged = ""
        self._tls_hinted = False
        self.run_as = self._users()
        # the guard runs as this worker, with its own Python; a spare one waits for each next launch
        self.sandbox = Sandbox(cfg.name, python, cfg.cgroups, spare=True)
        self._check_task_python()
        self.quota = CheckpointQuota(cfg.checkpoint_quota_mb)
        log.info("tasks are held by %s; they run as %s", self.sandbox.mode,
                 "their owners' mapped users" if cfg.users else (self.run_as.name if self.run_as else
                                                                 f"this worker's user (uid {os.getuid()})"))
        self.lease_s: float | None = None  # the controller's worker_timeout_s, from registration
        self._fenced = False
        self.channel = open_channel(cfg.controller, cfg.tls_ca)
        # torch here; not with per-owner users: one supervisor forked for every job would be one user's
        use_warm = (cfg.warm_ranks and any(launchers.get(n).warm_start for n in self.launchers)
                    and torch_importable() and not cfg.users)
        self.warm = WarmRanks(self.python, self.cfg.work_dir / "warm-ranks.log", start=self._warm_start) if use_warm \
            else None
        self.stub = pb_grpc.ControllerStub(self.channel)
        self.md = metadata(cfg.token)
        self.watch = OrdersWatch(cfg.name, self.instance, cfg.tls_ca)  # orders pushed: beat at once (worker_watch)
        # orders pushed on the lease connection set the same event: one wake-up, whichever way they came
        self.link = LeaseLink(self.watch.nudged.set, cfg.tls_ca, RENEW_TIMEOUT_S, on_no_push=self._watch_instead)
        # The WorkerAgent service: other nodes' launchers (mpirun) start their daemons here through it (no ssh).
        self.agent_server, self.agent_port = worker_agent.serve(
            self.cfg.host, worker_agent.AgentService(cfg.name, cfg.token, self._holder, self.sandbox))
        # horovodrun reaches other hosts by running `ssh` (its ssh check, its gloo ranks): on a job across workers it
        # finds this one first on its PATH, which is the rsh agent under that name.
        self.ssh_shim = rsh_agent.write_ssh_shim(self.cfg.work_dir / "agent-bin", self.python)

    def run(self, stop: threading.Event) -> None:
        """Heartbeat every ``interval``, and at once when a task exits or a program's first report arrives:
        those are the steps of a resize (stopped -> replaced -> training again) and each one otherwise
        waited for the next beat. A beat that carried such news is followed up after ``_FOLLOW_UP_S`` to
        fetch what the controller decided on it (a relaunch) without another full interval."""
        registered, backoff, due = False, 0.2, 0.0
        reached = time.monotonic()  # the last heartbeat the controller answered (orphan_timeout_s)
        renewed = reached  # when the last answered call was sent: the lease runs from there
        self.sandbox.become_subreaper()
        while not stop.is_set():
            self._fence(time.monotonic() - renewed)  # first: a worker resumed from SIGSTOP may be lost already
            news = self._poll()
            if self.warm is not None:
                self.warm.ensure()
            if not news and time.monotonic() < due and not self.watch.nudged.is_set():
                self.watch.nudged.wait(min(_POLL_S, self.interval))  # woken early by pushed orders
                continue
            self._beat_owed |= self.watch.nudged.is_set()  # pushed orders: beat the controller, not a renewal
            self.watch.nudged.clear()  # this heartbeat's reply carries what the controller pushed
            method = "Register"
            try:
                if not registered:
                    sent = time.monotonic()
                    self._register()
                    registered, renewed = True, sent
                    self._beats = 0  # the first heartbeat after registering is full
                    if self.interval > 1.0:  # a big fleet registering at once: its first beats spread over one interval
                        due = time.monotonic() + self._jitter.uniform(0, self.interval)
                        continue
                method, sent = "Heartbeat", time.monotonic()
                req = self._heartbeat(partial=self._beats % FULL_EVERY != 0)
                reply = self._beat(renewed, req)
                for t in self.tasks.values():
                    t.pending.clear()  # delivered
                self._told = {t.task_id for t in req.tasks if t.running} | (self._told & set(self.tasks))
                self._beats = 0 if reply.full_report else self._beats + 1
                self.interval = reply.heartbeat_interval_s or self.interval  # it grows with the fleet
                registered = not reply.reregister
                reached = time.monotonic()
                self._fence(reached - renewed)  # an answer that came after a stop past the lease: fence first
                renewed = sent
                self._apply(reply)
                backoff = 0.2
                due = time.monotonic() + (_FOLLOW_UP_S if news else self.interval)
                stop.wait(min(_POLL_S, self.interval))
            except grpc.RpcError as e:
                registered = keeps_registration(method, e.code().name)  # a late heartbeat: beat again, no Register
                # tried again after the back-off, not at the next interval: a heartbeat the controller shed or did not
                # answer in time may be the one a pushed order woke (up to 20 s more for a launch at 10,000 workers)
                due = 0.0
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    self._refused(e)
                    stop.wait(_REFUSED_RETRY_S)
                    continue
                if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                                grpc.StatusCode.INVALID_ARGUMENT):
                    log.error("controller refused this worker: %s: %s", e.code().name, e.details())
                elif e.code() == grpc.StatusCode.UNAVAILABLE:
                    self._hint_tls()
                    if self._controller_down():  # nobody counts this silence: a restart starts a fresh timeout
                        renewed = time.monotonic()
                wait, backoff = retry_after(backoff, e.code().name, self.interval, self._jitter)
                told = told_retry_after(e.trailing_metadata() if isinstance(e, grpc.Call) else None)
                wait = wait if told is None else told  # a shed Register: when the controller's queue has room
                if shed_renewed(method, e.code().name, e.details()):
                    renewed = sent  # the controller renewed the lease as of this heartbeat; only its news waits
                if self.lease_s:  # at least three tries within the lease before this worker fences its tasks
                    wait = min(wait, self.lease_s / 3)
                busy = e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # it answered, shedding load: not an orphan
                reached = time.monotonic() if busy else reached
                log.info("controller %s (%s); retry in %.1f s", "busy" if busy else "unreachable", e.code().name, wait)
                orphan = self.cfg.orphan_timeout_s
                if orphan is not None and time.monotonic() - reached > orphan:
                    # A pilot job must not hold a node for a controller that is gone (not restarted).
                    log.error("controller %s unreachable for %.0f s (orphan_timeout_s %g): leaving",
                              self.cfg.controller, time.monotonic() - reached, orphan)
                    break
                self._rediscover()
                stop.wait(wait)
        self.leave()

    def leave(self) -> None:
        """A graceful stop (SIGTERM, as Slurm stops a job step): say so, checkpoint and stop every task,
        wait for them at most ``stop_grace_s`` (then SIGKILL), report their exits, say goodbye, exit.

        The controller hears of it at once (Leave RPC) rather than after ``worker_timeout_s`` of silence,
        and the jobs stop as preempted (resumed elsewhere from their checkpoint, no restart counted). With
        the controller unreachable the tasks still checkpoint, and the notice is tried again while they stop and
        up to ``leave_notice_s`` after (a controller restarted meanwhile, as after a kill -9, then hears it:
        found by the harvesting end-to-end test, where a pilot preempted during the restart counted as a failed
        attempt); a controller still away then times the worker out."""
        grace = self.cfg.stop_grace_s
        t0 = time.monotonic()
        said = self._say_leave(final=False)
        for tid in list(self.tasks):
            self.kill(tid, checkpoint=True, grace_s=grace)
        deadline = time.time() + grace + 5.0  # past the grace the kill escalates to SIGKILL; then a reap margin
        while any(t.exit_code is None for t in self.tasks.values()) and time.time() < deadline:
            time.sleep(0.1)
            self._poll()
            said = said or self._say_leave(final=False, timeout=1.0)
            for tid in list(self.tasks):
                self.kill(tid, checkpoint=True, grace_s=grace)  # escalates once the grace is over
            self._deliver()
        self._poll()
        stopped = time.monotonic()
        # its tasks have stopped: wait a little more for a controller that is restarting (seconds, after kill -9)
        notice_until = time.time() + min(grace, self.cfg.leave_notice_s)
        while not said and time.time() < notice_until:
            said = self._say_leave(final=False, timeout=1.0)
            if not said:
                time.sleep(0.2)
        self._deliver()
        self._say_leave(final=True)
        told = time.monotonic()
        steps = self.shutdown()
        # A preempted pilot's node is free only once this process is gone; each stage's time is said so that a
        # slow release (a batch job waiting on it) can be placed: the tasks, the goodbye, or the teardown.
        log.info("left %.2f s after the stop: tasks stopped in %.2f s, goodbye said in %.2f s, shutdown %s",
                 time.monotonic() - t0, stopped - t0, told - stopped,
                 ", ".join(f"{k} {v:.2f} s" for k, v in steps.items()))

    def _say_leave(self, final: bool, timeout: float = 5.0, again: bool = True, shed_tries: int = 5) -> bool:
        """Whether the controller heard it. A Leave the controller shed (RESOURCE_EXHAUSTED: enough calls already
        waited for its lock) is sent again after a jittered pause, ``shed_tries`` times at most."""
        try:
            reply = self.stub.Leave(pb.LeaveRequest(worker_id=self.cfg.name, final=final, instance=self.instance),
                                    timeout=timeout, metadata=self.md)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and shed_tries > 0:
                time.sleep(self._jitter.uniform(0.05, 0.5))
                return self._say_leave(final, timeout, again, shed_tries - 1)
            if e.code() != grpc.StatusCode.UNAUTHENTICATED or not again:
                return False
            try:  # a restarted controller no longer knows this daemon's credential: register again, then repeat
                self._register()
            except grpc.RpcError:
                return False
            return self._say_leave(final, timeout, again=False)
        log.info("told the controller this worker %s (%d jobs stopping)", "left" if final else "is leaving",
                 reply.stopping_jobs)
        return True

    def _deliver(self) -> None:
        """One heartbeat that only reports (a leaving worker launches nothing and answers no kill)."""
        with contextlib.suppress(grpc.RpcError):
            reply = self.stub.Heartbeat(self._heartbeat(), timeout=5, metadata=self.md)
            for t in self.tasks.values():
                t.pending.clear()
            for tid in reply.forget:
                self.tasks.pop(tid, None)

    def _register(self) -> None:
        req = pb.RegisterRequest(worker_id=self.cfg.name, host=self.cfg.host, slots=self.cfg.slots,
                                 gpus=self.cfg.gpus, cpus=os.cpu_count() or 1, launchers=self.launchers,
                                 instance=self.instance, gpu_type=self.cfg.gpu_type, agent_port=self.agent_port)
        reply = self.stub.Register(req, timeout=10, metadata=self.md)
        # Heartbeat and Leave speak for this worker with its own credential (credentials.py), kept in memory only.
        self.md = metadata(self.cfg.token) + credential_metadata(reply.credential)
        self.interval = reply.heartbeat_interval_s or 1.0
        self.lease_s = reply.worker_timeout_s or None  # 0: a controller from before leases
        # renewals with nothing to report go to its lease server, which also pushes its orders (worker_link); without
        # one, orders are heard on a Watch stream (first: a lease server that does not push starts it again)
        self.watch.update(self.cfg.controller, 0 if reply.lease_port > 0 and reply.credential else reply.watch_port,
                          self.md)
        self._lease_to(reply)
        self._refused_logged = ""
        log.info("registered with %s as %s (%d slots, %d GPUs of type %s, launchers %s)", self.cfg.controller,
                 self.cfg.name, self.cfg.slots, self.cfg.gpus, self.cfg.gpu_type or "(not advertised)",
                 ",".join(self.launchers))

    def _heartbeat(self, partial: bool = False) -> pb.HeartbeatRequest:
        """The report: every task, or (``partial``) only those with news: not yet heard running, exited, or with
        progress to deliver (the controller takes the others as running on)."""
        req = pb.HeartbeatRequest(worker_id=self.cfg.name, spare_port=spare_port(self.cfg.host),
                                  agent_port=self.agent_port, partial=partial)
        req.instance = self.instance
        for tid, t in self.tasks.items():
            if partial and tid in self._told and t.exit_code is None and not t.pending:
                continue
            req.tasks.append(pb.TaskStatus(task_id=tid, job_id=t.launch.job_id, generation=t.launch.generation,
                                           running=t.exit_code is None, exit_code=t.exit_code or 0,
                                           progress=t.pending, reason=t.reason if t.exit_code is not None else ""))
        return req

    def _apply(self, reply: pb.HeartbeatReply) -> None:
        """Carry out the controller's orders. Nothing in one order may stop the daemon: a launch that cannot
        start is a failed task (``launch``), and anything else unexpected is logged and left for the next
        reconciliation. A worker that died on a bad order died again on its resend after every restart."""
        for tid in reply.forget:
            self.tasks.pop(tid, None)
        for k in reply.kill:
            try:
                self.kill(k.task_id, k.checkpoint, k.grace_s or DEFAULT_GRACE_S)
            except Exception:
                log.exception("task %s: kill failed", k.task_id)
        for launch in reply.launch:
            t = self.tasks.get(launch.task_id)
            try:
                if t is None:
                    self.launch(launch)
                elif t.exit_code is None and list(launch.hosts) != list(t.launch.hosts):
                    self._resize(t, launch)  # the controller resized it in place: the same task, a new host list
            except Exception:
                log.exception("task %s: order failed", launch.task_id)

    def _resize(self, t: Task, launch: pb.LaunchTask) -> None:
        """Apply an in-place resize the controller decided. It re-sends the LaunchTask until the program reports
        at the new size, so this runs once per change: afterwards the task's LaunchTask is the new one. A task
        that only holds slots for node 0's launcher (another node of a job across workers) just takes the new
        LaunchTask: node 0's horovodrun starts or removes the ranks here, through this worker's agent."""
        if t.proc is None and t.held is not None and horovod_elastic.size_range(launch):
            log.info("task %s holds %d slot(s) of a job resized in place to %d", t.launch.task_id, launch.nprocs,
                     launch.world_size)
            t.launch = launch
            return
        if t.offset == 0:
            # No report from the program yet: Horovod's driver tells rank 0 of a host change only once its worker is
            # up, and drops the news otherwise (seen on the loopback Slurm's pilots: a grow asked 2 s after the
            # launch was never made, the job trained at 1 to its end). The controller re-sends this LaunchTask on
            # every heartbeat until it sees the new size, so the rewrite waits for the first report.
            log.info("task %s: in-place resize waits for the program's first report", t.launch.task_id)
            return
        try:
            done = self.resize_in_place(t.launch.task_id, list(launch.hosts), dict(launch.agents),
                                        horovod_elastic.BatchTold.of(launch))
        except (ValueError, OSError) as e:  # outside its range, or its host file is gone: the controller falls
            # back to stop/relaunch when the new size is not reported (controller.IN_PLACE_TIMEOUT_S)
            log.error("task %s: in-place resize to %s refused: %s", t.launch.task_id, list(launch.hosts), e)
            return
        if done:
            # Device bookkeeping follows the size, so a job placed here next gets the devices a shrink freed.
            # (The launcher's CUDA_VISIBLE_DEVICES is fixed at launch: see docs/runtime.md, limits.)
            t.devices = t.devices[: launch.nprocs] if self.cfg.gpus else []
            if len(t.devices) < launch.nprocs and self.cfg.gpus:
                busy = {d for task in self.tasks.values() if task.exit_code is None for d in task.devices}
                t.devices += [d for d in range(self.cfg.gpus) if d not in busy][: launch.nprocs - len(t.devices)]
            t.launch = launch
        else:
            log.error("task %s is not an elastic Horovod task: cannot resize it in place", t.launch.task_id)

    def _holder(self, job_id: str, generation: int) -> worker_agent.Holder | None:
        """The agent service's check: a live, not stopping, slot-holding task of that job's attempt here."""
        for t in list(self.tasks.values()):
            if t.launch.job_id == job_id and t.launch.generation == generation and t.exit_code is None \
                    and t.term_at is None and t.held is not None:
                return t.held
        return None

    # ----------------------------------------------------------------------------------------- tasks
    def launch(self, t: pb.LaunchTask) -> None:
        """Start one node's task. A task that cannot start (a variable the OS refuses, a NUL byte, no such
        program or directory, any other error on the way) is recorded as exited with 127 and the reason, so the
        controller fails the attempt (and retries or fails the job) instead of the daemon dying on it."""
        try:
            self._launch(t)
        except Exception as e:  # never the daemon: the task fails, with the reason
            log.exception("task %s: cannot start", t.task_id)
            self._cannot_start(t, f"{type(e).__name__}: {e}")

    def _cannot_start(self, t: pb.LaunchTask, why: str) -> None:
        reason = clip(f"cannot start: {why}")
        log.error("task %s: %s", t.task_id, reason)
        old = self.tasks.get(t.task_id)
        if old is not None and old.proc is not None and old.exit_code is None:
            return  # it did start (the error came after): its exit will be reported as usual
        self.tasks[t.task_id] = Task(t, None, self.cfg.work_dir / t.task_id / "progress.jsonl", [],
                                     exit_code=CANNOT_START, reason=reason)

    def _launch(self, t: pb.LaunchTask) -> None:
        problem = launch_problem(t)
        if problem:
            self._cannot_start(t, problem)
            return
        user, problem = self._identity(t)
        cwd = t.env.get("HPCSCHED_WORKDIR") or None
        if not problem and t.command and cwd is not None:
            problem = workdir_problem(cwd, self.cfg.allowed_workdirs, self.cfg.work_dir, user)
        if not problem:  # before a checkpoint folder is handed out: a full disk fails every job on it
            problem = space_problem([self.cfg.work_dir] + ([Path(t.checkpoint_dir)] if t.node_rank == 0 else []),
                                    self.cfg.min_free_mb)
        if problem:
            self._cannot_start(t, problem)
            return
        run_dir = self.cfg.work_dir / t.task_id
        progress = task_run_dir(run_dir, user)
        devices = self._devices(t)
        argv, env = launchers.build(t, self.python, ",".join(map(str, devices)))
        if argv is not None and horovod_elastic.size_range(t):  # elastic Horovod: resized in place
            argv = horovod_elastic.elastic_command(argv, t, run_dir)
            env[rsh_agent.FILE_ENV] = str(run_dir / horovod_elastic.AGENTS)  # follows the job's hosts
            env |= horovod_elastic.batch_env(t, run_dir)  # the batch told with each in-place resize
        env["HPCSCHED_PROGRESS_FILE"] = str(progress)
        env["HPCSCHED_TASK_ID"] = t.task_id
        if user is not None:  # not the worker's home (root's): where the task's own files go
            env |= {"HOME": user.home, "USER": user.name, "LOGNAME": user.name}
        turns = interleave_dir(self.cfg.work_dir, self.cfg.name, t.group or t.job_id)
        env["HPCSCHED_INTERLEAVE_DIR"] = str(turns)
        if user is not None and os.getuid() == 0:  # the group's tasks (its users) make their stage locks there
            turns.mkdir(parents=True, exist_ok=True)
            os.chmod(turns, 0o1777)
        if self.cfg.token and t.agents:  # the launcher's rsh agent shows it to the other workers (not the token)
            env[rsh_agent.KEY_ENV] = worker_agent.job_key(self.cfg.token, t.job_id, t.generation)
        if t.agents and launchers.get(t.launcher).agent_as_ssh:
            env["PATH"] = f"{self.ssh_shim}{os.pathsep}{env.get('PATH') or self.base_env.get('PATH', '')}"
        proc = None
        how = quota = ""
        if t.node_rank == 0:
            ckpt = Path(t.checkpoint_dir)
            bind_checkpoint_dir(ckpt, t.env.get(JOB_UID_ENV, ""), make=self.quota.make)
            self.quota.make(ckpt)
            (ckpt / "generation").write_text(f"{t.generation}\n")
            private_checkpoint_dir(ckpt, user)
            quota = self.quota.apply(ckpt)
        if argv is not None and cwd is not None and not os.path.isdir(cwd):
            self._cannot_start(t, f"the job's workdir {cwd} is not a directory on this worker")
            return
        if argv is not None and launchers.get(t.launcher).warm_start and self.warm is not None:
            # a running member of its co-location group: start with it, not after the supervisor's imports
            mates = sorted({x.launch.job_id for x in self.tasks.values() if x.exit_code is None and t.group
                            and x.launch.group == t.group and x.launch.job_id != t.job_id})
            passed_over = self.warm.passed_over
            proc = self.warm.take(argv, self.base_env | env, cwd, run_dir / "output.log", may_wait=not mates)
            if proc is not None:
                how = ", warm start"
                if self.warm.took_importing:
                    log.info("task %s: the warm supervisor is still importing; the task starts once it is done",
                             t.task_id)
            elif self.warm.passed_over > passed_over:
                how = (f", cold start beside its group mate {','.join(mates)}: the warm supervisor was still "
                       f"importing ({self.warm.passed_over} such launches)")
        if argv is not None and proc is None:
            with open(run_dir / "output.log", "ab") as out:
                try:
                    proc = self.sandbox.spawn(argv, self.base_env | env, cwd=cwd, stdout=out, leaf=t.task_id,
                                              user=user)
                except (OSError, ValueError) as e:
                    self._cannot_start(t, str(e))
                    return
        held = worker_agent.Holder(self.base_env | env, cwd, user=user, leaf=t.task_id) if argv is None else None
        self.tasks[t.task_id] = Task(t, proc, progress, devices, held=held)
        log.info("launched %s (%s, %d procs%s%s)", t.task_id, t.launcher, t.nprocs, how if argv else ", holding",
                 f", {quota}" if quota else "")

    def resize_in_place(self, task_id: str, hosts: list[str], agents: dict[str, str] | None = None,
                        batch: horovod_elastic.BatchTold | None = None) -> bool:
        """Grow or shrink a running elastic Horovod task without stopping it (new ``host:slots`` list, the agents
        of its hosts when it spans several, and an adaptive-batch job's batch for the new size); False when the
        task is not one (the caller then stops and relaunches it)."""
        t = self.tasks.get(task_id)
        if t is None or t.exit_code is not None or t.proc is None or not horovod_elastic.size_range(t.launch):
            return False
        horovod_elastic.resize(self.cfg.work_dir / task_id, hosts, agents, batch)
        log.info("task %s resized in place to %s%s", task_id, ",".join(hosts),
                 f", batch {batch.batch_size}" if batch is not None else "")
        return True
    # --- elastic Horovod in-place resize: end ---

    def shutdown(self) -> dict[str, float]:
        """Kill what is left and close everything; returns each stage's seconds (``leave`` logs them)."""
        steps: dict[str, float] = {}
        for name, close in (("tasks", lambda: [self.kill(tid, checkpoint=False) for tid in list(self.tasks)]),
                            ("agent", lambda: self.agent_server.stop(grace=1)),
                            ("warm", lambda: self.warm is not None and self.warm.close()),
                            ("sandbox", self.sandbox.close), ("watch", self.watch.stop), ("lease", self.link.stop),
                            ("channel", self.channel.close)):
            t = time.monotonic()
            close()
            steps[name] = time.monotonic() - t
        return steps


