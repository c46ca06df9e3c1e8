"""A ``direct`` launcher's ranks supervisor started ahead of need (``WarmRanks``): relaunches fork from it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from hpcsched.runtime.launchers.direct import RANKS
from hpcsched.runtime.sandbox import Sandbox

log = logging.getLogger("hpcsched.runtime.worker")

# argv, environment, output -> the supervisor's process, its stdin a pipe (the launch is written there)
Start = Callable[[list[str], dict[str, str], IO[bytes]], subprocess.Popen]


def _plain_start(argv: list[str], env: dict[str, str], out: IO[bytes]) -> subprocess.Popen:
    """Under a task guard as the caller's user, no cgroup (a worker passes its own sandbox's)."""
    return Sandbox.plain().spawn(argv, env, stdout=out, stdin=subprocess.PIPE)


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

    def __init__(self, python: str, log: Path, delay_s: float = 1.0, preload: str = PRELOAD,
                 start: Start | None = None) -> None:
        self.python, self.log, self.delay_s, self.preload = python, log, delay_s, preload
        self.start = start or _plain_start  # how its process starts: the worker's sandbox (its user, its cgroup)
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
                self.proc = self.start([self.python, *RANKS, "--warm", f"--preload={self.preload}",
                                        f"--ready={self.ready_file}"],
                                       dict(os.environ) | {"OMP_NUM_THREADS": self.OMP}, out)

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
        """Hand a ``direct`` launch (``argv`` as ``launchers.direct.build`` built it) to the supervisor; one still
        importing only if ``may_wait`` (class docstring)."""
        self.wanted = True
        p = self.proc
        if p is None or p.poll() is not None or p.stdin is None or env.get("OMP_NUM_THREADS") != self.OMP \
                or argv[:3] != [self.python, *RANKS]:
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
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its guard and the supervisor under it
            self.proc.wait(timeout=5)
        self.proc = None
        self.ready_file.unlink(missing_ok=True)

