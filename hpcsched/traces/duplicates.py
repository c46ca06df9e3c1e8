"""One job recorded twice: merged, each extra record counted as ``duplicate_job``.

Accounting logs repeat a job in ways that look like two jobs: TORQUE writes some records under the
short id (``6``) and others under the full one (``6.edge.example.org``); ``sacct --duplicates`` and
archives taken at different times repeat a job's row; an array's range row (``123_[5-10]``, the tasks
not started when sacct ran) shares its JobIDRaw with the task that later ran under it. Replayed as two,
such a job holds its nodes twice. A record is the same job when its key (the id without the server
part, or sacct's JobIDRaw) and its start and end are the same; a requeued job's runs differ in their
times and stay apart (each held nodes).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

from hpcsched.model import Job
from hpcsched.traces.base import DUPLICATE_JOB, TraceReport


class SameJob:
    """Remembers (key -> start, end, id, line) of the jobs handed out, to tell a repeated record."""

    def __init__(self, report: TraceReport, why: str) -> None:
        self.report = report
        self.why = why  # what makes two records one job here, for the anomaly's detail
        self.seen: dict[str, tuple[float | None, float | None, str, int]] = {}

    def repeated(self, key: str, start: float | None, end: float | None, jid: str, lineno: int) -> bool:
        """True (counted) when ``key`` with the same start and end was handed out before."""
        prev = self.seen.get(key)
        if prev is not None and prev[0] == start and prev[1] == end and start is not None:
            self.report.anomaly(DUPLICATE_JOB, lineno, f"{jid} repeats {prev[2]} (line {prev[3]}): {self.why}")
            self.report.convert(f"records of one job ({self.why}) merged: each extra record counted as "
                                "duplicate_job and dropped")
            return True
        self.seen[key] = (start, end, jid, lineno)
        return False


_RANGE = re.compile(r"^(\d+)_\[([\d,\-%:]+)\]$")


def array_tasks(jid: str) -> list[str] | None:
    """``123_[1,4-6%2]`` -> ['123_1', '123_4', '123_5', '123_6'] (``%N`` limits concurrency, ``:S`` steps);
    None when ``jid`` is not an array's range row or the range is too large to be a real one."""
    m = _RANGE.match(jid)
    if m is None:
        return None
    base, spec = m.group(1), m.group(2).split("%", 1)[0]
    out: list[str] = []
    for part in spec.split(","):
        lo, _, rest = part.partition("-")
        hi, _, step = rest.partition(":")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (step and not step.isdigit()):
            return None
        a, b, s = int(lo), int(hi) if hi else int(lo), int(step) if step else 1
        if b < a or s < 1 or len(out) + (b - a) // s + 1 > MAX_ARRAY_TASKS:
            return None
        out += [f"{base}_{k}" for k in range(a, b + 1, s)]
    return out


MAX_ARRAY_TASKS = 1_000_001  # Slurm's MaxArraySize tops out at 4,000,001; a larger range is damage


class ArrayRanges:
    """sacct's range rows (``123_[5-10]``: tasks not started when sacct ran), held until the log's end.

    A row of a task with the range row's JobIDRaw (the task that ran under the array's own record) or
    the task ids' own rows replace it; what is left at the end becomes one job per task, never started.
    """

    def __init__(self, report: TraceReport) -> None:
        self.report = report
        self.held: dict[str, tuple[Job, list[str]]] = {}  # key (JobIDRaw) -> the range row, its task ids

    def hold(self, key: str, job: Job) -> bool:
        """Hold ``job`` if it is a range row (True); else False."""
        tasks = array_tasks(job.id)
        if tasks is None:
            return False
        self.held[key] = (job, tasks)
        return True

    def resolve(self, key: str, job: Job, lineno: int) -> None:
        """A task row arrived: a range row held under the same JobIDRaw was this job before it ran."""
        held = self.held.pop(key, None)
        if held is not None:
            rng, _ = held
            self.report.anomaly(DUPLICATE_JOB, lineno, f"array range row {rng.id} (line {rng.extra.get('line')}) "
                                f"resolved to its task {job.id}")

    def rest(self, same: SameJob, ids: set[str]) -> Iterator[Job]:
        """Range rows nothing replaced: one job per task not read as a row of its own (never started)."""
        for key, (rng, tasks) in self.held.items():
            line = rng.extra.get("line")
            if key in same.seen:
                self.report.anomaly(DUPLICATE_JOB, line if isinstance(line, int) else None,
                                    f"array range row {rng.id} resolved to its task {same.seen[key][2]}")
                continue
            self.report.convert("an array's range row (123_[5-10]: tasks not started when sacct ran) becomes one "
                                "job per task, never started")
            for tid in tasks:
                if tid not in ids:
                    yield dataclasses.replace(rng, id=tid, extra={**rng.extra, "array_range": rng.id})
