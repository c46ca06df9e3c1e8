"""``hpcsched calc``: the summary of one or more result directories, as a table, JSON or a CDF plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

# pandas (metrics, results) and rich are imported inside `calc`, so that `hpcsched --help` does not pay for them.


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 10 else f"{v:,.2f}"
    return str(v)


# Replay and harvest figures from meta.json (jobs.csv cannot recompute them); shown where a run records them.
HARVEST_KEYS = ("idle_node_hours", "used_node_hours", "useful_node_hours", "held_past_pmax_node_hours",
                "idle_pool_utilization", "useful_utilization", "rescales", "preemptions", "lost_samples", "lost_steps",
                "max_lost_steps", "decisions", "nonoptimal_decisions")
_REPLAY_SUMMARY_KEYS = ("idle_node_hours", "used_node_hours", "useful_node_hours", "held_past_pmax_node_hours",
                        "useful_utilization", "rescales", "preemptions", "decisions", "nonoptimal_decisions")


def harvest_metrics(meta: dict[str, Any]) -> dict[str, Any]:
    """Idle and used node-hours, idle-pool utilisation, rescales, preemptions, lost work and non-optimal
    decisions of a replay (``meta['summary']``) or Slurm harvest (top-level keys) result dir.

    A key the run did not record (an older replay, a simulation) is left out, never shown as 0.
    ``used_node_hours`` is node-time held by the elastic jobs; for a replay ``useful_node_hours`` leaves
    out what jobs held after reaching Pmax. ``lost_samples`` (replay) is work lost to preemptions and
    restarts; ``lost_steps`` (harvest) the steps lost past the last checkpoint, summed over preemptions.
    """
    out: dict[str, Any] = {}
    summary = meta.get("summary")
    if meta.get("tool") == "replay" and isinstance(summary, dict):
        out |= {k: summary[k] for k in _REPLAY_SUMMARY_KEYS if k in summary}
        if "samples_lost_preemption" in summary:
            out["lost_samples"] = summary["samples_lost_preemption"] + summary.get("samples_lost_restart", 0.0)
    elif meta.get("capacity_node_seconds") and "harvested_node_hours" in meta:
        out["idle_node_hours"] = float(meta["capacity_node_seconds"]) / 3600.0
        out["used_node_hours"] = meta["harvested_node_hours"]
        out |= {k: meta[k] for k in ("rescales", "preemptions", "decisions", "nonoptimal_decisions") if k in meta}
        if isinstance(meta.get("lost_steps"), list):
            out["lost_steps"] = sum(meta["lost_steps"])
    else:
        return out
    if isinstance(meta.get("nonoptimal_by_status"), dict):
        out["nonoptimal_by_status"] = meta["nonoptimal_by_status"]
    if out.get("idle_node_hours") and "used_node_hours" in out:
        out["idle_pool_utilization"] = float(out["used_node_hours"]) / float(out["idle_node_hours"])
    return out


def is_controller_state(path: Path) -> Path | None:
    """The controller state behind ``path``: a SQLite file, or a folder holding ``state.db`` (or ``run/state.db``)
    and no ``jobs.csv``; None for a result directory."""
    if path.is_dir():
        if (path / "jobs.csv").exists():
            return None
        for cand in (path / "state.db", path / "run" / "state.db"):
            if cand.is_file():
                return cand
        return None
    try:
        with path.open("rb") as f:
            return path if f.read(16) == b"SQLite format 3\x00" else None
    except OSError:
        return None


def controller_run(state: Path) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """A controller run read from its state (read-only; the controller may still run): the jobs table as
    ``read_results`` gives it (times in unix seconds; ``end`` for completed jobs only; ``nodes`` the largest size
    it ran at, ``node_seconds`` the worker-seconds its attempts held), its meta, and ``metrics.pilot_metrics``."""
    import pandas as pd

    from hpcsched.metrics.pilots import job_attempts, pilot_metrics
    from hpcsched.results import COLUMNS
    from hpcsched.runtime.store import Store

    store = Store(state, query_only=True)
    try:
        jobs, events, progress = store.jobs(), store.events(), store.progress()
    finally:
        store.close()
    pilots = pilot_metrics(events, progress)
    end = max([e["time"] for e in events] + [r["time"] for r in progress], default=0.0)
    attempts = job_attempts(events, end)
    rows = []
    for j in jobs:
        att = attempts.get(j.id, [])
        rows.append({"job_id": j.id, "submit": j.submit_time, "start": j.start_time,
                     "end": j.end_time if j.state == "completed" else None, "gpus": 0,
                     "nodes": max((len(w) for _, _, w in att), default=0),
                     "gpu_seconds": 0.0, "node_seconds": sum((b - a) * len(w) for a, b, w in att),
                     "status": j.state})
    df = pd.DataFrame(rows, columns=list(COLUMNS)).astype({"job_id": str})
    for c in ("submit", "start", "end"):
        df[c] = pd.to_numeric(df[c])
    return df, {"tool": "controller", "state": str(state)}, pilots


def calc(
    result_dirs: list[Path] = typer.Argument(..., help="Result directories (each holds jobs.csv, meta.json), or a "
                                            "controller's state file (state.db, or a folder holding it)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (a list for several dirs)."),
    plot: Path | None = typer.Option(None, "--plot", help="Write a JCT CDF of all given runs to this PNG."),
    isolated: str | None = typer.Option(
        None, "--isolated", help="Baseline for finish-time fairness rho = JCT / isolated JCT: 'fluid' (Gavel's "
        "isolated policy, each job on 1/N of the cluster, computed from the trace) or a result dir."),
    trace: Path | None = typer.Option(
        None, "--trace", help="The runs' job trace: each job's user (GPU-hours and cost per user, when jobs.csv "
        "has no user or project column) and, for --isolated fluid, its solo time (default: meta.json's trace)."),
    price: str | None = typer.Option(
        None, "--price", help="Price per GPU-hour: one number, or TYPE=P,... per GPU type (v100=2.48,k80=0.45)."),
) -> None:
    """Report avg / p50 / p95 / p99 JCT, makespan, span, queueing delay and utilisation.

    p99_jct is Muri's sorted(jct)[int(0.99 n)]; p99_jct_interp is the interpolated percentile.
    makespan (= span) is the last end minus the first submit, in seconds; first_submit and last_end
    are the trace-clock times behind it. Runs sharing a policy name are labelled by what differs.
    Fairness: finish-time fairness rho against --isolated (worst, p50/p90/p99, mean), Jain's index of
    the jobs' shares, GPU-hours and cost per user or project; a figure whose inputs the results do not
    hold is listed under "unavailable" with the reason.
    """
    from rich.console import Console
    from rich.table import Table

    from hpcsched.errors import InputError
    from hpcsched.metrics import METRIC_UNITS, summarize
    from hpcsched.metrics.fairness import FAIRNESS_UNITS, entities_from_trace, fairness_metrics, parse_prices
    from hpcsched.metrics.labels import run_labels, runs_subject
    from hpcsched.metrics.pilots import PILOT_UNITS
    from hpcsched.metrics.plot import plot_jct_cdf
    from hpcsched.results import read_results

    try:
        prices = parse_prices(price) if price is not None else None
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--price") from None
    fluid = isolated == "fluid"
    baseline_run = read_results(Path(isolated))[0] if isolated is not None and not fluid else None
    if trace is not None and not trace.is_file():
        raise InputError(trace, "no such trace file (--trace)")
    entities = entities_from_trace(trace) if trace is not None else None
    traces: dict[str, Any] = {}
    frames = []
    metas = []
    summaries = []
    for d in result_dirs:
        state = is_controller_state(d)
        pilots: dict[str, Any] = {}
        if state is not None:
            df, meta, pilots = controller_run(state)
        else:
            df, meta = read_results(d)
        frames.append(df)
        metas.append(meta | {"dir": str(d)})
        summary = {"dir": str(d)} | summarize(df, meta)
        summary |= {k: v for k, v in harvest_metrics(meta).items() if k not in summary}
        summary |= {k: v for k, v in pilots.items() if k not in summary}
        baseline, name, reason = (baseline_run, isolated, None) if not fluid else \
            _fluid_baseline(meta, trace, traces)
        fair = fairness_metrics(df, meta, baseline, name, entities, str(trace) if trace else None, prices, reason)
        if "unavailable" in summary and "unavailable" in fair:  # both say why: keep the reasons of both
            fair = fair | {"unavailable": summary["unavailable"] | fair["unavailable"]}
        summaries.append(summary | {k: v for k, v in fair.items() if k not in summary or k == "unavailable"})
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
    keys += [k for k in HARVEST_KEYS if k not in keys]
    keys += [k for k in PILOT_UNITS if k not in keys]
    keys += ["ftf_rho_max", "ftf_rho_worst_job", "ftf_rho_p50", "ftf_rho_p90", "ftf_rho_p99", "ftf_rho_mean",
             "ftf_jobs", "ftf_unmatched", "jain_share", "jain_jobs", "gpu_hours", "cost", "jain_entity_gpu_hours"]
    units = METRIC_UNITS | FAIRNESS_UNITS | PILOT_UNITS
    if any(s.get("first_submit") for s in summaries):  # a trace on a calendar clock: show the times behind makespan
        keys[keys.index("span") + 1:keys.index("span") + 1] = ["first_submit", "last_end"]
    table = Table(title=f"hpcsched calc: {subject}")
    table.add_column("metric")
    for s in summaries:
        table.add_column(s["label"], justify="right")
    for k in keys:
        if any(k in s for s in summaries):
            table.add_row(f"{k} ({units[k]})" if units.get(k) else k, *(_fmt(s.get(k)) for s in summaries))
    console.print(table)
    for line in _footnotes(summaries):
        console.print(line, highlight=False)
    if plot:
        console.print(f"JCT CDF written to {plot}")


def _footnotes(summaries: list[dict[str, Any]]) -> list[str]:
    """Lines under the table: the rho baseline, GPU-hours and cost per entity, and each unavailable figure with
    its reason. A line that holds for several runs is printed once; runs are named by their column number
    ("[2]", "[1, 3]"), as their labels are the table's headers."""
    def tag(cols: list[int]) -> str:
        return "" if len(cols) == len(summaries) else f"[{', '.join(str(c + 1) for c in cols)}] "

    lines: dict[str, list[int]] = {}
    for k, s in enumerate(summaries):
        if s.get("ftf_baseline"):
            lines.setdefault(f"rho = JCT / JCT in {s['ftf_baseline']}", []).append(k)
        if "gpu_hours_by_entity" in s:
            cost = s.get("cost_by_entity", {})
            parts = [f"{n} {h:,.2f} GPU-h" + (f" / {cost[n]:,.2f}" if n in cost else "")
                     for n, h in s["gpu_hours_by_entity"].items()]
            unknown = f"; {s['entity_unknown_jobs']} jobs without one" if s.get("entity_unknown_jobs") else ""
            lines.setdefault(f"per {s['entity']} ({s['entity_source']}{unknown}): {', '.join(parts)}", []).append(k)
        for metric, reason in s.get("unavailable", {}).items():
            lines.setdefault(f"{metric}: unavailable: {reason}", []).append(k)
    return [tag(cols) + text for text, cols in lines.items()]


def _fluid_baseline(meta: dict[str, Any], trace: Path | None,
                    cache: dict[str, Any]) -> tuple[dict[str, float] | None, str | None, str | None]:
    """Isolated JCTs for ``--isolated fluid`` (``metrics.isolated_jcts``): jobs from ``--trace``, else the
    trace the run recorded in meta.json; capacity from meta.json. (JCTs, name, None) or (None, None, reason)."""
    from hpcsched.metrics.fairness import isolated_jcts
    from hpcsched.traces import read_jobs

    path = str(trace) if trace is not None else meta.get("trace")
    if not path:
        return None, None, "--isolated fluid needs the run's jobs: meta.json names no trace; give --trace FILE"
    if not Path(path).is_file():
        return None, None, f"--isolated fluid: the run's trace {path} is not there; give --trace FILE"
    capacity = meta.get("capacity_gpus")
    if not capacity:
        return None, None, "--isolated fluid needs the run's GPU count (capacity_gpus), which meta.json lacks"
    key = f"{path}\0{capacity}"
    if key not in cache:
        try:
            cache[key] = isolated_jcts(read_jobs(path), float(capacity))
        except ValueError as e:
            cache[key] = str(e)
    if isinstance(cache[key], str):
        return None, None, f"--isolated fluid: {cache[key]}"
    return cache[key], f"fluid isolated (Gavel's policy as a fluid) on {capacity} GPUs, jobs from {path}", None


def register(app: typer.Typer) -> None:
    app.command("calc")(calc)
