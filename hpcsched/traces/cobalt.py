"""Cobalt (ALCF) job logs as the DIR-LAB/lumos CSV of Theta: one row per job, times in epoch seconds.

Columns: ``,job,user,project,state,gpu_num,cpu_num,node_num,submit_time,wait_time,run_time,wall_time,
node_hour,new_status`` (leading unnamed index). ``wall_time`` is the requested time; start is
``submit_time + wait_time``. ``new_status``: Pass -> completed, Killed -> cancelled (they ran and
held nodes, so they stay in), Failed -> failed.

The log does not say the machine size, and Cobalt ran on several ALCF machines, so no size is assumed
for every log: ``machine_nodes`` (``--machine-nodes``) sets it; otherwise a file whose name holds a
known machine's name as a word (``theta-2022-2023.csv.gz``) gets that machine's size from
``KNOWN_MACHINES``; otherwise none is set (``replay --log`` then uses the log's peak concurrent use).
Which one applied is stated as a conversion and in ``meta['machine_nodes_source']``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

from hpcsched.model import Job, JobStatus
from hpcsched.traces.base import MALFORMED_ROW, MAX_COUNT, UNKNOWN_FIELD, TraceFormat, TraceReport, csv_records

COLUMNS = ("job", "node_num", "submit_time", "wait_time", "run_time", "wall_time")
THETA_NODES = 4392
# Machines that ran Cobalt, by the word a log's file name would carry: (name, compute nodes).
KNOWN_MACHINES = {
    "theta": ("Theta", THETA_NODES),
    "thetagpu": ("ThetaGPU", 24),
    "mira": ("Mira", 49152),
    "cooley": ("Cooley", 126),
    "polaris": ("Polaris", 560),
}
_STATUS = {"pass": JobStatus.COMPLETED, "killed": JobStatus.CANCELLED, "failed": JobStatus.FAILED}


def _num(text: str) -> float | None:
    """A number, None for the unknowns real dumps hold (empty, nan, -1)."""
    t = text.strip()
    if t.lower() in ("", "nan", "none"):
        return None
    v = float(t)
    return None if v == -1 or not math.isfinite(v) else v


def _read(path: Path, report: TraceReport) -> Iterator[Job]:
    report.meta["time_base"] = "epoch"
    if report.options.get("machine_nodes"):
        report.meta["machine_nodes_source"] = "given as an option"
    else:
        known = known_machine(path)
        if known is not None:
            name, size = known
            report.meta.update(machine_nodes=size, machine_name=name,
                               machine_nodes_source=f"known machine {name}, named in the file name {path.name!r}")
            report.convert(f"machine size not in the log: {name}'s {size} nodes, from the file name "
                           "(--machine-nodes overrides)")
        else:
            report.convert("machine size not in the log and the file name names no known Cobalt machine "
                           f"({', '.join(KNOWN_MACHINES)}): none assumed (--machine-nodes sets it)")
    report.convert("start = submit_time + wait_time; wall_time = requested time; node_num = nodes")
    for lineno, row in csv_records(path, COLUMNS, report, what="Cobalt/Theta CSV"):
        try:
            submit, wait, run = _num(row["submit_time"]), _num(row["wait_time"]), _num(row["run_time"])
            nodes, wall = _num(row["node_num"]), _num(row["wall_time"])
            cpus = _num(row.get("cpu_num", "")) or 0
            gpus = _num(row.get("gpu_num", "")) or 0
            for name, v in (("node_num", nodes), ("cpu_num", cpus), ("gpu_num", gpus)):
                if v is not None and not (0 <= v <= MAX_COUNT and float(v).is_integer()):
                    raise ValueError(f"{name}: {v!r} is not a plausible count")
        except ValueError as e:
            report.anomaly(MALFORMED_ROW, lineno, str(e))
            continue
        if submit is None:
            report.anomaly(MALFORMED_ROW, lineno, "submit_time unknown: job skipped")
            continue
        for name, v in (("wait_time", wait), ("run_time", run), ("node_num", nodes), ("wall_time", wall)):
            if v is None:
                report.anomaly(UNKNOWN_FIELD, lineno, name)
        start = submit + wait if wait is not None else None
        yield Job(
            id=row["job"].strip(),
            submit=submit,
            nodes=int(nodes or 0),
            procs=int(cpus),
            gpus=int(gpus),
            duration=run,
            requested=wall,
            start=start,
            end=start + run if start is not None and run is not None and run >= 0 else None,
            status=_STATUS.get(row.get("new_status", "").strip().lower(), JobStatus.UNKNOWN),
            user=row.get("user") or None,
            queue=None,
            extra={"line": lineno},
        )


def known_machine(path: str | Path) -> tuple[str, int] | None:
    """(name, nodes) of the machine a log's file name names as a word, e.g. ``theta-2022.csv``; else None.

    Whole words only, so ``thetagpu-2023.csv`` is ThetaGPU, not Theta, and an unrelated name never
    borrows a size.
    """
    words = re.split(r"[^a-z0-9]+", Path(path).name.lower())
    for word in words:
        if word in KNOWN_MACHINES:
            return KNOWN_MACHINES[word]
    return None


def sniff(first_lines: list[str]) -> bool:
    line = next((s for s in first_lines if s.strip()), "")
    cols = {c.strip().strip('"') for c in line.split(",")}
    return set(COLUMNS) <= cols


FORMAT = TraceFormat("cobalt", "jobs", "Cobalt/ALCF Theta job CSV (DIR-LAB/lumos), epoch seconds", sniff, _read)
