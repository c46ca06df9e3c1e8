"""A DL trace's jobs, checked for what a simulator needs, every failure an ``InputError`` naming the file and line.

A module of its own, light on imports: ``hpcsched simulate --compat blox`` checks jobs with Blox's rule and must not
import the DL engine for it (a third of that command's start-up), while the engine's runs check with theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.model import Job


def load_checked_jobs(path: str | Path, check: Callable[[Job], object],
                      fmt: str | None = None) -> tuple[list[Job], dict[str, int]]:
    """The trace's jobs and the reader's anomaly counts. Each job needs a GPU, and ``check(job)`` (the simulator's
    own rule for its length, raising ValueError) must accept it."""
    from hpcsched.traces import open_trace

    trace = open_trace(path, fmt)
    if trace.format.kind != "jobs":
        raise InputError(path, f"{trace.format.name} holds {trace.format.kind} records, not jobs")
    jobs = list(trace)
    if not jobs:
        raise InputError(path, "the trace holds no jobs")
    for job in jobs:
        line = job.extra.get("line") if job.extra else None
        line = line if isinstance(line, int) else None
        if job.gpus <= 0:
            raise InputError(path, f"job {job.id}: needs >= 1 GPU to be simulated, got {job.gpus}", line)
        try:
            check(job)
        except ValueError as e:
            raise InputError(path, str(e), line) from None
    return jobs, dict(trace.report.anomalies)
