"""Slurm accounting: ``sacct --parsable2`` (also ``sacct -c``), CSV dumps with sacct names, jobcomp/filetxt.

Three layouts, one mapping to ``Job``: columns are matched by name, case-insensitively, with the
aliases in ``_ALIASES`` (sacct's ``JobID/Submit/Start/End/ElapsedRaw/Timelimit/NNodes/AllocCPUS/
State/NodeList``, the NREL Eagle dump's ``job_id/submit_time/.../wallclock_req/nodes_req``, and
jobcomp's ``JobId/SubmitTime/StartTime/EndTime/TimeLimit/NodeCnt/ProcCnt/JobState/NodeList``).

Units: datetimes (``2019-01-01 08:55:55`` or ``2019-01-01T08:55:55``) are naive local time in every
Slurm output; they are read as if UTC, so differences are exact (except across a DST change) and
``submit`` is epoch-like seconds. ``Timelimit`` strings use Slurm's time format (a bare number is
minutes; ``[D-]HH:MM:SS``); ``TimelimitRaw`` and jobcomp ``TimeLimit`` are minutes; Eagle's
``wallclock_req`` and ``run_time`` are seconds. ``UNLIMITED`` / ``Partition_Limit`` -> no request.
GPUs come from a ``gpus_req`` column or ``gres/gpu[:type]=N`` in AllocTRES/ReqTRES/Tres.

Rows of job steps (``123.batch``, ``123.extern``, ``123.0``) are skipped: the allocation is the job's
(``meta['job_steps_skipped']``). Jobs still RUNNING/PENDING, or without an end, are ``censored``.
Node lists are expanded with ``hostlist.expand_hostlist`` into ``extra['nodelist']``.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.model import Job, JobStatus
from hpcsched.traces.base import (
    CENSORED,
    MALFORMED_ROW,
    UNKNOWN_FIELD,
    TraceFormat,
    TraceReport,
    count_field,
    csv_records,
    numbered_lines,
)
from hpcsched.traces.hostlist import expand_hostlist

__all__ = ["FORMATS", "SACCT_FIELDS", "expand_hostlist", "parse_slurm_duration", "parse_slurm_time"]

# Job field -> column names it may come from (lower case), first present wins.
_ALIASES: dict[str, tuple[str, ...]] = {
    "id": ("jobid", "job_id", "jobidraw"),
    "submit": ("submit", "submit_time", "submittime"),
    "start": ("start", "start_time", "starttime"),
    "end": ("end", "end_time", "endtime"),
    "elapsed_s": ("elapsedraw", "run_time"),
    "elapsed": ("elapsed",),
    "limit_min": ("timelimitraw",),
    "limit": ("timelimit",),
    "limit_s": ("wallclock_req",),
    "nodes": ("nnodes", "allocnodes", "nodes_req", "reqnodes", "nodecnt"),
    "procs": ("alloccpus", "ncpus", "processors_req", "reqcpus", "proccnt"),
    "gpus": ("gpus_req", "allocgpus"),
    "tres": ("alloctres", "tres", "reqtres"),
    "state": ("state", "jobstate"),
    "nodelist": ("nodelist",),
    "user": ("user", "userid"),
    "queue": ("partition",),
}
_STATES = {
    "COMPLETED": JobStatus.COMPLETED,
    "FAILED": JobStatus.FAILED,
    "NODE_FAIL": JobStatus.FAILED,
    "OUT_OF_MEMORY": JobStatus.FAILED,
    "BOOT_FAIL": JobStatus.FAILED,
    "CANCELLED": JobStatus.CANCELLED,
    "TIMEOUT": JobStatus.TIMEOUT,
    "DEADLINE": JobStatus.TIMEOUT,
    "PREEMPTED": JobStatus.PREEMPTED,
    "REQUEUED": JobStatus.PREEMPTED,
    "RUNNING": JobStatus.RUNNING,
    "SUSPENDED": JobStatus.RUNNING,
    "RESIZING": JobStatus.RUNNING,
    "PENDING": JobStatus.PENDING,
}
_MISSING = {"", "unknown", "none", "n/a", "(null)"}
_GPU_TRES = re.compile(r"gres/gpu(?::[^=,]*)?=(\d+)")


def parse_slurm_time(text: str) -> float | None:
    """A Slurm datetime (naive, read as UTC) or epoch number -> seconds; None when unknown."""
    t = text.strip()
    if t.lower() in _MISSING:
        return None
    if t.replace(".", "", 1).isdigit():
        return _finite(t)
    try:
        return datetime.fromisoformat(t).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise ValueError(f"not a date-time: {t!r}") from None


def parse_slurm_duration(text: str, bare_unit_s: float = 60.0) -> float | None:
    """Slurm's time format -> seconds: ``[D-]HH:MM:SS``, ``MM:SS``, ``D-HH[:MM]``, or a bare number
    (minutes by Slurm's convention; ``bare_unit_s`` says otherwise). None for unknown/UNLIMITED."""
    t = text.strip()
    if t.lower() in _MISSING or t.upper() in ("UNLIMITED", "PARTITION_LIMIT", "INFINITE"):
        return None
    days = 0.0
    if "-" in t:
        d, _, t = t.partition("-")
        days = float(d)
    parts = [float(x) for x in t.split(":")] if t else []
    if not parts or len(parts) > 3 or not all(0 <= p < math.inf for p in [*parts, days]):
        raise ValueError(f"not a Slurm duration: {text!r}")
    if days and len(parts) < 3:  # D-HH, D-HH:MM
        parts += [0.0] * (3 - len(parts))
        h, m, s = parts
    elif len(parts) == 3:
        h, m, s = parts
    elif len(parts) == 2:
        h, m, s = 0.0, parts[0], parts[1]
    else:
        return parts[0] * bare_unit_s
    return days * 86400 + h * 3600 + m * 60 + s


def _columns(header: list[str]) -> dict[str, str]:
    """Job field -> the header column that supplies it."""
    lower = {c.strip().lower(): c for c in header}
    out: dict[str, str] = {}
    for key, names in _ALIASES.items():
        for n in names:
            if n in lower:
                out[key] = lower[n]
                break
    return out


def _state(raw: str) -> JobStatus:
    word = raw.strip().split(" ", 1)[0].upper().rstrip("+")  # "CANCELLED by 1000"
    return _STATES.get(word, JobStatus.UNKNOWN)


def _int(text: str | None) -> int | None:
    if text is None or text.strip().lower() in _MISSING:
        return None
    return count_field(text.strip(), "count")


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"not a finite number: {text!r}")
    return v


def _job(row: dict[str, str], cols: dict[str, str], lineno: int, report: TraceReport, jobcomp: bool) -> Job | None:
    """Map one row to a Job; None for a job step (skipped) or a row without id/submit (counted)."""
    def get(key: str) -> str | None:
        c = cols.get(key)
        return row.get(c) if c else None

    jid = (get("id") or "").strip()
    if not jid:
        report.anomaly(MALFORMED_ROW, lineno, "no job id")
        return None
    if "." in jid:  # 123.batch, 123.extern, 123.0: steps inside the job's allocation
        report.meta["job_steps_skipped"] = report.meta.get("job_steps_skipped", 0) + 1
        return None
    status = _state(get("state") or "")
    try:
        submit = parse_slurm_time(get("submit") or "")
        start = parse_slurm_time(get("start") or "")
        end = parse_slurm_time(get("end") or "")
        if (e := get("elapsed_s")) is not None and e.strip().lower() not in _MISSING:
            duration: float | None = _finite(e)
        elif (e := get("elapsed")) is not None:
            duration = parse_slurm_duration(e, bare_unit_s=1.0)
        else:
            duration = end - start if start is not None and end is not None else None
        if (lim := get("limit_s")) is not None:
            requested = parse_slurm_duration(lim, bare_unit_s=1.0)
        elif (lim := get("limit_min")) is not None or (jobcomp and (lim := get("limit")) is not None):
            requested = parse_slurm_duration(lim, bare_unit_s=60.0)
        else:
            requested = parse_slurm_duration(get("limit") or "")
        nodes, procs, gpus = _int(get("nodes")), _int(get("procs")), _int(get("gpus"))
        if gpus is None and (tres := get("tres")):
            gpus = sum(count_field(n, "gres/gpu") for n in _GPU_TRES.findall(tres))
    except ValueError as e:
        report.anomaly(MALFORMED_ROW, lineno, str(e))
        return None
    if submit is None:
        report.anomaly(MALFORMED_ROW, lineno, "submit time unknown: job skipped")
        return None
    extra: dict[str, object] = {"line": lineno}
    raw_list = get("nodelist")
    if raw_list is not None and raw_list.strip().lower() not in _MISSING | {"none assigned"}:
        try:
            names = expand_hostlist(raw_list)
            extra["nodelist"] = tuple(names)
            if nodes is None:
                nodes = len(set(names))
        except ValueError as e:
            report.anomaly(UNKNOWN_FIELD, lineno, f"NodeList: {e}")
    if status in (JobStatus.RUNNING, JobStatus.PENDING) or (start is not None and end is None):
        report.anomaly(CENSORED, lineno, f"job {jid} {status.value} at log end")
        duration = None if end is None else duration
    elif nodes is None:
        report.anomaly(UNKNOWN_FIELD, lineno, "node count")
    if start is None and status not in (JobStatus.PENDING, JobStatus.CANCELLED):  # cancelled while queued: no start
        report.anomaly(UNKNOWN_FIELD, lineno, "start time")
    user = get("user")
    return Job(
        id=jid,
        submit=submit,
        nodes=nodes or 0,
        procs=procs or 0,
        gpus=gpus or 0,
        duration=duration,
        requested=requested,
        start=start,
        end=end,
        status=status,
        user=user.split("(", 1)[0] if user else None,
        queue=get("queue") or None,
        extra=extra,
    )


_TIME_NOTE = "naive Slurm datetimes read as UTC -> epoch s (differences exact)"


def _read_csv(path: Path, report: TraceReport) -> Iterator[Job]:
    report.meta["time_base"] = "epoch"
    report.convert(_TIME_NOTE)
    cols: dict[str, str] | None = None
    for lineno, row in csv_records(path, (), report, what="Slurm CSV"):
        if cols is None:
            cols = _columns(list(row))
            _require(path, cols, lineno - 1)
            if cols.get("nodes", "").lower().startswith("nodes_req"):
                report.convert("nodes = nodes_req (requested; the dump has no allocated count)")
        job = _job(row, cols, lineno, report, jobcomp=False)
        if job is not None:
            yield job


SACCT_FIELDS = "JobID,JobName,Partition,Submit,Start,End,ElapsedRaw,TimelimitRaw,NNodes,NCPUS,AllocTRES,State,NodeList"


def _require(path: Path, cols: dict[str, str], header_line: int) -> None:
    missing = [k for k in ("id", "submit") if k not in cols]
    if missing:
        raise InputError(
            path, f"Slurm accounting without a {' or '.join(missing)} column: a replay needs submit times; "
            f"run sacct --parsable2 -o {SACCT_FIELDS}", max(header_line, 1),
        )


def _read_sacct(path: Path, report: TraceReport) -> Iterator[Job]:
    """``--parsable2`` (``|`` separated, header first) or sacct's fixed-width table (header, dashes)."""
    report.meta["time_base"] = "epoch"
    report.convert(_TIME_NOTE)
    header: list[str] | None = None
    spans: list[tuple[int, int]] | None = None
    cols: dict[str, str] = {}
    pending_header: str | None = None
    seen_any = False
    for lineno, line in numbered_lines(path, report):
        if not line.strip():
            continue
        seen_any = True
        if header is None:
            if "|" in line:
                header = [h.strip() for h in line.rstrip("|").split("|")]
                cols = _columns(header)
                _require(path, cols, lineno)
            elif pending_header is None:
                pending_header = line
            elif set(line.strip()) <= {"-", " "}:
                spans = [(m.start(), m.end()) for m in re.finditer(r"-+", line)]
                header = [pending_header[a:b].strip() for a, b in spans]
                cols = _columns(header)
                _require(path, cols, lineno - 1)
            else:
                raise InputError(path, "not sacct output: no '|' header and no dashes under the header", lineno)
            continue
        if spans is None:
            values = line.split("|")
            if len(values) == len(header) + 1 and values[-1] == "":  # --parsable: trailing '|'
                values.pop()
        else:
            values = [line[a:b + 1].strip() for a, b in spans]
        if len(values) != len(header):
            report.anomaly(MALFORMED_ROW, lineno, f"{len(values)} fields, header has {len(header)}")
            continue
        job = _job(dict(zip(header, values, strict=True)), cols, lineno, report, jobcomp=False)
        if job is not None:
            yield job
    if not seen_any:
        raise InputError(path, "empty file: no sacct header", 1)
    if header is None:
        raise InputError(path, "not sacct output: header without rows or dashes", 1)


_KV = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z_]*)=")


def _key_values(line: str) -> dict[str, str]:
    """``A=1 B=x y C=3`` -> {A: 1, B: 'x y', C: 3}: a value runs to the next `` Key=``."""
    marks = list(_KV.finditer(line))
    out: dict[str, str] = {}
    for m, nxt in zip(marks, [*marks[1:], None], strict=False):
        out.setdefault(m.group(1), line[m.end(): nxt.start() if nxt else len(line)].strip())
    return out


def _read_jobcomp(path: Path, report: TraceReport) -> Iterator[Job]:
    report.meta["time_base"] = "epoch"
    report.convert(_TIME_NOTE)
    report.convert("TimeLimit in minutes -> s")
    seen_any = False
    for lineno, line in numbered_lines(path, report):
        if not line.strip():
            continue
        seen_any = True
        kv = _key_values(line)
        if "JobId" not in kv:
            report.anomaly(MALFORMED_ROW, lineno, "no JobId=")
            continue
        cols = _columns(list(kv))
        if "JobState" in kv:
            cols["state"] = "JobState"
        if "ArrayJobId" in kv and "ArrayTaskId" in kv:
            kv["JobId"] = f"{kv['ArrayJobId']}_{kv['ArrayTaskId']}"
        job = _job(kv, cols, lineno, report, jobcomp=True)
        if job is not None:
            yield job
    if not seen_any:
        raise InputError(path, "empty file: no jobcomp lines", 1)


def _first(lines: list[str]) -> str:
    return next((s for s in lines if s.strip()), "")


def sniff_csv(first_lines: list[str]) -> bool:
    line = _first(first_lines)
    if "," not in line:
        return False
    try:
        cols = _columns(next(csv.reader([line])))
    except csv.Error:
        return False
    return "id" in cols and "submit" in cols and "state" in cols


def sniff_sacct(first_lines: list[str]) -> bool:
    line = _first(first_lines)
    if "|" in line:
        return "id" in _columns(line.split("|"))
    rest = [s for s in first_lines if s.strip()]
    return len(rest) >= 2 and set(rest[1].strip()) <= {"-", " "} and "id" in _columns(line.split())


def sniff_jobcomp(first_lines: list[str]) -> bool:
    line = _first(first_lines).lstrip()
    return line.startswith("JobId=") and " JobState=" in line


FORMATS = (
    TraceFormat("slurm-csv", "jobs", "CSV with sacct field names (e.g. NREL Eagle dump)", sniff_csv, _read_csv),
    TraceFormat("slurm-sacct", "jobs", "sacct --parsable2 / sacct -c output (| separated or table)",
                sniff_sacct, _read_sacct),
    TraceFormat("slurm-jobcomp", "jobs", "Slurm jobcomp/filetxt completion log (Key=Value lines)",
                sniff_jobcomp, _read_jobcomp),
)
