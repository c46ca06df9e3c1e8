"""``hpcsched trace convert``: any job trace hpcsched reads, written in another format.

Targets (``TARGETS``): ``swf`` (the batch replayer's and the Parallel Workloads Archive's format),
``muri`` (the simulator's DL trace CSV, milliseconds), ``slurm-sacct`` (``sacct -P`` layout, any
delimiter, or its fixed-width table) and ``pbs-accounting`` (PBS Pro / OpenPBS records). Every writer
writes what the matching reader reads back into the same ``Job`` where the target has a field for it;
what it has no field for is listed as a loss before anything is written.

A loss is *required* when the target's consumer cannot use a job without it: the simulator needs a GPU
count and a run time (or iterations), a batch replay a size. Required losses stop the conversion with one
error naming the count and the first line, unless ``allow_loss`` (``--allow-loss``) drops those jobs
(counted). Other losses (a user name SWF can only number, GPU counts next to node counts in SWF, profiles
outside Muri CSV, ...) are stated as notes. Batch logs have no GPU counts: ``gpus_per_node`` sizes their
jobs in GPUs for the simulator (nodes x GPUs per node).

Conversion holds the jobs in memory (about 0.5 KB each), because SWF and the simulator want them in
submit order and the headers need the whole log's extent.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from hpcsched.errors import InputError
from hpcsched.model import DEFAULT_ITERATION_S, Job, JobStatus
from hpcsched.traces.hostlist import compress_hostlist

__all__ = ["TARGETS", "ConvertResult", "Loss", "convert_trace", "losses", "write_jobs"]

TARGETS = ("swf", "muri", "slurm-sacct", "pbs-accounting")
_TARGET_ALIASES = {"sacct": "slurm-sacct", "pbs": "pbs-accounting", "openpbs": "pbs-accounting",
                   "pbspro": "pbs-accounting", "simulator": "muri", "tiresias": "muri"}


@dataclass(frozen=True)
class Loss:
    """Jobs whose ``what`` the target cannot hold; ``required``: the converted job would be unusable."""

    what: str
    count: int
    first_line: int | None
    required: bool


@dataclass
class ConvertResult:
    """What a conversion wrote and what it could not carry over."""

    source: str
    source_format: str
    target: str
    written: int = 0
    dropped: int = 0  # jobs left out for a required loss (only with allow_loss)
    losses: list[Loss] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    anomalies: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        text = f"{self.written:,} jobs written as {self.target} from {self.source} ({self.source_format})"
        if self.dropped:
            text += f"; {self.dropped:,} dropped (--allow-loss)"
        return text


def target_name(name: str) -> str:
    """A target format by name or alias; ValueError naming the choices."""
    n = _TARGET_ALIASES.get(name.lower(), name.lower())
    if n not in TARGETS:
        raise ValueError(f"cannot convert to {name!r}; targets: {', '.join(TARGETS)}")
    return n


def _line(job: Job) -> int | None:
    line = job.extra.get("line") if job.extra else None
    return line if isinstance(line, int) else None


def _count(jobs: Iterable[Job], pred: Callable[[Job], bool]) -> tuple[int, int | None]:
    n, first = 0, None
    for j in jobs:
        if pred(j):
            n += 1
            if first is None:
                first = _line(j)
    return n, first


def _duration(j: Job) -> float | None:
    if j.duration is not None:
        return j.duration
    if j.start is not None and j.end is not None:
        return j.end - j.start
    return None


def losses(jobs: Sequence[Job], target: str, gpus_per_node: int | None = None) -> list[Loss]:
    """What ``target`` cannot hold of ``jobs``: required losses first, then the rest."""
    target = target_name(target)
    out: list[Loss] = []

    def add(what: str, pred: Callable[[Job], bool], required: bool = False) -> None:
        n, first = _count(jobs, pred)
        if n:
            out.append(Loss(what, n, first, required))

    if target == "muri":
        gpn = gpus_per_node or 0
        # a job with no size at all is not helped by --gpus-per-node: said apart, so the hint is not misread
        add("no size at all (no GPU, node or processor count)", lambda j: j.gpus <= 0 and not (j.nodes or j.procs),
            required=True)
        add("no GPU count (the simulator schedules GPUs; --gpus-per-node G sizes batch jobs as nodes x G)",
            lambda j: j.gpus <= 0 and j.nodes * gpn <= 0 and bool(j.nodes or j.procs), required=True)
        add("no run time and no iterations (nothing for the simulator to run)",
            lambda j: not ((_duration(j) or 0) > 0 or (j.iterations or 0) > 0), required=True)
        add("node and processor counts (Muri CSV has GPUs only)", lambda j: bool(j.nodes or j.procs))
        add("start/end times, status, user and queue (Muri CSV has none)",
            lambda j: j.start is not None or j.user is not None or j.queue is not None)
        add("requested wall time", lambda j: j.requested is not None)
    elif target == "swf":
        add("size only in GPUs (SWF has no GPU field; convert to muri instead)",
            lambda j: j.gpus > 0 and not (j.nodes or j.procs), required=True)
        add("GPU counts next to node/processor counts (SWF has no GPU field)", lambda j: j.gpus > 0 and bool(
            j.nodes or j.procs))
        add("timeout status (SWF has no code for it: written as failed, 0)", lambda j: j.status is JobStatus.TIMEOUT)
    else:
        add("an unknown wait (the source's start was taken as its submit time; this target has no 'unknown' "
            "for it, so the start is written as known)", _wait_unknown)
    if target != "muri":
        add("iterations, iteration time, stage profile and model (only Muri CSV has them)",
            lambda j: j.iterations is not None or j.profile is not None or j.model is not None)
    return sorted(out, key=lambda loss: not loss.required)


def _wait_unknown(j: Job) -> bool:
    """The source gave no wait (SWF -1 in a log without waits): the start equals the submit by assumption."""
    return bool(j.extra) and bool(j.extra.get("wait_unknown"))


def source_notes(meta: dict[str, Any]) -> list[str]:
    """Fields the source's reader saw filled but no ``Job`` holds, so no target gets them."""
    not_kept = meta.get("swf_fields_not_kept")
    if isinstance(not_kept, dict) and not_kept:
        fields = ", ".join(f"{name} (first at line {line})" for name, line in not_kept.items())
        return [f"not carried over: the source's SWF {fields}: hpcsched reads no such job field"]
    return []


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
        bad, _ = _count(order, lambda j: j.procs > 0 and j.nodes > 0 and -(-j.procs // cpn) != j.nodes)
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
    unknown_waits, _ = _count(order, _wait_unknown)
    if unknown_waits:  # SWF's reader then takes -1 waits as start = submit again, even in a short file
        header.append("Note: submit times are start times where the wait is -1 (the source recorded no wait)")
    out.write("".join(f"; {h}\n" for h in header) + ";\n")
    for k, j in enumerate(order, 1):
        dur = _duration(j)
        procs = j.procs if j.procs > 0 else j.nodes * cpn
        f = [j.id if ids_numeric else str(k), _num(j.submit - base),
             _num(j.start - j.submit) if j.start is not None and not _wait_unknown(j) else "-1",
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
        dur = _duration(j)
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
    n, _ = _count(jobs, lambda j: j.status is JobStatus.PREEMPTED)
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


# ------------------------------------------------------------------------------------------- driving
def write_jobs(jobs: Sequence[Job], target: str, out: IO[str], meta: dict[str, Any] | None = None,
               source: str = "?", *, gpus_per_node: int | None = None, delimiter: str = "|", trailing: bool = False,
               rebase: bool = False) -> list[str]:
    """Write ``jobs`` in ``target`` to ``out``; returns notes on what the target changed. No loss check."""
    target = target_name(target)
    meta = dict(meta or {})
    notes: list[str] = []
    if target in ("slurm-sacct", "pbs-accounting") and meta.get("time_base") != "epoch" and jobs:
        notes.append("the source's times have no calendar base: written as dates counted from 1970-01-01 UTC")
    if target == "swf":
        return write_swf(jobs, out, meta, source)
    if target == "muri":
        return write_muri(jobs, out, meta, source, gpus_per_node, rebase)
    if target == "slurm-sacct":
        return notes + write_sacct(jobs, out, delimiter, trailing)
    return notes + write_pbs(jobs, out, meta, source)


def convert_trace(src: str | Path, to: str, out: str | Path | None = None, *, fmt: str | None = None,
                  options: dict[str, Any] | None = None, allow_loss: bool = False, gpus_per_node: int | None = None,
                  delimiter: str = "|", trailing: bool = False, rebase: bool = False, strict: bool = False,
                  progress: Callable[[str, int, int], None] | None = None,
                  stream: IO[str] | None = None) -> ConvertResult:
    """Read ``src`` (any job trace), check what ``to`` would lose, write it to ``out`` (``.gz`` compresses; None:
    ``stream``, default stdout). ``progress(phase, done, total)`` is called while reading (bytes) and writing.

    Raises ``InputError`` naming ``src`` and the first line concerned for a required loss without
    ``allow_loss``, and for a source that is not a job trace.
    """
    from hpcsched.traces import open_trace

    try:
        target = target_name(to)
    except ValueError as e:
        raise InputError(src, str(e)) from None
    src = Path(src)
    trace = open_trace(src, fmt, strict, options)
    if trace.format.kind != "jobs":
        raise InputError(src, f"{trace.format.name} holds {trace.format.kind} records, not jobs: nothing to convert")
    if progress is not None:
        trace.report.progress = lambda done, total: progress("reading", done, total)
    jobs = list(trace)
    meta = dict(trace.report.meta) | {"format": trace.format.name}
    result = ConvertResult(str(src), trace.format.name, target, anomalies=dict(trace.report.anomalies))
    found = losses(jobs, target, gpus_per_node)
    result.losses = found
    required = [loss for loss in found if loss.required]
    if required and not allow_loss:
        first = required[0]
        more = "; ".join(f"{loss.count:,} with {loss.what}" for loss in required[1:])
        raise InputError(src, f"converting to {target} would lose what it needs: {first.count:,} of {len(jobs):,} "
                         f"jobs have {first.what}{'; ' + more if more else ''}; --allow-loss drops them",
                         first.first_line)
    if required:
        keep = _usable(target, gpus_per_node)
        kept = [j for j in jobs if keep(j)]
        result.dropped = len(jobs) - len(kept)
        jobs = kept
    if not jobs:
        raise InputError(src, f"no job left to write as {target}")
    if progress is not None:
        progress("writing", 0, len(jobs))
    def write(f: IO[str]) -> list[str]:
        try:
            return write_jobs(jobs, target, f, meta, src.name, gpus_per_node=gpus_per_node, delimiter=delimiter,
                              trailing=trailing, rebase=rebase)
        except (ValueError, OverflowError) as e:  # a time no calendar format can hold
            raise InputError(src, f"cannot write as {target}: {e}") from None

    if out is None:  # whole, or nothing: an error leaves no half-written output behind
        buf = io.StringIO()
        result.notes = source_notes(meta) + write(buf)
        (stream or sys.stdout).write(buf.getvalue())
    else:
        out = Path(out)
        part = out.with_name(out.name + ".part")  # streamed to a side file, renamed when complete
        try:
            with (gzip.open(part, "wt", encoding="utf-8") if out.suffix == ".gz"
                  else part.open("w", encoding="utf-8")) as f:
                result.notes = source_notes(meta) + write(f)
            os.replace(part, out)
        except OSError as e:
            raise InputError(out, f"cannot write: {e.strerror or e}") from None
        finally:
            part.unlink(missing_ok=True)
    if progress is not None:
        progress("writing", len(jobs), len(jobs))
    result.written = len(jobs)
    return result


def _usable(target: str, gpus_per_node: int | None) -> Callable[[Job], bool]:
    """The jobs a target can use, for --allow-loss: the negation of its required losses."""
    if target == "muri":
        gpn = gpus_per_node or 0
        return lambda j: (j.gpus > 0 or j.nodes * gpn > 0) and ((_duration(j) or 0) > 0 or (j.iterations or 0) > 0)
    if target == "swf":
        return lambda j: not (j.gpus > 0 and not (j.nodes or j.procs))
    return lambda j: True
