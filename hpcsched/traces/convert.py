"""``hpcsched trace convert``: any job trace hpcsched reads, written in another format.

Targets (``TARGETS``): ``swf`` (the batch replayer's and the Parallel Workloads Archive's format),
``muri`` (the simulator's DL trace CSV, milliseconds), ``slurm-sacct`` (``sacct -P`` layout, any
delimiter, or its fixed-width table), ``pbs-accounting`` (PBS Pro / OpenPBS records), ``lsf-acct`` (LSF
``lsb.acct`` JOB_FINISH records) and ``sge-accounting`` (Grid Engine accounting(5)). Every writer
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
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hpcsched.errors import InputError
from hpcsched.model import Job, JobStatus
from hpcsched.traces.writers import (
    count_where,
    job_duration,
    wait_unknown,
    write_muri,
    write_pbs,
    write_sacct,
    write_swf,
)
from hpcsched.traces.writers_acct import acct_losses, write_lsf, write_sge

__all__ = ["TARGETS", "ConvertResult", "Loss", "convert_trace", "losses", "write_jobs"]

TARGETS = ("swf", "muri", "slurm-sacct", "pbs-accounting", "lsf-acct", "sge-accounting")
_TARGET_ALIASES = {"sacct": "slurm-sacct", "pbs": "pbs-accounting", "openpbs": "pbs-accounting",
                   "pbspro": "pbs-accounting", "simulator": "muri", "tiresias": "muri", "lsf": "lsf-acct",
                   "lsb.acct": "lsf-acct", "sge": "sge-accounting", "uge": "sge-accounting",
                   "grid-engine": "sge-accounting"}


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


def losses(jobs: Sequence[Job], target: str, gpus_per_node: int | None = None,
           meta: dict[str, Any] | None = None) -> list[Loss]:
    """What ``target`` cannot hold of ``jobs``: required losses first, then the rest. ``meta``: the source
    reader's (its cores per node decide how Grid Engine reads node counts back)."""
    target = target_name(target)
    out: list[Loss] = []

    def add(what: str, pred: Callable[[Job], bool], required: bool = False) -> None:
        n, first = count_where(jobs, pred)
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
            lambda j: not ((job_duration(j) or 0) > 0 or (j.iterations or 0) > 0), required=True)
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
            "for it, so the start is written as known)", wait_unknown)
    if target in ("lsf-acct", "sge-accounting"):
        for what, pred in acct_losses(jobs, target, meta or {}):
            add(what, pred)
    if target != "muri":
        add("iterations, iteration time, stage profile and model (only Muri CSV has them)",
            lambda j: j.iterations is not None or j.profile is not None or j.model is not None)
    return sorted(out, key=lambda loss: not loss.required)


def source_notes(meta: dict[str, Any]) -> list[str]:
    """Fields the source's reader saw filled but no ``Job`` holds, so no target gets them."""
    not_kept = meta.get("swf_fields_not_kept")
    if isinstance(not_kept, dict) and not_kept:
        fields = ", ".join(f"{name} (first at line {line})" for name, line in not_kept.items())
        return [f"not carried over: the source's SWF {fields}: hpcsched reads no such job field"]
    return []


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
    if target == "lsf-acct":
        return write_lsf(jobs, out)
    if target == "sge-accounting":
        return write_sge(jobs, out)
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
    found = losses(jobs, target, gpus_per_node, meta)
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
        return lambda j: (j.gpus > 0 or j.nodes * gpn > 0) and ((job_duration(j) or 0) > 0 or (j.iterations or 0) > 0)
    if target == "swf":
        return lambda j: not (j.gpus > 0 and not (j.nodes or j.procs))
    return lambda j: True
