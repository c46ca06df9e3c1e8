"""Standard Workload Format (Parallel Workloads Archive) and the headerless PBS/TORQUE variant.

SWF: 18 whitespace-separated fields per job, ``-1`` = unknown; header lines ``; Key: value``.
1 id, 2 submit (s since ``UnixStartTime``), 3 wait, 4 run time, 5 allocated procs, 6 avg CPU,
7 used memory, 8 requested procs, 9 requested time, 10 requested memory, 11 status, 12 user,
13 group, 14 executable, 15 queue, 16 partition, 17 preceding job, 18 think time.

The PBS/TORQUE variant (Alea's ``wagap`` log) has no header and 21 fields: field 2 is already an
epoch time, 10 is bytes, 19 is ``{node id per allocated CPU}``, 20 the queue name and 21 the PBS
node spec (``8:ppn=8:x86_64``).

Units: ``submit`` becomes epoch seconds (``UnixStartTime`` + field 2) when the header gives the
time base, else it stays as in the file (``report.meta['time_base']`` says which). Processors
become nodes by ``ceil(procs / cores_per_node)``, cores per node coming from the ``cores_per_node``
option, else ``MaxProcs / MaxNodes`` of the header, else 1; the variant counts the distinct node
ids in field 19 instead. Each conversion is stated in ``report.conversions``.

Anomalies: ``unknown_field`` counts each ``-1`` in the fields a scheduler needs (wait, run time,
allocated and requested procs, requested time, status; per field in ``meta['unknown_fields']``).
Status 1 -> completed, 0 -> failed, 5 -> cancelled, 2 -> preempted (partial, continued later),
3 -> completed, 4 -> failed (last partial run). Cancelled jobs stay in: if they ran they held nodes
(``meta['cancelled_that_ran']`` counts them).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.model import Job, JobStatus
from hpcsched.traces.base import MALFORMED_ROW, UNKNOWN_FIELD, TraceFormat, TraceReport, numbered_lines

_LIMIT = 2.0**53  # above this an SWF number is damage (and no longer exact as a float)
_STATUS = {
    1: JobStatus.COMPLETED,
    0: JobStatus.FAILED,
    5: JobStatus.CANCELLED,
    2: JobStatus.PREEMPTED,
    3: JobStatus.COMPLETED,
    4: JobStatus.FAILED,
}
# 0-based index -> name, for the fields whose -1 is counted as unknown.
_NEEDED = ((2, "wait"), (3, "run_time"), (4, "allocated_procs"), (7, "requested_procs"),
           (8, "requested_time"), (10, "status"))


def _number(text: str) -> float:
    """An SWF number; ValueError for anything that is not a finite one (``inf``, ``nan``, ``1e999``)."""
    try:
        v: float = int(text)
    except ValueError:
        v = float(text)
    if not abs(v) <= _LIMIT:  # also catches inf and nan
        raise ValueError(f"not a plausible SWF number: {text!r}")
    return v


def _header(line: str, meta: dict[str, str]) -> None:
    """``; Key: value`` -> meta[key] = value (first occurrence wins; repeated keys like Queue ignored)."""
    body = line.lstrip(";").strip()
    key, sep, value = body.partition(":")
    if sep and key and " " not in key.strip():
        meta.setdefault(key.strip(), value.strip())


def _header_int(path: Path, header: dict[str, str], key: str) -> int | None:
    if key not in header:
        return None
    try:
        v = int(float(header[key].split()[0]))
    except (ValueError, IndexError, OverflowError):
        raise InputError(path, f"SWF header {key}: {header[key]!r} is not a number") from None
    return v if v > 0 else None


def _setup(path: Path, report: TraceReport, header: dict[str, str]) -> tuple[float, float, int]:
    """From the header and options: (time offset, cores per node, unix start) and the stated conversions."""
    max_nodes, max_procs = _header_int(path, header, "MaxNodes"), _header_int(path, header, "MaxProcs")
    start = _header_int(path, header, "UnixStartTime")
    if max_nodes:
        report.meta["machine_nodes"] = max_nodes
    if max_procs:
        report.meta["machine_procs"] = max_procs
    opt = report.options.get("cores_per_node")
    if opt:
        cpn, why = float(opt), "given with --cores-per-node"
    elif max_nodes and max_procs:
        cpn, why = max_procs / max_nodes, f"MaxProcs {max_procs} / MaxNodes {max_nodes} from the header"
    else:
        cpn, why = 1.0, "assumed: header has no MaxProcs/MaxNodes (use --cores-per-node)"
    report.meta["cores_per_node"] = cpn
    report.convert(f"procs -> nodes = ceil(procs / {cpn:g} cores per node) ({why})")
    if start is not None:
        report.meta["time_base"] = "epoch"
        report.meta["unix_start_time"] = start
        report.convert(f"submit -> epoch s: UnixStartTime {start} + SWF submit")
    else:
        report.meta["time_base"] = "relative"
        report.convert("submit: seconds as in the file (no UnixStartTime header)")
    return float(start or 0), cpn, start or 0


def _read_swf(path: Path, report: TraceReport) -> Iterator[Job]:
    header: dict[str, str] = {}
    unknown: Counter[str] = Counter()
    report.meta.update(unknown_fields=unknown, cancelled_that_ran=0)
    cancelled_ran = 0
    setup: tuple[float, float, int] | None = None
    any_text = False
    lim, status_of, unknown_status = _LIMIT, _STATUS.get, JobStatus.UNKNOWN
    for lineno, line in numbered_lines(path, report):
        f = line.split()  # the hot loop (450k rows): one split serves the blank, comment and data tests
        if not f:
            continue
        any_text = True
        if f[0][0] == ";":
            if setup is None:
                _header(line, header)
            continue
        if setup is None:
            setup = _setup(path, report, header)
            offset, cpn, _ = setup
            cpn_int = int(cpn) if cpn == int(cpn) else 0
        if len(f) != 18:
            report.anomaly(MALFORMED_ROW, lineno, f"{len(f)} fields, SWF has 18")
            continue
        try:  # plain ints and no unknowns need none of the checks in _job
            submit, wait, run, alloc, req_time, status = (
                int(f[1]), int(f[2]), int(f[3]), int(f[4]), int(f[8]), int(f[10]))
        except ValueError:
            submit = -1
        if (0 <= submit < lim and 0 <= wait < lim and 0 <= run < lim and 0 < alloc < lim
                and 0 <= req_time < lim and status >= 0 and f[7] != "-1"):
            start = float(offset + submit + wait)
            if status == 5 and run > 0:
                cancelled_ran += 1
            yield Job(f[0], float(offset + submit), -(-alloc // cpn_int) if cpn_int else math.ceil(alloc / cpn - 1e-9),
                      0, alloc, float(run), float(req_time), start, start + run, None, None, None, None,
                      status_of(status, unknown_status), f[11] if f[11] != "-1" else None,
                      f[14] if f[14] != "-1" else None, {"line": lineno})
            continue
        job = _job(f, lineno, offset, cpn, report, unknown)
        if job is not None:
            yield job
    if not any_text:
        raise InputError(path, "empty file: no SWF header or jobs", 1)
    if setup is None:
        setup = _setup(path, report, header)
    report.meta["cancelled_that_ran"] += cancelled_ran
    for key in ("MaxJobs", "MaxRecords"):  # headers that disagree with the body (KTH: 28,490 vs 28,476)
        if key in header:
            report.meta[f"header_{key.lower()}"] = header[key]


def _job(f: list[str], lineno: int, offset: float, cpn: float, report: TraceReport, unknown: Counter[str],
         pbs: bool = False) -> Job | None:
    """One Job from SWF fields, every check made; None (counted) for a row that cannot be a job.

    ``pbs``: the 21-field variant, whose nodes come from field 19 (or the spec in 21), queue from 20.
    """
    try:
        submit, wait, run, alloc = _number(f[1]), _number(f[2]), _number(f[3]), _number(f[4])
        req_procs, req_time, status = _number(f[7]), _number(f[8]), int(f[10])
        nodes = _pbs_nodes(f[18], f[20]) if pbs else None
    except ValueError as e:
        report.anomaly(MALFORMED_ROW, lineno, str(e))
        return None
    if submit < 0:
        report.anomaly(MALFORMED_ROW, lineno, "submit time unknown (-1): job skipped")
        return None
    submit += offset
    if status == 5 and run > 0:
        report.meta["cancelled_that_ran"] += 1
    queue = f[19 if pbs else 14]
    for i, name in _NEEDED:
        if f[i] == "-1":
            unknown[name] += 1
            report.anomaly(UNKNOWN_FIELD, lineno, name)
    procs = int(alloc) if alloc > 0 else (int(req_procs) if req_procs > 0 else 0)
    if nodes is None:
        nodes = math.ceil(procs / cpn - 1e-9) if procs else 0
    start = float(submit + wait) if wait >= 0 else None
    duration = float(run) if run != -1 else None
    end = start + run if start is not None and run >= 0 else None
    return Job(
        id=f[0],
        submit=float(submit),
        nodes=nodes,
        procs=procs,
        duration=duration,
        requested=float(req_time) if req_time >= 0 else None,
        start=start,
        end=end,
        status=_STATUS.get(status, JobStatus.UNKNOWN),
        user=f[11] if f[11] != "-1" else None,
        queue=queue if queue != "-1" else None,
        extra={"line": lineno},
    )


def _pbs_nodes(cpu_ids: str, nodespec: str) -> int:
    """Distinct node ids in ``{a,a,b}``; else the node count of the PBS spec (``2:ppn=8+1:ppn=4``)."""
    ids = cpu_ids.strip("{}")
    if ids:
        return len(set(ids.split(",")))
    total = 0
    for part in nodespec.split("+"):
        head = part.split(":", 1)[0]
        total += int(head) if head.isdigit() else 1
    return total


def _read_pbs(path: Path, report: TraceReport) -> Iterator[Job]:
    unknown: Counter[str] = Counter()
    report.meta.update(unknown_fields=unknown, cancelled_that_ran=0, time_base="epoch")
    report.convert("submit: epoch s as in the file (field 2)")
    report.convert("nodes = distinct node ids in field 19; procs = allocated procs (field 5)")
    any_text = False
    for lineno, line in numbered_lines(path, report):
        if not line or line.isspace():
            continue
        any_text = True
        f = line.split()
        if len(f) != 21:
            report.anomaly(MALFORMED_ROW, lineno, f"{len(f)} fields, the PBS variant has 21")
            continue
        job = _job(f, lineno, 0.0, 1.0, report, unknown, pbs=True)
        if job is not None:
            yield job
    if not any_text:
        raise InputError(path, "empty file: no jobs", 1)


def _data_lines(first_lines: list[str]) -> list[list[str]]:
    return [s.split() for s in first_lines if s.strip() and not s.lstrip().startswith(";")]


def _numeric(fields: list[str]) -> bool:
    try:
        for x in fields:
            float(x)
    except ValueError:
        return False
    return True


_SWF_KEYS = ("Version:", "Computer:", "Installation:", "MaxJobs:", "MaxRecords:", "UnixStartTime:", "MaxNodes:",
             "MaxProcs:")


def sniff_swf(first_lines: list[str]) -> bool:
    """An SWF header key, or else data rows of 18 numbers."""
    comments = [s.lstrip(" ;") for s in first_lines if s.lstrip().startswith(";")]
    if any(c.startswith(_SWF_KEYS) for c in comments):
        return True
    rows = _data_lines(first_lines)
    return bool(rows) and all(len(r) == 18 and _numeric(r) for r in rows[:5])


def sniff_pbs(first_lines: list[str]) -> bool:
    rows = _data_lines(first_lines)
    return bool(rows) and len(rows) == len([s for s in first_lines if s.strip()]) and all(
        len(r) == 21 and _numeric(r[:18]) and r[18].startswith("{") for r in rows[:5]
    )


FORMAT = TraceFormat("swf", "jobs", "Standard Workload Format (Parallel Workloads Archive), 18 fields",
                     sniff_swf, _read_swf)
PBS_FORMAT = TraceFormat("swf-pbs", "jobs", "headerless 21-field SWF variant from PBS/TORQUE (Alea wagap)",
                         sniff_pbs, _read_pbs)
FORMATS = (FORMAT, PBS_FORMAT)
