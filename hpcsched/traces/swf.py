"""Standard Workload Format (Parallel Workloads Archive) and the headerless PBS/TORQUE variant.

SWF: 18 whitespace-separated fields per job, ``-1`` = unknown; header lines ``; Key: value``.
1 id, 2 submit (s since ``UnixStartTime``), 3 wait, 4 run time, 5 allocated procs, 6 avg CPU,
7 used memory, 8 requested procs, 9 requested time, 10 requested memory, 11 status, 12 user,
13 group, 14 executable, 15 queue, 16 partition, 17 preceding job, 18 think time.

Every header field SWF 2.2 defines (``HEADER_FIELDS``: Version ... MaxNodes, MaxProcs, UnixStartTime,
TimeZoneString, Queue, Partition, Note) is kept in ``report.meta['swf_header']``: numbers as numbers,
Queue/Partition/Note as lists (one per line), indented continuation lines joined to their field, keys
SWF does not define under ``other``. MaxNodes/MaxProcs give the machine size (``machine_nodes``,
``machine_procs``).

A log that gives no wait at all (every wait -1 in its first 1,000 rows, at least 20 of them, or fewer
when a header line says submit times are start times or waits are unknown) has start = submit for those
rows, each counted as ``unknown_wait`` (flagged, kept), so it can be replayed; option ``swf_waits`` =
``start`` / ``unknown`` decides instead. Elsewhere a -1 wait leaves the start unknown (``unknown_field``).

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
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.model import Job, JobStatus
from hpcsched.traces.base import MALFORMED_ROW, UNKNOWN_FIELD, TraceFormat, TraceReport, numbered_lines
from hpcsched.traces.swf_header import Header, NotKept, header_int

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


TRUNCATED_SHARE = 0.99  # fewer rows than this share of the header's MaxJobs: cut short, not cleaned
UNKNOWN_WAIT = "unknown_wait"  # wait -1 in a log without any wait: start taken as the submit time (kept)
_WAIT_PROBE_ROWS = 1000  # data rows looked at to tell a log without waits from one with a few unknown
_WAIT_MIN_ROWS = 20  # fewer rows, all without a wait, tell nothing unless the header says so
_SAYS_NO_WAITS = re.compile(r"submit\w*\s+times?\s+(?:are|is|=)\s+(?:the\s+|actually\s+)?start|"
                            r"wait\w*(?:\s+times?)?\s+(?:are\s+|is\s+)?(?:unknown|not\s+(?:available|known|recorded))",
                            re.IGNORECASE)


def setup_header(path: Path, report: TraceReport, header: Header) -> tuple[float, float, int]:
    """From the header and options: (time offset, cores per node, unix start) and the stated conversions."""
    max_nodes, max_procs = header_int(path, header, "MaxNodes"), header_int(path, header, "MaxProcs")
    start = header_int(path, header, "UnixStartTime")
    fields = header.meta()
    if fields:
        report.meta["swf_header"] = fields
    if max_nodes:
        report.meta["machine_nodes"] = max_nodes  # the replayer states it as "the log's header"
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


def waits_unknown(path: Path, report: TraceReport) -> bool:
    """Does the log give no wait at all (every wait -1 in its first data rows)? Such logs record start times
    as submit times (their header says so), so ``start = submit`` instead of an unknown start.

    The ``swf_waits`` option decides instead: ``start`` (submit is start) or ``unknown`` (leave them unknown).
    """
    forced = str(report.options.get("swf_waits") or "").lower()
    if forced in ("start", "unknown"):
        return forced == "start"
    seen, says = 0, False
    try:
        for _, line in numbered_lines(path):
            f = line.split()
            if f and f[0].startswith(";"):
                says = says or _SAYS_NO_WAITS.search(line) is not None
                continue
            if len(f) != 18:
                continue
            if f[2] != "-1":
                return False
            seen += 1
            if seen >= _WAIT_PROBE_ROWS:
                break
    except InputError:
        return False  # the main pass reports the damage with its line
    return seen >= _WAIT_MIN_ROWS or (seen > 0 and says)


def _read_swf(path: Path, report: TraceReport) -> Iterator[Job]:
    header = Header()
    unknown: Counter[str] = Counter()
    report.meta.update(unknown_fields=unknown, cancelled_that_ran=0)
    cancelled_ran = 0
    wait_is_start = waits_unknown(path, report)
    if wait_is_start:
        report.meta["waits_unknown"] = True
        report.convert("no wait in the log (every wait -1): start = submit, each such job counted as unknown_wait "
                       "(the log's submit times are start times; swf_waits=unknown keeps starts unknown)")
    setup: tuple[float, float, int] | None = None
    any_text = False
    not_kept = NotKept()
    data_rows = 0
    report.meta["swf_fields_not_kept"] = not_kept.first
    lim, status_of, unknown_status = _LIMIT, _STATUS.get, JobStatus.UNKNOWN
    for lineno, line in numbered_lines(path, report):
        f = line.split()  # the hot loop (450k rows): one split serves the blank, comment and data tests
        if not f:
            continue
        any_text = True
        if f[0][0] == ";":
            if setup is None:
                header.add(line)
            continue
        if setup is None:
            setup = setup_header(path, report, header)
            offset, cpn, _ = setup
            cpn_int = int(cpn) if cpn == int(cpn) else 0
        data_rows += 1
        if len(f) != 18:
            report.anomaly(MALFORMED_ROW, lineno, f"{len(f)} fields, SWF has 18")
            continue
        not_kept.check(f, lineno)
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
        job = _job(f, lineno, offset, cpn, report, unknown, wait_is_start=wait_is_start)
        if job is not None:
            yield job
    if not any_text:
        raise InputError(path, "empty file: no SWF header or jobs", 1)
    if setup is None:
        setup = setup_header(path, report, header)
    report.meta["cancelled_that_ran"] += cancelled_ran
    rows = data_rows
    for key in ("MaxJobs", "MaxRecords"):  # headers that disagree with the body (KTH: 28,490 vs 28,476)
        if key in header:
            report.meta[f"header_{key.lower()}"] = header[key]
    note_truncation(path, header, rows, report)


def note_truncation(path: Path, header: Header, rows: int, report: TraceReport) -> None:
    """A header counting more jobs than the file holds: a truncated download or an excerpt, whose figures
    cover its rows only (a cleaned log drops a few jobs too, so the share is said)."""
    for key in ("MaxJobs", "MaxRecords"):
        said = header_int(path, header, key) if key in header else None
        if said and rows < TRUNCATED_SHARE * said:
            report.note(f"the SWF header says {key} {said:,} but the file holds {rows:,} job rows "
                        f"({100 * rows / said:.3g}%): a truncated file or an excerpt; figures cover these rows only")
            return
        if said and rows < said:
            report.note(f"the SWF header says {key} {said:,}, the file holds {rows:,} job rows ({said - rows:,} fewer, "
                        "as a cleaned log that dropped some)")
            return


def _job(f: list[str], lineno: int, offset: float, cpn: float, report: TraceReport, unknown: Counter[str],
         pbs: bool = False, wait_is_start: bool = False) -> Job | None:
    """One Job from SWF fields, every check made; None (counted) for a row that cannot be a job.

    ``pbs``: the 21-field variant, whose nodes come from field 19 (or the spec in 21), queue from 20.
    ``wait_is_start``: the log has no waits, so a -1 wait means start = submit (counted as ``unknown_wait``).
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
    extra: dict[str, object] = {"line": lineno}
    if wait_is_start and wait == -1:
        wait = 0
        unknown["wait"] += 1
        report.anomaly(UNKNOWN_WAIT, lineno, "wait -1: start = submit")
        extra["wait_unknown"] = True  # so a conversion writes the wait as unknown again, not as 0
    for i, name in _NEEDED:
        if f[i] == "-1" and not (i == 2 and wait_is_start):
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
        extra=extra,
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
