"""Alibaba GPU cluster traces (alibaba/clusterdata): v2023 pods with fractional GPUs, v2020 PAI jobs and tasks.

``alibaba-pod`` -- ``cluster-trace-gpu-v2023/csv/openb_pod_list*.csv`` (headed):
``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,
scheduled_time``, times in seconds from the trace start (relative). One job per pod: submit = creation,
start = scheduled, end = deletion, duration = deletion - scheduled. ``pod_phase`` Succeeded -> completed,
Failed -> failed, Running -> running and counted ``censored`` (its deletion time is the trace end, so its
run time is a lower bound), Pending -> never scheduled: skipped, counted in ``meta['skipped']``.

Fractional GPUs: ``gpu_milli`` < 1000 asks for that share of each of its ``num_gpu`` GPUs (GPU sharing;
in the trace only 1-GPU pods do). The simulator places whole GPUs, so each share is ROUNDED UP to a whole
GPU: the job gets ``num_gpu`` GPUs (reader option ``gpu_fraction``: ``ceil``, the default, or ``drop`` to
skip such pods); either way it is counted in ``meta['fractional_gpu']`` and the GPUs it really asked for
(``num_gpu x gpu_milli / 1000``) are kept in ``Job.extra['gpu_share']``. ``gpu_milli`` outside 0..1000
is a malformed row. Jobs without GPUs
(``num_gpu`` = 0, CPU-only pods) cannot run in a GPU simulator: skipped and counted
(``meta['skipped']['cpu_only']``; option ``cpu_jobs=keep`` keeps them with 0 GPUs).

``alibaba-pai`` -- ``cluster-trace-gpu-v2020`` ``pai_task_table.csv`` (NO header in the originals; a
first line with the column names of ``pai_task_table.header`` is accepted): ``job_name,task_name,
inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type``; ``plan_gpu`` is percent of
one GPU per instance (50 = half a GPU), times are seconds (desensitised, relative). A job is the run of
consecutive rows with the same ``job_name`` (tasks such as ps / worker / evaluator); a job whose rows
are split apart becomes two jobs, the second counted as ``duplicate_id``. GPUs: the job's share
sum(inst_num x plan_gpu / 100) rounded up to whole GPUs (fractions counted and handled as above).
start = earliest task start, end = latest task end. The job table beside it (the same file name with
``pai_job_table`` for ``pai_task_table``, or reader option ``pai_jobs``) is joined when present, for
the submit time (its ``start_time`` is the submission), the job's end, status and user; without it the
submit is the first task start (counted in ``meta['pai_join']``). The join holds one small tuple per job
of the job table in memory (about 200 bytes a job).

``alibaba-pai-job`` -- ``pai_job_table.csv`` on its own (``job_name,inst_id,user,status,start_time,
end_time``, no header): jobs without sizes (GPUs 0, counted in ``meta['gpus_unknown']``) and with the
wait included in the duration; read ``pai_task_table`` for simulation.

Status (PAI): Terminated -> completed, Failed -> failed, Running -> running (censored), Waiting -> pending.
Model, iterations and stage profile follow the seeded fill rule of ``hpcsched.traces.synth``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpcsched.errors import InputError
from hpcsched.model import Job, JobStatus
from hpcsched.traces.base import (
    CENSORED,
    MALFORMED_ROW,
    UNKNOWN_FIELD,
    TraceFormat,
    TraceReport,
    count_field,
    csv_header_is,
    csv_records,
    numbered_lines,
)

# ------------------------------------------------------------------------------------------- shared


def _gpu_policy(report: TraceReport) -> tuple[bool, bool]:
    """(drop fractional-GPU jobs, keep CPU-only jobs) from the reader options, checked."""
    frac = str(report.options.get("gpu_fraction", "ceil")).lower()
    cpu = str(report.options.get("cpu_jobs", "skip")).lower()
    if frac not in ("ceil", "drop") or cpu not in ("skip", "keep"):
        raise InputError(report.path, f"options: gpu_fraction must be ceil|drop (got {frac!r}), "
                                      f"cpu_jobs skip|keep (got {cpu!r})")
    report.convert("fractional GPU (a share of one GPU) -> " + (
        "job skipped" if frac == "drop" else "rounded up to whole GPUs") + "; counted in meta 'fractional_gpu'")
    report.convert("CPU-only jobs (0 GPUs) " + ("kept with 0 GPUs" if cpu == "keep" else
                                                "skipped (a GPU simulator cannot run them)")
                   + "; counted in meta 'skipped'")
    return frac == "drop", cpu == "keep"


def _number(text: str, name: str) -> float | None:
    t = text.strip()
    if t == "" or t.lower() in ("nan", "none", "null"):
        return None
    v = float(t)
    if not math.isfinite(v):
        raise ValueError(f"{name}: not a finite number: {text!r}")
    return v


# -------------------------------------------------------------------------------------- v2023 pods

POD_COLUMNS = ("name", "num_gpu", "gpu_milli", "pod_phase", "creation_time", "deletion_time", "scheduled_time")
_POD_PHASE = {"succeeded": JobStatus.COMPLETED, "failed": JobStatus.FAILED, "running": JobStatus.RUNNING,
              "pending": JobStatus.PENDING}


def _read_pods(path: Path, report: TraceReport) -> Iterator[Job]:
    from hpcsched.traces.synth import DLFill

    report.meta["time_base"] = "relative"
    report.convert("pod: submit = creation_time, start = scheduled_time, end = deletion_time (s, relative); "
                   "duration = deletion - scheduled; Running pods end at the trace end (censored)")
    drop_frac, keep_cpu = _gpu_policy(report)
    skipped: dict[str, int] = report.meta.setdefault("skipped", {"never_scheduled": 0, "cpu_only": 0,
                                                                 "fractional_gpu": 0})
    report.meta["fractional_gpu"] = 0
    fill = DLFill(report)
    for lineno, row in csv_records(path, POD_COLUMNS, report, what="Alibaba v2023 pod list"):
        try:
            name = row["name"].strip()
            if not name:
                raise ValueError("empty pod name")
            num_gpu = count_field(row["num_gpu"].strip() or "0", "num_gpu")
            milli = _number(row["gpu_milli"], "gpu_milli")
            created = _number(row["creation_time"], "creation_time")
            scheduled = _number(row["scheduled_time"], "scheduled_time")
            deleted = _number(row["deletion_time"], "deletion_time")
            cpu_milli = _number(row.get("cpu_milli", ""), "cpu_milli")
            if milli is not None and not 0 <= milli <= 1000:
                raise ValueError(f"gpu_milli: {milli:g} is not in 0..1000")
            if cpu_milli is not None and not 0 <= cpu_milli <= 1e12:
                raise ValueError(f"cpu_milli: {cpu_milli:g} is not plausible")
        except ValueError as e:
            report.anomaly(MALFORMED_ROW, lineno, str(e))
            continue
        if created is None:
            report.anomaly(MALFORMED_ROW, lineno, "creation_time missing: pod skipped")
            continue
        phase = row["pod_phase"].strip().lower()
        if scheduled is None or phase == "pending":
            skipped["never_scheduled"] += 1
            continue
        fractional = num_gpu > 0 and milli is not None and 0 < milli < 1000
        share = num_gpu * (milli / 1000.0 if fractional and milli is not None else 1.0)
        if num_gpu == 0:
            if not keep_cpu:
                skipped["cpu_only"] += 1
                continue
        elif fractional:
            report.meta["fractional_gpu"] += 1
            if drop_frac:
                skipped["fractional_gpu"] += 1
                continue
        status = _POD_PHASE.get(phase, JobStatus.UNKNOWN)
        if deleted is None:
            report.anomaly(UNKNOWN_FIELD, lineno, "deletion_time")
        if status is JobStatus.RUNNING:
            report.anomaly(CENSORED, lineno, "Running at the trace end: run time is a lower bound")
        duration = deleted - scheduled if deleted is not None else None
        f = fill(name, duration)
        yield Job(id=name, submit=created, gpus=num_gpu, procs=math.ceil((cpu_milli or 0) / 1000),
                  duration=duration, start=scheduled, end=deleted, iterations=f.iterations,
                  iteration_time=f.iteration_time, profile=f.profile, model=f.model, status=status,
                  queue=row.get("qos", "").strip() or None,
                  extra={"line": lineno, "gpu_share": share, "gpu_milli": milli,
                         "gpu_spec": row.get("gpu_spec", "").strip() or None})


POD_FORMAT = TraceFormat("alibaba-pod", "jobs", "Alibaba GPU trace v2023 pod list (openb_pod_list, fractional GPUs)",
                         lambda lines: csv_header_is(lines, "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"),
                         _read_pods)


# ------------------------------------------------------------------------------------------ v2020 PAI

JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
TASK_COLUMNS = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time", "plan_cpu", "plan_mem",
                "plan_gpu", "gpu_type")
PAI_STATUS = {"terminated": JobStatus.COMPLETED, "failed": JobStatus.FAILED, "running": JobStatus.RUNNING,
              "waiting": JobStatus.PENDING, "interrupted": JobStatus.FAILED}
_STATUS_WORDS = {"Terminated", "Failed", "Running", "Waiting", "Interrupted"}


def _headerless_sniff(columns: tuple[str, ...]) -> Any:
    def sniff(first_lines: list[str]) -> bool:
        line = next((s for s in first_lines if s.strip()), "")
        fields = [f.strip() for f in line.split(",")]
        if fields[: len(columns)] == list(columns):
            return True
        return len(fields) == len(columns) and fields[3] in _STATUS_WORDS and bool(fields[0])
    return sniff


def _rows(path: Path, columns: tuple[str, ...], report: TraceReport | None,
          what: str) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, {column: text}) of a PAI table, with or without its header line; wrong widths are malformed."""
    width = len(columns)
    first = True
    for lineno, line in numbered_lines(path, report):
        if not line.strip():
            continue
        fields = line.split(",")
        if first:
            first = False
            if [f.strip() for f in fields[:width]] == list(columns):
                continue
        if len(fields) != width:
            if report is not None:
                report.anomaly(MALFORMED_ROW, lineno, f"{len(fields)} fields, a {what} row has {width}")
            continue
        yield lineno, dict(zip(columns, fields, strict=True))
    if first:
        raise InputError(path, f"empty file: no {what} rows", 1)


def _pai_jobs(path: Path) -> dict[str, tuple[float | None, float | None, str, str, str]]:
    """job_name -> (submit, end, status, user, inst_id) of a pai_job_table; bad rows are left out."""
    out: dict[str, tuple[float | None, float | None, str, str, str]] = {}
    for _, row in _rows(path, JOB_COLUMNS, None, "pai_job_table"):
        try:
            out[row["job_name"].strip()] = (_number(row["start_time"], "start_time"), _number(row["end_time"], "end"),
                                            row["status"].strip(), row["user"].strip(), row["inst_id"].strip())
        except ValueError:
            continue
    return out


def _job_table_for(path: Path, report: TraceReport) -> dict[str, tuple[float | None, float | None, str, str, str]]:
    given = report.options.get("pai_jobs")
    other = Path(given) if given else path.with_name(path.name.replace("pai_task_table", "pai_job_table"))
    join = report.meta.setdefault("pai_join", {"jobs_in_job_table": 0, "matched": 0, "submit_from_task_start": 0})
    if other == path or not other.is_file():
        report.convert("no pai_job_table beside the task table: submit = first task start (no queue wait)")
        return {}
    try:
        table = _pai_jobs(other)
    except InputError as e:
        report.meta["pai_job_table_error"] = str(e)
        report.convert(f"pai_job_table {other.name} unreadable ({e.message}): not joined")
        return {}
    join["jobs_in_job_table"] = len(table)
    report.convert(f"joined {other.name}: submit = job start_time (submission), end, status and user from it")
    return table


def _read_pai_tasks(path: Path, report: TraceReport) -> Iterator[Job]:
    report.meta["time_base"] = "relative"
    report.convert("PAI tasks: a job = consecutive rows of one job_name; GPUs = sum(inst_num x plan_gpu / 100); "
                   "start = first task start, end = last task end (s, relative)")
    drop_frac, keep_cpu = _gpu_policy(report)
    skipped: dict[str, int] = report.meta.setdefault("skipped", {"never_started": 0, "no_run_time": 0,
                                                                 "cpu_only": 0, "fractional_gpu": 0})
    report.meta["fractional_gpu"] = 0
    jobs = _job_table_for(path, report)
    from hpcsched.traces.synth import DLFill

    fill = DLFill(report)
    group: list[tuple[int, dict[str, str]]] = []
    for lineno, row in _rows(path, TASK_COLUMNS, report, "pai_task_table"):
        if group and row["job_name"] != group[0][1]["job_name"]:
            job = _pai_job(group, report, jobs, drop_frac, keep_cpu, skipped, fill)
            if job is not None:
                yield job
            group = []
        group.append((lineno, row))
    if group:
        job = _pai_job(group, report, jobs, drop_frac, keep_cpu, skipped, fill)
        if job is not None:
            yield job


def _pai_job(group: list[tuple[int, dict[str, str]]], report: TraceReport, jobs: dict[str, Any], drop_frac: bool,
             keep_cpu: bool, skipped: dict[str, int], fill: Any) -> Job | None:
    lineno = group[0][0]
    name = group[0][1]["job_name"].strip()
    share, cpu = 0.0, 0.0
    starts: list[float] = []
    ends: list[float] = []
    statuses: set[str] = set()
    types: set[str] = set()
    try:
        if not name:
            raise ValueError("empty job_name")
        for _, row in group:
            inst = _number(row["inst_num"], "inst_num") or 0.0
            plan_gpu = _number(row["plan_gpu"], "plan_gpu") or 0.0
            plan_cpu = _number(row["plan_cpu"], "plan_cpu") or 0.0
            if not (0 <= inst <= 1e6 and 0 <= plan_gpu <= 1e6 and 0 <= plan_cpu <= 1e9):
                raise ValueError(f"implausible inst_num {inst:g} / plan_gpu {plan_gpu:g} / plan_cpu {plan_cpu:g}")
            share += inst * plan_gpu / 100.0
            cpu += inst * plan_cpu / 100.0
            s, e = _number(row["start_time"], "start_time"), _number(row["end_time"], "end_time")
            if s is not None and s > 0:
                starts.append(s)
            if e is not None and e > 0:
                ends.append(e)
            statuses.add(row["status"].strip())
            if row["gpu_type"].strip():
                types.add(row["gpu_type"].strip())
    except ValueError as err:
        report.anomaly(MALFORMED_ROW, lineno, str(err))
        return None
    joined = jobs.get(name)
    join = report.meta["pai_join"]
    if not starts:
        skipped["never_started"] += 1
        return None
    start = min(starts)
    if joined is not None:
        submit, end, status_word, user, inst_id = joined
        if submit is None or submit > start:
            submit = start
    else:
        submit, end, user, inst_id = start, None, None, None
        status_word = next((w for w in ("Failed", "Running", "Waiting", "Terminated") if w in statuses), "")
    if end is None or end <= 0:
        end = max(ends) if ends else None
    if end is None or end < start:
        skipped["no_run_time"] += 1
        return None
    gpus = math.ceil(share - 1e-9) if share > 0 else 0
    if gpus == 0:
        if not keep_cpu:
            skipped["cpu_only"] += 1
            return None
    elif abs(share - round(share)) > 1e-9:
        report.meta["fractional_gpu"] += 1
        if drop_frac:
            skipped["fractional_gpu"] += 1
            return None
    status = PAI_STATUS.get(status_word.lower(), JobStatus.UNKNOWN)
    if status is JobStatus.RUNNING:
        report.anomaly(CENSORED, lineno, "running at the trace end: run time is a lower bound")
    join["matched" if joined is not None else "submit_from_task_start"] += 1  # counted for the jobs handed out
    duration = end - start
    f = fill(name, duration)
    return Job(id=name, submit=submit, gpus=gpus, procs=math.ceil(cpu), duration=duration, start=start, end=end,
               iterations=f.iterations, iteration_time=f.iteration_time, profile=f.profile, model=f.model,
               status=status, user=user or None,
               extra={"line": lineno, "tasks": len(group), "gpu_share": share, "gpu_type": ",".join(sorted(types)),
                      "inst_id": inst_id})


def _read_pai_jobs(path: Path, report: TraceReport) -> Iterator[Job]:
    report.meta["time_base"] = "relative"
    report.convert("pai_job_table alone: submit = start_time (submission), end = end_time, duration = end - submit "
                   "(includes the wait); GPUs unknown (0): read pai_task_table for sizes")
    unknown = 0
    report.meta["gpus_unknown"] = 0
    for lineno, row in _rows(path, JOB_COLUMNS, report, "pai_job_table"):
        try:
            name = row["job_name"].strip()
            if not name:
                raise ValueError("empty job_name")
            submit = _number(row["start_time"], "start_time")
            end = _number(row["end_time"], "end_time")
        except ValueError as e:
            report.anomaly(MALFORMED_ROW, lineno, str(e))
            continue
        if submit is None:
            report.anomaly(MALFORMED_ROW, lineno, "start_time (submission) missing: job skipped")
            continue
        status = PAI_STATUS.get(row["status"].strip().lower(), JobStatus.UNKNOWN)
        if end is None or end <= 0:
            end = None
            report.anomaly(CENSORED if status is JobStatus.RUNNING else UNKNOWN_FIELD, lineno, "end_time")
        unknown += 1
        report.meta["gpus_unknown"] = unknown
        yield Job(id=name, submit=submit, duration=end - submit if end is not None else None, end=end, status=status,
                  user=row["user"].strip() or None, extra={"line": lineno, "inst_id": row["inst_id"].strip()})


PAI_FORMAT = TraceFormat("alibaba-pai", "jobs", "Alibaba GPU trace v2020 PAI pai_task_table (joins pai_job_table)",
                         _headerless_sniff(TASK_COLUMNS), _read_pai_tasks)
PAI_JOB_FORMAT = TraceFormat("alibaba-pai-job", "jobs", "Alibaba GPU trace v2020 PAI pai_job_table (no sizes)",
                             _headerless_sniff(JOB_COLUMNS), _read_pai_jobs)
FORMATS = (POD_FORMAT, PAI_FORMAT, PAI_JOB_FORMAT)
