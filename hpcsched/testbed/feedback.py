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
from dataclasses import replace
from pathlib import Path

from hpcsched.allocator import Group, Policy, Snapshot
from hpcsched.model import ClusterSpec, Job
from hpcsched.sim.engine import SimResult
from hpcsched.sim.semantics import SOLO_FACTOR
from hpcsched.testbed.mapping import ScaledJob, sim_job
from hpcsched.testbed.measure import Measured

MURI_HEADER = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "batch_size", "duration", "interval",
               "iteration_time", "resource_time_0", "resource_time_1", "resource_time_2", "priority")


def trace_jobs(jobs: list[ScaledJob], scale: float) -> list[Job]:
    return [sim_job(j, scale) for j in jobs]


def measured_jobs(jobs: list[ScaledJob], scale: float, measured: dict[str, Measured]) -> list[Job]:
    """``measured`` is keyed by trace id; jobs never measured keep their nominal profile.

    The start-up and tear-down folded into every job is the run's median, a property of the cluster
    (process start, imports, rendezvous), not each job's own: a job's own would tell the simulation
    how that particular attempt went, which is what it is being checked against.
    """
    overhead = cluster_overhead_s(measured)
    out = []
    for j in jobs:
        m = measured.get(j.trace_id)
        pace = m.solo_pace() if m is not None else None
        if m is None or pace is None:
            out.append(sim_job(j, scale))
            continue
        it = pace / SOLO_FACTOR
        out.append(sim_job(j, scale, iteration_s=it, profile=m.profile(), extra_iterations=round(overhead / it)))
    return out


def cluster_overhead_s(measured: dict[str, Measured]) -> float:
    """Median real seconds one attempt costs beyond its steps (start-up + tear-down) over the run's jobs."""
    xs = [m.overhead_s() for m in measured.values() if m.startup_s]
    return statistics.median(xs) if xs else 0.0


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


def as_runtime_runs(policy: Policy, name: str) -> Policy:
    """The policy as the runtime executes it: it sees only what the controller knows.

    The controller learns a job's iteration time and stage profile from the job's own progress
    reports (``hpcsched.runtime.controller._job_state``): a job that has never run shows the policy
    no iteration time, no remaining time and no profile, so duration-aware policies (SRTF, SRSF,
    Muri-S) rank it last. The simulator would otherwise rank it by the trace's duration. (A job file
    may declare a profile, ``testbed --declare-profiles``; this model does not cover that case yet.)

    Groups are kept as the controller can run them (``hpcsched.runtime.scheduler``): it co-locates a
    group's members on the same slots but never moves a running job to form a group, so a group keeps
    its first running member (the anchor) and the queued members that need no more GPUs than it; other
    running members, and queued ones too big to join, run as units of their own right after it. The
    simulator would otherwise move running jobs together (paying a restart each). Simulating knowledge
    or moves the runtime does not have would compare two different schedules.
    """

    def flat(snapshot: Snapshot) -> list[Group]:
        views = tuple(v if v.first_start is not None else
                      replace(v, iteration_time=None, remaining_s=None, profile=None) for v in snapshot.jobs)
        by_id = {v.id: v for v in views}
        out: list[Group] = []
        for g in policy(replace(snapshot, jobs=views)):
            out += runtime_units(g, by_id)
        return out

    flat.__name__ = name
    flat.service_thresholds = getattr(policy, "service_thresholds", ())  # type: ignore[attr-defined]
    return flat


def runtime_units(g: Group, by_id: dict) -> list[Group]:
    """One policy group as the controller runs it: its anchor with the members that can join it, then the rest
    alone (see ``as_runtime_runs``)."""
    if len(g.job_ids) < 2:
        return [g]
    running = [j for j in g.job_ids if by_id[j].running]
    if not running:
        return [g]
    anchor = by_id[running[0]]
    if all(j == anchor.id or (not by_id[j].running and by_id[j].gpus <= anchor.gpus) for j in g.job_ids):
        return [g]
    # The group's period holds only for all of its members: a partial group runs as singles (rare: it takes a
    # preempted member that has run before, beside a running member elsewhere).
    return [Group((anchor.id,)), *(Group((j,)) for j in g.job_ids if j != anchor.id)]


def run_sim(jobs: list[Job], cluster: ClusterSpec, policy: str, out: Path, trace_name: str, *,
            flatten: bool = True) -> SimResult:
    """Simulate ``jobs`` (read back from the Muri CSV written beside the results, so the CLI on that file
    gives the same jobs); ``flatten`` runs the policy as the runtime does (see ``as_runtime_runs``)."""
    from hpcsched.runtime.scheduler import resolve_policy
    from hpcsched.sim.engine import simulate
    from hpcsched.sim.runs import load_jobs, write_run

    trace = write_muri_trace(out / "trace.csv", jobs)
    loaded, _ = load_jobs(trace)
    fn = resolve_policy(policy)
    result = simulate(loaded, cluster, as_runtime_runs(fn, policy) if flatten else fn, trace=trace_name)
    result.meta["knowledge"] = "what the controller knows" if flatten else "the whole trace"
    write_run(out, result)
    return result
