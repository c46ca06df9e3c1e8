"""Helios (SenseTime, SC'21; S-Lab-System-Group/HeliosData) Slurm job logs: ``cluster_log.csv``.

Columns (as released): ``job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,
duration,queue``; some copies carry ``jobname`` after ``vc`` (kept in ``Job.extra``). Times are naive
``YYYY-MM-DD HH:MM:SS`` (read as UTC -> epoch s, the convention of every naive datetime in hpcsched);
``duration`` = end - start and ``queue`` = start - submit, both seconds (a duration that disagrees with
the times by more than a second is counted in ``meta['duration_mismatch']``; the column wins). ``vc`` (the
virtual cluster) becomes ``queue``; ``node_num`` nodes, ``cpu_num`` processors, ``gpu_num`` GPUs.

States: COMPLETED, CANCELLED, FAILED, TIMEOUT as such; NODE_FAIL -> failed (the Helios paper counts it as
failed); RUNNING -> running (censored); PENDING rows never ran: skipped and counted in ``meta['skipped']``.
About half of Helios' jobs use no GPU: CPU-only jobs are skipped and counted (``meta['skipped']['cpu_only']``;
reader option ``cpu_jobs=keep`` keeps them with 0 GPUs). A job without a duration or an end never ran and
is skipped likewise. Models, iterations and stage profiles follow the seeded fill rule of
``hpcsched.traces.synth`` (``jobname`` is free text, never read as a model).

The same layout is what HeliosArtifact writes for its Philly comparison (``philly_trace.csv``), so that
file reads with this format too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.model import Job, JobStatus
from hpcsched.traces.base import CENSORED, MALFORMED_ROW, TraceFormat, TraceReport, count_field, csv_records

COLUMNS = ("job_id", "gpu_num", "state", "submit_time", "start_time", "end_time")
_STATES = {"COMPLETED": JobStatus.COMPLETED, "CANCELLED": JobStatus.CANCELLED, "FAILED": JobStatus.FAILED,
           "TIMEOUT": JobStatus.TIMEOUT, "NODE_FAIL": JobStatus.FAILED, "RUNNING": JobStatus.RUNNING,
           "PENDING": JobStatus.PENDING, "OUT_OF_MEMORY": JobStatus.FAILED, "PREEMPTED": JobStatus.PREEMPTED}


def sniff(first_lines: list[str]) -> bool:
    """Helios' header: job_id, gpu_num, the three times and a vc column (Slurm CSVs have no vc)."""
    line = next((s for s in first_lines if s.strip()), "")
    cols = {c.strip().strip('"') for c in line.split(",")}
    return set(COLUMNS) <= cols and "vc" in cols


def _when(text: str) -> float | None:
    t = text.strip()
    if t in ("", "None", "nan", "NaT", "Unknown"):
        return None
    return datetime.fromisoformat(t).replace(tzinfo=UTC).timestamp()


def _read(path: Path, report: TraceReport) -> Iterator[Job]:
    from hpcsched.traces.synth import DLFill

    cpu = str(report.options.get("cpu_jobs", "skip")).lower()
    if cpu not in ("skip", "keep"):
        raise InputError(report.path, f"option cpu_jobs must be skip|keep, got {cpu!r}")
    keep_cpu = cpu == "keep"
    report.meta["time_base"] = "epoch"
    report.convert("Helios: naive datetimes read as UTC -> epoch s; duration column (s) = run time; vc -> queue")
    report.convert("CPU-only jobs (gpu_num 0) " + ("kept with 0 GPUs" if keep_cpu else "skipped")
                   + "; jobs that never ran skipped; counted in meta 'skipped'")
    skipped: dict[str, int] = report.meta.setdefault("skipped", {"cpu_only": 0, "never_ran": 0})
    report.meta["duration_mismatch"] = 0
    fill = DLFill(report)
    for lineno, row in csv_records(path, COLUMNS, report, what="Helios cluster_log"):
        try:
            jid = row["job_id"].strip()
            if not jid:
                raise ValueError("empty job_id")
            gpus = count_field(row["gpu_num"].strip() or "0", "gpu_num")
            nodes = count_field(row.get("node_num", "").strip() or "0", "node_num")
            procs = count_field(row.get("cpu_num", "").strip() or "0", "cpu_num")
            submit, start, end = _when(row["submit_time"]), _when(row["start_time"]), _when(row["end_time"])
            dur_text = row.get("duration", "").strip()
            duration = float(dur_text) if dur_text not in ("", "nan") else None
            if duration is not None and not math.isfinite(duration):
                raise ValueError(f"duration: not finite: {dur_text!r}")
        except (ValueError, OverflowError) as e:
            report.anomaly(MALFORMED_ROW, lineno, str(e))
            continue
        if submit is None:
            report.anomaly(MALFORMED_ROW, lineno, "submit_time missing: job skipped")
            continue
        status = _STATES.get(row["state"].strip().upper(), JobStatus.UNKNOWN)
        if duration is None and start is not None and end is not None:
            duration = end - start
        elif duration is not None and start is not None and end is not None and abs(end - start - duration) > 1:
            report.meta["duration_mismatch"] += 1
        if status is JobStatus.PENDING or start is None or duration is None:
            skipped["never_ran"] += 1
            continue
        if gpus == 0 and not keep_cpu:
            skipped["cpu_only"] += 1
            continue
        if status is JobStatus.RUNNING:
            report.anomaly(CENSORED, lineno, "running when the log was taken: run time is a lower bound")
        f = fill(jid, duration)
        yield Job(id=jid, submit=submit, nodes=nodes, gpus=gpus, procs=procs, duration=duration, start=start,
                  end=end, iterations=f.iterations, iteration_time=f.iteration_time, profile=f.profile,
                  model=f.model, status=status, user=row.get("user", "").strip() or None,
                  queue=row.get("vc", "").strip() or None,
                  extra={"line": lineno} | ({"jobname": row["jobname"]} if row.get("jobname") else {}))


FORMAT = TraceFormat("helios", "jobs", "Helios (SenseTime) cluster_log.csv, naive datetimes", sniff, _read)
