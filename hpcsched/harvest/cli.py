"""``hpcsched replay``: elastic jobs harvesting the idle nodes of a real machine, replayed from its log."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from hpcsched.harvest.replay import ACCOUNTING

# The options' help and types need these; the replay runner and rich are imported inside `replay_cmd`.
from hpcsched.milp import SOLVERS, Objective


def replay_cmd(
    idle: Path | None = typer.Option(None, "--idle", help="BFTrainer idle intervals (node,idle_start,idle_end)."),
    log: Path | None = typer.Option(None, "--log", help="A batch job log (SWF, Slurm, Cobalt...) replayed first-fit."),
    jobs_file: Path = typer.Option(..., "--jobs", help="Elastic job bounds (Jbnd CSV)."),
    curves: Path = typer.Option(..., "--curves", help="Scaling curves (JNPs CSV: job,Ns,Ps,...)."),
    out: Path = typer.Option(..., "--out", help="Directory for jobs.csv, meta.json, events.csv, job_progress.csv."),
    nodes: int | None = typer.Option(None, "--nodes", help="--idle: the first N nodes of the node order; "
                                     "--log: machine size (default: the log header's or a known machine's size, "
                                     "else the log's peak concurrent use; the size used and its source are "
                                     "printed)."),
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
    no_pause: bool = typer.Option(False, "--no-pause", help="Never pause an admitted job, as the runtime controller "
                                  "decides: jobs are admitted at their minimum first come first served, and a job the "
                                  "allocator would pause is held at its minimum (BFTrainer's model may pause any)."),
    max_jobs: int = typer.Option(10, "--max-jobs", help="Jobs admitted at once (the reference's maxJ)."),
    time_limit: float = typer.Option(10.0, "--time-limit", help="Seconds per MILP decision."),
    start: float | None = typer.Option(None, "--start", help="Replay start (epoch s); default: the first elastic "
                                       "submit (--idle), the log's first job start (--log)."),
    skip_warmup: bool = typer.Option(False, "--skip-warmup", help="--log: start where the log's use first reaches "
                                     "its typical level (a log lacks the jobs running when it begins)."),
    log_format: str | None = typer.Option(None, "--format", help="--log: the log's format (default: detected; "
                                          "hpcsched trace inspect --help lists them)."),
    columns: str | None = typer.Option(None, "--columns", help="--log: the columns of a headerless sacct dump "
                                       "(sacct -P --noheader): its --format list, or xdmod / apel."),
    delimiter: str | None = typer.Option(None, "--delimiter", help="--log: sacct's field delimiter."),
    goodput: Path | None = typer.Option(None, "--goodput", help="Goodput profiles (CSV job,application,"
                                        "gpus_per_node,epochs): those jobs train a Pollux application with an "
                                        "adaptive batch; their progress and Pmax are useful (base-batch) samples."),
    value: str = typer.Option("goodput", "--value", help="With --goodput: what the MILP values profiled jobs by: "
                              "goodput (throughput x statistical efficiency at the best batch) or throughput (the "
                              "samples/s of that configuration). Other jobs are valued by their curves either way."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar (shown on stderr only when it is a "
                               "terminal, never with --json)."),
) -> None:
    """Replay idle nodes harvested by elastic jobs (BFTrainer), one allocator decision per pool change.

    Utilisation is node-seconds held by elastic jobs / idle node-seconds until the last job completes
    (BFTrainer's figure); useful utilisation leaves out nodes held by jobs already past Pmax. The machine
    size and its source, log rows and jobs left out, a warm-up start and non-optimal decisions are
    printed on stderr and kept in meta.json; with --json, stdout holds only the JSON object. A progress bar
    with ETA over the pool events shows on stderr when it is a terminal (not with --json or --quiet).
    Example: hpcsched replay --idle trace-data/bftrainer/idle-intervals.csv.gz --nodes 40
    --jobs trace-data/bftrainer/hps-shufflenet-Jbnd-10J.csv --curves trace-data/bftrainer/hps-shufflenet-JNPs-10J.csv
    --tfwd 10 --out out/replay40
    """

    from rich.console import Console

    from hpcsched.harvest.replay import ReplayConfig
    from hpcsched.harvest.run import ReplayRequest, run_replay
    from hpcsched.milp import SolverUnavailable
    from hpcsched.progress import progress_bar, wanted

    if (idle is None) == (log is None):
        raise typer.BadParameter("give exactly one of --idle FILE or --log FILE")
    if solver not in SOLVERS:
        raise typer.BadParameter(f"--solver must be one of {', '.join(SOLVERS)}")
    if accounting not in ACCOUNTING:
        raise typer.BadParameter(f"--accounting must be one of {', '.join(ACCOUNTING)}")
    if value not in ("goodput", "throughput"):
        raise typer.BadParameter("--value must be goodput or throughput")
    if tfwd <= 0:
        raise typer.BadParameter("--tfwd must be > 0")
    config = ReplayConfig(tfwd=tfwd, solver=solver, objective=objective, accounting=accounting,
                          max_jobs=max_jobs, time_limit=time_limit, predict_tfwd=predict_tfwd,
                          exact_events=exact_events, no_pause=no_pause)
    if skip_warmup and log is None:
        raise typer.BadParameter("--skip-warmup applies to --log only (idle intervals record the busy nodes)")
    if (log_format or columns or delimiter) and log is None:
        raise typer.BadParameter("--format, --columns and --delimiter apply to --log only")
    log_options: dict[str, object] = {k: v for k, v in (("columns", columns), ("delimiter", delimiter)) if v}
    request = ReplayRequest(jobs_file, curves, idle=idle, log=log, nodes=nodes, node_order=node_order, start=start,
                            config=config, skip_warmup=skip_warmup, log_format=log_format, log_options=log_options,
                            goodput=goodput, value=value)
    err = Console(stderr=True)
    source = idle if idle is not None else log
    assert source is not None
    # pulses while the log or idle data becomes pool events (seconds, even at 160,000 nodes), then counts the
    # replayed events with an ETA; the replay may stop early, once every elastic job is done
    with progress_bar(f"replay: reading {source.name}", None, wanted(as_json, quiet)) as update:
        progress = None if update is None else (lambda k, n: update(done=k, total=n, label="replay"))
        # a log's read (bytes; a gzipped one by its compressed offset) and first fit (jobs) get a percentage too
        log_progress = None if update is None else (lambda k, n, what: update(done=k, total=n, label=f"replay: {what}"))
        try:
            run = run_replay(request, out, progress=progress, log_progress=log_progress)
        except SolverUnavailable as e:  # a missing extra or Gurobi's size-limited licence: say which
            err.print(f"error: {e}", markup=False, highlight=False)
            raise typer.Exit(2) from None
    s, tl = run.summary, run.timeline
    if as_json:
        placed = {"log_placement": tl.notes["log_placement"]} if "log_placement" in tl.notes else {}
        print(json.dumps({**s, "nodes": len(tl.nodes), "machine_nodes_source": tl.notes.get("machine_nodes_source"),
                          **placed,
                          "nonoptimal_by_status": run.result.nonoptimal_by_status, "notes": run.notes,
                          "warnings": run.warnings, "out": str(out)}))
    else:
        con = Console(highlight=False, soft_wrap=True)
        lines = [
            f"replay on {len(tl.nodes):,} nodes ({tl.notes.get('machine_nodes_source')}), {s['events']:,} events, "
            f"{s['jobs_done']}/{s['jobs']} elastic jobs done",
            f"idle {s['idle_node_hours']:,.1f} node-h; held by the jobs {s['used_node_hours']:,.1f} node-h: "
            f"utilisation {s['utilization']:.4f} (BFTrainer's: held / idle)",
            f"useful {s['useful_node_hours']:,.1f} node-h (held less {s['held_past_pmax_node_hours']:,.1f} held past "
            f"Pmax): useful utilisation {s['useful_utilization']:.4f}",
            f"rescales {s['rescales']:,}, preemptions {s['preemptions']:,}, samples {s['samples']:.4g} (lost: "
            f"{s['samples_lost_preemption']:.4g} to preemptions, {s['samples_lost_restart']:.4g} to restarts); "
            f"{s['decisions']:,} decisions, {s['nonoptimal_decisions']:,} not proven optimal",
            f"results in {out}",
        ]
        for line in lines:
            con.print(line, markup=False)
    # stderr in both modes, after the figures: what they need beside them; never mixed into --json's stdout
    for note in run.notes:
        err.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    for warning in run.warnings:
        err.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_cmd)
