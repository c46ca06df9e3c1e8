"""Philly-derived DL job CSV as published with Sia (SOSP'23): ``timestamp,duration,num_gpus,gpu_time,cluster``.

``timestamp`` is the submit time as a naive datetime (read as UTC -> epoch seconds, like every naive
datetime in hpcsched), ``duration`` seconds, ``num_gpus`` GPUs, ``cluster`` the virtual cluster
(kept as ``queue``). Rows are not sorted by submit (counted as ``unsorted_submit``) and carry no job
id: a job's id is its data row number (1 = first job), stable for a given file. ``gpu_time`` is
duration x GPUs and only checked.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from hpcsched.model import Job, JobStatus
from hpcsched.traces.base import MALFORMED_ROW, TraceFormat, TraceReport, count_field, csv_header_is, csv_records

COLUMNS = ("timestamp", "duration", "num_gpus")


def _read(path: Path, report: TraceReport) -> Iterator[Job]:
    report.meta["time_base"] = "epoch"
    report.convert("timestamp (naive datetime, read as UTC) -> submit epoch s; id = data row number")
    row_no = 0
    for lineno, row in csv_records(path, COLUMNS, report, what="Philly CSV"):
        row_no += 1
        try:
            submit = datetime.fromisoformat(row["timestamp"].strip()).replace(tzinfo=UTC).timestamp()
            duration = float(row["duration"])
            gpus = count_field(row["num_gpus"], "num_gpus")
        except ValueError as e:
            report.anomaly(MALFORMED_ROW, lineno, str(e))
            continue
        if not math.isfinite(duration):
            report.anomaly(MALFORMED_ROW, lineno, "duration is not finite")
            continue
        yield Job(
            id=str(row_no),
            submit=submit,
            gpus=gpus,
            duration=duration,
            status=JobStatus.COMPLETED,
            queue=(row.get("cluster") or "").strip() or None,
            extra={"line": lineno},
        )


FORMAT = TraceFormat("philly", "jobs", "Philly-derived DL jobs CSV (Sia artifacts)",
                     lambda lines: csv_header_is(lines, *COLUMNS), _read)
