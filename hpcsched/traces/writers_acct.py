"""``trace convert`` to the accounting files of LSF (``lsb.acct``) and Grid Engine (``accounting``): what their
readers (``traces.lsf``, ``traces.sge``) read back into the same ``Job``, and the list of what they cannot hold.

Both formats number their jobs and keep whole seconds, so a job whose id is not a number (or ``N[i]`` /
``N.i`` for an array element) is renumbered and a fractional time rounded, each listed by ``acct_losses``
before anything is written. LSF's ``JOB_FINISH`` has no run limit among the fields read and tells only DONE
from EXIT; Grid Engine records only a job's master host, so its node count reads back from its slots.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import IO, Any

from hpcsched.model import Job, JobStatus
from hpcsched.traces.writers import job_duration

__all__ = ["acct_losses", "sge_in_ms", "write_lsf", "write_sge"]

_LSF_ID = re.compile(r"(\d+)(?:\[(\d+)\])?")
_SGE_ID = re.compile(r"(\d+)(?:\.(\d+))?")
_LSF_DONE, _LSF_EXIT = 64, 32
_SGE_ENFORCED = 37  # accounting(5): qmaster enforced h_rt
_SGE_FIELDS = 45  # SGE 6's record: through ar_submission_time
_EPOCH_MS_FLOOR = 1e8  # epoch seconds (1973 on): x 1000 is above the reader's millisecond threshold (1e11)


def _end(j: Job) -> float | None:
    if j.end is not None:
        return j.end
    d = job_duration(j)
    return j.start + d if j.start is not None and d is not None else None


def _fractional(j: Job) -> bool:
    return any(t is not None and t != math.floor(t) for t in (j.submit, j.start, _end(j), j.requested))


def _hosts(j: Job) -> list[str] | None:
    names = j.extra.get("nodelist") if j.extra else None
    return list(names) if isinstance(names, tuple | list) and names and len(names) == j.nodes else None


def acct_losses(jobs: Sequence[Job], target: str, meta: dict[str, Any]) -> list[tuple[str, Callable[[Job], bool]]]:
    """(what, which jobs) the target cannot hold; none of them makes a job unusable for a batch replay."""
    ms = target == "sge-accounting" and sge_in_ms(jobs)
    out: list[tuple[str, Callable[[Job], bool]]] = [
        ("fractional seconds (the file keeps whole seconds: rounded down)", _fractional) if not ms else
        ("times finer than a millisecond (written in milliseconds, as UGE 8.2+: rounded)",
         lambda j: any(t is not None and round(t * 1000) != t * 1000 for t in (j.submit, j.start, _end(j)))),
        ("GPU counts (no GPU field)", lambda j: j.gpus > 0),
    ]
    if ms:
        out.append(("a fractional requested wall time (h_rt in whole seconds)",
                    lambda j: j.requested is not None and j.requested != math.floor(j.requested)))
    if target == "lsf-acct":
        out += [
            ("a job id that is not a number or N[index] (renumbered)", lambda j: not _LSF_ID.fullmatch(j.id)),
            ("requested wall time (JOB_FINISH holds no run limit among the fields read)",
             lambda j: j.requested is not None),
            ("a status other than completed or failed (LSF writes DONE or EXIT: the others read back as failed)",
             lambda j: j.status not in (JobStatus.COMPLETED, JobStatus.FAILED)),
            ("a node count without a size in processors (LSF counts slots: written as 1 per node)",
             lambda j: j.nodes > 0 and j.procs <= 0),
        ]
    else:
        cpn = meta.get("cores_per_node")
        how = f"read back with --cores-per-node {int(cpn)}" if isinstance(cpn, int | float) and cpn > 1 else (
            "read back as 1 for a serial job, the slots for a parallel one")
        out += [
            ("a job id that is not a number or N.task (renumbered)", lambda j: not _SGE_ID.fullmatch(j.id)),
            (f"node count (Grid Engine records the master host only: {how})",
             lambda j: j.nodes != _sge_nodes_back(j, cpn)),
            ("a status Grid Engine has no code for (a job that ran reads back as completed, failed or timeout, "
             "one that never started as cancelled)", _sge_status_lost),
            ("a size only in nodes (written as slots = nodes)", lambda j: j.nodes > 0 and j.procs <= 0),
        ]
    return out


def _sge_status_lost(j: Job) -> bool:
    if j.start is None or _end(j) is None:
        return j.status is not JobStatus.CANCELLED
    return j.status not in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.TIMEOUT)


def _text(v: str | None) -> str:
    """A Grid Engine field: ':' separates fields and a record is one line."""
    return "".join("_" if c in ":\n\r" else c for c in (v or ""))


def _sge_nodes_back(j: Job, cpn: object) -> int:
    """The node count the Grid Engine reader gives the written job."""
    slots = j.procs if j.procs > 0 else j.nodes
    if isinstance(cpn, int | float) and cpn > 1:
        return max(1, math.ceil(slots / cpn - 1e-9)) if slots else 1
    return slots if j.nodes > 1 and slots else 1


def _renumber(jobs: Sequence[Job], pattern: re.Pattern[str]) -> Callable[[Job], tuple[int, int]]:
    """(number, array index) per job: its own where it has them, else numbers above every job's own."""
    top = max((int(m.group(1)) for j in jobs if (m := pattern.fullmatch(j.id))), default=0)
    fresh: dict[str, int] = {}

    def number(j: Job) -> tuple[int, int]:
        m = pattern.fullmatch(j.id)
        if m:
            return int(m.group(1)), int(m.group(2) or 0)
        if j.id not in fresh:
            fresh[j.id] = top + len(fresh) + 1
        return fresh[j.id], 0

    return number


def _q(text: str | None) -> str:
    return '"' + (text or "").replace('"', '""') + '"'


def _t(v: float | None) -> int:
    return 0 if v is None else math.floor(v)


def write_lsf(jobs: Sequence[Job], out: IO[str]) -> list[str]:
    """``JOB_FINISH`` records (LSF 10.1 field order) in end order; a job that never started gets startTime 0."""
    number = _renumber(jobs, _LSF_ID)
    rows = []
    for seq, j in enumerate(jobs):
        jid, idx = number(j)
        end = _end(j)
        started = j.start is not None and end is not None
        procs = j.procs if j.procs > 0 else j.nodes
        hosts = _hosts(j) or ([f"host{k}" for k in range(j.nodes)] if j.nodes > 0 else [])
        per = [procs // len(hosts) + (1 if k < procs % len(hosts) else 0) for k in range(len(hosts))] if hosts else []
        ex = [f"{max(n, 1)}*{h}" for n, h in zip(per, hosts, strict=True)]
        status = _LSF_DONE if j.status is JobStatus.COMPLETED else _LSF_EXIT
        event = _t(end) if started else _t(j.submit)
        f = ["JOB_FINISH", _q("10.1"), str(event), str(jid), "0", "0", str(max(procs, 0)), str(_t(j.submit)),
             "0", "0", str(_t(j.start) if started else 0), _q(j.user), _q(j.queue), _q(""), _q(""), _q(""), _q(""),
             _q(""), _q(""), _q(""), _q(""), _q(""), "0", str(len(ex)), *ex, str(status), "1.00", _q(j.id),
             _q(""), *(["0"] * 19), _q(""), _q(""), "0" if status == _LSF_DONE else "1", str(max(procs, 0)), _q(""),
             "0", str(idx)]
        f[0] = _q(f[0])
        rows.append((event, seq, " ".join(f)))
    for _, _, line in sorted(rows):
        out.write(line + "\n")
    return []


def sge_in_ms(jobs: Sequence[Job]) -> bool:
    """Whether to write times in milliseconds, as UGE 8.2 and later do: when some time has a fraction and all
    are epoch seconds (the reader tells milliseconds from their size, so times since 0 cannot use them)."""
    return any(_fractional(j) for j in jobs) and min((j.submit for j in jobs), default=0.0) >= _EPOCH_MS_FLOOR


def write_sge(jobs: Sequence[Job], out: IO[str]) -> list[str]:
    """accounting(5) records (SGE 6's 45 fields) in end order; a job that never started has start and end 0.
    Times with fractions are kept to the millisecond where ``sge_in_ms``."""
    number = _renumber(jobs, _SGE_ID)
    ms = sge_in_ms(jobs)

    def stamp(v: float | None) -> str:
        return str(round(v * 1000)) if ms and v is not None else str(_t(v))

    rows = []
    for seq, j in enumerate(jobs):
        jid, task = number(j)
        end = _end(j)
        started = j.start is not None and end is not None
        slots = j.procs if j.procs > 0 else j.nodes
        hosts = _hosts(j)
        failed, code = {JobStatus.COMPLETED: (0, 0), JobStatus.TIMEOUT: (_SGE_ENFORCED, 137)}.get(j.status, (0, 1))
        category = f"-l h_rt={_t(j.requested)}" if j.requested is not None else ""
        f = ["0"] * _SGE_FIELDS
        f[0], f[1], f[2], f[3], f[4] = _text(j.queue), _text(hosts[0] if hosts else "unknown"), (
            "hpcsched"), _text(j.user), _text(j.id)
        f[5], f[6], f[8] = str(jid), "sge", stamp(j.submit)
        f[9], f[10] = (stamp(j.start), stamp(end)) if started else ("0", "0")
        f[11], f[12] = str(failed), str(code)
        f[13] = str(_t(end) - _t(j.start)) if started else "0"
        f[31], f[32], f[33], f[34] = "NONE", "defaultdepartment", ("mpi" if j.nodes > 1 else "NONE"), str(max(slots, 0))
        f[35], f[39], f[41] = str(task), category, "NONE"
        rows.append((_t(end) if started else _t(j.submit), seq, ":".join(f)))
    for _, _, line in sorted(rows):
        out.write(line + "\n")
    return []
