"""The worker daemon: one per node. Registers, heartbeats, launches and kills the node's tasks.

It never listens: every heartbeat carries the node's task statuses and new progress reports, and the
reply carries what to launch, kill or forget. When the controller is unreachable (restarting) the
worker keeps its tasks running and buffers their reports until a heartbeat goes through again.

Tasks report progress by appending JSON lines to ``$HPCSCHED_PROGRESS_FILE``; the worker forwards the
complete lines. A task is started in its own session (so a kill reaches its whole tree) with the
parent-death signal set, so a dead worker does not leave a launcher behind. Nothing written in Python
runs between fork and exec: gRPC's threads hold locks and epoll descriptors that a Python ``preexec_fn``
in the forked child could touch (seen: SIGABRT, "epoll_wait ... Bad file descriptor"), so the session is
made by ``start_new_session`` (C code in ``_posixsubprocess``) and the death signal by ``setpriv``, an
exec'd program, where it is installed. The node-rank-0 worker
writes the attempt's generation into the checkpoint directory before it launches: a program left over
from an older attempt sees a newer generation there and exits instead of overwriting checkpoints. It also binds
the folder to the job's uid (``bind_checkpoint_dir``): a folder another job left (the same id in a lost state) is
moved aside, never resumed.

Identity (issue 15): each daemon sends a random ``instance`` with Register, Heartbeat and Leave; the controller
lets one live daemon hold a name, and a second one is refused (FAILED_PRECONDITION): it logs why, kills any task
it still runs (the controller no longer counts them as its), and asks again every few seconds, so it takes the
name only once the holder has been silent for the controller's worker timeout. Credentials never reach a task:
the worker's token variable (and any variable holding the token) is removed from what tasks inherit. With an
``address_file`` the worker re-reads it while the controller is unreachable, so it follows a controller restarted
on a new port (``listen: 127.0.0.1:0``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc

from hpcsched.runtime import horovod_elastic, launchers, rsh_agent, worker_agent
from hpcsched.runtime.auth import metadata, open_channel
from hpcsched.runtime.config import WorkerConfig
from hpcsched.runtime.credentials import credential_metadata
from hpcsched.runtime.launch import JOB_UID_ENV
from hpcsched.runtime.rpc import pb, pb_grpc

log = logging.getLogger("hpcsched.runtime.worker")

_POLL_S = 0.1  # how often tasks are checked between heartbeats (exits, first reports)
_FOLLOW_UP_S = 0.1  # a heartbeat after one that carried news: fetches the controller's reaction
DEFAULT_GRACE_S = 30.0  # SIGTERM (checkpoint and exit) -> SIGKILL of the whole task tree, unless told otherwise
_PROGRESS_FIELDS = {f.name for f in pb.Progress.DESCRIPTOR.fields}
_REFUSED_RETRY_S = 3.0  # a daemon refused its name asks again this often (the holder may go silent)
CREDENTIAL_ENV = ("HPCSCHED_TOKEN",)  # never passed on to a task


@dataclass(slots=True)
class Task:
    launch: pb.LaunchTask
    proc: subprocess.Popen | None  # None: holds slots for a launcher that started its ranks elsewhere
    progress_path: Path
    devices: list[int]
    offset: int = 0
    exit_code: int | None = None
    reason: str = ""  # how it ended, when badly: sent with its exit (the job's message on the controller)
    term_at: float | None = None
    grace_s: float = DEFAULT_GRACE_S
    pending: list[pb.Progress] = field(default_factory=list)
    # What a remote launcher's command (an MPI daemon started through this worker's agent service) runs with,
    # and those commands: a slot-holding task's processes, killed with it.
    held: worker_agent.Holder | None = None


def _pdeathsig_prefix() -> list[str]:
    """argv prefix that makes the task SIGKILLed when the worker dies (PR_SET_PDEATHSIG), set by util-linux
    ``setpriv`` after fork and before it execs the task: the same process, no Python in the child."""
    exe = shutil.which("setpriv")
    return [exe, "--pdeathsig", "KILL", "--"] if exe else []


def spawn(argv: list[str], env: dict[str, str], cwd: str | None, out: IO[bytes], stdin: int = subprocess.DEVNULL
          ) -> subprocess.Popen:
    """Start a task fork-safely (see the module docstring): own session, parent-death signal, no preexec_fn."""
    return subprocess.Popen([*_pdeathsig_prefix(), *argv], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                            stdin=stdin, start_new_session=True)


class WarmRanks:
    """One ``ranks.py --warm`` supervisor started ahead of need, torch imported, waiting for a launch on stdin.

    Kept from a node's first ``direct`` launch on (that one starts cold): what it speeds up is a relaunch,
    and workers that never run a ``direct`` job do not pay its import. A ``direct`` launch takes it (the
    ranks are forked from it: no torch import in a resize's relaunch) and becomes an ordinary task process
    (same session, signals, exit code). The next one starts ``delay_s`` after a take: the forked ranks get
    the CPU first, and the replacement (3.6 s of CPU to import torch and torch._dynamo here) must be ready
    for the next resize, which hysteresis (``min_runtime_s``, 10 s) keeps that close. The OMP thread count
    is read when torch loads, so only launches that want what it was started with (OMP_NUM_THREADS=1, the
    launchers' default) take it.

    A supervisor still importing (it writes its pid to ``ready_file`` once done) holds a launch handed to it
    for the rest of its imports. For a torch program that is less than a cold start (a 1-proc ddp_train launched
    0.3-2 s into the imports reported first 0.3-1.9 s after its launch that way, 2.2-3.5 s cold), so a lone
    launch still takes it (``took_importing``, logged). A launch that joins a running member of its
    co-location group does not (``may_wait`` False: it starts cold, counted in ``passed_over``): members take
    turns only while both train, and the second member of a Muri-S pair, launched a heartbeat after the first
    (whose cold launch had set the supervisor off), began training 2-13 s late, once after its mate had
    finished (0 of 250 steps in turn); cold, 0.2-0.4 s late."""

    # torch._dynamo too: the first optimizer a program builds imports it (torch.optim's dynamo guard), 3 s of
    # CPU here, twice torch's own import; neither starts a thread, so the fork stays safe.
    PRELOAD = "torch,torch.distributed,torch._dynamo"
    OMP = "1"

    def __init__(self, python: str, log: Path, delay_s: float = 1.0, preload: str = PRELOAD) -> None:
        self.python, self.log, self.delay_s, self.preload = python, log, delay_s, preload
        self.proc: subprocess.Popen | None = None
        self.not_before = 0.0
        self.wanted = False  # set by the node's first ``direct`` launch: a node that never runs one pays nothing
        self.ready_file = log.with_name(log.name + ".ready")
        self.passed_over = 0  # launches that started cold rather than wait for the supervisor's imports
        self.took_importing = False  # the last take found the supervisor still importing

    def ensure(self) -> None:
        """Start one if none is ready or starting (called from the worker loop)."""
        if not self.wanted:
            return
        if self.proc is not None and self.proc.poll() is not None:  # died untaken (see its log): not in a loop
            log.warning("warm ranks supervisor exited with %s (log %s)", self.proc.returncode, self.log)
            self.proc, self.not_before = None, time.monotonic() + 3 * self.delay_s
        if self.proc is None and time.monotonic() >= self.not_before:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            self.ready_file.unlink(missing_ok=True)
            with open(self.log, "ab") as out:
                self.proc = spawn([self.python, *launchers.RANKS, "--warm", f"--preload={self.preload}",
                                   f"--ready={self.ready_file}"],
                                  dict(os.environ) | {"OMP_NUM_THREADS": self.OMP}, None, out, stdin=subprocess.PIPE)

    def ready(self) -> bool:
        """A supervisor is waiting with its modules imported (the pid it wrote is the one started)."""
        p = self.proc
        if p is None or p.poll() is not None:
            return False
        try:
            return self.ready_file.read_text().strip() == str(p.pid)
        except OSError:
            return False

    def take(self, argv: list[str], env: dict[str, str], cwd: str | None, log: Path,
             may_wait: bool = True) -> subprocess.Popen | None:
        """Hand a ``direct`` launch (``argv`` as ``launchers.direct`` built it) to the supervisor; one still
        importing only if ``may_wait`` (class docstring)."""
        self.wanted = True
        p = self.proc
        if p is None or p.poll() is not None or p.stdin is None or env.get("OMP_NUM_THREADS") != self.OMP \
                or argv[:3] != [self.python, *launchers.RANKS]:
            return None
        self.took_importing = not self.ready()
        if self.took_importing and not may_wait:
            self.passed_over += 1
            return None
        self.ready_file.unlink(missing_ok=True)
        self.proc, self.not_before = None, time.monotonic() + self.delay_s
        try:
            p.stdin.write((json.dumps({"args": argv[3:], "env": env, "cwd": cwd, "log": str(log)}) + "\n").encode())
            p.stdin.close()
        except OSError:  # it died meanwhile: start cold (and reap it)
            p.kill()
            p.wait(timeout=5)
            return None
        return p

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None
        self.ready_file.unlink(missing_ok=True)


def _orphaned_launcher(pid: int) -> bool:
    """True when ``pid`` (a launcher we asked to stop) has no child processes left."""
    try:
        return not any((Path(f"/proc/{pid}/task") / tid / "children").read_text().strip()
                       for tid in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return False


def spare_port(host: str) -> int:
    """A port free on this node right now (the kernel's choice), for the next job's rendezvous."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_LEAVE_NOTICE_S = 5.0  # a leaving worker's retries of its notice after its tasks stopped (see Worker.leave)

class Worker:
    def __init__(self, cfg: WorkerConfig, python: str = sys.executable) -> None:
        # Absolute from the start: a task runs in its job's workdir, where a relative progress-file or
        # log path would name another file (or none).
        self.cfg = dataclasses.replace(cfg, work_dir=cfg.work_dir.resolve())
        self.python = python
        self.tasks: dict[str, Task] = {}
        self.launchers = launchers.available()
        self.interval = 1.0
        self.instance = uuid.uuid4().hex  # this daemon, as against another started with the same name
        self.base_env = task_base_env(os.environ, cfg.token)  # what tasks inherit: no credentials
        self._refused_logged = ""
        self._tls_hinted = False
        self.channel = open_channel(cfg.controller, cfg.tls_ca)
        use_warm = cfg.warm_ranks and "direct" in self.launchers and "torchrun" in self.launchers  # torch here
        self.warm = WarmRanks(python, self.cfg.work_dir / "warm-ranks.log") if use_warm else None
        self.stub = pb_grpc.ControllerStub(self.channel)
        self.md = metadata(cfg.token)
        # The WorkerAgent service: other nodes' launchers (mpirun) start their daemons here through it (no ssh).
        self.agent_server, self.agent_port = worker_agent.serve(
            self.cfg.host, worker_agent.AgentService(cfg.name, cfg.token, self._holder, _pdeathsig_prefix()))
        # horovodrun reaches other hosts by running `ssh` (its ssh check, its gloo ranks): on a job across workers it
        # finds this one first on its PATH, which is the rsh agent under that name.
        self.ssh_shim = rsh_agent.write_ssh_shim(self.cfg.work_dir / "agent-bin", python)

    # ------------------------------------------------------------------------------------- main loop
    def run(self, stop: threading.Event) -> None:
        """Heartbeat every ``interval``, and at once when a task exits or a program's first report arrives:
        those are the steps of a resize (stopped -> replaced -> training again) and each one otherwise
        waited for the next beat. A beat that carried such news is followed up after ``_FOLLOW_UP_S`` to
        fetch what the controller decided on it (a relaunch) without another full interval."""
        registered = False
        backoff = 0.2
        due = 0.0
        reached = time.monotonic()  # the last heartbeat the controller answered (orphan_timeout_s)
        while not stop.is_set():
            news = self._poll()
            if self.warm is not None:
                self.warm.ensure()
            if not news and time.monotonic() < due:
                stop.wait(min(_POLL_S, self.interval))
                continue
            try:
                if not registered:
                    self._register()
                    registered = True
                reply = self.stub.Heartbeat(self._heartbeat(), timeout=10, metadata=self.md)
                for t in self.tasks.values():
                    t.pending.clear()  # delivered
                registered = not reply.reregister
                reached = time.monotonic()
                self._apply(reply)
                backoff = 0.2
                due = time.monotonic() + (_FOLLOW_UP_S if news else self.interval)
                stop.wait(min(_POLL_S, self.interval))
            except grpc.RpcError as e:
                registered = False
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    self._refused(e)
                    stop.wait(_REFUSED_RETRY_S)
                    continue
                if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                                grpc.StatusCode.INVALID_ARGUMENT):
                    log.error("controller refused this worker: %s: %s", e.code().name, e.details())
                elif e.code() == grpc.StatusCode.UNAVAILABLE:
                    self._hint_tls()
                log.info("controller unreachable (%s); retrying in %.1f s", e.code().name, backoff)
                orphan = self.cfg.orphan_timeout_s
                if orphan is not None and time.monotonic() - reached > orphan:
                    # A pilot job must not hold a node for a controller that is gone (not restarted).
                    log.error("controller %s unreachable for %.0f s (orphan_timeout_s %g): leaving",
                              self.cfg.controller, time.monotonic() - reached, orphan)
                    break
                self._rediscover()
                stop.wait(backoff)
                backoff = min(backoff * 2, self.interval * 2)
        self.leave()

    def leave(self) -> None:
        """A graceful stop (SIGTERM, as Slurm stops a job step): say so, checkpoint and stop every task,
        wait for them at most ``stop_grace_s`` (then SIGKILL), report their exits, say goodbye, exit.

        The controller hears of it at once (Leave RPC) rather than after ``worker_timeout_s`` of silence,
        and the jobs stop as preempted (resumed elsewhere from their checkpoint, no restart counted). With
        the controller unreachable the tasks still checkpoint, and the notice is tried again while they stop and
        up to ``_LEAVE_NOTICE_S`` after (a controller restarted meanwhile, as after a kill -9, then hears it:
        found by the harvesting end-to-end test, where a pilot preempted during the restart counted as a failed
        attempt); a controller still away then times the worker out."""
        grace = self.cfg.stop_grace_s
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
        # its tasks have stopped: wait a little more for a controller that is restarting (seconds, after kill -9)
        notice_until = time.time() + min(grace, _LEAVE_NOTICE_S)
        while not said and time.time() < notice_until:
            said = self._say_leave(final=False, timeout=1.0)
            if not said:
                time.sleep(0.2)
        self._deliver()
        self._say_leave(final=True)
        self.shutdown()

    def _rediscover(self) -> None:
        """With an address file: when the controller is unreachable, read it again and reconnect if the address
        changed (the controller restarted on another port: ``listen: HOST:0``)."""
        if self.cfg.address_file is None:
            return
        try:
            address = self.cfg.address_file.read_text().split()[0]
        except (OSError, IndexError):
            return  # not written yet: the controller is starting
        if address != self.cfg.controller:
            log.info("controller moved: %s -> %s (from %s)", self.cfg.controller, address, self.cfg.address_file)
            self.cfg = dataclasses.replace(self.cfg, controller=address)
            self.channel.close()
            self.channel = open_channel(address, self.cfg.tls_ca)
            self.stub = pb_grpc.ControllerStub(self.channel)

    def _hint_tls(self) -> None:
        """Say once why a controller that accepts connections stays unreachable when this worker has no CA: a
        TLS controller closes a plaintext connection, and a worker without ``--tls-ca`` retried forever with no
        hint (issue 15)."""
        if self.cfg.tls_ca is not None or self._tls_hinted:
            return
        host, _, port = self.cfg.controller.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                pass
        except (OSError, ValueError):
            return  # not listening at all: the controller is down or restarting, nothing to hint
        self._tls_hinted = True
        log.error("the controller at %s accepts connections but not this worker's calls: if it talks TLS, start the "
                  "worker with --tls-ca CA.pem (tls_ca: in its YAML)", self.cfg.controller)

    def _refused(self, e: grpc.RpcError) -> None:
        """The controller refused this daemon its name (another live daemon holds it): say so once per reason,
        and stop the tasks it still runs, which the controller counts as the holder's or as lost."""
        why = e.details() or ""
        if why != self._refused_logged:
            log.error("refused by the controller: %s", why)
            self._refused_logged = why
        for tid in list(self.tasks):
            self.kill(tid, checkpoint=False)

    def _say_leave(self, final: bool, timeout: float = 5.0, again: bool = True) -> bool:
        """Whether the controller heard it."""
        try:
            reply = self.stub.Leave(pb.LeaveRequest(worker_id=self.cfg.name, final=final, instance=self.instance),
                                    timeout=timeout, metadata=self.md)
        except grpc.RpcError as e:
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
        self._refused_logged = ""
        log.info("registered with %s as %s (%d slots, %d GPUs of type %s, launchers %s)", self.cfg.controller,
                 self.cfg.name, self.cfg.slots, self.cfg.gpus, self.cfg.gpu_type or "(not advertised)",
                 ",".join(self.launchers))

    def _heartbeat(self) -> pb.HeartbeatRequest:
        req = pb.HeartbeatRequest(worker_id=self.cfg.name, spare_port=spare_port(self.cfg.host),
                                  agent_port=self.agent_port)
        req.instance = self.instance
        for tid, t in self.tasks.items():
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
            done = self.resize_in_place(t.launch.task_id, list(launch.hosts), dict(launch.agents))
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
        reason = _clip(f"cannot start: {why}")
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
        run_dir = self.cfg.work_dir / t.task_id
        run_dir.mkdir(parents=True, exist_ok=True)
        devices = self._devices(t)
        argv, env = launchers.build(t, self.python, ",".join(map(str, devices)))
        if argv is not None and horovod_elastic.size_range(t):  # elastic Horovod: resized in place (issue 6b)
            argv = horovod_elastic.elastic_command(argv, t, run_dir)
            env[rsh_agent.FILE_ENV] = str(run_dir / horovod_elastic.AGENTS)  # follows the job's hosts (issue 18)
        progress = run_dir / "progress.jsonl"
        env["HPCSCHED_PROGRESS_FILE"] = str(progress)
        env["HPCSCHED_TASK_ID"] = t.task_id
        env["HPCSCHED_INTERLEAVE_DIR"] = str(interleave_dir(self.cfg.work_dir, self.cfg.name, t.group or t.job_id))
        if self.cfg.token and t.agents:  # the launcher's rsh agent shows it to the other workers (not the token)
            env[rsh_agent.KEY_ENV] = worker_agent.job_key(self.cfg.token, t.job_id, t.generation)
        if t.agents and t.launcher == "horovodrun":
            env["PATH"] = f"{self.ssh_shim}{os.pathsep}{env.get('PATH') or self.base_env.get('PATH', '')}"
        proc = None
        how = ""
        if t.node_rank == 0:
            ckpt = Path(t.checkpoint_dir)
            bind_checkpoint_dir(ckpt, t.env.get(JOB_UID_ENV, ""))
            ckpt.mkdir(parents=True, exist_ok=True)
            (ckpt / "generation").write_text(f"{t.generation}\n")
        cwd = t.env.get("HPCSCHED_WORKDIR") or None
        if argv is not None and cwd is not None and not os.path.isdir(cwd):
            self._cannot_start(t, f"the job's workdir {cwd} is not a directory on this worker")
            return
        if argv is not None and t.launcher == "direct" and self.warm is not None:
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
                    proc = spawn(argv, self.base_env | env, cwd, out)
                except (OSError, ValueError) as e:
                    self._cannot_start(t, str(e))
                    return
        held = worker_agent.Holder(self.base_env | env, cwd) if argv is None else None
        self.tasks[t.task_id] = Task(t, proc, progress, devices, held=held)
        log.info("launched %s (%s, %d procs%s)", t.task_id, t.launcher, t.nprocs, how if argv else ", holding")

    # --- elastic Horovod in-place resize (issue 6b, logic in horovod_elastic.py): begin ---
    def resize_in_place(self, task_id: str, hosts: list[str], agents: dict[str, str] | None = None) -> bool:
        """Grow or shrink a running elastic Horovod task without stopping it (new ``host:slots`` list, and the
        agents of its hosts when it spans several); False when the task is not one (the caller then stops and
        relaunches it)."""
        t = self.tasks.get(task_id)
        if t is None or t.exit_code is not None or t.proc is None or not horovod_elastic.size_range(t.launch):
            return False
        horovod_elastic.resize(self.cfg.work_dir / task_id, hosts, agents)
        log.info("task %s resized in place to %s", task_id, ",".join(hosts))
        return True
    # --- elastic Horovod in-place resize: end ---

    def _devices(self, t: pb.LaunchTask) -> list[int]:
        """The task's devices: those of a live task of its co-location group (interleaved jobs share them),
        topped up with free ones if it needs more; else free ones."""
        if not self.cfg.gpus:
            return []
        live = [task for task in self.tasks.values() if task.exit_code is None]
        mates = [d for task in live if t.group and task.launch.group == t.group for d in task.devices]
        shared = list(dict.fromkeys(mates))[: t.nprocs]
        busy = {d for task in live for d in task.devices}
        return shared + [d for d in range(self.cfg.gpus) if d not in busy][: t.nprocs - len(shared)]

    def kill(self, task_id: str, checkpoint: bool, grace_s: float = DEFAULT_GRACE_S) -> None:
        t = self.tasks.get(task_id)
        if t is None or t.exit_code is not None:
            return
        t.grace_s = grace_s
        if t.proc is None:
            live = [p for p in (t.held.procs if t.held else ()) if p.poll() is None]
            if checkpoint and live:  # remote ranks here: the launcher on node 0 stops them; _poll waits for it
                t.term_at = t.term_at or time.time()
                return
            for p in live:
                worker_agent.kill_session(p)
            t.exit_code = 0 if checkpoint else -9
            return
        if checkpoint and t.term_at is None:
            t.term_at = time.time()
            with contextlib.suppress(ProcessLookupError):
                t.proc.send_signal(signal.SIGTERM)  # the launcher forwards it; programs checkpoint and exit
        elif not checkpoint or time.time() - t.term_at > t.grace_s:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(t.proc.pid, signal.SIGKILL)

    def _poll(self) -> bool:
        """Read progress and reap exits; True when the controller should hear now (an exit, a first report)."""
        news = False
        for t in self.tasks.values():
            self._read_progress(t)
            news |= any(p.first for p in t.pending)
            if t.exit_code is None and t.proc is None and t.term_at is not None and t.held is not None:
                live = [p for p in t.held.procs if p.poll() is None]
                if not live or time.time() - t.term_at > t.grace_s:
                    for p in live:
                        worker_agent.kill_session(p)
                    t.exit_code, news = 0, True
            if t.exit_code is None and t.proc is not None:
                code = t.proc.poll()
                if code is not None:
                    self._read_progress(t)
                    t.exit_code = code
                    news = True
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(t.proc.pid, signal.SIGKILL)  # leftovers of the tree
                    if code != 0:
                        t.reason = exit_reason(code, self.cfg.work_dir / t.launch.task_id / "output.log")
                        log.warning("task %s %s", t.launch.task_id, t.reason)
                    else:
                        log.info("task %s exited with 0", t.launch.task_id)
                elif t.term_at is not None and (time.time() - t.term_at > t.grace_s or _orphaned_launcher(t.proc.pid)):
                    # Past the grace, or the launcher's programs have checkpointed and gone while the
                    # launcher itself is still tearing down (torchrun: 3-5 s): nothing left to wait for.
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(t.proc.pid, signal.SIGKILL)
        return news

    def _read_progress(self, t: Task) -> None:
        """New complete report lines, at most ``_READ_CHUNK`` bytes a poll (a task may write anything there), and
        at most ``MAX_PENDING`` reports kept per task until a heartbeat delivers them (``thin_reports``): a worker
        cut off from its controller for long kept every report, and the heartbeat that finally carried them passed
        gRPC's 4 MB limit, refused at every retry."""
        try:
            with open(t.progress_path, "rb") as f:
                f.seek(t.offset)
                data = f.read(_READ_CHUNK)
        except OSError:  # not there yet, or made unreadable by the task: no reports, and never the daemon's end
            return
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) == _READ_CHUNK:  # one "line" longer than a chunk: no report, skipped
            log.warning("task %s: progress line over %d bytes skipped", t.launch.task_id, _READ_CHUNK)
            t.offset += len(data)
            return
        t.offset += end
        for line in data[:end].splitlines():
            try:
                d = json.loads(line)
                if not isinstance(d, dict):
                    raise TypeError(f"expected a JSON object, got {type(d).__name__}")
                t.pending.append(pb.Progress(**{k: v for k, v in d.items() if k in _PROGRESS_FIELDS}))
            except (ValueError, TypeError) as e:
                log.warning("task %s: bad progress line %r: %s", t.launch.task_id, line[:80], e)
        if len(t.pending) > MAX_PENDING:
            before = len(t.pending)
            t.pending = thin_reports(t.pending, MAX_PENDING)
            log.warning("task %s: %d progress reports not yet delivered; kept %d (first, done, checkpoints and the "
                        "latest)", t.launch.task_id, before, len(t.pending))

    def shutdown(self) -> None:
        for tid in list(self.tasks):
            self.kill(tid, checkpoint=False)
        self.agent_server.stop(grace=1)
        if self.warm is not None:
            self.warm.close()
        self.channel.close()


MAX_PENDING = 2000  # reports per task awaiting a heartbeat (~100 B each: far below a message's 4 MB)
_READ_CHUNK = 1 << 20  # bytes of a progress file read per poll


def thin_reports(reports: list[pb.Progress], keep: int) -> list[pb.Progress]:
    """At most about ``keep`` reports, in order: every one the controller acts on (a first report, the last
    ``done``, one naming a checkpoint) and the latest of the others; the steps in between are only samples."""
    marked = [i for i, p in enumerate(reports) if p.first or p.done or p.checkpoint]
    room = max(keep // 2, keep - len(marked))
    kept = set(marked[-keep // 2:]) | set(range(max(0, len(reports) - room), len(reports)))
    return [p for i, p in enumerate(reports) if i in kept]


CANNOT_START = 127  # the exit code of a task that never started, as a shell reports a command it cannot run
MAX_REASON_CHARS = 300
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The last line of a Python traceback ("OSError: [Errno 98] Address already in use"): the best one-line reason.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b.*")


def launch_problem(t: pb.LaunchTask) -> str:
    """Why the OS would refuse this task's command line or environment ('' when it would not). The controller
    refuses such job files at submit; this is the worker's own check, as it must not trust what it is sent
    (an older controller, a state file from before the check): Popen raises on them, and that killed the daemon."""
    for k, v in t.env.items():
        if not _ENV_NAME.fullmatch(k):
            return f"environment variable name {k!r} is not a valid name ([A-Za-z_][A-Za-z0-9_]*)"
        if "\0" in v:
            return f"environment variable {k} contains a NUL byte"
    for a in t.command:
        if "\0" in a:
            return f"command argument {a!r} contains a NUL byte"
    if not t.command:
        return "empty command"
    return ""


def exit_reason(code: int, output: Path) -> str:
    """'exited with 1: OSError: [Errno 98] Address already in use': how a task ended and the line of its output
    that most likely says why (a traceback's last line, else the last line), bounded and free of control codes."""
    if code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    elif 128 < code <= 128 + 64:
        try:
            how = f"exited with {code} (a process killed by {signal.Signals(code - 128).name})"
        except ValueError:
            how = f"exited with {code}"
    else:
        how = f"exited with {code}"
    line = _telling_line(output)
    return _clip(f"{how}: {line}" if line else how)


def _telling_line(output: Path) -> str:
    try:
        with open(output, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    own = [ln for ln in lines if not ln.startswith("ranks: ")]  # the program's, not the direct supervisor's
    for ln in reversed(own):
        if _EXCEPTION_LINE.match(ln):
            return ln
    if own:
        return own[-1]
    # Nothing from the program: only the supervisor's "cannot start rank N: why" adds to the exit code.
    start = [ln for ln in lines if ln.startswith("ranks: cannot start")]
    return start[-1].removeprefix("ranks: ") if start else ""


def _clip(text: str) -> str:
    """One printable line of at most MAX_REASON_CHARS (a program's output may hold anything, ANSI codes too)."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def task_base_env(environ: dict[str, str] | os._Environ, token: str | None) -> dict[str, str]:
    """What a task inherits from the worker's environment: everything but credentials (CREDENTIAL_ENV, and any
    variable whose value is the worker's token). Issue 15: the token reached every job's environment, so any job
    could act as a worker."""
    return {k: v for k, v in environ.items() if k not in CREDENTIAL_ENV and not (token and v == token)}


UID_FILE = "job-uid"


def bind_checkpoint_dir(ckpt: Path, uid: str) -> None:
    """Bind a job's checkpoint folder to its uid before its first launch there. A folder holding anything but
    this job's marker (another job's, or files without a marker: a job of a lost state with the same id) is moved
    aside to ``.lost-<name>-<its uid or 'unmarked'>-<time>`` in the same parent, kept for the operator, never
    resumed. ``uid`` empty (a job stored before uids): the folder is used as is."""
    if not uid:
        return
    marker = ckpt / UID_FILE
    try:
        owner = marker.read_text().strip()
    except FileNotFoundError:
        owner = ""
    if owner == uid:
        return
    if ckpt.is_dir() and any(ckpt.iterdir()):
        aside = ckpt.with_name(f".lost-{ckpt.name}-{_safe(owner) if owner else 'unmarked'}-{int(time.time())}")
        os.replace(ckpt, aside)
        log.warning("checkpoint folder %s belonged to another job (%s): moved to %s; job uid %s starts fresh", ckpt,
                    owner or "no uid marker", aside, uid)
    ckpt.mkdir(parents=True, exist_ok=True)
    tmp = ckpt / f".{UID_FILE}.{os.getpid()}.tmp"
    tmp.write_text(uid + "\n")
    os.replace(tmp, marker)


def interleave_dir(work_dir: Path, worker: str, group: str) -> Path:
    """Where the tasks of one co-location group on this worker keep their stage locks: interleaved jobs take
    turns per stage through them (``workloads/_common.StageTurns``); a job alone has them to itself. The
    worker's name keeps workers apart when their work dirs are one path on a shared file system."""
    return work_dir / "interleave" / _safe(worker) / _safe(group)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"
