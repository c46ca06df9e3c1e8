"""Blox's synthetic Philly-like workload (msr-fiddle/blox ``simulator_simple.py --sim-type trace-synthetic``).

Blox draws its job stream from Python's ``random`` after ``seed(1)``: every job needs 1 GPU, lasts
``60 * 10**U(1.5, 3)`` s (80%) or ``60 * 10**U(3, 4)`` s (20%) -- drawn once per Philly job that passes its
10**1.5..10**4-minute filter, while it parses the ``cluster_job_log`` -- and arrives after a Poisson gap of
``ceil(-ln(1 - U) / L * 3600)`` s, followed by one ``randint(0, 8)`` (its model-zoo pick, unused by the
simulation but it consumes the stream). The Philly log only decides how many jobs pass the filter.

The stream depends on Blox's pickle cache of the parsed jobs in its working directory:

- cache present (every run after the first): the durations are the cache's (drawn right after ``seed(1)``), and
  the arrivals are drawn after a fresh ``seed(1)`` (the same numbers again). This is the default here and needs
  no log.
- no cache (the very first run): the arrivals continue the stream after the parse's draws, so they depend on
  how many jobs pass the filter: give ``cluster_job_log`` (``--cluster-job-log``) to reproduce this case.

Blox reuses the parsed jobs cyclically (job ``i`` has the duration of parsed job ``i mod N``); with a log this
is reproduced, without one the stream assumes ``N`` is larger than the jobs asked for (Blox's 1 GB Philly log
passes ~5,000+ jobs). Written with our own code from Blox's semantics, not its code.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpcsched.errors import InputError

SEED = 1
"""Blox's ``SimulatorRunner.random_seed``; the stream is Blox's only with this seed."""
MODEL_ZOO_CLASSES = 9
"""Models in Blox's default model zoo: each job consumes one ``randint(0, 8)``."""
MIN_S = math.pow(10, 1.5) * 60
MAX_S = math.pow(10, 4) * 60
HEADER = "job_id,num_gpu,submit_time,duration\n"


@dataclass(frozen=True, slots=True)
class BloxJob:
    job_id: int
    gpus: int
    submit: int
    duration: float


def _duration(rng: random.Random) -> float:
    """Blox's Gavel-like length: two draws, in this order."""
    if rng.random() >= 0.8:
        return 60 * (10 ** rng.uniform(3, 4))
    return 60 * (10 ** rng.uniform(1.5, 3))


def _gap(rng: random.Random, jobs_per_hour: float) -> int:
    return math.ceil(-math.log(1.0 - rng.random()) / jobs_per_hour * 60 * 60)


def count_passing(cluster_job_log: str | Path) -> int:
    """How many jobs of a Philly ``cluster_job_log`` (JSON) pass Blox's filter, attempts summed.

    As Blox parses it: attempts with a missing time, a non-positive duration or no GPUs are skipped, and a job
    whose last attempt is skipped is dropped; the kept jobs' summed duration must lie strictly inside
    10**1.5..10**4 minutes.
    """
    path = Path(cluster_job_log)
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(path, f"not a Philly cluster_job_log (JSON): {e}", getattr(e, "lineno", None)) from None
    if not isinstance(data, list):
        raise InputError(path, "not a Philly cluster_job_log: expected a JSON array of jobs")
    n = 0
    fmt = "%Y-%m-%d %H:%M:%S"
    try:
        for j in data:
            attempts = j["attempts"]
            total = 0.0
            for i, a in enumerate(attempts):
                start, end = a["start_time"], a["end_time"]
                if "None" in start or "None" in end:
                    continue
                seconds = (datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds()
                gpus = sum(len(d["gpus"]) for d in a["detail"])
                if seconds <= 0.0 or gpus <= 0:
                    continue
                total += seconds
                if i == len(attempts) - 1 and MIN_S < total < MAX_S:
                    n += 1
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(path, f"job {n}: not in the cluster_job_log schema ({e!r})") from None
    return n


def generate(jobs: int, jobs_per_hour: float, seed: int = SEED, passing: int | None = None) -> list[BloxJob]:
    """The first ``jobs`` jobs of Blox's stream at ``jobs_per_hour``.

    ``passing``: the number of log jobs passing Blox's filter when its pickle cache does NOT exist (its first
    run); None for the cached case.
    """
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    if not jobs_per_hour > 0 or not math.isfinite(jobs_per_hour):
        raise ValueError(f"--jobs-per-hour must be a positive number, got {jobs_per_hour}")
    if passing is not None and passing < 1:
        raise ValueError("the cluster_job_log has no job passing Blox's 10**1.5..10**4-minute filter")
    rng = random.Random(seed)
    cycle = passing if passing is not None else jobs
    durations = [_duration(rng) for _ in range(cycle)]
    if passing is None:
        rng.seed(seed)  # the cache was drawn after seed(1); the arrivals after a fresh seed(1)
    out: list[BloxJob] = []
    submit = 0
    for i in range(jobs):
        submit += _gap(rng, jobs_per_hour)
        rng.randint(0, MODEL_ZOO_CLASSES - 1)
        out.append(BloxJob(i, 1, submit, durations[i % cycle]))
    return out


def write_trace(jobs: list[BloxJob], out: str | Path) -> int:
    """A Tiresias-style CSV (``job_id,num_gpu,submit_time,duration``, seconds; durations as Python's repr, so
    they read back as the very doubles Blox used); returns the bytes written."""
    text = HEADER + "".join(f"{j.job_id},{j.gpus},{j.submit},{j.duration!r}\n" for j in jobs)
    data = text.encode()
    Path(out).write_bytes(data)
    return len(data)
