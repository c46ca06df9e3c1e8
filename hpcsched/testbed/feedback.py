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
from dataclasses import replace
from pathlib import Path

from hpcsched.allocator import DeclaredPolicy, Group, JobView, Policy, PolicyHints, Snapshot, hints_of
from hpcsched.core.speed import SOLO_FACTOR
from hpcsched.model import ClusterSpec, Job, ResourceProfile
from hpcsched.sim.engine import SimResult
from hpcsched.testbed.groupfit import raw_period
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


def as_runtime_runs(policy: Policy, name: str, declared: Mapping[str, ResourceProfile] | None = None,
                    min_runtime_s: float = 0.0) -> Policy:
    """The policy as the runtime executes it: it sees only what the controller knows.

    The controller learns a job's iteration time and stage profile from the job's own progress
    reports (``hpcsched.runtime.controller._job_state``): a job that has never run shows the policy
    no iteration time, no remaining time and no profile, so duration-aware policies (SRTF, SRSF,
    Muri-S) rank it last. The simulator would otherwise rank it by the trace's duration. With
    ``declared`` (job id -> the profile its job file declares, trace seconds: ``testbed
    --declare-profiles``) such a job shows the controller's view instead: the declared profile, an
    iteration time of its total and the remaining time that gives, so Muri-S can group it at once.

    Groups are kept as the controller can run them (``runtime_units``). Each unit's period is computed
    here from the jobs' own profiles (what the simulation says they are), not from what the policy was
    shown: a declared profile decides the grouping, the job's real stages decide how fast the group runs.

    ``min_runtime_s`` (trace seconds) is the controller's hysteresis (``scheduler.plan``): a unit with a
    member whose current attempt started less than that long ago is admitted before all others, so it is
    not preempted. An attempt starts at the decision that launched it (the previous call, as the engine
    starts what a call places). The controller re-plans every tick, so it may preempt the moment the
    protection ends; here the next event after that does.
    """
    keys: dict[str, str] = {}  # co-location key a job got when its unit was last emitted (as the controller)
    started: dict[str, float] = {}  # running job -> when its current attempt was launched
    prev_t, prev_running = [0.0], set[str]()  # the previous call's time and running jobs

    def flat(snapshot: Snapshot) -> list[Group]:
        true = {v.id: v for v in snapshot.jobs}
        views = tuple(v if v.first_start is not None else _shown(v, (declared or {}).get(v.id))
                      for v in snapshot.jobs)
        units = runtime_units(policy(replace(snapshot, jobs=views)), true, keys)
        running = {v.id for v in snapshot.jobs if v.running}
        for i in running - prev_running:
            started[i] = prev_t[0]
        prev_t[0] = snapshot.now
        prev_running.clear()
        prev_running.update(running)
        if min_runtime_s <= 0:
            return units
        young = {i for i in running if snapshot.now - started[i] < min_runtime_s}
        kept = [u for u in units if young.intersection(u.job_ids)]
        return kept + [u for u in units if not young.intersection(u.job_ids)]

    return DeclaredPolicy(name, flat, PolicyHints(service_thresholds=hints_of(policy).service_thresholds))


def _shown(v: JobView, declared: ResourceProfile | None) -> JobView:
    """A job that has not run yet as the controller shows it: its declared profile, else nothing."""
    if declared is None or declared.total_s <= 0:
        return replace(v, iteration_time=None, remaining_s=None, profile=None)
    it = declared.total_s
    left = None if v.iterations_total is None else max(0.0, v.iterations_total - v.iterations_done) * it
    return replace(v, iteration_time=it, remaining_s=left, profile=declared)


def runtime_units(groups: list[Group], views: Mapping[str, JobView], keys: dict[str, str]) -> list[Group]:
    """The policy's groups as the controller runs them, by the controller's own rule
    (``hpcsched.core.decide.runnable_units``): a running job is never moved to form a group; a group keeps
    its first running member (the anchor) with the jobs co-located with it, and its queued members join
    when they need no more slots than the anchor; other running members (with their co-located mates) and
    queued ones too big to join run as units of their own right after it. Jobs co-located earlier stay
    together whatever the policy says now. ``keys`` (updated here) holds each job's co-location key, as
    the controller gives it when the job starts. The simulator would otherwise move running jobs together.
    """
    from hpcsched.core.decide import JobState, runnable_units

    policy_groups = [ids for ids in (tuple(i for i in g.job_ids if i in views) for g in groups) if ids]
    listed = {i for g in policy_groups for i in g}
    policy_groups += [(i,) for i in views if i not in listed]  # as the controller: a dropped job is not lost
    ids = [i for g in policy_groups for i in g]
    by_id = {i: JobState(i, views[i].submit, views[i].running, views[i].gpus, views[i].gpus, views[i].gpus,
                         group=keys.get(i, i) if views[i].running else None) for i in ids}
    out: list[Group] = []
    for unit in runnable_units(ids, policy_groups, by_id):
        running = [i for i in unit if views[i].running]
        key = keys.get(running[0], running[0]) if running else "+".join(unit)
        period = _period([views[i] for i in unit]) if len(unit) > 1 else None
        if len(unit) > 1 and period is None:  # a member without a profile: the group cannot be timed
            out += [Group((i,)) for i in unit]
            continue
        out.append(Group(tuple(unit), period))
        for i in unit:
            if not views[i].running:
                keys[i] = key
    return out


def _period(members: list[JobView]) -> float | None:
    """The raw pipeline period of a unit (``groupfit.raw_period``). The controller caps a co-located group at 4
    jobs; runs recorded before that cap may hold larger groups, which the same pipeline model times with k
    slots and the engine runs at their own measured factor, else the 4-member one."""
    if any(v.profile is None or v.profile.total_s <= 0 for v in members):
        return None
    return raw_period([v.profile.stages() for v in members])


def run_sim(jobs: list[Job], cluster: ClusterSpec, policy: str, out: Path, trace_name: str, *,
            flatten: bool = True, declared: Mapping[str, ResourceProfile] | None = None,
            group_factors: Mapping[int, float] | None = None, restart_s: float | None = None,
            min_runtime_s: float = 0.0) -> SimResult:
    """Simulate ``jobs`` (read back from the Muri CSV written beside the results, so the CLI on that file
    gives the same jobs); ``flatten`` runs the policy as the runtime does (see ``as_runtime_runs``, with
    ``declared`` and the controller's ``min_runtime_s``, trace seconds); ``group_factors`` replace the
    simulator's default group slowdowns (measured ones);
    ``restart_s`` (trace seconds, recorded in ``meta.json``) replaces the per-model restart table."""
    from hpcsched.runtime.scheduler import resolve_policy
    from hpcsched.sim.engine import simulate
    from hpcsched.sim.runs import load_jobs, write_run

    trace = write_muri_trace(out / "trace.csv", jobs)
    loaded, _ = load_jobs(trace)
    fn = resolve_policy(policy)
    runs = as_runtime_runs(fn, policy, declared, min_runtime_s) if flatten else fn
    result = simulate(loaded, cluster, runs, trace=trace_name, group_factors=group_factors, restart_s=restart_s)
    result.meta["knowledge"] = "what the controller knows" if flatten else "the whole trace"
    if flatten and min_runtime_s > 0:
        result.meta["min_runtime_s"] = min_runtime_s
    write_run(out, result)
    return result
