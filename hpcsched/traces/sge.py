"""Grid Engine accounting (SGE 6, Son of Grid Engine, Open Grid Scheduler, Univa/Altair UGE): ``accounting(5)``.

One finished job (or array task) per line, fields separated by ':'; lines starting with '#' are the
file's header. Fields read (accounting(5)): 1 qname, 2 hostname, 3 group, 4 owner, 5 job_name,
6 job_number, 7 account, 8 priority, 9 submission_time, 10 start_time, 11 end_time, 12 failed,
13 exit_status, 14 ru_wallclock, ..., 32 project, 33 department, 34 granted_pe, 35 slots, 36 task_number,
37 cpu, 38 mem, 39 io, 40 category (the request: ``-l h_rt=...``), 41 iow, 42 pe_taskid. UGE 8.2 and later
write the three times in milliseconds (told from their size; said in ``report.conversions``) and add fields
after these, which are not read.

Mapping: id = job_number, or ``job_number.task_number`` for an array task; submit/start/end as
written (epoch s); duration = end - start; procs = slots; requested = ``h_rt`` from the category (s or
``H:M:S``); nodes: Grid Engine records only the master host, so nodes = ceil(slots / cores per node)
with the ``cores_per_node`` option (``--cores-per-node``), else 1 per slot for parallel (PE) jobs and 1
for serial ones (said). Status: failed 0 and exit 0 -> completed; failed 37 (h_rt enforced) ->
timeout; else failed. Records of a parallel job's slave tasks (pe_taskid other than NONE) are the
same job's parts, not jobs: skipped, counted in ``meta['pe_task_records_skipped']``. A job that never
started (start_time 0, deleted while queued) has no start.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.model import Job, JobStatus
from hpcsched.traces.base import MALFORMED_ROW, TraceFormat, TraceReport, count_field, numbered_lines

__all__ = ["FORMAT"]

_FIELDS = 42  # through pe_taskid; SGE 6 writes 45, UGE more
_MS = 10**11  # an epoch time above this is in milliseconds (s would be the year 5138)
_H_RT = re.compile(r"(?:^|[\s,])h_rt=([\d:.]+)")
_PE_TASK = re.compile(r"\d+\.\S+")  # pe_taskid of a slave task: "1.node101"
_ENFORCED_LIMIT = 37  # accounting(5) failed code: qmaster enforced h_rt, h_cpu or h_vmem


def _seconds(text: str) -> float:
    parts = [float(p) for p in text.split(":")]
    if len(parts) > 3:
        raise ValueError(f"h_rt: not a time: {text!r}")
    total = 0.0
    for p in parts:
        total = total * 60 + p
    return total


def _job(f: list[str], lineno: int, report: TraceReport, cpn: float | None) -> Job | None:
    submit, start, end = float(f[8]), float(f[9]), float(f[10])
    if submit > _MS:
        submit, start, end = submit / 1000, start / 1000, end / 1000
        report.convert("submission/start/end times in milliseconds (UGE 8.2 and later) -> s")
    failed, code = int(f[11]), int(f[12])
    slots = count_field(f[34], "slots")
    task = f[35]
    jid = f[5] if task in ("0", "", "undefined") else f"{f[5]}.{task}"
    pe = f[33] not in ("NONE", "")
    if cpn:
        nodes = max(1, math.ceil(slots / cpn - 1e-9)) if slots else 1
    else:
        nodes = slots if pe and slots else 1
    m = _H_RT.search(f[39])
    requested = _seconds(m.group(1)) if m else None
    started = start > 0
    if failed == 0 and code == 0:
        status = JobStatus.COMPLETED
    elif failed == _ENFORCED_LIMIT:
        status = JobStatus.TIMEOUT
    else:
        status = JobStatus.FAILED
    if not started:
        status = JobStatus.CANCELLED
    return Job(id=jid, submit=submit, nodes=nodes, procs=slots, duration=end - start if started else None,
               requested=requested, start=start if started else None, end=end if started else None, status=status,
               user=f[3] or None, queue=f[0] or None, extra={"line": lineno, "nodelist": (f[1],)} if not pe
               else {"line": lineno})


def _read(path: Path, report: TraceReport) -> Iterator[Job]:
    report.meta["time_base"] = "epoch"
    cpn = report.options.get("cores_per_node")
    cpn = float(cpn) if cpn else None
    report.convert("Grid Engine accounting: submit/start/end as written (epoch s), procs = slots, requested = h_rt "
                   "of the category; nodes = " + (f"ceil(slots / {cpn:g}) (--cores-per-node)" if cpn else
                                                  "1 for serial jobs, slots for parallel (PE) ones (Grid Engine "
                                                  "records the master host only; --cores-per-node sets it)"))
    seen = False
    pe_tasks = 0
    for lineno, line in numbered_lines(path, report):
        if not line.strip() or line.startswith("#"):
            continue
        seen = True
        f = line.split(":")
        if len(f) < _FIELDS:
            report.anomaly(MALFORMED_ROW, lineno, f"{len(f)} fields, Grid Engine accounting has at least {_FIELDS}")
            continue
        if _PE_TASK.fullmatch(f[41]):  # (a ':' inside the category shifts f[41]; such text is no task id)
            pe_tasks += 1
            continue
        try:
            job = _job(f, lineno, report, cpn)
        except ValueError as e:
            report.anomaly(MALFORMED_ROW, lineno, str(e))
            continue
        if job is not None:
            yield job
    if not seen:
        raise InputError(path, "empty file: no accounting records", 1)
    if pe_tasks:
        report.meta["pe_task_records_skipped"] = pe_tasks
        report.convert(f"{pe_tasks} record(s) of parallel jobs' slave tasks (pe_taskid set) are parts of their job: "
                       "skipped")


def sniff(first_lines: list[str]) -> bool:
    rows = [s for s in first_lines if s.strip() and not s.startswith("#")][:5]
    if not rows:
        return False
    for r in rows:
        f = r.split(":")
        if len(f) < _FIELDS or not all(f[k].strip().lstrip("-").isdigit() for k in (5, 8, 9, 10, 11, 12)):
            return False
    return True


FORMAT = TraceFormat("sge-accounting", "jobs", "Grid Engine accounting(5) file (SGE, SoGE, OGS, Univa/Altair UGE)",
                     sniff, _read)
