"""The process side of a worker: its ``Task`` records and how they start, are polled, read and killed, as which
user (``TaskControl``, mixed into ``worker.Worker``: one concept, the worker's own tasks, apart from its link to the
controller)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from hpcsched.runtime import task_guard, worker_agent
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.sandbox import Identity, Sandbox, lookup_user, runnable_problem
from hpcsched.runtime.task_report import MAX_PENDING, exit_reason, thin_reports
from hpcsched.runtime.worker_config import WorkerConfig

log = logging.getLogger("hpcsched.runtime.worker")

DEFAULT_GRACE_S = 30.0  # SIGTERM (checkpoint and exit) -> SIGKILL of the whole task tree, unless told otherwise
_PROGRESS_FIELDS = {f.name for f in pb.Progress.DESCRIPTOR.fields}
_READ_CHUNK = 1 << 20  # bytes of a progress file read per poll


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


def spawn(argv: list[str], env: dict[str, str], cwd: str | None, out: IO[bytes], stdin: int = subprocess.DEVNULL
          ) -> subprocess.Popen:
    """Start a task fork-safely under a task guard, as the caller's user and with no cgroup (a worker uses its
    own ``Sandbox``): its own session, its tree killed when it ends or its parent dies."""
    return Sandbox.plain().spawn(argv, env, cwd=cwd, stdin=stdin, stdout=out)

def _orphaned_launcher(guard: int) -> bool:
    """True when the launcher under ``guard`` (one we asked to stop) has no child processes left."""
    return not any(task_guard.descendants_direct(k) for k in task_guard.descendants_direct(guard))


class TaskControl:
    """A worker's tasks (the ``Worker`` sets these attributes)."""

    cfg: WorkerConfig
    tasks: dict[str, Task]
    sandbox: Sandbox
    run_as: Identity | None
    python: str

    def _users(self) -> Identity | None:
        """Check the identities the config names (ValueError naming the key) and say where tasks get the worker's
        own rights; returns the ``run_as`` user."""
        if (self.cfg.run_as or self.cfg.users) and os.getuid() != 0:
            raise ValueError("run_as and users need a worker that runs as root (it switches each task to that user)")
        for owner, local in self.cfg.users.items():
            try:
                lookup_user(local)
            except ValueError as e:
                raise ValueError(f"users: {owner}: {e}") from None
        try:
            run_as = lookup_user(self.cfg.run_as) if self.cfg.run_as else None
        except ValueError as e:
            raise ValueError(f"run_as: {e}") from None
        if os.getuid() == 0 and run_as is None and not self.cfg.users:
            log.warning("this worker runs as root and so would its tasks, able to read its token file and other "
                        "jobs' checkpoints: set run_as (one unprivileged user) or users (owner -> local user) in "
                        "its config (docs/runtime.md, threat model)")
        return run_as

    def _check_task_python(self) -> None:
        """Say at start, once per user, when a task user cannot run the Python tasks run under (``python``): every
        ``direct``, ``torchrun`` and ``horovodrun`` job of that user would fail with "Permission denied"."""
        if os.getuid() != 0:
            return
        names = ([self.cfg.run_as] if self.cfg.run_as else []) + sorted(set(self.cfg.users.values()))
        for name in names:
            problem = runnable_problem(self.python, lookup_user(name))
            if problem:
                log.warning("tasks run as %s cannot run %s (%s): their direct, torchrun and horovodrun jobs and "
                            "their .py commands will fail to start; give the worker a task_python they can run "
                            "(docs/runtime.md, deploying workers)", name, self.python, problem)

    def _warm_start(self, argv: list[str], env: dict[str, str], out: IO[bytes]) -> subprocess.Popen:
        return self.sandbox.spawn(argv, env, stdout=out, stdin=subprocess.PIPE, leaf=f"warm-{uuid.uuid4().hex[:8]}",
                                  user=self.run_as)

    # ------------------------------------------------------------------------------------- main loop
    def _identity(self, t: pb.LaunchTask) -> tuple[Identity | None, str]:
        """Whom the task runs as (None: this worker's own user) or why it may not run here."""
        if not self.cfg.users:
            return self.run_as, ""
        if not t.owner:
            return None, ("the job has no owner (a controller without user tokens) and this worker runs jobs only "
                          "as the local users its config maps owners to (users:)")
        local = self.cfg.users.get(t.owner)
        if local is None:
            return None, f"job owner {t.owner!r} is not in this worker's user map (worker config users:)"
        try:
            return lookup_user(local), ""
        except ValueError as e:
            return None, f"job owner {t.owner!r} maps to {local!r}: {e}"

    # --- elastic Horovod in-place resize (logic in horovod_elastic.py): begin ---
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
                self.sandbox.kill_tree(p)
            self.sandbox.kill_leaf(t.launch.task_id)
            t.exit_code = 0 if checkpoint else -9
            return
        if checkpoint and t.term_at is None:
            t.term_at = time.time()
            with contextlib.suppress(ProcessLookupError):
                t.proc.send_signal(signal.SIGTERM)  # its guard passes it to the launcher; programs checkpoint, exit
        elif not checkpoint or time.time() - t.term_at > t.grace_s:
            self.sandbox.kill(t.proc)

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
                        self.sandbox.kill_tree(p)
                    self.sandbox.kill_leaf(t.launch.task_id)
                    t.exit_code, news = 0, True
            if t.exit_code is None and t.proc is not None:
                code = t.proc.poll()
                if code is not None:
                    self._read_progress(t)
                    t.exit_code = code
                    news = True
                    self.sandbox.kill(t.proc)  # leftovers of the tree (its guard killed them; its cgroup too)
                    self.sandbox.release(t.proc)
                    if code != 0:
                        t.reason = exit_reason(code, self.cfg.work_dir / t.launch.task_id / "output.log")
                        log.warning("task %s %s", t.launch.task_id, t.reason)
                    else:
                        log.info("task %s exited with 0", t.launch.task_id)
                elif t.term_at is not None and (time.time() - t.term_at > t.grace_s or _orphaned_launcher(t.proc.pid)):
                    # Past the grace, or the launcher's programs have checkpointed and gone while the
                    # launcher itself is still tearing down (torchrun: 3-5 s): nothing left to wait for.
                    self.sandbox.kill(t.proc)
        self.sandbox.sweep()
        self.sandbox.refill()
        return news

    def _read_progress(self, t: Task) -> None:
        """New complete report lines, at most ``_READ_CHUNK`` bytes a poll (a task may write anything there), and
        at most ``MAX_PENDING`` reports kept per task until a heartbeat delivers them (``thin_reports``): a worker
        cut off from its controller for long kept every report, and the heartbeat that finally carried them passed
        gRPC's 4 MB limit, refused at every retry."""
        try:
            # never through a link: a task could point it at a file only the worker may read
            with os.fdopen(os.open(t.progress_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
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
