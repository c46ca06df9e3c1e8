"""The Pollux OSDI'21 artifact's workload CSV, as it ships (``simulator/workloads*/workload-<N>.csv``).

Columns ``name,time,application,num_replicas,batch_size``: a job's name, its submission (seconds from the start),
its application (a profile in ``hpcsched.goodput``), and the "TunedJobs" request -- GPUs and global batch size --
that the Tiresias and Optimus baselines run at (Pollux chooses both itself, but for ncf's fixed batch).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from hpcsched.errors import InputError

COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


@dataclass(frozen=True, slots=True)
class PolluxJob:
    """One row of a Pollux workload."""

    name: str
    time: float
    application: str
    num_replicas: int
    batch_size: int


def looks_like_pollux(path: str | Path) -> bool:
    """True when the file's header is the Pollux workload's (extra columns allowed)."""
    try:
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError):
        return False
    return set(COLUMNS) <= {c.strip() for c in header}


def read_pollux_workload(path: str | Path, applications: tuple[str, ...] | None = None) -> list[PolluxJob]:
    """The rows of ``path`` in file order (the simulator's job order). A malformed row, an unknown application
    (when ``applications`` is given) or a repeated name is an :class:`InputError` naming the line."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(p, f"cannot read the workload: {e}") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        raise InputError(p, "empty workload", 1)
    header = [c.strip() for c in rows[0]]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise InputError(p, f"not a Pollux workload: header lacks {', '.join(missing)} (needs {','.join(COLUMNS)})", 1)
    idx = {c: header.index(c) for c in COLUMNS}
    jobs: list[PolluxJob] = []
    seen: set[str] = set()
    for line, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise InputError(p, f"{len(row)} fields but the header has {len(header)}", line)
        name, app = row[idx["name"]].strip(), row[idx["application"]].strip()
        try:
            t = float(row[idx["time"]])
            reps = int(row[idx["num_replicas"]])
            batch = int(row[idx["batch_size"]])
        except ValueError as e:
            raise InputError(p, f"not a number: {e}", line) from None
        if not name or name in seen:
            raise InputError(p, f"job name {name!r} is empty or repeated", line)
        if t < 0 or reps < 1 or batch < 1:
            raise InputError(p, "time must be >= 0, num_replicas and batch_size >= 1", line)
        if applications is not None and app not in applications:
            raise InputError(p, f"unknown application {app!r}; known: {', '.join(applications)}", line)
        seen.add(name)
        jobs.append(PolluxJob(name, t, app, reps, batch))
    if not jobs:
        raise InputError(p, "the workload holds no jobs")
    return jobs
