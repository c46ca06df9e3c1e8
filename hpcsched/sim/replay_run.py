"""One replay from files to files: the single code path behind ``hpcsched replay`` and a sweep's replay cell.

``run_replay(request, out)`` reads the elastic jobs, builds the idle-pool timeline (from BFTrainer
idle intervals or by replaying a batch log first-fit), runs the replayer and writes ``jobs.csv``,
``meta.json``, ``events.csv`` and ``job_progress.csv`` into ``out``. The CLI adds option parsing and
printing, the sweep adds arrival scaling and its cell bookkeeping; neither re-implements a step, so a
sweep cell and the command with the same parameters give the same files.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.model import ElasticJob
from hpcsched.results import write_results
from hpcsched.sim.replay import EVENT_COLUMNS, ReplayConfig, ReplayResult, replay
from hpcsched.sim.replay_events import PoolTimeline, timeline_from_intervals, timeline_from_log

EVENTS_FILE = "events.csv"
PROGRESS_FILE = "job_progress.csv"

JobsHook = Callable[[list[ElasticJob]], list[ElasticJob]]


@dataclass(frozen=True)
class ReplayRequest:
    """Everything one replay needs: the jobs, exactly one source of idle nodes, and the allocator's config.

    ``nodes`` means the first N names of the node order for ``idle``, and the machine size for ``log``
    (None: the log's peak use). ``start`` (epoch s) applies to ``idle`` only; None: the first submit.
    """

    jobs_file: Path
    curves: Path
    idle: Path | None = None
    log: Path | None = None
    nodes: int | None = None
    node_order: Path | None = None
    start: float | None = None
    config: ReplayConfig = field(default_factory=ReplayConfig)

    def __post_init__(self) -> None:
        if (self.idle is None) == (self.log is None):
            raise ValueError("give exactly one of idle (idle intervals) or log (a batch job log)")


@dataclass
class ReplayRun:
    """What ``run_replay`` produced: the replayer's result, the pool it harvested, and what it wrote."""

    result: ReplayResult
    timeline: PoolTimeline
    meta: dict[str, object]
    submit_shift_s: float
    out: Path

    @property
    def summary(self) -> dict[str, object]:
        return self.result.summary


def shift_into_log(jobs: Sequence[ElasticJob], start: float, end: float) -> tuple[list[ElasticJob], float]:
    """Move the jobs so the first submits at the log's start when their times miss the log.

    BFTrainer's job files use their own epoch; against a real log they would otherwise arrive before
    or after every idle node. Returns the moved jobs and the shift (0 when they already fall inside).
    """
    first = min(j.submit for j in jobs)
    if start <= first <= end:
        return list(jobs), 0.0
    shift = start - first
    return [dataclasses.replace(j, submit=j.submit + shift) for j in jobs], shift


def idle_timeline(idle: Path, nodes: int | None, order_file: Path | None, start: float) -> PoolTimeline:
    """The pool from idle intervals; ``nodes`` keeps the first N names of the node order.

    The node order defaults to ``node-order.txt`` beside the idle file (the bundled data's layout).
    """
    from hpcsched.traces.bftrainer import read_idle_intervals, read_node_order

    if order_file is None and (idle.parent / "node-order.txt").is_file():
        order_file = idle.parent / "node-order.txt"
    names: list[str] | None = read_node_order(order_file) if order_file is not None else None
    if nodes is not None:
        if names is None:
            raise InputError(idle, "--nodes N takes the first N names of a node-order file; give --node-order")
        if not 1 <= nodes <= len(names):
            raise InputError(order_file, f"--nodes {nodes}: the node order lists {len(names)} nodes")
        names = names[:nodes]
    return timeline_from_intervals(read_idle_intervals(idle), names, start)


def run_replay(
    request: ReplayRequest,
    out: Path,
    *,
    prepare_jobs: JobsHook | None = None,
    progress: Callable[[int, int], None] | None = None,
    meta_extra: Mapping[str, object] | None = None,
) -> ReplayRun:
    """Replay ``request`` and write its files into ``out``.

    ``prepare_jobs`` alters the jobs right after they are read (the sweep scales their arrivals);
    ``progress(done, total)`` follows the replayer's events; ``meta_extra`` is merged into meta.json.
    Bad input raises InputError; a solver that is not installed raises SolverUnavailable.
    """
    from hpcsched.traces.bftrainer import read_elastic_jobs

    jobs = read_elastic_jobs(request.jobs_file, request.curves)
    if prepare_jobs is not None:
        jobs = prepare_jobs(jobs)
    if not jobs:
        raise InputError(request.jobs_file, "no jobs")
    shift = 0.0
    if request.idle is not None:
        t0 = request.start if request.start is not None else min(j.submit for j in jobs)
        tl = idle_timeline(request.idle, request.nodes, request.node_order, t0)
    else:
        assert request.log is not None
        tl = timeline_from_log(request.log, request.nodes)
        jobs, shift = shift_into_log(jobs, tl.start, tl.end)
    cfg = request.config
    res = replay(tl, jobs, cfg, progress=progress)
    s = res.summary
    meta: dict[str, object] = {
        "tool": "replay", "policy": f"bftrainer-{cfg.solver}", "trace": str(request.idle or request.log),
        "jobs_file": str(request.jobs_file), "cluster": f"{len(tl.nodes)} nodes", "capacity_nodes": len(tl.nodes),
        "capacity_node_seconds": float(s["idle_node_hours"]) * 3600.0,  # type: ignore[arg-type]
        "tfwd": cfg.tfwd, "objective": str(cfg.objective), "accounting": cfg.accounting,
        "predict_tfwd": cfg.predict_tfwd, "exact_events": cfg.exact_events, "max_jobs": cfg.max_jobs,
        "submit_shift_s": shift, **(meta_extra or {}), **tl.notes, "summary": s,
    }
    write_replay(out, res, meta)
    return ReplayRun(res, tl, meta, shift, out)


def _num(v: object) -> object:
    return (f"{v:.6f}".rstrip("0").rstrip(".") or "0") if isinstance(v, float) else v


def write_replay(out: Path, res: ReplayResult, meta: dict[str, object]) -> None:
    """jobs.csv + meta.json (the simulator's schema, so ``hpcsched calc`` reads them), events, progress."""
    write_results(out, res.jobs, meta)
    with open(out / EVENTS_FILE, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(EVENT_COLUMNS)
        for row in res.events:
            w.writerow([_num(v) for v in row])
    with open(out / PROGRESS_FILE, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["job_id", "samples", "rescales", "preemptions"])
        w.writeheader()
        w.writerows(res.per_job)
