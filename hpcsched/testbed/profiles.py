"""Profiles learned from an earlier testbed run, to predict a new one (``--profiles-from RUN_DIR``).

The measured simulation of a run uses that run's own measurements: it shows the simulator can
reproduce what happened, not that it can predict. Here the profiles come from another run instead:
per workload (the mapping's model / batch / storage latency), the median real pace and stage split of
its jobs' report windows while alone on their worker (else alone in their group; a workload that only ran
interleaved: its own stage time per step, as ``measure.Measured.solo_pace``), and that run's median
start-up and tear-down per launch (``profile/overheads.csv``, apart from the iteration times). Start-up
and tear-down follow the machine's load, so when both runs carry a start-up probe (``probe``) they are
scaled by the ratio of the new run's probe, taken before its first job, to the old one's, and charged as
every job's restart cost (wall time per launch, ``LearnedProfiles.restart_s``); that run's measured group
factors (``profile/group-factors.csv``) time the groups. Jobs whose workload the earlier
run never measured keep their nominal profile.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hpcsched.errors import InputError
from hpcsched.model import Job, ResourceProfile
from hpcsched.primitives.speed import SOLO_FACTOR
from hpcsched.testbed.compare import ITERATIONS_FILE
from hpcsched.testbed.driver import load_run
from hpcsched.testbed.mapping import ScaledJob, Workload, sim_job


@dataclass(frozen=True)
class LearnedProfiles:
    pace_s: dict[Workload, float]  # real seconds per step, alone on a worker
    stages_s: dict[Workload, ResourceProfile]  # real seconds
    overhead_s: float  # one attempt's start-up + tear-down, real seconds (as measured then)
    source: str
    startup_s: float | None = None  # median per launch, real seconds (None: an old run without overheads.csv)
    teardown_s: float | None = None
    probe_s: float | None = None  # the start-up probe of that run

    def overhead_at(self, probe_s: float | None) -> float:
        """Start-up + tear-down of one attempt on a machine whose probe now reads ``probe_s``."""
        base = (self.startup_s or 0.0) + (self.teardown_s or 0.0) if self.startup_s is not None else self.overhead_s
        if probe_s is None or not self.probe_s:
            return base
        return base * probe_s / self.probe_s

    def restart_s(self, scale: float, probe_s: float | None = None) -> float:
        """The restart cost (trace seconds at ``scale``) of every job in a simulation predicted from this
        run: its median start-up + tear-down per launch, scaled by the start-up probe (``overhead_at``)."""
        return self.overhead_at(probe_s) * scale


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
    grouped = "group_size" in win.columns  # a run measured since group sizes are recorded
    for w, g in win.groupby("workload", sort=False):
        solo = g[g["sharing"] == 1]
        if not len(solo) and grouped:
            solo = g[g["group_size"] == 1]
        if len(solo) or not grouped:
            g = solo if len(solo) else g
            pace[w] = float(g["pace_s"].median()) / scale
        else:  # it only ran interleaved: its own stage time per step (no waiting for a turn), as Measured does
            pace[w] = float((g["data_s"] + g["compute_s"] + g["comm_s"]).median()) / scale
        stages[w] = ResourceProfile(*(float(g[c].median()) / scale for c in ("data_s", "compute_s", "comm_s")))
    overhead = float(win.groupby("job_id")["startup_s"].first().median()) / scale
    startup = teardown = None
    ov_file = run_dir / "profile" / "overheads.csv"
    if ov_file.is_file():
        ov = pd.read_csv(ov_file, dtype={"job_id": str})
        ov = ov[ov["job_id"].isin({j["runtime"].get("job_id") for j in run["jobs"] if j.get("runtime")})]
        startup = float(ov["startup_s"].median()) if len(ov) else None
        teardown = float(ov["teardown_s"].dropna().median()) if ov["teardown_s"].notna().any() else 0.0
    return LearnedProfiles(pace, stages, overhead, str(run_dir), startup, teardown,
                           run["meta"].get("startup_probe_s"))


def predicted_jobs(jobs: list[ScaledJob], scale: float, learned: LearnedProfiles) -> list[Job]:
    """The replayed jobs with another run's per-workload profiles (trace seconds). The start-up and tear-down
    are not in the jobs: ``LearnedProfiles.restart_s`` is the simulation's restart cost."""
    out = []
    for j in jobs:
        pace = learned.pace_s.get(j.workload)
        if pace is None:
            out.append(sim_job(j, scale))
            continue
        it = pace / SOLO_FACTOR
        out.append(sim_job(j, scale, iteration_s=it, profile=learned.stages_s[j.workload]))
    return out
