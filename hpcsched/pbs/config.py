"""The ``pbs:`` section of a controller file (``node_source: pbs``), validated, and the pilot's job script."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from hpcsched.errors import InputError
from hpcsched.runtime.worker_start import pilot_worker_argv


@dataclass(frozen=True, slots=True)
class PbsConfig:
    """How the controller harvests a PBS Pro cluster's free nodes (``hpcsched.pbs.pilots``)."""

    queue: str | None = None  # the queue pilots go to (qsub -q); None: the server's default
    account: str | None = None  # qsub -A
    walltime_s: int = 3600  # each pilot's -l walltime; its worker leaves leave_before_s before it
    leave_before_s: int = 60
    max_pilots: int = 4
    slots: int = 1  # per pilot's worker (its chunk's ncpus)
    gpus: int = 0  # per pilot's worker (its chunk's ngpus, when > 0)
    stop_grace_s: float = 4.0  # the pilot worker's checkpoint time on SIGTERM (qdel, the walltime)
    orphan_timeout_s: float = 600.0  # a pilot whose controller is unreachable this long leaves
    poll_s: float = 2.0
    start_timeout_s: float = 300.0  # queued longer: deleted (never started)
    register_timeout_s: float = 120.0  # running, but no worker registered by then: deleted (hung)
    settle_s: float = 10.0  # decisions wait at most this long after a pilot started for its worker to register
    idle_release_s: float = 60.0  # a pilot with nothing to run this long, while none is needed, is released
    # Give nodes back to queued batch jobs: while other users' jobs wait for nodes the free ones cannot give them,
    # pilots are deleted (idle ones first) until they can. False: pilots leave only at their walltime or when idle.
    yield_to_queued: bool = True
    work_dir: Path = Path("pilots")  # pilots' logs, work dirs and token file (a shared file system)
    python: str = sys.executable
    worker_config: Path | None = None  # the pilots' worker config file (``--config``): run_as, users, ...
    qsub_args: tuple[str, ...] = ()  # anything else the site needs (-l place=excl, -l filesystems=...)


_KEYS = {f.name for f in fields(PbsConfig)}


def read_pbs_config(data: Any, source: str, line: int | None, base: Path) -> PbsConfig:
    """The ``pbs:`` mapping of a controller file (errors name the file and the section's line)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(source, "pbs: expected a mapping (queue, max_pilots, walltime_s, ...)", line)
    unknown = sorted(str(k) for k in set(data) - _KEYS)
    if unknown:
        raise InputError(source, f"pbs: unknown key {unknown[0]!r}; expected one of {', '.join(sorted(_KEYS))}", line)
    defaults, out = PbsConfig(), {}
    for k, v in data.items():
        want = str if k in ("queue", "account", "python") else type(getattr(defaults, k))
        if k in ("work_dir", "worker_config"):
            if not isinstance(v, str) or not v:
                raise InputError(source, f"pbs: {k}: expected a path, got {v!r}", line)
            p = Path(v).expanduser()
            out[k] = p if p.is_absolute() else base / p
            continue
        if k == "qsub_args":
            if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
                raise InputError(source, f"pbs: qsub_args: expected a list of strings, got {v!r}", line)
            out[k] = tuple(v)
            continue
        if want is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, want) or (want in (int, float) and isinstance(v, bool)):
            raise InputError(source, f"pbs: {k}: expected {want.__name__}, got {v!r}", line)
        if want in (int, float) and v < 0 or k in ("max_pilots", "slots", "walltime_s", "poll_s") and v <= 0:
            raise InputError(source, f"pbs: {k}: must be {'> 0' if v == 0 else '>= 0'}, got {v}", line)
        out[k] = v
    cfg = PbsConfig(**out)
    if cfg.leave_before_s >= cfg.walltime_s:
        raise InputError(source, f"pbs: leave_before_s ({cfg.leave_before_s}) must be below walltime_s "
                                 f"({cfg.walltime_s})", line)
    return cfg


def walltime(seconds: int) -> str:
    """PBS's ``HH:MM:SS``."""
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def pilot_script(cfg: PbsConfig, controller: str, token_file: Path | None, tag: str) -> str:
    """The pilot's job script: one worker named after the PBS job (``pilot-$PBS_JOBID``), run under ``timeout`` so
    it gets SIGTERM ``leave_before_s`` before the walltime and leaves with a checkpoint in time. ``exec``: a
    ``qdel`` (PBS sends SIGTERM to the job's processes, then SIGKILL after its kill_delay) reaches the worker."""
    argv = pilot_worker_argv(cfg.python, controller, cfg.slots, cfg.gpus, cfg.stop_grace_s, cfg.orphan_timeout_s,
                             token_file, cfg.worker_config)
    words = " ".join(shlex.quote(a) for a in argv)
    work = shlex.quote(str(cfg.work_dir))
    return (f"#!/bin/bash\n# hpcsched pilot ({tag}): one worker for the controller at {controller}\n"
            f"exec timeout --preserve-status -s TERM {cfg.walltime_s - cfg.leave_before_s} "
            f'{words} --name "pilot-$PBS_JOBID" --work-dir {work}/"$PBS_JOBID"\n')
