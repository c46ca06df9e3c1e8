"""The writers of ``hpcsched trace convert``: one per target format, each writing what the matching reader reads
back into the same ``Job``; and the few facts of a job they and the loss check share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import IO, Any

from hpcsched.model import DEFAULT_ITERATION_S, Job, JobStatus
from hpcsched.traces.hostlist import compress_hostlist


def _line(job: Job) -> int | None:
    line = job.extra.get("line") if job.extra else None
    return line if isinstance(line, int) else None


def count_where(jobs: Iterable[Job], pred: Callable[[Job], bool]) -> tuple[int, int | None]:
    """How many jobs ``pred`` holds for, and the source line of the first (None where the reader gave none)."""
    n, first = 0, None
    for j in jobs:
        if pred(j):
            n += 1
            if first is None:
                first = _line(j)
    return n, first


def job_duration(j: Job) -> float | None:
    """The job's run time: recorded, else end - start, else None."""
    if j.duration is not None:
        return j.duration
    if j.start is not None and j.end is not None:
        return j.end - j.start
    return None



def wait_unknown(j: Job) -> bool:
    """The source gave no wait (SWF -1 in a log without waits): the start equals the submit by assumption."""
    return bool(j.extra) and bool(j.extra.get("wait_unknown"))



# ---------------------------------------------------------------------------------------------- numbers
def _num(v: float) -> str:
    """A number as short as it reads back exactly: whole numbers without a fraction."""
    if math.isfinite(v) and v == int(v) and abs(v) < 2**53:
        return str(int(v))
    return repr(float(v))


def _ms(v: float) -> str:
    """Seconds as Muri's milliseconds; a value within a nanosecond of a whole millisecond is written whole, so a
    trace read from whole milliseconds is written back byte for byte."""
    ms = v * 1000.0
    r = round(ms)
    return str(int(r)) if abs(ms - r) < 1e-6 else repr(ms)


def _hms(seconds: float) -> str:
    """``[D-]HH:MM:SS`` (Slurm) for whole seconds; fractional seconds keep their fraction."""
    whole = int(seconds)
    frac = seconds - whole
    d, rest = divmod(whole, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    sec = f"{s:02d}" if not frac else f"{s + frac:09.6f}".rstrip("0")
    return f"{d}-{h:02d}:{m:02d}:{sec}" if d else f"{h:02d}:{m:02d}:{sec}"


def _pbs_hms(seconds: float) -> str:
    """PBS walltime ``HH:MM:SS``, hours unbounded."""
    whole = int(seconds)
    frac = seconds - whole
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    sec = f"{s:02d}" if not frac else f"{s + frac:09.6f}".rstrip("0")
    return f"{h:02d}:{m:02d}:{sec}"


def _iso(t: float) -> str:
    dt = datetime.fromtimestamp(t, UTC).replace(tzinfo=None)
    return dt.isoformat(timespec="seconds" if t == int(t) else "microseconds")


# ------------------------------------------------------------------------------------------------ SWF
_SWF_STATUS = {JobStatus.COMPLETED: 1, JobStatus.FAILED: 0, JobStatus.CANCELLED: 5, JobStatus.PREEMPTED: 2,
               JobStatus.TIMEOUT: 0}


def _cores_per_node(jobs: Sequence[Job], meta: dict[str, Any]) -> int | None:
    """Cores per node under which ``ceil(procs / c) == nodes`` for every job with both, as SWF's reader
    turns processors back into nodes; the source's own value first. None: no single value fits."""
    given = meta.get("cores_per_node")
    candidates: list[int] = []
    if isinstance(given, int | float) and given >= 1 and given == int(given):
        candidates.append(int(given))
    lo, hi = 1.0, math.inf
    for j in jobs:
        if j.procs > 0 and j.nodes > 0:
            lo = max(lo, j.procs / j.nodes)
            if j.nodes > 1:
                hi = min(hi, j.procs / (j.nodes - 1))
    if hi > lo:
        candidates.append(math.ceil(lo))
    for c in candidates:
        if all(-(-j.procs // c) == j.nodes for j in jobs if j.procs > 0 and j.nodes > 0):
            return c
    return None


def _numbering(values: Iterable[str | None]) -> tuple[dict[str, int], bool]:
    """SWF's numeric user/queue fields: numbers kept, names numbered 1.. in order of appearance."""
    names = [v for v in dict.fromkeys(v for v in values if v is not None)]
    if all(v.isdigit() for v in names):
        return {v: int(v) for v in names}, False
    return {v: k for k, v in enumerate(names, 1)}, True


def write_swf(jobs: Sequence[Job], out: IO[str], meta: dict[str, Any], source: str) -> list[str]:
    """SWF 2.2 with a header; jobs in submit order. Returns notes on what changed."""
    notes: list[str] = []
    order = sorted(jobs, key=lambda j: j.submit)
    epoch = meta.get("time_base") == "epoch"
    first = min((j.submit for j in order), default=0.0)
    unix_start = meta.get("unix_start_time")  # an SWF source's own time base, kept where it still fits
    base = (int(unix_start) if isinstance(unix_start, int | float) and unix_start <= first else math.floor(first)) \
        if epoch else 0
    ids_numeric = all(j.id.isdigit() and int(j.id) > 0 for j in order) and len({j.id for j in order}) == len(order)
    if not ids_numeric:
        notes.append("SWF job numbers are counters: jobs renumbered 1..n in submit order (the original id is in "
                     "no SWF field)")
    cpn = _cores_per_node(order, meta)
    if cpn is None:
        cpn = 1
        bad, _ = count_where(order, lambda j: j.procs > 0 and j.nodes > 0 and -(-j.procs // cpn) != j.nodes)
        notes.append(f"no cores-per-node value makes ceil(procs / cores) equal every job's node count: {bad} job(s) "
                     "will read back with nodes = procs")
    users, renamed_users = _numbering(j.user for j in order)
    queues, renamed_queues = _numbering(j.queue for j in order)
    if renamed_users or renamed_queues:
        notes.append("SWF users and queues are numbers: names numbered 1.. in order of appearance")
    machine = meta.get("machine_nodes")
    max_nodes = int(machine) if isinstance(machine, int | float) and machine > 0 else None
    if max_nodes is None and cpn != 1:
        max_nodes = max((j.nodes for j in order), default=0) or None
        notes.append("machine size unknown: MaxNodes is the largest job's, so that MaxProcs / MaxNodes gives the "
                     f"{cpn} cores per node the node counts need")
    swf_header = meta.get("swf_header")
    computer = (swf_header.get("Computer") if isinstance(swf_header, dict) else None) or meta.get("machine_name")
    header = ["Version: 2.2", f"Computer: {computer or 'unknown'}",
              f"Conversion: hpcsched trace convert from {source} ({meta.get('format', '?')})"]
    if epoch:
        header.append(f"UnixStartTime: {base}")
    if max_nodes:
        header += [f"MaxNodes: {max_nodes}", f"MaxProcs: {max_nodes * cpn}"]
    header.append(f"MaxJobs: {len(order)}")
    header.append(f"MaxRecords: {len(order)}")
    if not epoch:
        header.append("Note: submit times as the source gave them (no calendar time base)")
    unknown_waits, _ = count_where(order, wait_unknown)
    if unknown_waits:  # SWF's reader then takes -1 waits as start = submit again, even in a short file
        header.append("Note: submit times are start times where the wait is -1 (the source recorded no wait)")
    out.write("".join(f"; {h}\n" for h in header) + ";\n")
    for k, j in enumerate(order, 1):
        dur = job_duration(j)
        procs = j.procs if j.procs > 0 else j.nodes * cpn
        f = [j.id if ids_numeric else str(k), _num(j.submit - base),
             _num(j.start - j.submit) if j.start is not None and not wait_unknown(j) else "-1",
             _num(dur) if dur is not None and dur >= 0 else "-1",
             str(procs) if procs > 0 else "-1", "-1", "-1", str(procs) if procs > 0 else "-1",
             _num(j.requested) if j.requested is not None and j.requested >= 0 else "-1", "-1",
             str(_SWF_STATUS.get(j.status, -1)),
             str(users[j.user]) if j.user is not None else "-1", "-1", "-1",
             str(queues[j.queue]) if j.queue is not None else "-1", "-1", "-1", "-1"]
        out.write(" ".join(f) + "\n")
    return notes


# ----------------------------------------------------------------------------------------------- Muri
def write_muri(jobs: Sequence[Job], out: IO[str], meta: dict[str, Any], source: str,
               gpus_per_node: int | None = None, rebase: bool = False) -> list[str]:
    """Muri/Tiresias CSV in milliseconds, submit order; duration-only jobs get the simulator's own rule
    (1-s iterations: iterations = ceil(duration), iteration time = duration / iterations)."""
    notes: list[str] = []
    order = sorted(jobs, key=lambda j: j.submit)
    base = min((j.submit for j in order), default=0.0) if rebase else 0.0
    if rebase and base:
        notes.append(f"submit times start at 0 (the source's first submit, {base:.0f}, subtracted)")
    profiles = bool(order) and all(j.profile is not None for j in order)
    if not profiles and any(j.profile is not None for j in order):
        notes.append("stage profiles dropped: Muri CSV needs one for every job or none")
    cols = ["job_id", "num_gpu", "submit_time", "iterations", "model_name", "batch_size", "duration", "interval",
            "iteration_time", *(["resource_time_0", "resource_time_1", "resource_time_2"] if profiles else []),
            "priority"]
    out.write(",".join(cols) + "\n")
    filled = 0
    for j in order:
        gpus = j.gpus if j.gpus > 0 else j.nodes * (gpus_per_node or 0)
        dur = job_duration(j)
        it, n = j.iteration_time, j.iterations
        if n is None or n <= 0:
            filled += 1
            step = it if it and it > 0 else DEFAULT_ITERATION_S
            n = max(1, math.ceil((dur or 0.0) / step))
            it = (dur or 0.0) / n
        elif it is None and dur:
            it = dur / n
        extra = j.extra or {}
        row = [j.id, str(gpus), _ms(j.submit - base), str(n), j.model or "unknown",
               str(extra.get("batch_size", 0)), _ms(dur) if dur is not None else "0", str(extra.get("interval", 0)),
               _ms(it) if it is not None else "0"]
        if profiles:
            row += [_ms(x) for x in j.profile.stages()]  # type: ignore[union-attr]
        row.append(str(extra.get("priority", 0)))
        out.write(",".join(_csv_field(v) for v in row) + "\n")
    if filled:
        notes.append(f"{filled} job(s) had no iterations: the simulator's rule for a duration-only job is written "
                     "out (1-s iterations: iterations = ceil(duration), iteration_time = duration / iterations)")
    if gpus_per_node and any(j.gpus <= 0 for j in order):
        notes.append(f"GPUs = nodes x {gpus_per_node} (--gpus-per-node) for jobs that gave no GPU count")
    return notes


def _csv_field(v: str) -> str:
    return f'"{v.replace(chr(34), chr(34) * 2)}"' if any(c in v for c in ',"\n') else v


# ---------------------------------------------------------------------------------------------- sacct
_SACCT_COLUMNS = ("JobID", "JobName", "Partition", "User", "Submit", "Start", "End", "ElapsedRaw", "Timelimit",
                  "NNodes", "NCPUS", "AllocTRES", "State", "NodeList")
_SACCT_STATE = {JobStatus.COMPLETED: "COMPLETED", JobStatus.FAILED: "FAILED", JobStatus.CANCELLED: "CANCELLED",
                JobStatus.TIMEOUT: "TIMEOUT", JobStatus.PREEMPTED: "PREEMPTED", JobStatus.RUNNING: "RUNNING",
                JobStatus.PENDING: "PENDING", JobStatus.UNKNOWN: "UNKNOWN"}


def _sacct_row(j: Job, safe_id: str) -> list[str]:
    tres = ",".join(p for p in (f"cpu={j.procs}" if j.procs else "", f"node={j.nodes}" if j.nodes else "",
                                f"gres/gpu={j.gpus}" if j.gpus else "") if p)
    nodelist = j.extra.get("nodelist") if j.extra else None
    unfinished = j.status in (JobStatus.RUNNING, JobStatus.PENDING)
    return [safe_id, "", j.queue or "", j.user or "", _iso(j.submit),
            _iso(j.start) if j.start is not None else "Unknown",
            _iso(j.end) if j.end is not None and not unfinished else "Unknown",
            _num(j.duration) if j.duration is not None and not unfinished else "",
            _hms(j.requested) if j.requested is not None and j.requested >= 0 else "",
            str(j.nodes), str(j.procs), tres, _SACCT_STATE[j.status],
            compress_hostlist(nodelist) if isinstance(nodelist, tuple | list) and nodelist else ""]


def write_sacct(jobs: Sequence[Job], out: IO[str], delimiter: str = "|", trailing: bool = False) -> list[str]:
    """``sacct -P`` (``trailing``: ``-p``) with any ``delimiter``, or ``delimiter="table"``: sacct's fixed-width
    table (header, ruler, right-justified values; columns wide enough that nothing is cut)."""
    notes: list[str] = []
    bad = "." + ("" if delimiter == "table" else delimiter) + "\n"
    rows = []
    renamed = 0
    for j in jobs:
        safe = "".join("_" if c in bad or c.isspace() else c for c in j.id)
        renamed += safe != j.id
        row = _sacct_row(j, safe)
        rows.append(row)
    if renamed:
        notes.append(f"{renamed} job id(s) held '.', whitespace or the delimiter (sacct reads 123.batch as a step of "
                     "job 123): those characters became '_'")
    if delimiter == "table":
        widths = [max(len(c), *(len(r[k]) for r in rows)) if rows else len(c) for k, c in enumerate(_SACCT_COLUMNS)]
        out.write(" ".join(c.rjust(w) for c, w in zip(_SACCT_COLUMNS, widths, strict=True)) + " \n")
        out.write(" ".join("-" * w for w in widths) + " \n")
        for r in rows:
            out.write(" ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) + " \n")
        return notes
    end = delimiter if trailing else ""
    out.write(delimiter.join(_SACCT_COLUMNS) + end + "\n")
    for r in rows:
        out.write(delimiter.join(r) + end + "\n")
    return notes


# ------------------------------------------------------------------------------------------------ PBS
def _pbs_time(t: float) -> str:
    return datetime.fromtimestamp(math.floor(t), UTC).strftime("%m/%d/%Y %H:%M:%S")


def _pbs_value(v: str) -> str:
    return f'"{v}"' if any(c.isspace() for c in v) or v == "" else v


def write_pbs(jobs: Sequence[Job], out: IO[str], meta: dict[str, Any], source: str) -> list[str]:
    """PBS Pro accounting records in time order, record times in UTC: Q (+ D) for jobs that never started,
    Q + S for running ones, an E record (after a D for cancelled ones) for every job that ran."""
    notes: list[str] = []
    events: list[tuple[float, int, str]] = []
    renamed = 0
    for seq, j in enumerate(jobs):
        jid = "".join("_" if c in ";" or c.isspace() else c for c in j.id)
        if (jid[:1] in ("R", "S", "M") and jid[1:2].isdigit()) or jid.split(".", 1)[0].endswith("[]"):
            jid = "J" + jid  # reservation-like or array-parent ids would be skipped when read back
        renamed += jid != j.id
        common = [f"user={_pbs_value(j.user)}" if j.user else "", f"queue={_pbs_value(j.queue)}" if j.queue else "",
                  f"ctime={_num(j.submit)}", f"qtime={_num(j.submit)}", f"etime={_num(j.submit)}"]
        if j.start is None:
            events.append((j.submit, seq, f"{_pbs_time(j.submit)};Q;{jid};queue={_pbs_value(j.queue or 'workq')}"))
            if j.status is JobStatus.CANCELLED:
                events.append((j.submit, seq, f"{_pbs_time(j.submit)};D;{jid};requestor=hpcsched"))
            continue
        nodelist = j.extra.get("nodelist") if j.extra else None
        res = [f"start={_num(j.start)}"]
        if isinstance(nodelist, tuple | list) and nodelist and len(nodelist) == j.nodes:
            res.append("exec_host=" + "+".join(f"{h}/0" for h in nodelist))
        res += [f"Resource_List.ncpus={j.procs}" if j.procs else "", f"Resource_List.ngpus={j.gpus}" if j.gpus else "",
                f"Resource_List.nodect={j.nodes}" if j.nodes else "",
                f"Resource_List.walltime={_pbs_hms(j.requested)}" if j.requested is not None else ""]
        events.append((j.submit, seq, f"{_pbs_time(j.submit)};Q;{jid};queue={_pbs_value(j.queue or 'workq')}"))
        if j.status is JobStatus.RUNNING:
            events.append((j.start, seq, f"{_pbs_time(j.start)};S;{jid};" + " ".join(p for p in common + res if p)))
            continue
        end = j.end if j.end is not None else j.start + (j.duration or 0.0)
        if j.status is JobStatus.CANCELLED:
            events.append((end, seq, f"{_pbs_time(end)};D;{jid};requestor=hpcsched"))
        code = {JobStatus.COMPLETED: "0", JobStatus.FAILED: "1", JobStatus.TIMEOUT: "-29", JobStatus.CANCELLED: "271",
                JobStatus.PREEMPTED: "271"}.get(j.status)
        fields = [*common, *res, f"end={_num(j.end)}" if j.end is not None else "",
                  f"Exit_status={code}" if code is not None else "",
                  f"resources_used.walltime={_pbs_hms(j.duration)}" if j.duration is not None and j.duration >= 0
                  else "", "run_count=1"]
        events.append((end, seq, f"{_pbs_time(end)};E;{jid};" + " ".join(p for p in fields if p)))
    if renamed:
        notes.append(f"{renamed} job id(s) changed to be read back as jobs (';' or spaces, reservation-like ids)")
    n, _ = count_where(jobs, lambda j: j.status is JobStatus.PREEMPTED)
    if n:
        notes.append(f"{n} preempted job(s) written as killed (Exit_status 271): they read back as failed")
    machine = meta.get("machine_nodes")
    if isinstance(machine, int | float) and machine > 0:
        out.write(f"# MaxNodes: {int(machine)}\n")
    if meta.get("machine_name"):
        out.write(f"# machine: {meta['machine_name']}\n")
    out.write(f"# hpcsched: converted from {source}\n")
    for _, _, line in sorted(events, key=lambda e: (e[0], e[1])):
        out.write(line + "\n")
    return notes

