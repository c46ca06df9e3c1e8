"""PBS Professional / OpenPBS (and TORQUE) accounting logs: ``server_priv/accounting/YYYYMMDD`` files.

Each line is one record ``MM/DD/YYYY HH:MM:SS;T;ID;MESSAGE`` (the format Polaris-class machines write):
the record time is the server's local clock, ``T`` the record type, ``MESSAGE`` space-separated
``key=value`` pairs (a value with spaces is double-quoted). Job records: ``Q`` queued, ``S`` started,
``E`` ended (the job's full account), ``D`` deleted on request, ``A`` aborted by the server, ``R``
rerun (a run that ended and was requeued), ``C``/``T``/``a``/``M`` checkpoint, restart, altered, moved.
Reservation and licence records (``B F K k U Y L P``; ids ``R123.``, ``S123.``, ``M123.``) are skipped,
each type counted in ``meta['records_by_type']``.

One ``Job`` per job, from its ``E`` record (which repeats everything the earlier records said):
submit = ``ctime`` (creation: ``qtime`` restarts when a job moves queue or is requeued), else ``qtime``;
start/end = ``start``/``end`` (epoch s; 0 = unknown); duration = ``resources_used.walltime``, else end
- start; requested = ``Resource_List.walltime``; nodes = distinct hosts of ``exec_vnode`` (a vnode
``host[1]`` is on ``host``), else of ``exec_host``, else ``Resource_List.nodect``, else the chunk counts
of ``Resource_List.select`` (``2:ncpus=64:ngpus=4+1:ncpus=8`` -> 3), else TORQUE's
``Resource_List.nodes``; GPUs = ``Resource_List.ngpus``, else the select's, else ``exec_vnode``'s;
processors likewise from ``ncpus``. Status: a ``D`` record -> cancelled; ``Exit_status`` 0 -> completed,
-29 (killed at its walltime) -> timeout, other -> failed. Each ``R`` run held nodes, so it is a job of
its own, ``ID:runN``, preempted. Jobs without an ``E`` record by the end of the log come last: deleted
or aborted ones (cancelled, or failed if they had started), and still queued or running ones
(``censored``). ``Q``/``D``/``A`` records carry only the record time, which is local: it is turned into
epoch seconds with the offset between record times and the epoch times of ``S``/``E`` records
(``meta['record_time_offset_s']``), assumed 0 (UTC) until one is seen.

Machine size, always stated in ``meta['machine_nodes_source']``: the ``machine_nodes`` option
(``--nodes`` / ``--machine-nodes``); else a header comment the log may start with (``# MaxNodes: 560``,
``# machine: polaris``, as ``hpcsched trace convert`` writes); else a known machine (``KNOWN_MACHINES``)
named by the PBS server in the job ids (``123.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov``) or in the
file name; else, after the whole log, its peak concurrent use (a lower bound).

Anomalies: ``malformed_row`` (a line that is not a record: dropped), ``unknown_field`` (an E record
without start, end or size), ``censored``, and what every job log gets (``hpcsched.traces``).
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
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
    numbered_lines,
)
from hpcsched.traces.duplicates import SameJob

__all__ = ["FORMAT", "KNOWN_MACHINES", "known_machine", "parse_record", "parse_walltime", "sniff"]

# Machines that run (or ran) PBS Pro / OpenPBS, by a word of their PBS server's name or a log's file name:
# (name, compute nodes), from the centres' public system descriptions.
KNOWN_MACHINES: dict[str, tuple[str, int]] = {
    "polaris": ("Polaris", 560),  # ALCF, HPE Apollo 6500 Gen10+: 560 nodes x 4 A100
    "aurora": ("Aurora", 10624),  # ALCF, HPE Cray EX: 10,624 nodes x 6 Intel Max GPUs
    "sunspot": ("Sunspot", 128),  # ALCF Aurora test and development system
    "crux": ("Crux", 256),  # ALCF CPU system
    "sophia": ("Sophia", 24),  # ALCF, the former ThetaGPU: 24 DGX A100 nodes
    "theta": ("Theta", 4392),  # ALCF (Cobalt, later PBS); 4,392 KNL nodes
    "thetagpu": ("ThetaGPU", 24),
    "cheyenne": ("Cheyenne", 4032),  # NCAR, SGI ICE XA
    "derecho": ("Derecho", 2570),  # NCAR, HPE Cray EX: 2,488 CPU + 82 GPU nodes
}
_RECORD = re.compile(r"(\d\d)/(\d\d)/(\d{4}) (\d\d):(\d\d):(\d\d);([A-Za-z]);([^;]*);(.*)")
_KV = re.compile(r'(?:^|(?<=\s))([A-Za-z_][\w.\-]*)=("(?:[^"\\]|\\.)*"|\S*)')
_JOB_TYPES = frozenset("QSEDARCTaM")
_SIGKILLED_WALLTIME = -29  # JOB_EXEC_KILL_WALLTIME: PBS killed the job at its walltime
_HOST = re.compile(r"\[\d+\]$")  # vnode "host[1]" -> host "host"
_HEADER = re.compile(r"#\s*([A-Za-z_][\w ]*?)\s*[:=]\s*(\S.*?)\s*$")


def sniff(first_lines: list[str]) -> bool:
    """The first line that is not a comment is a PBS accounting record."""
    for line in first_lines:
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        return _RECORD.fullmatch(s) is not None
    return False


def parse_record(line: str) -> tuple[float, str, str, str] | None:
    """(record time as if UTC, type, id, message) of one record line; None if it is not one."""
    m = _RECORD.fullmatch(line.strip())
    if m is None:
        return None
    mo, d, y, hh, mm, ss = (int(x) for x in m.groups()[:6])
    try:
        t = datetime(y, mo, d, hh, mm, ss, tzinfo=UTC).timestamp()
    except ValueError:
        return None
    return t, m.group(7), m.group(8).strip(), m.group(9)


def key_values(message: str) -> dict[str, str]:
    """``user=a account="X Y" Resource_List.select=2:ncpus=4`` -> {user: a, account: 'X Y', ...}."""
    out: dict[str, str] = {}
    for m in _KV.finditer(message):
        v = m.group(2)
        if len(v) >= 2 and v[0] == '"' and v[-1] == '"':
            v = v[1:-1]
        out.setdefault(m.group(1), v)
    return out


def parse_walltime(text: str) -> float:
    """``HH:MM:SS`` (hours may exceed 24), ``MM:SS`` or seconds -> seconds; ValueError otherwise."""
    parts = text.strip().split(":")
    if not 1 <= len(parts) <= 3 or not all(p.replace(".", "", 1).isdigit() for p in parts):
        raise ValueError(f"not a walltime: {text!r}")
    v = 0.0
    for p in parts:
        v = v * 60 + float(p)
    return v


def _epoch(kv: dict[str, str], key: str) -> float | None:
    """An epoch-seconds attribute; 0 (written when PBS lost the time) and absent are unknown."""
    text = kv.get(key)
    if text is None or text == "":
        return None
    v = float(text)
    if not 0 <= v < 2**40:
        raise ValueError(f"{key}: {text!r} is not an epoch time")
    return v or None


def _hosts(spec: str, vnode: bool) -> list[str]:
    """Distinct hosts, in order, of ``(h1:ncpus=4)+(h2[0]:ncpus=4+h2[1]:ncpus=4)`` or ``h1/0*8+h2/0-3``."""
    seen: dict[str, None] = {}
    for part in spec.replace("(", "").replace(")", "").split("+"):
        name = part.split(":" if vnode else "/", 1)[0].strip()
        if name:
            seen.setdefault(_HOST.sub("", name) if vnode else name, None)
    return list(seen)


def _chunks(select: str) -> tuple[int, int, int]:
    """(chunks, ncpus, ngpus) of a select statement ``2:ncpus=64:ngpus=4+1:ncpus=8``."""
    nodes = cpus = gpus = 0
    for chunk in select.split("+"):
        parts = chunk.split(":")
        n = count_field(parts[0], "select chunk count") if parts[0].isdigit() else 1
        res = dict(p.split("=", 1) for p in parts if "=" in p)
        nodes += n
        cpus += n * (count_field(res["ncpus"], "select ncpus") if "ncpus" in res else 0)
        gpus += n * (count_field(res["ngpus"], "select ngpus") if "ngpus" in res else 0)
    return nodes, cpus, gpus


def _vnode_sum(spec: str, key: str) -> int:
    return sum(count_field(v, key) for v in re.findall(rf"\b{key}=(\d+)", spec))


def _torque_nodes(spec: str) -> int:
    """TORQUE ``Resource_List.nodes``: ``2:ppn=8`` -> 2, ``n1+n2:ppn=4`` -> 2."""
    total = 0
    for part in spec.split("+"):
        head = part.split(":", 1)[0]
        total += count_field(head, "nodes") if head.isdigit() else 1
    return total


@dataclass
class _Open:
    """What the records before a job's E record said about it."""

    line: int
    queued: float | None = None  # Q record time (as if UTC)
    kv: dict[str, str] = field(default_factory=dict)  # the S record's attributes
    started: bool = False
    deleted: bool = False
    aborted: bool = False
    runs: int = 0  # R records so far


def _size(kv: dict[str, str]) -> tuple[int | None, int, int, tuple[str, ...]]:
    """(nodes or None, procs, gpus, hosts) from an S/E/R record's attributes, by the rules in the docstring."""
    hosts: list[str] = []
    if kv.get("exec_vnode"):
        hosts = _hosts(kv["exec_vnode"], vnode=True)
    elif kv.get("exec_host"):
        hosts = _hosts(kv["exec_host"], vnode=False)
    sel = _chunks(kv["Resource_List.select"]) if kv.get("Resource_List.select") else None
    nodes: int | None = len(hosts) or None
    if nodes is None and kv.get("Resource_List.nodect"):
        nodes = count_field(kv["Resource_List.nodect"], "Resource_List.nodect")
    if nodes is None and sel is not None:
        nodes = sel[0]
    if nodes is None and kv.get("Resource_List.nodes"):
        nodes = _torque_nodes(kv["Resource_List.nodes"])
    gpus = procs = 0
    if kv.get("Resource_List.ngpus"):
        gpus = count_field(kv["Resource_List.ngpus"], "Resource_List.ngpus")
    elif sel is not None and sel[2]:
        gpus = sel[2]
    elif kv.get("exec_vnode"):
        gpus = _vnode_sum(kv["exec_vnode"], "ngpus")
    if kv.get("Resource_List.ncpus"):
        procs = count_field(kv["Resource_List.ncpus"], "Resource_List.ncpus")
    elif sel is not None and sel[1]:
        procs = sel[1]
    elif kv.get("resources_used.ncpus"):
        procs = count_field(kv["resources_used.ncpus"], "resources_used.ncpus")
    elif kv.get("exec_vnode"):
        procs = _vnode_sum(kv["exec_vnode"], "ncpus")
    return nodes, procs, gpus, tuple(hosts)


def known_machine(name: str) -> tuple[str, int] | None:
    """(machine, nodes) for the first whole word of ``name`` (a server or file name) in ``KNOWN_MACHINES``."""
    for word in re.split(r"[^a-z0-9]+", name.lower()):
        if word in KNOWN_MACHINES:
            return KNOWN_MACHINES[word]
    return None


class _Reader:
    """One pass over a log: open jobs by id, the machine size and the peak of concurrent use."""

    def __init__(self, path: Path, report: TraceReport) -> None:
        self.path, self.report = path, report
        self.open: dict[str, _Open] = {}
        self.offset: float | None = None  # record time (local, read as UTC) minus epoch time
        self.sized = False
        self.header: dict[str, str] = {}
        self.types: Counter[str] = Counter()
        self.marks_t: array[float] = array("d")
        self.marks_n: array[int] = array("q")
        self.same = SameJob(report, "TORQUE's short and full id of one job, same start and end")

    # ------------------------------------------------------------------ machine size
    def size_machine(self, jid: str) -> None:
        """Settle the machine size before the first job is handed out (the size check reads it then)."""
        self.sized = True
        meta, opt = self.report.meta, self.report.options.get("machine_nodes")
        if opt:
            meta["machine_nodes_source"] = "given as an option"
            return
        for key in ("maxnodes", "machine_nodes", "nodes"):
            if key in self.header:
                try:
                    n = count_field(self.header[key].split()[0], key)
                except (ValueError, IndexError):
                    raise InputError(self.path, f"header {key}: {self.header[key]!r} is not a node count", 1) \
                        from None
                if n > 0:
                    meta.update(machine_nodes=n, machine_nodes_source=f"the log's header ({key})")
                    return
        server = jid.split(".", 1)[1] if "." in jid else ""
        for where, text in (("header", self.header.get("machine", "")), ("PBS server", server),
                            ("file name", self.path.name)):
            known = known_machine(text)
            if known is not None:
                name, nodes = known
                meta.update(machine_nodes=nodes, machine_name=name,
                            machine_nodes_source=f"known machine {name}, named by the {where} {text!r}")
                self.report.convert(f"machine size not in the log: {name}'s {nodes} nodes (known machine, from "
                                    f"the {where}; --nodes overrides)")
                return

    def finish_machine(self) -> None:
        """No size from an option, header or known machine: the log's peak concurrent use (a lower bound)."""
        meta = self.report.meta
        if "machine_nodes_source" in meta:
            return
        if not self.marks_t:
            meta["machine_nodes_source"] = "unknown: no job with a start, an end and a size (give --nodes)"
            return
        order = sorted(range(len(self.marks_t)), key=lambda k: (self.marks_t[k], self.marks_n[k]))
        level = peak = 0
        for k in order:  # ends (negative) before starts at the same second
            level += self.marks_n[k]
            peak = max(peak, level)
        meta.update(machine_nodes=peak, machine_nodes_source="the log's peak concurrent use (a lower bound; "
                    "give --nodes for the real size)")
        self.report.convert(f"machine size not in the log: its peak concurrent use, {peak} nodes (--nodes sets it)")

    # ------------------------------------------------------------------ records
    def local(self, t: float) -> float:
        """A record time (local clock read as UTC) as epoch seconds, with the learnt offset."""
        return t - (self.offset or 0.0)

    def learn_offset(self, record_t: float, epoch_t: float | None) -> None:
        if self.offset is None and epoch_t:
            off = round((record_t - epoch_t) / 900.0) * 900.0  # time zones are whole quarter hours
            if abs(off) <= 14 * 3600:
                self.offset = off
                self.report.meta["record_time_offset_s"] = off
                if off:
                    self.report.convert(f"record times are local, UTC{off / 3600:+g} h (from the epoch times in "
                                        "S/E records): turned into epoch s for jobs known only by Q/D/A records")

    def job(self, jid: str, kv: dict[str, str], lineno: int, status: JobStatus, opened: _Open | None,
            run: int | None = None) -> Job:
        """A Job from an E (or R) record's attributes, with what earlier records said."""
        submit = _epoch(kv, "ctime") or _epoch(kv, "qtime")
        if submit is None and opened is not None and opened.queued is not None:
            submit = self.local(opened.queued)
        start, end = _epoch(kv, "start"), _epoch(kv, "end")
        nodes, procs, gpus, hosts = _size(kv)
        duration: float | None = None
        if kv.get("resources_used.walltime"):
            duration = parse_walltime(kv["resources_used.walltime"])
        elif start is not None and end is not None:
            duration = end - start
        requested = parse_walltime(kv["Resource_List.walltime"]) if kv.get("Resource_List.walltime") else None
        if submit is None:
            submit = start if start is not None else end
        if submit is None:
            raise ValueError("no ctime, qtime, start or end: job skipped")
        for name, v in (("start", start), ("end", end), ("node count", nodes)):
            if v is None:
                self.report.anomaly(UNKNOWN_FIELD, lineno, f"{name} ({jid})")
        if start is not None and end is not None and nodes:
            self.marks_t.extend((start, end))
            self.marks_n.extend((nodes, -nodes))
        extra: dict[str, object] = {"line": lineno}
        if hosts:
            extra["nodelist"] = hosts
        if run is not None:
            extra["run_of"] = jid
        return Job(
            id=jid if run is None else f"{jid}:run{run}", submit=submit, nodes=nodes or 0, gpus=gpus, procs=procs,
            duration=duration, requested=requested, start=start, end=end, status=status,
            user=kv.get("user") or None, queue=kv.get("queue") or None, extra=extra,
        )

    def read(self) -> Iterator[Job]:
        report = self.report
        report.meta["time_base"] = "epoch"
        report.convert("submit = ctime (else qtime); start/end epoch s; duration = resources_used.walltime; "
                       "nodes = distinct exec_vnode/exec_host hosts, else Resource_List.nodect / select chunks")
        seen_any = False
        for lineno, line in numbered_lines(self.path, report):
            s = line.strip()
            if not s:
                continue
            if s.startswith("#"):
                if not seen_any and (m := _HEADER.match(s)):
                    self.header.setdefault(m.group(1).strip().lower().replace(" ", "_"), m.group(2))
                continue
            seen_any = True
            rec = parse_record(s)
            if rec is None:
                report.anomaly(MALFORMED_ROW, lineno, "not a PBS accounting record (MM/DD/YYYY HH:MM:SS;T;id;...)")
                continue
            t, kind, jid, message = rec
            self.types[kind] += 1
            if kind not in _JOB_TYPES or not jid or (jid[0] in "RSM" and jid[1:2].isdigit()):
                continue  # reservations (R123., S123., M123.), licences, provisioning: no job to read
            if jid.split(".", 1)[0].endswith("[]"):  # an array's parent: its subjobs have records of their own
                report.meta["array_parent_records_skipped"] = report.meta.get("array_parent_records_skipped", 0) + 1
                continue
            if not self.sized:
                self.size_machine(jid)
            opened = self.open.get(jid)
            try:
                if kind == "E":
                    kv = key_values(message)
                    self.open.pop(jid, None)
                    self.learn_offset(t, _epoch(kv, "end"))
                    job = self.job(jid, kv, lineno, self._status(kv, opened), opened)
                    short = jid.split(".", 1)[0]
                    self._close_other_forms(jid, short)
                    if not self.same.repeated(short, job.start, job.end, jid, lineno):
                        yield job
                elif kind == "R":
                    kv = key_values(message)
                    o = self.open.setdefault(jid, _Open(lineno))
                    o.runs += 1
                    if kv.get("run_count", "").isdigit():
                        o.runs = int(kv["run_count"])
                    if _epoch(kv, "start") is not None:
                        self.learn_offset(t, _epoch(kv, "end"))
                        report.meta["rerun_records"] = report.meta.get("rerun_records", 0) + 1
                        report.convert("an R (rerun) record is a run that ended and was requeued: a job of its "
                                       "own, ID:runN, preempted")
                        yield self.job(jid, kv, lineno, JobStatus.PREEMPTED, o, run=o.runs)
                else:
                    o = opened or self.open.setdefault(jid, _Open(lineno))
                    if kind == "Q" and o.queued is None:
                        o.queued = t
                    elif kind == "S":
                        kv = key_values(message)
                        o.kv, o.started = kv, True
                        self.learn_offset(t, _epoch(kv, "start"))
                    elif kind == "D":
                        o.deleted = True
                    elif kind == "A":
                        o.aborted = True
            except ValueError as e:
                report.anomaly(MALFORMED_ROW, lineno, f"{jid}: {e}")
        if not seen_any:
            raise InputError(self.path, "empty file: no PBS accounting records", 1)
        yield from self._unfinished()
        report.meta["records_by_type"] = dict(sorted(self.types.items()))
        self.finish_machine()

    def _close_other_forms(self, jid: str, short: str) -> None:
        """TORQUE may write a job's Q/S records under its short id and its E record under the full one (or the
        reverse): the E record ends the job under either form, else it would stay open, 'running at log end'."""
        if jid != short:
            self.open.pop(short, None)
        else:
            for other in [k for k in self.open if k.startswith(short + ".")]:
                self.open.pop(other)

    def _status(self, kv: dict[str, str], opened: _Open | None) -> JobStatus:
        if opened is not None and opened.deleted:
            return JobStatus.CANCELLED
        try:
            code = int(kv.get("Exit_status", ""))
        except ValueError:
            return JobStatus.UNKNOWN
        if code == 0:
            return JobStatus.COMPLETED
        return JobStatus.TIMEOUT if code == _SIGKILLED_WALLTIME else JobStatus.FAILED

    def _unfinished(self) -> Iterator[Job]:
        """Jobs with no E record by the log's end: deleted/aborted (ended) or still queued/running (censored)."""
        partial = 0
        for jid, o in self.open.items():
            if not o.started and o.queued is None:
                partial += 1  # only C/a/M/T/D/A/R records here: queued before the log began, no submit time
                continue
            kv = dict(o.kv)
            if o.deleted or o.aborted:
                status = JobStatus.CANCELLED if o.deleted or not o.started else JobStatus.FAILED
            else:
                status = JobStatus.RUNNING if o.started else JobStatus.PENDING
                self.report.anomaly(CENSORED, o.line, f"job {jid} {status.value} at log end")
            try:
                if not o.started:
                    yield self._queued_only(jid, o, status)
                else:
                    yield self.job(jid, kv, o.line, status, o)
            except ValueError as e:
                self.report.anomaly(MALFORMED_ROW, o.line, f"{jid}: {e}")
        if partial:
            self.report.meta["jobs_before_log_skipped"] = partial
            self.report.convert(f"{partial} job(s) with records here but neither a Q, S nor E record (queued before "
                                "the log began, no submit time): skipped, counted in jobs_before_log_skipped")

    def _queued_only(self, jid: str, o: _Open, status: JobStatus) -> Job:
        assert o.queued is not None
        return Job(id=jid, submit=self.local(o.queued), status=status, extra={"line": o.line})


def _read(path: Path, report: TraceReport) -> Iterator[Job]:
    return _Reader(path, report).read()


FORMAT = TraceFormat("pbs-accounting", "jobs", "PBS Pro / OpenPBS / TORQUE accounting log (server_priv/accounting)",
                     sniff, _read)
