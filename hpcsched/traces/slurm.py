"""Slurm accounting: ``sacct`` output in every layout it prints, CSV dumps with sacct names, jobcomp/filetxt.

sacct (also ``sacct -c``): ``-p`` ('|' after every field), ``-P`` (between fields), ``--delimiter=CHARS``
(tab, ',', multi-character, even letters: found where sacct's field names meet in the header; or given
with the ``delimiter`` option), and the fixed-width table under its ``----`` ruler (values sacct cut at the
column width, marked '+', are counted as ``truncated_field``). A field holding the delimiter (Constraints
``[broadwell|skylake]``, a job name, a comment) or a line break splits its row into too many pieces: the
row is rejoined by the header's column count, extra pieces going back into the free-text columns that can
hold them, and kept only when exactly one reading gives every typed column (ids, dates, durations, counts,
states, node lists) a value of its shape (``repaired_row``, kept; else ``malformed_row``, dropped). Header
problems are named: the delimiter the header seems to use, a header-less ``sacct -n``, a table without
its ruler, a missing JobID or Submit column.

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
from hpcsched.traces.duplicates import ArrayRanges, SameJob
from hpcsched.traces.hostlist import expand_hostlist
from hpcsched.traces.nodeuse import NodeListMachine
from hpcsched.traces.sacct_layout import (
    MAX_CONTINUATION,
    REPAIRED_ROW,
    TRUNCATED_FIELD,
    Layout,
    delimiter_option,
    header_fields,
    headerless_layout,
    is_ruler,
    known_split,
    layout_of,
    parse_columns,
    uniform_split,
)

__all__ = ["FORMATS", "SACCT_FIELDS", "delimiter_option", "expand_hostlist", "parse_slurm_duration", "parse_slurm_time"]

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
        dt = datetime.fromisoformat(t)
    except ValueError:
        raise ValueError(f"not a date-time: {t!r}") from None
    # SLURM_TIME_FORMAT may add an offset (2023-02-21T14:37:02+0100): honour it; naive times read as UTC.
    return (dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)).timestamp()


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
    """"CANCELLED by 1000" -> cancelled; a word the fixed-width table cut short ("OUT_OF_ME+") by its prefix."""
    text = raw.strip()
    word = text.split(" ", 1)[0].upper().rstrip("+")
    status = _STATES.get(word)
    if status is None and text.endswith("+") and len(word) >= 2:
        found = {v for k, v in _STATES.items() if k.startswith(word)}
        status = found.pop() if len(found) == 1 else None
    return status or JobStatus.UNKNOWN


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


def _require(path: Path, cols: dict[str, str], header_line: int, layout: Layout | None = None) -> None:
    missing = [k for k in ("id", "submit") if k not in cols]
    if missing:
        seen = f" ({layout.describe()}: {', '.join(layout.names[:8])}{', ...' if layout.width > 8 else ''})" \
            if layout is not None else ""
        need = " or ".join({"id": "JobID", "submit": "Submit"}[k] for k in missing)
        raise InputError(
            path, f"Slurm accounting header{seen} has no {need} column: a replay needs job ids and submit times; "
            f"run sacct --parsable2 -o {SACCT_FIELDS}", max(header_line, 1),
        )


def _lines_after(first: tuple[int, str], rest: Iterator[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    yield first
    yield from rest


def _read_sacct(path: Path, report: TraceReport) -> Iterator[Job]:
    """Every layout sacct prints (see above); rows with the delimiter inside a field are rejoined by the
    header's column count where exactly one reading fits (``repaired_row``), else counted as malformed."""
    report.meta["time_base"] = "epoch"
    report.convert(_TIME_NOTE)
    given = delimiter_option(report.options.get("delimiter"))
    lines = numbered_lines(path, report)
    head = next(((n, s) for n, s in lines if s.strip()), None)
    if head is None:
        raise InputError(path, "empty file: no sacct header", 1)
    header_line, header = head
    named = report.options.get("columns")
    if named:
        try:
            names = parse_columns(named)
        except ValueError as e:
            raise InputError(path, str(e)) from None
        layout, has_header = headerless_layout(path, header_line, header, names, given)
        cols = _columns(layout.names)
        _require(path, cols, header_line, layout)
        report.convert(f"columns named by --columns ({layout.width}: {', '.join(names[:6])}"
                       f"{', ...' if layout.width > 6 else ''})" + ("; the file's own header line matches them, "
                                                                      "skipped" if has_header else ""))
        second = None if has_header else head
    else:
        second = next(((n, s) for n, s in lines if s.strip()), None)
        layout = layout_of(path, header_line, header, second[1] if second else None, given)
        cols = _columns(layout.names)
        _require(path, cols, header_line, layout)
    report.meta["sacct_layout"] = layout.describe()
    if layout.delimiter is None:
        report.convert("sacct fixed-width table: values cut at the column width ('+') are read as far as they go "
                       "(sacct -P keeps them whole)")
        rows: Iterator[tuple[int, str]] = lines
    else:
        rows = _lines_after(second, lines) if second is not None else lines
    used = sorted({layout.names.index(c) for c in cols.values()})
    state_col = layout.names.index(cols["state"]) if "state" in cols else -1
    pending: tuple[int, str, int] | None = None  # (line, text, lines) of a row cut short by a line break
    width = layout.width
    raw_col = next((c for c in layout.names if c.lower() == "jobidraw"), None)
    same = SameJob(report, "sacct rows of one JobIDRaw with the same start and end (sacct --duplicates, "
                   "archives that overlap)" if raw_col else "sacct rows of one JobID with the same start and end")
    ranges = ArrayRanges(report)
    machine = NodeListMachine()
    ids: set[str] = set()  # array task ids read as rows, so a range row left at the end does not make them twice
    for lineno, line in rows:
        if not line.strip():
            continue
        values = layout.split(line)
        note = ""
        if layout.delimiter is not None:
            if pending is not None:
                start, text, spanned = pending
                pending = None
                if len(values) < width:  # the rest of a field that held a line break
                    joined = text + "\n" + line
                    values = layout.split(joined)
                    if len(values) < width and spanned < MAX_CONTINUATION:
                        pending = (start, joined, spanned + 1)
                        continue
                    lineno, note = start, f"a field spans {spanned + 1} lines"
                else:
                    report.anomaly(MALFORMED_ROW, start, f"{len(layout.split(text))} fields, header has {width}, "
                                   "and the next line does not continue it")
            if len(values) < width and not note:
                pending = (lineno, line, 1)
                continue
            if len(values) > width:
                fixed, why = layout.rejoin(values, used)
                if fixed is None and len(values) == width + 1 and not values[-1].strip():
                    fixed, why = values[:-1], ""  # sacct -p rows under a header without the trailing delimiter
                if fixed is None:
                    report.anomaly(MALFORMED_ROW, lineno, why)
                    continue
                values, note = fixed, "; ".join(x for x in (note, why) if x)
            elif len(values) < width:
                report.anomaly(MALFORMED_ROW, lineno, f"{len(values)} fields, header has {width}")
                continue
        if note:
            report.anomaly(REPAIRED_ROW, lineno, note)
        if layout.delimiter is None:
            for j in used:
                a, b = layout.spans[j]  # type: ignore[index]
                if j != state_col and values[j].endswith("+") and len(values[j]) >= b - a:
                    report.anomaly(TRUNCATED_FIELD, lineno, f"{layout.names[j]} {values[j]!r}")
                    # a cut node list names some of the job's nodes, or a node that does not exist: none kept
                    values[j] = "" if layout.names[j] == cols.get("nodelist") else values[j][:-1]
        row = dict(zip(layout.names, values, strict=True))
        job = _job(row, cols, lineno, report, jobcomp=False)
        if job is None:
            continue
        key = row[raw_col].strip() if raw_col else job.id
        if ranges.hold(key, job):
            continue
        ranges.resolve(key, job, lineno)
        if same.repeated(key, job.start, job.end, job.id, lineno):
            continue
        if "_" in job.id:
            ids.add(job.id)
        machine.add(job)
        yield job
    yield from ranges.rest(same, ids)
    machine.finish(report)
    if pending is not None:
        report.anomaly(MALFORMED_ROW, pending[0], f"{len(layout.split(pending[1]))} fields, header has "
                       f"{layout.width}, at the end of the file")


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
    machine = NodeListMachine()
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
            machine.add(job)
            yield job
    if not seen_any:
        raise InputError(path, "empty file: no jobcomp lines", 1)
    machine.finish(report)


def _first(lines: list[str]) -> str:
    return next((s for s in lines if s.strip()), "")


def sniff_csv(first_lines: list[str]) -> bool:
    """A headed CSV with id, submit and state columns whose unquoted rows have the header's width.

    ``sacct -P --delimiter=,`` looks the same in its header, but its AllocTRES and node lists hold
    unquoted commas: such a file is left to the sacct reader, which rejoins them.
    """
    rest = [s for s in first_lines if s.strip()]
    line = rest[0] if rest else ""
    if "," not in line:
        return False
    try:
        header = next(csv.reader([line]))
    except csv.Error:
        return False
    cols = _columns(header)
    if not ("id" in cols and "submit" in cols and "state" in cols):
        return False
    return all('"' in row or len(row.split(",")) == len(header) for row in rest[1:])


def sniff_sacct(first_lines: list[str]) -> bool:
    """sacct's header: its field names joined by one delimiter (JobID among them), or a table with a ruler."""
    rest = [s for s in first_lines if s.strip()]
    if not rest:
        return False
    line = rest[0]
    if len(rest) >= 2 and is_ruler(rest[1]):
        return "id" in _columns(line.split())
    d = known_split(line)
    if d is None:
        d = "|" if "|" in line else uniform_split(line)
    return d is not None and "id" in _columns(header_fields(line, d)[0])


def sniff_jobcomp(first_lines: list[str]) -> bool:
    line = _first(first_lines).lstrip()
    return line.startswith("JobId=") and " JobState=" in line


FORMATS = (
    TraceFormat("slurm-csv", "jobs", "CSV with sacct field names (e.g. NREL Eagle dump)", sniff_csv, _read_csv),
    TraceFormat("slurm-sacct", "jobs", "sacct output: -p / -P / --delimiter (any, tab included) or fixed-width table",
                sniff_sacct, _read_sacct),
    TraceFormat("slurm-jobcomp", "jobs", "Slurm jobcomp/filetxt completion log (Key=Value lines)",
                sniff_jobcomp, _read_jobcomp),
)
