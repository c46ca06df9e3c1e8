"""What a worker says about its tasks: how one ended (``exit_reason``), why one cannot start (``launch_problem``), and
which progress reports it keeps while its controller is away (``thin_reports``)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from hpcsched.runtime import launchers
from hpcsched.runtime.rpc import pb

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
    if t.launcher not in launchers.names():  # a newer controller's: nothing here knows how to start it
        return f"launcher {t.launcher!r} is not one this worker knows ({', '.join(launchers.names())})"
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
    return clip(f"{how}: {line}" if line else how)


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


def clip(text: str) -> str:
    """One printable line of at most MAX_REASON_CHARS (a program's output may hold anything, ANSI codes too)."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."

