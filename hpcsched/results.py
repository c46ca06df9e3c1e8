"""The per-job results file every run writes and ``hpcsched calc`` reads.

Schema ``hpcsched.jobs/1`` (``RESULT_DIR/jobs.csv``), one row per job, times in seconds:

| column       | meaning                                                        |
|--------------|----------------------------------------------------------------|
| job_id       | the trace's job id                                             |
| submit       | arrival time                                                   |
| start        | first time it ran (empty if it never ran)                      |
| end          | completion time (empty if unfinished when the run stopped)     |
| gpus         | GPUs requested (0 for node-sized jobs)                         |
| nodes        | nodes requested or the largest size it ran at (0 if GPU-sized) |
| gpu_seconds  | GPU-seconds actually held (preemption and resizing counted)    |
| node_seconds | node-seconds actually held                                     |
| status       | completed / unfinished / ...                                   |

Beside it, ``RESULT_DIR/meta.json`` names the run: ``schema``, ``tool`` (simulate, replay,
testbed), ``policy``, ``trace``, ``cluster``, ``capacity_gpus``, ``capacity_nodes`` and, where the
capacity is not constant over time (idle-node harvesting), ``capacity_node_seconds``.
Extra columns and keys may be added; these are never removed or renamed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd

from hpcsched.errors import InputError

SCHEMA = "hpcsched.jobs/1"
JOBS_FILE = "jobs.csv"
META_FILE = "meta.json"


@dataclass(frozen=True, slots=True)
class JobResult:
    job_id: str
    submit: float
    start: float | None
    end: float | None
    gpus: int = 0
    nodes: int = 0
    gpu_seconds: float = 0.0
    node_seconds: float = 0.0
    status: str = "completed"


COLUMNS = tuple(f.name for f in fields(JobResult))


def write_results(out_dir: str | Path, results: Iterable[JobResult], meta: Mapping[str, Any]) -> Path:
    """Write ``jobs.csv`` and ``meta.json`` into ``out_dir`` (created if needed); returns the dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [asdict(r) for r in results]
    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(out / JOBS_FILE, index=False, float_format="%.6f")
    (out / META_FILE).write_text(json.dumps({"schema": SCHEMA, **meta}, indent=2, default=str) + "\n")
    return out


def read_results(result_dir: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The jobs table and the run's metadata, checked against the schema."""
    d = Path(result_dir)
    jobs_path = d / JOBS_FILE if d.is_dir() else d
    if not jobs_path.is_file():
        raise InputError(jobs_path, f"no results file (expected {JOBS_FILE} written by simulate/replay/testbed)")
    meta_path = jobs_path.parent / META_FILE
    meta: dict[str, Any] = {}
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError as e:
            raise InputError(meta_path, f"invalid JSON: {e.msg}", e.lineno) from None
        schema = meta.get("schema", SCHEMA)
        if not str(schema).startswith("hpcsched.jobs/"):
            raise InputError(meta_path, f"unknown results schema {schema!r}")
    try:
        df = pd.read_csv(jobs_path, dtype={"job_id": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise InputError(jobs_path, f"not a results CSV: {e}") from None
    missing = [c for c in ("job_id", "submit", "start", "end") if c not in df.columns]
    if missing:
        raise InputError(jobs_path, f"missing columns {missing}; schema {SCHEMA} needs {list(COLUMNS)}", 1)
    for c in ("submit", "start", "end", "gpus", "nodes", "gpu_seconds", "node_seconds"):
        if c in df.columns:
            bad = pd.to_numeric(df[c], errors="coerce").isna() & df[c].notna()
            if bad.any():
                line = int(bad.to_numpy().nonzero()[0][0]) + 2
                raise InputError(jobs_path, f"column {c} holds a non-number", line)
            df[c] = pd.to_numeric(df[c])
    return df, meta

