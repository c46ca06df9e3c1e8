"""IBM Spectrum LSF accounting: ``lsb.acct`` (the format of the LSF-run leadership machines).

One record per line, space-separated, strings double-quoted (a quote inside doubled: ``""``). Job records
are ``JOB_FINISH`` (IBM's "lsb.acct" file reference, LSF 5-10); ``JOB_RESIZE`` and
``EVENT_ADRSV_FINISH`` records hold no job of their own and are counted in ``meta['records_by_type']``.
The ``JOB_FINISH`` fields read, in order: 1 type, 2 version, 3 event time (when the job ended), 4 jobId,
5 userId, 6 options, 7 numProcessors, 8 submitTime, 9 beginTime, 10 termTime, 11 startTime, 12 userName,
13 queue, 14 resReq, 15 dependCond, 16 preExecCmd, 17 fromHost, 18 cwd, 19 inFile, 20 outFile, 21 errFile,
22 jobFile, 23 numAskedHosts, then that many askedHosts, numExHosts, that many execHosts (one per slot,
or ``N*host`` with ``LSF_HPC_EXTENSIONS=SHORT_EVENTFILE``), jStatus (64 DONE, 32 EXIT), hostFactor,
jobName, command, the 19 ``lsfRusage`` numbers, mailUser, projectName, exitStatus, maxNumProcessors,
loginShell, timeEvent, idx (the array index).

Mapping: id = jobId, or ``jobId[idx]`` for an array element; submit = submitTime, start = startTime
(0: never started), end = the event time, duration = end - start; procs = numProcessors; nodes = distinct
execHosts; status DONE -> completed, EXIT -> failed (LSF writes a killed job as EXIT too: it is not told
apart from a failed one). The run limit is not among these fields:
``requested`` stays unknown (said in ``report.conversions``). Times are epoch seconds.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.model import Job, JobStatus
from hpcsched.traces.base import MALFORMED_ROW, TraceFormat, TraceReport, count_field, numbered_lines

__all__ = ["FORMAT", "tokens"]

_TOKEN = re.compile(r'"((?:[^"]|"")*)"|([^\s"]+)')
_DONE, _EXIT = 64, 32
_RUSAGE = 19  # lsfRusage numbers after the command
_JOB_TYPES = ("JOB_FINISH",)


def tokens(line: str) -> list[str]:
    """The fields of one record: quoted strings unquoted (``""`` inside -> ``"``), numbers as text."""
    return [q.replace('""', '"') if q is not None and bare == "" else bare
            for q, bare in _TOKEN.findall(line)]


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: not a whole number: {text!r}") from None


def _hosts(fields: list[str], k: int, n: int) -> list[str]:
    """``n`` exec host entries from ``fields[k]``: ``host`` (one per slot) or ``N*host``."""
    out: list[str] = []
    for h in fields[k:k + n]:
        count, star, name = h.partition("*")
        out.append(name if star and count.isdigit() else h)
    return out


def _job(f: list[str], lineno: int) -> Job:
    """One Job from a JOB_FINISH record's fields (ValueError naming the field for a damaged one)."""
    event_t, jid = _int(f[2], "event time"), _int(f[3], "jobId")
    procs = count_field(f[6], "numProcessors")
    submit, start = _int(f[7], "submitTime"), _int(f[10], "startTime")
    user, queue = f[11], f[12]
    k = 22
    asked = count_field(f[k], "numAskedHosts")
    k += 1 + asked
    n_ex = count_field(f[k], "numExHosts")
    hosts = _hosts(f, k + 1, n_ex)
    k += 1 + n_ex
    status_code = _int(f[k], "jStatus")
    rest = k + 4 + _RUSAGE  # jStatus, hostFactor, jobName, command, then the rusage numbers
    idx = 0
    if len(f) > rest + 6 and f[rest + 6].lstrip("-").isdigit():
        idx = int(f[rest + 6])
    if len(f) < k + 4:
        raise ValueError(f"{len(f)} fields: the record ends before jobName and command")
    status = {_DONE: JobStatus.COMPLETED, _EXIT: JobStatus.FAILED}.get(status_code & (_DONE | _EXIT),
                                                                         JobStatus.UNKNOWN)
    started = start > 0
    extra: dict[str, object] = {"line": lineno}
    names = tuple(dict.fromkeys(hosts))
    if names:
        extra["nodelist"] = names
    return Job(
        id=f"{jid}[{idx}]" if idx > 0 else str(jid), submit=float(submit), nodes=len(names), procs=procs,
        duration=float(event_t - start) if started else None, requested=None,
        start=float(start) if started else None, end=float(event_t) if started else None, status=status,
        user=user or None, queue=queue or None, extra=extra,
    )


def _read(path: Path, report: TraceReport) -> Iterator[Job]:
    report.meta["time_base"] = "epoch"
    report.convert("LSF lsb.acct JOB_FINISH: submit = submitTime, start = startTime, end = the event time (epoch s); "
                   "nodes = distinct execHosts, procs = numProcessors; the run limit is not in these fields "
                   "(requested unknown)")
    types: Counter[str] = Counter()
    seen = False
    for lineno, line in numbered_lines(path, report):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        seen = True
        f = tokens(line)
        kind = f[0] if f else ""
        types[kind] += 1
        if kind not in _JOB_TYPES:
            if not re.fullmatch(r"[A-Z_0-9]+", kind):
                report.anomaly(MALFORMED_ROW, lineno, "not an lsb.acct record (\"TYPE\" \"version\" ...)")
            continue
        try:
            if len(f) < 26:
                raise ValueError(f"{len(f)} fields, JOB_FINISH has at least 26")
            yield _job(f, lineno)
        except (ValueError, IndexError) as e:
            report.anomaly(MALFORMED_ROW, lineno, str(e) if isinstance(e, ValueError) else "record cut short")
    if not seen:
        raise InputError(path, "empty file: no lsb.acct records", 1)
    report.meta["records_by_type"] = dict(sorted(types.items()))


def sniff(first_lines: list[str]) -> bool:
    rows = [s.lstrip() for s in first_lines if s.strip() and not s.lstrip().startswith("#")]
    return bool(rows) and bool(re.match(r'"(JOB_FINISH|JOB_RESIZE|EVENT_ADRSV_FINISH)" "\d', rows[0]))


FORMAT = TraceFormat("lsf-acct", "jobs", "IBM Spectrum LSF accounting file lsb.acct (JOB_FINISH records)", sniff, _read)
