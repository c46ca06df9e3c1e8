"""What ``hpcsched jobs`` and ``workers`` show: the columns of each row, their order, and the JSON / YAML forms.

The default columns are the ones a user scans a queue for (kubectl's and squeue's habit): for a job its id, name,
user, state, size, progress and age; for a worker its id, state, slots in use, GPUs, pilot and host. ``-o wide``
adds the rest, whole. ``-o json`` is the ``--json`` output (every field of the message, its keys unchanged).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

from hpcsched.runtime.rpc import pb
from hpcsched.runtime.tables import Column, render, since

OUTPUTS = ("table", "wide", "json", "yaml")
JOB_SORTS = ("id", "name", "user", "state", "size", "progress", "age")
WORKER_SORTS = ("id", "state", "used", "host")


# Protocol fields renamed to names no batch system owns, and the ``--json`` keys they had: a key is a contract, so
# the old one is still given, beside the new one and with the same value.
FORMER_KEYS = {"source_job_id": "slurm_job_id", "source_node": "slurm_node"}


def as_dicts(rows: Sequence) -> list[dict]:
    """Every field of each message (set or not), repeated fields as lists: the ``--json`` keys (a renamed field
    under its former key too, ``FORMER_KEYS``)."""
    fields = [f.name for f in rows[0].DESCRIPTOR.fields] if rows else []
    out = []
    for r in rows:
        d: dict = {}
        for k in fields:
            v = getattr(r, k)
            d[k] = v if isinstance(v, str | int | float) else list(v)
            if k in FORMER_KEYS:
                d[FORMER_KEYS[k]] = d[k]
        out.append(d)
    return out


def dump(rows: Sequence, output: str) -> str:
    """``-o json`` (as ``--json`` printed it) or ``-o yaml``."""
    data = as_dicts(rows)
    if output == "yaml":
        import yaml

        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1 << 16).rstrip()
    return json.dumps(data, indent=1)


def _size(j: pb.JobInfo) -> str:
    now = j.procs if j.state in ("running", "stopping") else j.target_procs or j.procs
    return f"{now} ({j.min_procs}-{j.max_procs})" if j.min_procs != j.max_procs else str(now)


def _progress(j: pb.JobInfo, wide: bool) -> str:
    if not j.steps_total:
        return str(j.steps_done) if j.steps_done else "-"
    text = f"{j.steps_done}/{j.steps_total}"
    return text if wide or len(text) <= 11 else f"{100 * j.steps_done // j.steps_total}%"


def _seq(job_id: str) -> tuple[int, str]:
    digits = job_id.lstrip("j")
    return (int(digits), job_id) if digits.isdigit() else (1 << 62, job_id)


def sort_jobs(rows: list[pb.JobInfo], key: str, reverse: bool = False) -> list[pb.JobInfo]:
    """Sorted by one of JOB_SORTS (ties in submit order); ``age``: oldest first."""
    keys: dict[str, Callable[[pb.JobInfo], object]] = {
        "id": lambda j: _seq(j.job_id), "name": lambda j: j.name, "user": lambda j: j.owner,
        "state": lambda j: j.state, "size": lambda j: j.procs or j.target_procs,
        "progress": lambda j: j.steps_done / j.steps_total if j.steps_total else 0.0,
        "age": lambda j: j.submit_time,
    }
    out = sorted(rows, key=lambda j: _seq(j.job_id))
    return sorted(out, key=keys[key], reverse=reverse) if key != "id" else out[::-1] if reverse else out


def jobs_table(rows: Sequence[pb.JobInfo], wide: bool, width: int | None, now: float | None = None) -> str:
    """The jobs as a table: the default columns fit ``width`` (names and users elided in the middle; ids and
    states whole); ``wide``: every column, nothing shortened."""
    now = time.time() if now is None else now
    cols = [Column("ID", elide=False), Column("NAME"), Column("USER"), Column("STATE", elide=False),
            Column("SIZE", right=True), Column("PROGRESS", right=True), Column("AGE", right=True)]
    if wide:
        cols += [Column(h) for h in ("LAUNCHER", "LOSS", "CKPT", "RESTARTS", "WORKERS", "PILOTS", "INTERLEAVED",
                                     "SIZED BY", "MESSAGE")]
    table = []
    for j in rows:
        r = [j.job_id, j.name, j.owner or "-", j.state, _size(j), _progress(j, wide), since(j.submit_time, now)]
        if wide:
            sized = "" if not j.sizing else "MILP" if j.sizing == "optimal" else f"{j.sizing} (not optimal)"
            r += [j.launcher, f"{j.first_loss:.3f} -> {j.last_loss:.3f}" if j.steps_done else "-",
                  str(j.last_checkpoint_step), str(j.restarts), ",".join(j.workers) or "-",
                  ",".join(j.pilot_jobs) or "-", ",".join(j.interleaved_with) or "-", sized or "-", j.message or "-"]
        table.append(r)
    return render(cols, table, None if wide else width)


def _pilot(w: pb.WorkerInfo) -> str:
    return f"{w.source_job_id}@{w.source_node} {w.pilot_state.lower()}" if w.pilot else "-"


def sort_workers(rows: list[pb.WorkerInfo], key: str, reverse: bool = False) -> list[pb.WorkerInfo]:
    keys: dict[str, Callable[[pb.WorkerInfo], object]] = {
        "id": lambda w: w.worker_id, "state": lambda w: not w.alive, "used": lambda w: w.used, "host": lambda w: w.host,
    }
    return sorted(sorted(rows, key=lambda w: w.worker_id), key=keys[key], reverse=reverse)


def workers_table(rows: Sequence[pb.WorkerInfo], wide: bool, width: int | None, now: float | None = None) -> str:
    """The workers, one line each (a pilot too: its batch job, node and state in one cell)."""
    now = time.time() if now is None else now
    cols = [Column("WORKER", elide=False), Column("STATE", elide=False), Column("USED", right=True),
            Column("GPUS", right=True), Column("GPU TYPE"), Column("PILOT"), Column("HOST")]
    if wide:
        cols += [Column("LAST SEEN", right=True)]
    table = []
    for w in rows:
        # the type a worker advertises matters without GPUs too: jobs that ask for a type go only to its workers
        r = [w.worker_id, "alive" if w.alive else "lost", f"{w.used}/{w.slots}", str(w.gpus), w.gpu_type or "-",
             _pilot(w), w.host]
        if wide:
            r.append(since(w.last_seen, now))
        table.append(r)
    return render(cols, table, None if wide else width)


def nodes_table(nodes: Sequence[pb.SourceNode], width: int | None) -> str:
    """``workers --nodes``: each node of the pilots' partition (queue) and what it does for the controller."""
    cols = [Column("NODE", elide=False), Column("PILOT", elide=False), Column("USE (OR WHY NOT USED)")]
    return render(cols, [[n.node, n.source_job_id or "-", n.use] for n in nodes], width)
