"""The two simulations a testbed run is held to: one from the trace's profiles, one from measured ones.

- ``sim-trace``: the replayed jobs (same sizes, same steps, same submit times) with the workloads'
  nominal iteration times split in the trace's stage proportions. This is what one would predict
  before running anything.
- ``sim-measured``: the same jobs with what the runtime measured: each job's median real pace alone on
  its worker (divided by the simulator's 1.015 solo factor, so the simulated solo speed equals the
  measured one), its measured stage split, and one attempt's measured start-up and tear-down folded in
  as extra iterations. Restarts after the first are charged the simulator's own restart model, not the
  measured overhead: how often a job restarts is the simulation's to decide.

Both are written as Muri CSV traces (``trace.csv``, milliseconds) beside their results, so
``hpcsched simulate --trace OUT/sim-measured/trace.csv ...`` reproduces the second simulation, and the
runtime's own ``hpcsched profile`` output lands in ``OUT/profile``.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Mapping
from pathlib import Path

from hpcsched.model import ClusterSpec, Job, ResourceProfile
from hpcsched.primitives.speed import SOLO_FACTOR
from hpcsched.sim.engine import SimResult
from hpcsched.testbed.mapping import ScaledJob, sim_job
from hpcsched.testbed.measure import Measured

MURI_HEADER = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "batch_size", "duration", "interval",
               "iteration_time", "resource_time_0", "resource_time_1", "resource_time_2", "priority")


def trace_jobs(jobs: list[ScaledJob], scale: float) -> list[Job]:
    return [sim_job(j, scale) for j in jobs]


def measured_jobs(jobs: list[ScaledJob], scale: float, measured: dict[str, Measured]) -> list[Job]:
    """``measured`` is keyed by trace id; jobs never measured keep their nominal profile. Start-up and
    tear-down are not in the jobs: see ``measured_restart_s``."""
    out = []
    for j in jobs:
        m = measured.get(j.trace_id)
        pace = m.solo_pace() if m is not None else None
        if m is None or pace is None:
            out.append(sim_job(j, scale))
            continue
        it = pace / SOLO_FACTOR
        out.append(sim_job(j, scale, iteration_s=it, profile=m.profile()))
    return out


def cluster_overhead_s(measured: dict[str, Measured]) -> float | None:
    """Median real seconds one attempt costs beyond its steps (start-up + tear-down) over the run's jobs;
    None when no launch was measured."""
    xs = [m.overhead_s() for m in measured.values() if m.startup_s]
    return statistics.median(xs) if xs else None


def measured_restart_s(measured: dict[str, Measured], scale: float) -> float | None:
    """The restart cost (trace seconds) of every job in the measured simulations: the run's median start-up +
    tear-down per launch. The cluster's median, not each job's own: it is a property of the machine
    (process start, imports, rendezvous), and a job's own would tell the simulation how that attempt went,
    which is what it is being checked against. None (the simulator's table) when nothing was measured."""
    real = cluster_overhead_s(measured)
    return None if real is None else real * scale


def write_muri_trace(path: Path, jobs: list[Job]) -> Path:
    """Jobs as a Muri CSV (milliseconds), the format ``hpcsched simulate`` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(MURI_HEADER)
        for j in jobs:
            stages = j.profile.stages() if j.profile is not None else (0.0, j.iteration_time or 0.0, 0.0)
            w.writerow((j.id, j.gpus, _ms(j.submit), j.iterations, j.model or "unknown", 0,
                        _ms((j.iterations or 0) * (j.iteration_time or 0.0)), 0, _ms(j.iteration_time or 0.0),
                        *(_ms(s) for s in stages), 0))
    return path


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f}"


def run_sim(jobs: list[Job], cluster: ClusterSpec, policy: str, out: Path, trace_name: str, *,
            flatten: bool = True, declared: Mapping[str, ResourceProfile] | None = None,
            group_factors: Mapping[int, float] | None = None, restart_s: float | None = None,
            min_runtime_s: float = 0.0) -> SimResult:
    """Simulate ``jobs`` (read back from the Muri CSV written beside the results, so the CLI on that file
    gives the same jobs). ``flatten``: decide as the runtime's controller does, through the shared decision
    core (``hpcsched.sim.core_decisions``: what the controller knows of jobs, with ``declared`` profiles, its
    hysteresis ``min_runtime_s`` in trace seconds, running jobs never moved to form groups); otherwise the
    simulator's own planner with full knowledge. ``group_factors`` replace the simulator's default group
    slowdowns (measured ones); ``restart_s`` (trace seconds, recorded in ``meta.json``) replaces the per-model
    restart table."""
    from hpcsched.core.decide import DecideOptions
    from hpcsched.runtime.scheduler import resolve_policy
    from hpcsched.sim.core_decisions import AsController
    from hpcsched.sim.engine import simulate
    from hpcsched.sim.runs import load_jobs, write_run

    trace = write_muri_trace(out / "trace.csv", jobs)
    loaded, _ = load_jobs(trace)
    fn = resolve_policy(policy)
    core = AsController(DecideOptions(min_runtime_s=min_runtime_s), dict(declared or {})) if flatten else None
    result = simulate(loaded, cluster, fn, trace=trace_name, group_factors=group_factors, restart_s=restart_s,
                      as_controller=core)
    result.meta["knowledge"] = "what the controller knows" if flatten else "the whole trace"
    write_run(out, result)
    return result
