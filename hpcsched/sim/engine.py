"""Event-driven DL-cluster simulator: the clock jumps from event to event, the policy decides at each.

Events are arrivals, predicted completions and, for policies that declare
``service_thresholds`` (GPU-seconds, e.g. Tiresias' queue limits), the moment a running job's
attained service crosses one. At every event the engine advances every running job, retires the
finished ones, admits the arrivals, asks the policy for groups and (re)places the cluster.

How a policy's groups are executed (the contract the interleaving policies rely on)
-------------------------------------------------------------------------------------
1. The policy returns ``list[Group]``, highest priority first. A job may appear in at most one
   group; jobs it leaves out do not run. Single-job groups are ordinary jobs.
2. A group needs ``max(member gpus)`` GPUs, placed once for the whole group with consolidated
   placement (``hpcsched.primitives.placement.place_consolidated``); all members share those GPUs.
3. Groups are taken in the returned order; one that does not fit the GPUs left is skipped and the
   engine goes on with the next (backfilling), so the order is a priority, not a queue.
   In ``compat="muri"`` for Themis and Muri-S/L, groups are first CHOSEN in order and then placed
   largest first (the reference's two passes); a chosen group that no longer fits does not run.
4. Speed: a solo job runs one iteration per ``iteration_time x 1.015``. A group of k >= 2 members
   runs ONE iteration of EVERY member per ``period_s x GROUP_FACTOR[k]`` (1.33/1.015, 1.5/1.015,
   1.37/1.015 for k = 2, 3, 4; ``hpcsched.primitives.speed``), so ``period_s`` is the raw interleaved
   period the policy computed from the stage profiles; a multi-job group without ``period_s`` is an
   error. A solo group with ``period_s`` runs at ``period_s x 1.015``.
5. Restart cost (``hpcsched.core.speed.restart_cost``, per model and GPU count; in default mode
   ``simulate(..., restart_s=S)`` gives every job ``S`` instead, e.g. a testbed's measured start-up +
   tear-down per launch). Default mode: a member pays its OWN cost once, as wall-clock time in which it
   makes no progress, whenever its GPUs change (first start, resume after preemption, migration);
   joining or leaving a group on the same GPUs is free. ``compat="muri"``: at every event every
   running member loses the SUM of its group's members' costs from that interval's progress.
6. Accounting: a member's ``gpu_seconds`` is the group's GPUs x time / k; attained service
   (``JobView.attained_gpu_s``, LAS/Tiresias/Muri-L) is the job's own GPUs x wall time running.
7. Default mode, placement: first an in-place pass (unchanged running groups keep their GPUs, new
   groups take first fit among the free GPUs). If that could differ from a fresh plan (a group
   changed members, a group did not fit while a lower-priority running group could have yielded,
   or the policy left a running job out), the engine plans afresh: it chooses groups in priority
   order on an empty cluster, then keeps chosen running groups on their old GPUs where they are
   free and places the rest first fit (or, if fragmentation forbids, uses the fresh placement).
   Whoever ends up on other GPUs pays the restart cost. Compat mode always re-places from scratch.
8. Policies whose ``PolicyHints`` (``hpcsched.allocator``) promise ``runs_every_job`` (the baselines) are not
   asked at all in default mode while every active job fits beside the running ones: any order would run
   them all.
9. Policies that declare an ``order_key`` hint (``hpcsched.policies.ordering.ordered_by``: every active job as a
   solo group, sorted by that key of its view, ties in arrival order, and a WAITING job's key depends
   only on its own view) are not called in default mode either: the engine keeps the waiting jobs
   sorted by (key, arrival) as they start and stop, sorts only the running ones at each event and
   merges the two lazily, which is exactly the policy's answer without the O(active jobs) sort.
   In compat mode the same holds, except for a policy whose hints say ``compat_rank_order`` (Tiresias): its
   compat answer is the order of the reference's queue lists, which the engine keeps as (queue, seq)
   keys that never change while a job waits.
10. Policies that declare a ``vector_keys(now, cluster, columns, compat) -> [key arrays]`` hint (Themis)
   are one numpy function over per-job columns (``sim.orders.COLS``, active jobs in arrival order) giving sort
   keys, most significant first, lowest first, ties in arrival order. The engine keeps those columns
   in arrays, refreshes only the running jobs' rows at each event, calls that function instead of
   building a snapshot of every active job, and sorts only the head of the order that placement can
   use (the rest on demand); the policy called on a snapshot builds the same columns from the views,
   calls the same function and sorts fully.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpcsched.allocator import Policy, policy_name
from hpcsched.compat import MODES as COMPAT_MODES
from hpcsched.model import ClusterSpec, Job
from hpcsched.primitives.speed import SOLO_FACTOR
from hpcsched.results import JobResult
from hpcsched.sim.jobrun import EngineJob
from hpcsched.sim.loop import DLEngine

if TYPE_CHECKING:
    import pandas as pd

    from hpcsched.sim.core_decisions import AsController, DecisionEvent

TIMELINE_COLUMNS = ("time", "busy_gpus", "running_jobs", "queued_jobs")
"""The timeline's columns, one row per event."""


@dataclass
class SimResult:
    """What one simulation produced: per-job results, the cluster timeline and run statistics.

    The timeline is kept as plain numbers (``timeline_values``, ``timeline_rows``); ``timeline`` builds the
    DataFrame on first use, so that a run that only writes its files (``hpcsched simulate``) never imports
    pandas (its import was the largest part of the command's start-up).
    """

    results: list[JobResult]
    timeline_values: list[float]  # TIMELINE_COLUMNS of every event, row after row (flat: what the engine appends)
    meta: dict[str, Any]
    iterations_done: dict[str, float]
    iterations_total: dict[str, float]
    events: int
    wall_s: float
    rejected: list[str] = field(default_factory=list)
    decisions: list[DecisionEvent] = field(default_factory=list)  # as_controller runs: every start and stop decided
    _timeline: pd.DataFrame | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def timeline(self) -> pd.DataFrame:
        """time, busy_gpus, running_jobs, queued_jobs (floats), one row per event; built once, on first use."""
        if self._timeline is None:
            import numpy as np
            import pandas as pd

            values = np.array(self.timeline_values, dtype=float).reshape(-1, len(TIMELINE_COLUMNS))
            self._timeline = pd.DataFrame(values, columns=list(TIMELINE_COLUMNS))
        return self._timeline

    def timeline_rows(self) -> list[tuple[float, ...]]:
        """The timeline as one tuple per event (``TIMELINE_COLUMNS``), without pandas."""
        it = iter(self.timeline_values)
        return list(zip(*[it] * len(TIMELINE_COLUMNS), strict=True))

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([_row(r) for r in self.results], columns=list(JobResult.__slots__))

    def summary(self) -> dict[str, Any]:
        """``hpcsched.metrics.summarize`` of ``frame()``, computed from the records (no pandas)."""
        from hpcsched.metrics import summarize_results

        return summarize_results(self.results, self.meta)



def _row(r: JobResult) -> dict[str, Any]:
    return {k: getattr(r, k) for k in JobResult.__slots__}


def simulate(
    jobs: Sequence[Job],
    cluster: ClusterSpec,
    policy: str | Policy,
    compat: str | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    trace: str = "",
    group_factors: Mapping[int, float] | None = None,
    restart_s: float | None = None,
    as_controller: AsController | None = None,
    slowdown: float | None = None,
) -> SimResult:
    """Run ``jobs`` on ``cluster`` under ``policy`` (a registry name or a Policy function).

    ``compat="muri"`` reproduces the reference simulator's accounting (see ``hpcsched.compat.muri``).
    ``group_factors`` ({member count: factor}) replaces ``group_factor(k)`` where a running group's speed
    is computed (a size without a factor of its own takes 4's), and nowhere else: factors measured on a
    testbed change how fast groups run, not which groups the policy forms (the real controller decides with
    the default factors too).
    ``restart_s`` (default mode only; compat keeps the reference's table) is every job's restart cost in
    seconds instead of the per-model table: a measured start-up + tear-down per launch is a property of the
    machine, not of the model, and must be paid as wall-clock time, not as iterations at a group's pace.
    ``as_controller`` (default mode only) takes every decision through the shared decision core as the
    runtime's controller does (``hpcsched.sim.core_decisions``): what it knows of jobs, its hysteresis, its
    rule that running jobs are never moved to form groups; the decisions are returned (``SimResult.decisions``).
    ``slowdown`` (default mode only) is a solo job's period over its iteration time (the solo factor,
    1.015 unless given): the speed model's measured overhead of a training step, a named option so that a
    comparison with a simulator that has none (Blox) can turn it off (1.0).
    ``progress(completed, total)`` is called now and then for a progress bar.
    Raises ValueError for jobs that cannot be simulated (no size or length) or a bad policy answer.
    """
    if compat is not None and compat not in COMPAT_MODES:
        raise ValueError(f"unknown compat mode {compat!r}; known: {', '.join(COMPAT_MODES)}")
    if compat in ("gavel", "blox"):  # their own loops, not this engine's rules
        raise ValueError(f"compat {compat!r} is its own round loop: hpcsched.hetero.simulate.run_gavel / "
                         "hpcsched.compat.blox.simulate_blox")
    if as_controller is not None and compat is not None:
        raise ValueError("as_controller runs the controller's rules; compat modes run the reference's: pick one")
    if restart_s is not None and not (restart_s >= 0 and math.isfinite(restart_s)):
        raise ValueError(f"restart_s must be a finite number of seconds >= 0, got {restart_s}")
    if slowdown is not None and (compat is not None or not (slowdown > 0 and math.isfinite(slowdown))):
        raise ValueError(f"slowdown must be a finite factor > 0 and only without compat, got {slowdown}")
    if isinstance(policy, str):
        from hpcsched.policies import get_policy

        fn = get_policy(policy)
    else:
        fn = policy
    name = policy_name(fn)
    t0 = time.perf_counter()
    eng = DLEngine(jobs, cluster, fn, name, compat, progress, restart_s, as_controller,
                  SOLO_FACTOR if slowdown is None else slowdown)
    if group_factors:
        eng.gf |= {int(k): float(f) for k, f in group_factors.items() if int(k) >= 2}
    eng.run()
    meta = {
        "tool": "simulate",
        "policy": name,
        "trace": trace,
        "cluster": cluster.name,
        "capacity_gpus": cluster.gpus,
        "capacity_nodes": cluster.nodes,
        "compat": compat,
        "events": eng.events,
    }
    if restart_s is not None and compat is None:  # every job's restart cost (the per-model table otherwise)
        meta["restart_s"] = restart_s
    if compat is None:  # the speed model's two named costs, as this run used them
        meta["slowdown_factor"] = SOLO_FACTOR if slowdown is None else slowdown
        meta["restart_cost"] = "per-model table" if restart_s is None else restart_s
    if group_factors:  # the factors groups ran at (a size not listed takes 4's)
        meta["group_factors"] = {str(k): v for k, v in eng.gf.items()}
    if as_controller is not None:
        meta["executor"] = "controller"
        meta["min_runtime_s"] = as_controller.options.min_runtime_s
        meta["declared_profiles"] = len(as_controller.declared)
        # co-located jobs with no stage profile, run at a compute-only pipeline period: a guess, so counted
        meta["untimed_colocated_jobs"] = len(eng.core.untimed) if eng.core is not None else 0
        meta["admission"] = as_controller.options.admission
        meta["placement"] = as_controller.options.placement
        if as_controller.options.admission != "accept-all":
            meta["load_threshold"] = as_controller.options.load_threshold
    return SimResult(
        results=[_result(j) for j in eng.jobs],
        timeline_values=eng.timeline,
        meta=meta,
        iterations_done={j.id: j.done for j in eng.jobs},
        iterations_total={j.id: j.total for j in eng.jobs},
        events=eng.events,
        wall_s=time.perf_counter() - t0,
        rejected=[j.id for j in eng.jobs if j.status == "rejected"],
        decisions=eng.core.log if eng.core is not None else [],
    )


def _result(j: EngineJob) -> JobResult:
    status = "completed" if j.end is not None else ("rejected" if j.status == "rejected" else "unfinished")
    return JobResult(j.id, j.submit, j.first_start, j.end, j.gpus, 0, j.gpu_s, 0.0, status)

