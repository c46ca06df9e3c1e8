"""Trace readers: one module per format, all yielding the records of ``hpcsched.model``.

``open_trace`` detects the format (or takes ``fmt``), streams records and runs the checks every
job log gets (sorted submits, unique ids, sane run times, jobs that fit the machine), counting each
anomaly in the trace's ``TraceReport``.

Conventions for every reader: times are seconds; ``Job.submit`` is epoch seconds where the log ties
its times to the calendar (SWF with ``UnixStartTime``, PBS/wagap, PBS accounting, Cobalt, Slurm, Philly; naive
datetimes read as UTC), otherwise as the log gives them (Muri: relative); ``report.meta['time_base']``
says which. Sizes are nodes, processors and GPUs; every conversion is listed in
``report.conversions``. Each ``Job.extra['line']`` is the line it came from.

A new format is one module of this package defining ``FORMAT`` (or ``FORMATS``, a tuple): any module that is
neither one of the shipped formats imported below nor one of ``HELPERS`` is imported when this package is and its
formats are added after the shipped ones (so sniffed after them: a shipped sniffer never loses its files to a new
one; ``--format NAME`` picks any).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpcsched.errors import InputError
from hpcsched.model import Job
from hpcsched.traces import alibaba, bftrainer, cobalt, gavel, helios, lsf, muri, pbs, philly, sge, slurm, swf
from hpcsched.traces.base import (
    DUPLICATE_ID,
    LARGER_THAN_MACHINE,
    MALFORMED_ROW,
    NEGATIVE_RUNTIME,
    RUNTIME_OVER_REQUEST,
    UNSORTED_SUBMIT,
    ZERO_RUNTIME,
    TraceFormat,
    TraceReport,
    head_lines,
    numbered_lines,
)
from hpcsched.traces.recognise import recognised_unsupported

__all__ = ["FORMATS", "Trace", "TraceFormat", "TraceReport", "detect_format", "numbered_lines", "open_trace",
           "read_jobs"]

# Sniffing tries formats in this order: specific headers first, loose sniffers (node lists) last.
FORMATS: dict[str, TraceFormat] = {f.name: f for f in (
    gavel.FORMAT,  # strict: 10 typed tab-separated fields, no header
    philly.TIRESIAS_FORMAT, philly.JOBLOG_FORMAT, *alibaba.FORMATS, helios.FORMAT,  # DL; Tiresias (s) before Muri (ms)
    muri.FORMAT, muri.CLUSTER_FORMAT, cobalt.FORMAT, philly.FORMAT, *swf.FORMATS, pbs.FORMAT, lsf.FORMAT,
    sge.FORMAT, *slurm.FORMATS,
    *bftrainer.FORMATS
)}

# Other names users reach for; ``--format`` accepts them too.
ALIASES = {"sacct": "slurm-sacct", "jobcomp": "slurm-jobcomp", "eagle": "slurm-csv", "theta": "cobalt",
           "pbs": "swf-pbs", "wagap": "swf-pbs", "sia": "philly", "idle": "bftrainer-idle",
           "jbnd": "bftrainer-bounds", "jnps": "bftrainer-curves",
           "openpbs": "pbs-accounting", "pbspro": "pbs-accounting", "pbs-pro": "pbs-accounting",
           "lsf": "lsf-acct", "lsb.acct": "lsf-acct", "sge": "sge-accounting", "uge": "sge-accounting",
           "grid-engine": "sge-accounting", "torque": "pbs-accounting"}

ALIASES |= {"philly-json": "philly-joblog", "cluster_job_log": "philly-joblog", "openb": "alibaba-pod",
            "alibaba": "alibaba-pod", "pai": "alibaba-pai", "pai-job": "alibaba-pai-job", "sensetime": "helios"}


def detect_format(path: str | Path) -> TraceFormat:
    """The registered format whose sniffer accepts the file's first lines."""
    lines = head_lines(path)
    if not any(line.strip() for line in lines):
        raise InputError(path, "empty file", 1)
    for fmt in FORMATS.values():
        if fmt.sniff(lines):
            return fmt
    known = recognised_unsupported(lines)
    if known is not None:
        raise InputError(path, known, 1)
    raise InputError(
        path, f"unrecognised trace format (known: {', '.join(FORMATS)}); give one with --format", 1
    )


class Trace:
    """A trace file opened for streaming: iterate it once for its records; ``report`` fills as you go."""

    def __init__(
        self, path: str | Path, fmt: str | None = None, strict: bool = False, options: dict[str, Any] | None = None
    ) -> None:
        self.path = Path(path)
        fmt = ALIASES.get(fmt.lower(), fmt.lower()) if fmt is not None else None
        if fmt is None and options and options.get("columns"):
            fmt = "slurm-sacct"  # named columns are those of a headerless sacct dump, which no sniffer can tell
        if fmt is None:
            self.format = detect_format(self.path)
        elif fmt in FORMATS:
            self.format = FORMATS[fmt]
        else:
            raise InputError(self.path, f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
        if options and options.get("columns") and self.format.name != "slurm-sacct":
            raise InputError(self.path, f"--columns names the fields of a headerless sacct dump; the format here is "
                             f"{self.format.name}, which names its own")
        self.report = TraceReport(str(self.path), self.format.name, strict=strict, options=dict(options or {}))

    def __iter__(self) -> Iterator[Any]:
        self.report.reset()  # a second pass counts afresh instead of doubling every anomaly
        records = self.format.read(self.path, self.report)
        if self.format.kind == "jobs":
            records = _validated(records, self.report)
        return _counted(records, self.report)


def _counted(records: Any, report: TraceReport) -> Iterator[Any]:
    """Count what is handed out; a file that gave nothing but malformed rows is one clear error."""
    n = 0
    for n, rec in enumerate(records, 1):  # noqa: B007 - n is read after the loop
        report.records = n
        yield rec
    if n == 0 and report.anomalies[MALFORMED_ROW]:
        report.fail_unreadable()


def open_trace(
    path: str | Path, fmt: str | None = None, strict: bool = False, options: dict[str, Any] | None = None
) -> Trace:
    """Open a trace for one streaming pass. ``options``: reader settings such as ``cores_per_node``."""
    return Trace(path, fmt, strict, options)


def read_jobs(
    path: str | Path, fmt: str | None = None, strict: bool = False, options: dict[str, Any] | None = None
) -> list[Job]:
    """All jobs of a job trace, in file order (a convenience for traces that fit in memory)."""
    trace = open_trace(path, fmt, strict, options)
    if trace.format.kind != "jobs":
        raise InputError(path, f"{trace.format.name} holds {trace.format.kind} records, not jobs")
    return list(trace)


def _machine(report: TraceReport) -> tuple[int, int, int]:
    """Machine size for the larger-than-machine check: options override what the file's header said."""
    for key in ("machine_nodes", "machine_procs", "machine_gpus"):
        given = report.options.get(key)
        if given:
            report.meta[key] = int(given)
            report.convert(f"{key.replace('_', ' ')} = {int(given)} (given as an option)")
    return tuple(int(report.meta.get(k) or 0) for k in ("machine_nodes", "machine_procs", "machine_gpus"))  # type: ignore[return-value]


def _validated(jobs: Any, report: TraceReport) -> Iterator[Job]:
    """The checks every job log gets, whatever its format.

    A repeated id (Slurm array tasks share one) is counted and made unique as ``id#n`` (n-th
    occurrence), so that results keyed by id stay one row per job. A negative run time (a missing
    end stamp) is counted and becomes unknown. The machine size is read after the first job,
    because readers learn it from headers while streaming.
    """
    seen = _SeenIds()
    repeats: dict[str, int] = {}
    last_submit = float("-inf")
    machine: tuple[int, int, int] | None = None
    for job in jobs:  # the hot loop of every read: the common, clean job takes no branch
        if machine is None:
            machine = _machine(report)
            max_nodes, max_procs, max_gpus = machine
        jid = job.id
        if seen.repeated(jid):
            n = repeats[jid] = repeats.get(jid, 1) + 1
            report.anomaly(DUPLICATE_ID, _line(job), jid)
            job = dataclasses.replace(job, id=f"{jid}#{n}")
            report.convert("a repeated job id becomes id#n (n-th occurrence)")
        if job.submit < last_submit:
            report.anomaly(UNSORTED_SUBMIT, _line(job))
        else:
            last_submit = job.submit
        d = job.duration
        if d is not None:
            if d <= 0:
                if d == 0:
                    report.anomaly(ZERO_RUNTIME, _line(job))
                else:
                    report.anomaly(NEGATIVE_RUNTIME, _line(job))
                    job = dataclasses.replace(job, duration=None, end=None)
            elif job.requested is not None and d > job.requested > 0:
                report.anomaly(RUNTIME_OVER_REQUEST, _line(job))
        if (max_nodes and job.nodes > max_nodes) or (max_procs and job.procs > max_procs) or (
            max_gpus and job.gpus > max_gpus
        ):
            report.anomaly(LARGER_THAN_MACHINE, _line(job))
        yield job


class _SeenIds:
    """The ids handed out, for the repeated-id check, in bounded memory for the common log.

    Most logs number their jobs 1, 2, 3, ... in file order: an id above the last such number cannot
    repeat one, so it is kept as 8 bytes in a sorted array instead of a set entry (~80 bytes); a 10^7-job
    SWF then costs 80 MB here, not 1 GB. Other ids (names, numbers out of order) go to a set.
    """

    def __init__(self) -> None:
        self.ascending: array[int] = array("q")
        self.last = -1
        self.other: set[str] = set()

    def repeated(self, jid: str) -> bool:
        """Whether ``jid`` was seen before; records it."""
        if jid.isdigit() and (jid[0] != "0" or jid == "0") and len(jid) < 19:
            v = int(jid)
            if v > self.last:
                self.ascending.append(v)
                self.last = v
                return False
            k = bisect_left(self.ascending, v)
            if k < len(self.ascending) and self.ascending[k] == v:
                return True
        if jid in self.other:
            return True
        self.other.add(jid)
        return False


def _line(job: Job) -> int | None:
    line = job.extra.get("line") if job.extra else None
    return line if isinstance(line, int) else None


# Modules of this package that define no format (readers' helpers, writers, generators, commands): not imported by
# the discovery below, which would otherwise cost every reader their start-up (``cli`` imports typer).
HELPERS = frozenset({"base", "blox", "cli", "convert", "duplicates", "generate_cli", "hostlist", "nodeuse", "pollux",
                     "recognise", "sacct_layout", "swf_columns", "swf_header", "synth", "writers", "writers_acct"})


def _discovered() -> list[str]:
    """This package's modules that are neither shipped formats nor helpers: format modules added by dropping them
    here, by name (a directory listing)."""
    shipped = {f.read.__module__.rpartition(".")[2] for f in FORMATS.values()}
    return sorted(m.name for m in pkgutil.iter_modules(__path__)
                  if m.name not in shipped and m.name not in HELPERS and not m.name.startswith("_"))


def _formats_of(name: str) -> tuple[TraceFormat, ...]:
    """The formats a discovered module defines; a module that defines none is a helper that should be listed."""
    module = importlib.import_module(f"{__name__}.{name}")
    found = tuple(getattr(module, "FORMATS", ())) or ((module.FORMAT,) if hasattr(module, "FORMAT") else ())
    if not found:
        raise ImportError(f"{module.__name__} defines no FORMAT or FORMATS: a helper module of hpcsched.traces is "
                          f"listed in HELPERS there")
    for fmt in found:
        if fmt.name in FORMATS:
            raise ImportError(f"{module.__name__} defines format {fmt.name!r}, a name already taken")
    return found


DISCOVERED = tuple(_discovered())
FORMATS |= {f.name: f for name in DISCOVERED for f in _formats_of(name)}
