"""Gavel's trace format (stanford-futuredata/gavel, ``scheduler/traces``): one job per line, 10 tab-separated fields.

Fields, in order: job type (``ResNet-18 (batch size 64)``, the key into Gavel's throughput table), command
(with ``%s`` for the data directory), working directory, the command's steps argument, needs-data-dir
(0/1), total steps, scale factor (GPUs, >= 1), priority weight, SLO (a negative one means none) and
arrival time (s, relative). No header. Gavel numbers jobs from 0 in file order; so do we.

Mapped to ``Job``: id = index, submit = arrival, gpus = scale factor, iterations = total steps,
model = job type; the rest in ``extra`` (``command``, ``working_directory``, ``num_steps_arg``,
``needs_data_dir``, ``priority_weight``, ``slo`` (None when negative), ``line``). A job's length in
seconds depends on the GPU type it gets, so ``duration`` is unknown (the throughput table gives it).

Anomalies of this reader: ``malformed_row`` (wrong field count, a field that is not a number of its
kind, scale factor < 1; skipped), ``zero_steps`` (total steps 0; kept).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hpcsched.model import Job
from hpcsched.traces.base import MALFORMED_ROW, TraceFormat, TraceReport, count_field, numbered_lines

ZERO_STEPS = "zero_steps"
FIELDS = ("job_type", "command", "working_directory", "num_steps_arg", "needs_data_dir", "total_steps",
          "scale_factor", "priority_weight", "SLO", "arrival_time")


def _count(text: str, name: str) -> int:
    try:
        return count_field(text.strip(), name)
    except ValueError as e:
        raise ValueError(str(e) if str(e).startswith(name) else f"{name}: not a whole number: {text!r}") from None


def _number(text: str, name: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{name}: not a number: {text!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name}: not a finite number: {text!r}")
    return v


@dataclass(frozen=True, slots=True)
class GavelLine:
    """One parsed line, typed."""

    job_type: str
    command: str
    working_directory: str
    num_steps_arg: str
    needs_data_dir: bool
    total_steps: int
    scale_factor: int
    priority_weight: float
    slo: float | None
    arrival: float


def parse_line(line: str) -> GavelLine:
    """The fields of one Gavel line, typed; ValueError naming the bad field."""
    parts = line.split("\t")
    if len(parts) != len(FIELDS):
        raise ValueError(f"{len(parts)} tab-separated fields, Gavel's format has {len(FIELDS)}")
    job_type, command, workdir, steps_arg, needs, steps, scale, weight, slo, arrival = parts
    if not job_type.strip():
        raise ValueError("job_type: empty")
    if needs.strip() not in ("0", "1"):
        raise ValueError(f"needs_data_dir: expected 0 or 1, got {needs!r}")
    scale_factor = _count(scale, "scale_factor")
    if scale_factor < 1:
        raise ValueError(f"scale_factor: must be >= 1, got {scale!r}")
    priority = _number(weight, "priority_weight")
    if priority < 0:
        raise ValueError(f"priority_weight: must be >= 0, got {weight!r}")
    arrival_s = _number(arrival, "arrival_time")
    if arrival_s < 0:
        raise ValueError(f"arrival_time: must be >= 0, got {arrival!r}")
    slo_v = _number(slo, "SLO")
    return GavelLine(job_type, command, workdir, steps_arg, needs.strip() == "1",
                     _count(steps, "total_steps"), scale_factor, priority,
                     slo_v if slo_v >= 0 else None, arrival_s)


def sniff(first_lines: list[str]) -> bool:
    """Every non-empty line of the head has Gavel's 10 tab-separated fields and parses (no header)."""
    lines = [s for s in first_lines if s.strip()]
    if not lines:
        return False
    try:
        for s in lines[:10]:
            parse_line(s)
    except ValueError:
        return False
    return True


def _read(path: Path, report: TraceReport) -> Iterator[Job]:
    report.meta["time_base"] = "relative"
    report.convert("Gavel trace: arrival_time (s) -> submit, scale_factor -> gpus, total_steps -> iterations")
    n = 0
    for lineno, line in numbered_lines(path, report):
        if not line.strip():
            continue
        try:
            f = parse_line(line)
        except ValueError as e:
            report.anomaly(MALFORMED_ROW, lineno, str(e))
            continue
        if f.total_steps == 0:
            report.anomaly(ZERO_STEPS, lineno)
        extra = {"command": f.command, "working_directory": f.working_directory, "num_steps_arg": f.num_steps_arg,
                 "needs_data_dir": f.needs_data_dir, "priority_weight": f.priority_weight, "slo": f.slo,
                 "line": lineno}
        yield Job(id=str(n), submit=f.arrival, gpus=f.scale_factor, iterations=f.total_steps, model=f.job_type,
                  extra=extra)
        n += 1


FORMAT = TraceFormat("gavel", "jobs", "Gavel job trace (10 tab-separated fields: type, command, ..., steps, "
                     "scale factor, priority, SLO, arrival s)", sniff, _read)
