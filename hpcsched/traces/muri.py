"""Muri / Tiresias DL trace CSV (Rivendile/Muri), times in MILLISECONDS.

Columns: job_id,num_gpu,submit_time,iterations,model_name,batch_size,duration,interval,
iteration_time,resource_time_0,resource_time_1,resource_time_2,priority.
resource_time_0/1/2 are the data (CPU+IO), compute (GPU) and network stages of one iteration.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from hpcsched.cluster_spec import read_cluster_spec
from hpcsched.model import ClusterSpec, Job, JobStatus, ResourceProfile
from hpcsched.traces.base import MALFORMED_ROW, TraceFormat, TraceReport, count_field, csv_header_is, csv_rows

COLUMNS = ("job_id", "num_gpu", "submit_time", "iterations", "model_name")
_MS = 1e-3


def sniff(first_lines: list[str]) -> bool:
    return csv_header_is(first_lines, *COLUMNS)


def _ms(text: str) -> float:
    v = float(text) * _MS
    if not math.isfinite(v):
        raise ValueError(f"not a finite time: {text!r}")
    return v


def read(path: Path, report: TraceReport) -> Iterator[Job]:
    report.convert("times in milliseconds -> seconds (x 0.001)")
    report.convert("num_gpu -> gpus; nodes left 0 (placement decides)")
    for lineno, row, idx in csv_rows(path, COLUMNS, report, what="Muri trace"):
        try:
            has_rt = all(f"resource_time_{k}" in idx for k in range(3))
            rt = [_ms(row[idx[f"resource_time_{k}"]]) for k in range(3)] if has_rt else None
            yield Job(
                id=row[idx["job_id"]].strip(),
                submit=_ms(row[idx["submit_time"]]),
                gpus=count_field(row[idx["num_gpu"]], "num_gpu"),
                duration=_ms(row[idx["duration"]]) if "duration" in idx else None,
                iterations=int(float(row[idx["iterations"]])),
                iteration_time=_ms(row[idx["iteration_time"]]) if "iteration_time" in idx else None,
                profile=ResourceProfile(*rt) if rt else None,
                model=row[idx["model_name"]].strip(),
                status=JobStatus.COMPLETED,
                extra={"line": lineno} | {k: row[idx[k]] for k in ("batch_size", "interval", "priority") if k in idx},
            )
        except (ValueError, OverflowError) as e:
            report.anomaly(MALFORMED_ROW, lineno, str(e))


FORMAT = TraceFormat("muri", "jobs", "Muri/Tiresias DL trace CSV (milliseconds)", sniff, read)


CLUSTER_COLUMNS = ("num_switch", "num_node_p_switch", "num_gpu_p_node")


def _read_cluster(path: Path, report: TraceReport) -> Iterator[ClusterSpec]:
    """The one ClusterSpec of a Muri ``cluster_spec/*.csv``, so ``trace inspect`` shows it too."""
    spec = read_cluster_spec(path)
    report.meta.update(machine_nodes=spec.nodes, machine_gpus=spec.gpus)
    yield spec


CLUSTER_FORMAT = TraceFormat(
    "muri-cluster", "cluster", "Muri cluster spec CSV (switches x nodes x GPUs)",
    lambda lines: csv_header_is(lines, *CLUSTER_COLUMNS), _read_cluster,
)
