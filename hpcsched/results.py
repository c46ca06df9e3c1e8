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

import csv
import json
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcsched.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

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
    """Write ``jobs.csv`` and ``meta.json`` into ``out_dir`` (created if needed); returns the dir.

    Written with the csv module, not pandas, so that a run's process does not import pandas to save its
    results (pandas is most of ``hpcsched simulate``'s start-up); the bytes are those pandas'
    ``to_csv(index=False, float_format="%.6f")`` wrote before (``write_csv``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    row = attrgetter(*COLUMNS)
    write_csv(out / JOBS_FILE, COLUMNS, [row(r) for r in results])
    (out / META_FILE).write_text(json.dumps({"schema": SCHEMA, **meta}, indent=2, default=str) + "\n")
    return out


FLOAT_FORMAT = "%.6f"


def write_csv(path: str | Path, columns: Sequence[str], rows: Sequence[Sequence[Any]], all_float: bool = False) -> None:
    """``pd.DataFrame(rows, columns=columns).to_csv(path, index=False, float_format=FLOAT_FORMAT)``, without pandas.

    Result files are compared byte for byte across versions and tools, so this writes exactly what pandas
    did: each column's type is what pandas would infer from its values (``_column_kind``); a float column
    (any float, or integers with a missing value) is written with ``FLOAT_FORMAT``, an integer column as
    integers, other columns (text, mixed types) with ``str``; missing values (None, NaN) are empty fields.
    ``all_float`` treats every value as a float (a frame built from a float array, like the simulator's
    timeline), which is also the fast path. Quoting is the csv module's minimal quoting with ``\n`` line
    ends, as pandas uses it. tests/test_cli_startup.py compares the bytes with pandas' on random columns.
    """
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(columns)
        if not rows:
            return
        if all_float:
            line = ",".join([FLOAT_FORMAT] * len(columns)) + "\n"
            try:
                text = "".join([line % tuple(r) for r in rows])
            except TypeError:  # a None: the general path writes it as a missing value
                text = "nan"
            if "nan" not in text:  # a NaN is an empty field in pandas' output: the general path
                f.write(text)
                return
        cols = [[r[i] for r in rows] for i in range(len(columns))]
        out = [_format_column(c, "f" if all_float else _column_kind(c)) for c in cols]
        w.writerows(zip(*out, strict=True))


def _missing(v: object) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def _column_kind(values: Sequence[Any]) -> str:
    """The dtype pandas infers for a column built from these Python values: 'i' (int64), 'f' (float64, NaN for
    a missing value), 'b' (bool) or 'o' (object, also an all-missing column). Integers beyond int64, which no
    result holds, are taken as text ('o'): pandas' choice for them depends on what else the column holds."""
    kinds: set[str] = set()
    has_missing = False
    for v in values:
        if _missing(v):
            has_missing = True
        elif isinstance(v, bool):
            kinds.add("b")
        elif isinstance(v, numbers.Integral):
            kinds.add("i" if -(2**63) <= int(v) < 2**63 else "o")
        elif isinstance(v, numbers.Real):
            kinds.add("f")
        else:
            kinds.add("o")
    if kinds and kinds <= {"i", "f"}:
        return "f" if "f" in kinds or has_missing else "i"
    if kinds == {"b"} and not has_missing:
        return "b"
    return "o"


def _format_column(values: Sequence[Any], kind: str) -> list[str]:
    """The strings pandas hands the csv writer for one column of that kind (missing values: '')."""
    if kind == "f":
        fmt = FLOAT_FORMAT
        return ["" if v is None or v != v else fmt % v for v in values]
    if kind == "i" or kind == "b":
        return [str(v) for v in values]
    return ["" if _missing(v) else str(v) for v in values]


def read_results(result_dir: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The jobs table and the run's metadata, checked against the schema."""
    import pandas as pd  # here, not at the top: writing results (every run) must not import pandas

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

