"""Profiles learned from an earlier testbed run, to predict a new one (``--profiles-from RUN_DIR``).

The measured simulation of a run uses that run's own measurements: it shows the simulator can
reproduce what happened, not that it can predict. Here the profiles come from another run instead:
per workload (the mapping's model / batch / storage latency), the median real pace and stage split of
its jobs' report windows while alone on their worker, and that run's median start-up + tear-down.
Jobs whose workload the earlier run never measured keep their nominal profile.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hpcsched.errors import InputError
from hpcsched.model import Job, ResourceProfile
from hpcsched.sim.semantics import SOLO_FACTOR
from hpcsched.testbed.compare import ITERATIONS_FILE
from hpcsched.testbed.driver import load_run
from hpcsched.testbed.mapping import ScaledJob, Workload, sim_job


@dataclass(frozen=True)
class LearnedProfiles:
    pace_s: dict[Workload, float]  # real seconds per step, alone on a worker
    stages_s: dict[Workload, ResourceProfile]  # real seconds
    overhead_s: float  # one attempt's start-up + tear-down, real seconds
    source: str


def learn(run_dir: Path) -> LearnedProfiles:
    """Per-workload profiles from a finished testbed run folder (its testbed.json and iterations.csv)."""
    run = load_run(run_dir)
    win_file = run_dir / ITERATIONS_FILE
    if run is None or not win_file.is_file():
        raise InputError(run_dir, f"not a measured testbed run (needs testbed.json and {ITERATIONS_FILE})")
    scale = float(run["scale"])
    workload = {str(j["trace_id"]): Workload(**j["workload"]) for j in run["jobs"]}
    win = pd.read_csv(win_file, dtype={"job_id": str})
    if win.empty:
        raise InputError(win_file, "no measured report windows in this run")
    win["workload"] = win["job_id"].map(workload)
    pace, stages = {}, {}
    for w, g in win.groupby("workload", sort=False):
        solo = g[g["sharing"] == 1]
        g = solo if len(solo) else g
        pace[w] = float(g["pace_s"].median()) / scale
        stages[w] = ResourceProfile(*(float(g[c].median()) / scale for c in ("data_s", "compute_s", "comm_s")))
    overhead = float(win.groupby("job_id")["startup_s"].first().median()) / scale
    return LearnedProfiles(pace, stages, overhead, str(run_dir))


def predicted_jobs(jobs: list[ScaledJob], scale: float, learned: LearnedProfiles) -> list[Job]:
    """The replayed jobs with another run's per-workload profiles and overhead (trace seconds)."""
    out = []
    for j in jobs:
        pace = learned.pace_s.get(j.workload)
        if pace is None:
            out.append(sim_job(j, scale))
            continue
        it = pace / SOLO_FACTOR
        out.append(sim_job(j, scale, iteration_s=it, profile=learned.stages_s[j.workload],
                           extra_iterations=round(learned.overhead_s / it)))
    return out
