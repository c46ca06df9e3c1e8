"""``hpcsched replay``: elastic jobs harvesting the idle nodes of a real machine, replayed from its log."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from hpcsched.errors import InputError
from hpcsched.milp import SOLVERS, Objective, SolverUnavailable
from hpcsched.model import ElasticJob
from hpcsched.results import write_results
from hpcsched.sim.replay import ACCOUNTING, EVENT_COLUMNS, ReplayConfig, ReplayResult, replay
from hpcsched.sim.replay_events import PoolTimeline, timeline_from_intervals, timeline_from_log

EVENTS_FILE = "events.csv"
PROGRESS_FILE = "job_progress.csv"


def _shifted(jobs: list[ElasticJob], start: float, end: float) -> tuple[list[ElasticJob], float]:
    """Elastic jobs moved so the first submits at the log's start, when their times miss the log."""
    first = min(j.submit for j in jobs)
    if start <= first <= end:
        return jobs, 0.0
    shift = start - first
    moved = [ElasticJob(j.id, j.submit + shift, j.jmin, j.jmax, j.curve, j.total_samples, j.scale_up_s,
                        j.scale_down_s) for j in jobs]
    return moved, shift


def _idle_timeline(idle: Path, nodes: int | None, order_file: Path | None, start: float) -> PoolTimeline:
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


def _num(v: object) -> object:
    return (f"{v:.6f}".rstrip("0").rstrip(".") or "0") if isinstance(v, float) else v


def _write(out: Path, res: ReplayResult, meta: dict[str, object]) -> None:
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


def replay_cmd(
    idle: Path | None = typer.Option(None, "--idle", help="BFTrainer idle intervals (node,idle_start,idle_end)."),
    log: Path | None = typer.Option(None, "--log", help="A batch job log (SWF, Slurm, Cobalt...) replayed first-fit."),
    jobs_file: Path = typer.Option(..., "--jobs", help="Elastic job bounds (Jbnd CSV)."),
    curves: Path = typer.Option(..., "--curves", help="Scaling curves (JNPs CSV: job,Ns,Ps,...)."),
    out: Path = typer.Option(..., "--out", help="Directory for jobs.csv, meta.json, events.csv, job_progress.csv."),
    nodes: int | None = typer.Option(None, "--nodes", help="--idle: the first N nodes of the node order; "
                                     "--log: machine size (default: the log's peak use)."),
    node_order: Path | None = typer.Option(None, "--node-order", help="Node order file (default: node-order.txt "
                                           "beside --idle)."),
    tfwd: float = typer.Option(10.0, "--tfwd", help="Look-ahead window Tfwd, seconds."),
    solver: str = typer.Option("highs", "--solver", help=f"One of {', '.join(SOLVERS)}."),
    objective: Objective = typer.Option(Objective.REFERENCE, "--objective", help="reference: BFTrainer's; "
                                        "window: charges restart stalls inside Tfwd."),
    accounting: str = typer.Option("reference", "--accounting", help=f"How rescales cost progress: {ACCOUNTING}."),
    predict_tfwd: bool = typer.Option(False, "--predict-tfwd", help="Tfwd = median idle stretch seen so far."),
    exact_events: bool = typer.Option(False, "--exact-events", help="Also re-solve when a job completes or is "
                                      "submitted (the reference waits for the next pool change)."),
    max_jobs: int = typer.Option(10, "--max-jobs", help="Jobs admitted at once (the reference's maxJ)."),
    time_limit: float = typer.Option(10.0, "--time-limit", help="Seconds per MILP decision."),
    start: float | None = typer.Option(None, "--start", help="Replay start (epoch s); default: first job's submit."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
) -> None:
    """Replay idle nodes harvested by elastic jobs (BFTrainer), one allocator decision per pool change.

    Utilisation is node-seconds used by elastic jobs / idle node-seconds, until the last job completes.
    Example: hpcsched replay --idle trace-data/bftrainer/idle-intervals.csv.gz --nodes 40
    --jobs trace-data/bftrainer/hps-shufflenet-Jbnd-10J.csv --curves trace-data/bftrainer/hps-shufflenet-JNPs-10J.csv
    --tfwd 10 --out out/replay40
    """
    from hpcsched.traces.bftrainer import read_elastic_jobs

    if (idle is None) == (log is None):
        raise typer.BadParameter("give exactly one of --idle FILE or --log FILE")
    if solver not in SOLVERS:
        raise typer.BadParameter(f"--solver must be one of {', '.join(SOLVERS)}")
    if accounting not in ACCOUNTING:
        raise typer.BadParameter(f"--accounting must be one of {', '.join(ACCOUNTING)}")
    if tfwd <= 0:
        raise typer.BadParameter("--tfwd must be > 0")
    jobs = read_elastic_jobs(jobs_file, curves)
    if not jobs:
        raise InputError(jobs_file, "no jobs")
    err = Console(stderr=True)
    shift = 0.0
    with err.status("building idle-pool events..."):
        if idle is not None:
            t0 = start if start is not None else min(j.submit for j in jobs)
            tl = _idle_timeline(idle, nodes, node_order, t0)
        else:
            assert log is not None
            tl = timeline_from_log(log, nodes)
            jobs, shift = _shifted(jobs, tl.start, tl.end)
    config = ReplayConfig(tfwd=tfwd, solver=solver, objective=objective, accounting=accounting,
                          max_jobs=max_jobs, time_limit=time_limit, predict_tfwd=predict_tfwd,
                          exact_events=exact_events)
    with Progress(TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("replay", total=max(len(tl.events), 1))
        try:
            res = replay(tl, jobs, config, progress=lambda k, n: bar.update(task, completed=k, total=max(n, 1)))
        except SolverUnavailable as e:  # a missing extra or Gurobi's size-limited licence: say which
            err.print(f"error: {e}", markup=False, highlight=False)
            raise typer.Exit(2) from None
    s = res.summary
    meta: dict[str, object] = {
        "tool": "replay", "policy": f"bftrainer-{solver}", "trace": str(idle or log), "jobs_file": str(jobs_file),
        "cluster": f"{len(tl.nodes)} nodes", "capacity_nodes": len(tl.nodes),
        "capacity_node_seconds": float(s["idle_node_hours"]) * 3600.0,  # type: ignore[arg-type]
        "tfwd": tfwd, "objective": str(objective), "accounting": accounting, "predict_tfwd": predict_tfwd,
        "exact_events": exact_events, "max_jobs": max_jobs, "submit_shift_s": shift, **tl.notes, "summary": s,
    }
    _write(out, res, meta)
    if as_json:
        print(json.dumps({**s, "nodes": len(tl.nodes), "out": str(out)}))
        return
    con = Console()
    con.print(f"replay on {len(tl.nodes)} nodes, {s['events']} events, {s['jobs_done']}/{s['jobs']} jobs done")
    con.print(f"idle {s['idle_node_hours']:.1f} node-h, used {s['used_node_hours']:.1f} node-h, "
              f"utilisation {s['utilization']:.4f}, rescales {s['rescales']}, samples {s['samples']:.4g}")
    con.print(f"results in {out}")


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_cmd)
