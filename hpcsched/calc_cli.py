"""``hpcsched calc``: the summary of one or more result directories, as a table, JSON or a CDF plot."""

from __future__ import annotations

import json
from pathlib import Path

import typer

# pandas (metrics, results) and rich are imported inside `calc`, so that `hpcsched --help` does not pay for them.


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 10 else f"{v:,.2f}"
    return str(v)


def calc(
    result_dirs: list[Path] = typer.Argument(..., help="Result directories (each holds jobs.csv, meta.json)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (a list for several dirs)."),
    plot: Path | None = typer.Option(None, "--plot", help="Write a JCT CDF of all given runs to this PNG."),
) -> None:
    """Report avg / p50 / p95 / p99 JCT, makespan, span, queueing delay and utilisation.

    p99_jct is Muri's sorted(jct)[int(0.99 n)]; p99_jct_interp is the interpolated percentile.
    makespan (= span) is the last end minus the first submit, in seconds; first_submit and last_end
    are the trace-clock times behind it. Runs sharing a policy name are labelled by what differs.
    """
    from rich.console import Console
    from rich.table import Table

    from hpcsched.metrics import METRIC_UNITS, plot_jct_cdf, run_labels, runs_subject, summarize
    from hpcsched.results import read_results

    frames = []
    metas = []
    summaries = []
    for d in result_dirs:
        df, meta = read_results(d)
        frames.append(df)
        metas.append(meta | {"dir": str(d)})
        summaries.append({"dir": str(d)} | summarize(df, meta))
    labels = run_labels(metas)
    subject = runs_subject(metas)
    for s, label in zip(summaries, labels, strict=True):
        s["label"] = label
    if plot:
        plot_jct_cdf(list(zip(labels, frames, strict=True)), plot, subject)
    if as_json:
        print(json.dumps(summaries[0] if len(summaries) == 1 else summaries))
        return
    console = Console()
    keys = ["jobs", "unfinished", "avg_jct", "p50_jct", "p95_jct", "p99_jct", "p99_jct_interp",
            "makespan", "span", "avg_queue", "utilization", "harvested_node_hours", "preemptions", "max_lost_steps"]
    if any(s.get("first_submit") for s in summaries):  # a trace on a calendar clock: show the times behind makespan
        keys[keys.index("span") + 1:keys.index("span") + 1] = ["first_submit", "last_end"]
    table = Table(title=f"hpcsched calc: {subject}")
    table.add_column("metric")
    for s in summaries:
        table.add_column(s["label"], justify="right")
    for k in keys:
        if any(k in s for s in summaries):
            table.add_row(f"{k} ({METRIC_UNITS[k]})" if k in METRIC_UNITS else k, *(_fmt(s.get(k)) for s in summaries))
    console.print(table)
    if plot:
        console.print(f"JCT CDF written to {plot}")


def register(app: typer.Typer) -> None:
    app.command("calc")(calc)
