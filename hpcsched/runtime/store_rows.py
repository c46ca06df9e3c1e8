"""The rows of the controller's state (``store``) as typed records: a job (its spec parsed back from the JSON it is
stored as), an allocation (one task of a job attempt on a worker), a worker; and the column lists they are read
with, positionally."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from hpcsched.runtime.adaptive_batch import parse_batch
from hpcsched.runtime.jobfile import JobSpec

ACTIVE = ("pending", "running", "stopping")
FINAL = ("completed", "failed", "cancelled")


@dataclass(slots=True)
class JobRow:
    """One ``jobs`` row; ``spec`` is parsed back into the JobSpec the user submitted."""

    id: str
    seq: int
    name: str
    spec: JobSpec
    state: str
    procs: int
    target_procs: int
    generation: int
    steps_done: int
    first_loss: float | None
    last_loss: float | None
    ckpt_step: int
    ckpt_path: str | None
    submit_time: float
    start_time: float | None
    end_time: float | None
    restarts: int
    message: str
    stop_reason: str | None
    stop_time: float | None
    last_resize_s: float | None
    executed_s: float
    attained_s: float
    iteration_s: float | None
    data_s: float | None
    compute_s: float | None
    comm_s: float | None
    done: int
    uid: str | None = None  # None: a job stored before uids existed (its checkpoints live under its id alone)
    owner: str | None = None  # who submitted it (the name of their token); None: stored before owners existed
    # The co-location key of its latest attempt (jobs interleaved on the same slots share it; a job alone has its own
    # id), set when the attempt starts. None: never started, or finished before the column existed.
    group: str | None = None


# Quoted: ``group`` is an SQL keyword.
JOB_COLS = ", ".join(f'"{f.name}"' for f in fields(JobRow))
SPEC_AT = [f.name for f in fields(JobRow)].index("spec")


@dataclass(slots=True)
class AllocRow:
    task_id: str
    job_id: str
    generation: int
    worker_id: str
    node_rank: int
    nprocs: int
    state: str  # launching | running | exited
    exit_code: int | None
    launch: bytes  # serialized LaunchTask, resent verbatim if a worker never confirmed it


@dataclass(slots=True)
class WorkerRow:
    id: str
    host: str
    slots: int
    gpus: int
    cpus: int
    launchers: tuple[str, ...]
    registered: float
    alive: bool
    gpu_type: str = ""  # as advertised; "": a worker (or a state file) from before GPU types


# Named, not ``*``: columns added by ``Store._migrate`` follow the first release's, and a row is read positionally.
WORKER_COLS = "id, host, slots, gpus, cpus, launchers, registered, alive, gpu_type"


def worker_row(r: tuple) -> WorkerRow:
    return WorkerRow(r[0], r[1], r[2], r[3], r[4], tuple(x for x in r[5].split(",") if x), r[6], bool(r[7]), r[8] or "")


def spec_to_json(s: JobSpec) -> str:
    return json.dumps({
        "name": s.name, "command": list(s.command), "launcher": s.launcher, "procs": s.procs,
        "min_procs": s.min_procs, "max_procs": s.max_procs, "steps": s.steps, "workdir": s.workdir, "env": s.env,
        "curve_procs": list(s.curve_procs), "curve_rates": list(s.curve_rates), "resize_s": s.resize_s,
        "profile": list(s.profile) if s.profile else None, "gpu_types": list(s.gpu_types), "model": s.model,
    } | ({"batch": s.batch.as_dict()} if s.batch is not None else {}))


def spec_from_json(text: str) -> JobSpec:
    d = json.loads(text)  # rows written before the scaling fields existed simply lack them: defaults
    for k in ("command", "curve_procs", "curve_rates", "profile", "gpu_types"):
        if d.get(k) is not None:
            d[k] = tuple(d[k])
    if d.get("batch") is not None:
        d["batch"] = parse_batch(d["batch"])
    return JobSpec(**d)
