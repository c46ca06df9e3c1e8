"""``hpcsched simulate --compat blox``: load, run Blox's loop (``hpcsched.compat.blox``), write, summarise.

Writes the results schema (``jobs.csv`` + ``meta.json``, every admitted job; those cut off by the window's end
are ``unfinished``), ``rounds.csv`` (Blox's preemptions per round, with the GPUs and jobs of each round) and
``responsiveness.csv`` (per job: first metering after the first launch minus submit, Blox's definition).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hpcsched.compat.blox import iterations, simulate_blox
from hpcsched.model import Job
from hpcsched.results import write_csv, write_results
from hpcsched.sim.trace_jobs import load_checked_jobs

ROUNDS_FILE = "rounds.csv"
RESPONSIVENESS_FILE = "responsiveness.csv"


def load_blox_jobs(path: Path) -> tuple[list[Job], dict[str, int]]:
    """The trace's jobs, each checked for what Blox's loop needs (a GPU, a duration or iterations with their
    time), and the reader's anomaly counts."""
    return load_checked_jobs(path, iterations)


def run_blox_command(trace: Path, cluster: Path, policy: str, out: Path, as_json: bool,
                     window: tuple[int, int] | None, round_s: float, optimus_load: float | None) -> dict:
    """Run and write one ``--compat blox`` simulation; returns (and prints, with ``as_json``) its summary."""
    from hpcsched.cluster_spec import read_cluster_spec
    from hpcsched.metrics import summarize_results
    from hpcsched.window import in_window

    spec = read_cluster_spec(cluster)
    jobs, anomalies = load_blox_jobs(trace)
    res = simulate_blox(jobs, spec, policy, round_s, window, optimus_load)
    meta = res.meta | {"trace": str(trace), "cluster": getattr(spec, "name", None), "capacity_gpus": spec.gpus}
    write_results(out, res.results, meta | {"wall_s": round(res.wall_s, 4)})
    write_csv(out / ROUNDS_FILE, ("time", "preemptions", "busy_gpus", "running_jobs", "queued_jobs"), res.rounds)
    write_csv(out / RESPONSIVENESS_FILE, ("job_id", "responsiveness"), sorted(
        res.responsiveness.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else kv[0]), all_float=False)
    if anomalies:
        from hpcsched.harvest.log_checks import describe_rows

        print(f"note: {trace}: {describe_rows(len(jobs), anomalies)}", file=sys.stderr)
    if policy == "optimus" and optimus_load is None:
        print("note: --compat blox optimus without --blox-optimus-load: no speed-up (1.0; Blox's load-indexed "
              "table gives 1.0 at loads 6-9 too)", file=sys.stderr)
    shown = res.results if window is None else in_window(res.results, window)
    summary = {"dir": str(out)} | summarize_results(shown, meta) | {"events": res.events, "wall_s": res.wall_s}
    if window is not None:
        summary |= {"window": f"{window[0]}-{window[1]}", "jobs_simulated": len(res.results)}
        if not res.meta.get("window_finished"):
            print(f"warning: {trace}: the trace ended before every job of the window finished; the window's "
                  "figures cover the jobs that did (meta.json window_finished false)", file=sys.stderr)
        elif res.meta.get("trace_exhausted"):
            print(f"warning: {trace}: every job of the trace arrived before the window finished: Blox's unbounded "
                  "stream would have brought more, which can change the window under srtf/las (meta.json "
                  "trace_exhausted); generate more jobs", file=sys.stderr)
    resp = [res.responsiveness[r.job_id] for r in shown if r.job_id in res.responsiveness]
    summary["avg_responsiveness"] = sum(resp) / len(resp) if resp else None
    summary["preemptions"] = res.meta["preemptions"]
    if as_json:
        print(json.dumps(summary))
    return summary
