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
   placement (``hpcsched.sim.placement.place_consolidated``); all members share those GPUs.
3. Groups are taken in the returned order; one that does not fit the GPUs left is skipped and the
   engine goes on with the next (backfilling), so the order is a priority, not a queue.
   In ``compat="muri"`` for Themis and Muri-S/L, groups are first CHOSEN in order and then placed
   largest first (the reference's two passes); a chosen group that no longer fits does not run.
4. Speed: a solo job runs one iteration per ``iteration_time x 1.015``. A group of k >= 2 members
   runs ONE iteration of EVERY member per ``period_s x GROUP_FACTOR[k]`` (1.33/1.015, 1.5/1.015,
   1.37/1.015 for k = 2, 3, 4; ``hpcsched.sim.semantics``), so ``period_s`` is the raw interleaved
   period the policy computed from the stage profiles; a multi-job group without ``period_s`` is an
   error. A solo group with ``period_s`` runs at ``period_s x 1.015``.
5. Restart cost (``semantics.restart_cost``, per model and GPU count). Default mode: a member
   pays its OWN cost once whenever its GPUs change (first start, resume after preemption, migration);
   joining or leaving a group on the same GPUs is free. ``compat="muri"``: at every event every
   running member loses the SUM of its group's members' costs from that interval's progress.
6. Accounting: a member's ``gpu_seconds`` is the group's GPUs x time / k; attained service
   (``JobView.attained_gpu_s``, LAS/Tiresias/Muri-L) is the job's own GPUs x wall time running.
7. Default mode keeps a running group on its GPUs when the new plan still places it (same GPU
   count, same members' GPUs free); otherwise the plan is re-placed from scratch, and whoever moved
   pays the restart cost.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from hpcsched.allocator import Group, JobView, Policy, Snapshot
from hpcsched.model import ClusterSpec, Job
from hpcsched.results import JobResult
from hpcsched.sim import placement as pl
from hpcsched.sim.semantics import (
    COMPAT_MODES,
    SOLO_FACTOR,
    CompatRules,
    compat_rules,
    group_factor,
    restart_cost,
)

DEFAULT_ITERATION_S = 1.0
"""Iteration length given to jobs whose trace has only a duration (Philly): iterations = duration / 1 s."""

_INF = math.inf


class _J:
    """Mutable per-run state of one job (the Job record itself stays frozen)."""

    __slots__ = (
        "job", "id", "idx", "submit", "gpus", "model", "total", "it", "dur", "restart",
        "done", "executed", "attained", "gpu_s", "first_start", "end", "running", "place",
        "period", "charge", "warm", "share", "group", "predicted", "view", "ever_ran", "status",
    )  # fmt: skip

    def __init__(self, job: Job, idx: int, compat: bool) -> None:
        self.job, self.id, self.idx = job, job.id, idx
        self.gpus = job.gpus
        self.model = job.model
        it, total = _iterations(job)
        if compat:  # the reference reads milliseconds as integers: reproduce its rounding exactly
            it = round(it * 1000) / 1000 if job.iteration_time is not None else it
            self.submit = round(job.submit * 1000) / 1000
            self.dur = round((job.duration or total * it) * 1000) / 1000
        else:
            self.submit = job.submit
            self.dur = job.duration if job.duration is not None else total * it
        self.total, self.it = total, it
        self.restart = restart_cost(job.model, job.gpus)
        self.done = self.executed = self.attained = self.gpu_s = 0.0
        self.first_start: float | None = None
        self.end: float | None = None
        self.running = False
        self.place: tuple[tuple[int, int], ...] | None = None
        self.period = it * SOLO_FACTOR
        self.charge = 0.0  # compat: seconds lost per event
        self.warm = 0.0  # default: restart seconds still to pay
        self.share = float(job.gpus)  # GPUs accounted to this job while running
        self.group: tuple[str, ...] = ()
        self.predicted = _INF
        self.view: JobView | None = None
        self.ever_ran = False
        self.status = "pending"


def _iterations(job: Job) -> tuple[float, float]:
    """(solo seconds per iteration, total iterations); duration-only jobs get 1-s iterations."""
    if job.iterations is not None and job.iterations > 0:
        if job.iteration_time is not None and job.iteration_time > 0:
            return job.iteration_time, float(job.iterations)
        if job.duration is not None and job.duration > 0:
            return job.duration / job.iterations, float(job.iterations)
    if job.duration is not None and job.duration > 0:
        it = job.iteration_time if job.iteration_time and job.iteration_time > 0 else DEFAULT_ITERATION_S
        n = max(1.0, math.ceil(job.duration / it))
        return job.duration / n, n
    raise ValueError(f"job {job.id}: needs iterations with an iteration time, or a duration > 0")


@dataclass
class SimResult:
    """What one simulation produced: per-job results, the cluster timeline and run statistics."""

    results: list[JobResult]
    timeline: pd.DataFrame  # time, busy_gpus, running_jobs, queued_jobs (one row per event)
    meta: dict[str, Any]
    iterations_done: dict[str, float]
    iterations_total: dict[str, float]
    events: int
    wall_s: float
    rejected: list[str] = field(default_factory=list)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([_row(r) for r in self.results], columns=list(JobResult.__slots__))

    def summary(self) -> dict[str, Any]:
        from hpcsched.metrics import summarize

        return summarize(self.frame(), self.meta)


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
) -> SimResult:
    """Run ``jobs`` on ``cluster`` under ``policy`` (a registry name or a Policy function).

    ``compat="muri"`` reproduces the reference simulator's accounting (see ``semantics``).
    ``progress(completed, total)`` is called now and then for a progress bar.
    Raises ValueError for jobs that cannot be simulated (no size or length) or a bad policy answer.
    """
    if compat is not None and compat not in COMPAT_MODES:
        raise ValueError(f"unknown compat mode {compat!r}; known: {', '.join(COMPAT_MODES)}")
    if isinstance(policy, str):
        from hpcsched.policies import get_policy

        name, fn = policy, get_policy(policy)
    else:
        name, fn = getattr(policy, "__name__", "custom"), policy
    t0 = time.perf_counter()
    eng = _Engine(jobs, cluster, fn, name, compat, progress)
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
    return SimResult(
        results=[_result(j) for j in eng.jobs],
        timeline=pd.DataFrame(
            np.array(eng.timeline, dtype=float).reshape(-1, 4),
            columns=["time", "busy_gpus", "running_jobs", "queued_jobs"],
        ),
        meta=meta,
        iterations_done={j.id: j.done for j in eng.jobs},
        iterations_total={j.id: j.total for j in eng.jobs},
        events=eng.events,
        wall_s=time.perf_counter() - t0,
        rejected=[j.id for j in eng.jobs if j.status == "rejected"],
    )


def _result(j: _J) -> JobResult:
    status = "completed" if j.end is not None else ("rejected" if j.status == "rejected" else "unfinished")
    return JobResult(j.id, j.submit, j.first_start, j.end, j.gpus, 0, j.gpu_s, 0.0, status)


class _Engine:
    def __init__(
        self,
        jobs: Sequence[Job],
        cluster: ClusterSpec,
        policy: Policy,
        name: str,
        compat: str | None,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.compat = compat is not None
        self.mode = compat  # told to policies (Snapshot.compat): interleaving follows the speed model
        self.rules: CompatRules = compat_rules(name) if self.compat else CompatRules()
        self.cluster, self.policy, self.name, self.progress = cluster, policy, name, progress
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].submit)  # stable: file order on ties
        self.jobs = [_J(jobs[i], k, self.compat) for k, i in enumerate(order)]
        self.gpn = cluster.gpus_per_node
        self.nps = cluster.nodes_per_switch if cluster.switches > 1 else None
        self.thresholds = tuple(sorted(getattr(policy, "service_thresholds", ())))
        self.active: list[_J] = []
        self.running: list[_J] = []
        self.events = 0
        self.timeline: list[float] = []
        self.by_id: dict[str, _J] = {}
        self.finished = 0
        for j in self.jobs:
            if j.gpus <= 0 or j.gpus > cluster.gpus:
                j.status = "rejected"  # cannot ever run here; reported, not dropped

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> None:
        jobs, n = self.jobs, len(self.jobs)
        ptr, now = 0, 0.0
        t_end = _INF
        while True:
            while ptr < n and jobs[ptr].status == "rejected":
                ptr += 1
            t_arr = jobs[ptr].submit if ptr < n else _INF
            t_wake = self._next_wake(now) if self.thresholds and self.running else _INF
            t = min(t_arr, t_end, t_wake)
            if t == _INF:
                break
            self._advance(t - now if self.events else 0.0, t)
            now = t
            self.events += 1
            if t_end <= t:
                self._complete(t)
            while ptr < n and jobs[ptr].submit <= t:
                j = jobs[ptr]
                ptr += 1
                if j.status == "rejected":
                    continue
                self.active.append(j)
                self.by_id[j.id] = j
            self._reschedule(t)
            t_end = min((j.predicted for j in self.running), default=_INF)
            busy = sum(j.share for j in self.running)
            self.timeline += (t, busy, len(self.running), len(self.active) - len(self.running))
            if self.progress is not None and self.events % 256 == 0:
                self.progress(self.finished, n)
        if self.progress is not None:
            self.progress(self.finished, n)

    def _next_wake(self, now: float) -> float:
        best = _INF
        for j in self.running:
            for thr in self.thresholds:
                if j.attained < thr:
                    if self.compat:  # reference: ceil(limit / gpus) - executed + now
                        w = math.ceil(thr / j.gpus) - j.executed + now
                    else:
                        w = now + (thr - j.attained) / j.gpus
                    best = min(best, max(w, now))
                    break
        return best

    def _advance(self, dt: float, t: float) -> None:
        if dt <= 0:
            return
        compat = self.compat
        for j in self.running:
            j.executed += dt
            j.attained += dt * j.gpus
            j.gpu_s += dt * j.share
            if compat:
                j.done += max(dt - j.charge, 0.0) / j.period
            else:
                w = min(dt, j.warm)
                j.warm -= w
                j.done += (dt - w) / j.period
            j.view = None

    def _complete(self, t: float) -> None:
        tol = 0.0 if self.compat else 1e-9 * max(1.0, abs(t))
        ended = [j for j in self.running if j.predicted <= t + tol]
        if not ended:
            return
        for j in ended:
            j.end = t
            j.running = False
            j.status = "completed"
            j.place = None
            if not self.compat:
                j.done = j.total if abs(j.done - j.total) <= 1e-6 * max(1.0, j.total) else j.done
            del self.by_id[j.id]
        self.finished += len(ended)
        self.running = [j for j in self.running if j.end is None]
        self.active = [j for j in self.active if j.end is None]

    # -- decisions ---------------------------------------------------------------------------
    def _view(self, j: _J) -> JobView:
        v = j.view
        if v is None:
            rem_iters = max(j.total - j.done, 0.0)
            if self.compat and not j.ever_ran and self.rules.new_remaining == "duration":
                remaining = j.dur
            else:
                remaining = rem_iters * j.it * SOLO_FACTOR
            v = JobView(
                id=j.id,
                submit=j.submit,
                gpus=j.gpus,
                iterations_total=int(round(j.total)),
                iterations_done=j.done,
                iteration_time=j.it,
                attained_gpu_s=j.attained,
                executed_s=j.executed,
                remaining_s=remaining,
                profile=j.job.profile,
                running=j.running,
                first_start=j.first_start,
                model=j.model,
            )
            j.view = v
        return v

    def _reschedule(self, t: float) -> None:
        if not self.active:
            return
        held = sum(j.share for j in self.running)
        snap = Snapshot(
            now=t,
            jobs=tuple(self._view(j) for j in self.active),
            cluster=self.cluster,
            free_gpus=int(round(self.cluster.gpus - held)),
            compat=self.mode,
        )
        groups = self.policy(snap)
        plan = self._place(self._resolve(groups))
        self._apply(plan, t)

    def _resolve(self, groups: list[Group]) -> list[tuple[Group, list[_J], int]]:
        seen: set[str] = set()
        out = []
        for g in groups:
            members = []
            for jid in g.job_ids:
                j = self.by_id.get(jid)
                if j is None:
                    raise ValueError(f"policy {self.name!r} returned job {jid!r}, which is not active")
                if jid in seen:
                    raise ValueError(f"policy {self.name!r} put job {jid!r} in two groups")
                seen.add(jid)
                members.append(j)
            if not members:
                continue
            if len(members) > 1 and g.period_s is None:
                raise ValueError(f"policy {self.name!r}: group {g.job_ids} of {len(members)} jobs has no period_s")
            out.append((g, members, max(m.gpus for m in members)))
        return out

    def _place(self, cands: list[tuple[Group, list[_J], int]]) -> list[tuple[Group, list[_J], Any]]:
        total = self.cluster.gpus
        if self.rules.placement == "count":  # compat Tiresias: counting only, no nodes
            chosen, left = [], total
            for g, members, need in cands:
                if need <= left:
                    left -= need
                    chosen.append((g, members, None))
            return chosen
        free = [self.gpn] * self.cluster.nodes
        left = total
        first: list[tuple[Group, list[_J], Any]] = []
        for g, members, need in cands:
            if left == 0:
                break
            if need > left:
                continue
            p = pl.place_consolidated(free, need, self.gpn, self.nps)
            if p is not None:
                pl.apply(free, p)
                left -= need
                first.append((g, members, tuple(p)))
        if self.compat:
            if not self.rules.two_pass:
                return first
            free = [self.gpn] * self.cluster.nodes
            out = []
            for g, members, _ in sorted(first, key=lambda c: -max(m.gpus for m in c[1])):
                p = pl.place_consolidated(free, max(m.gpus for m in members), self.gpn, self.nps)
                if p is not None:
                    pl.apply(free, p)
                    out.append((g, members, tuple(p)))
            return out
        return self._sticky(first)

    def _sticky(self, first: list[tuple[Group, list[_J], Any]]) -> list[tuple[Group, list[_J], Any]]:
        """Keep running groups on their GPUs where possible; fall back to the fresh plan."""
        free = [self.gpn] * self.cluster.nodes
        out: list[Any] = [None] * len(first)
        rest = []
        for i, (g, members, _fresh) in enumerate(first):
            old = next((m.place for m in members if m.running and m.place is not None), None)
            need = max(m.gpus for m in members)
            if old is not None and sum(k for _, k in old) == need and all(free[n] >= k for n, k in old):
                pl.apply(free, list(old))
                out[i] = (g, members, old)
            else:
                rest.append(i)
        for i in rest:
            g, members, _ = first[i]
            p = pl.place_consolidated(free, max(m.gpus for m in members), self.gpn, self.nps)
            if p is None:
                return first  # fragmentation: the fresh plan is feasible by construction
            pl.apply(free, p)
            out[i] = (g, members, tuple(p))
        return out

    def _apply(self, plan: list[tuple[Group, list[_J], Any]], t: float) -> None:
        compat = self.compat
        now_running: list[_J] = []
        for g, members, p in plan:
            k = len(members)
            need = max(m.gpus for m in members)
            if k == 1 and g.period_s is None:
                period = None
            else:
                period = g.period_s * group_factor(k)
            charge = sum(restart_cost(m.model, m.gpus) for m in members) if self.rules.group_restart else None
            ids = tuple(m.id for m in members)
            for m in members:
                moved = not m.running or m.place != p
                m.period = period if period is not None else m.it * SOLO_FACTOR
                m.share = need / k
                m.group = ids
                if compat:
                    m.charge = charge if charge is not None and k > 1 else m.restart
                elif moved:
                    m.warm = m.restart
                if not m.running:
                    m.running = True
                    m.status = "running"
                    m.ever_ran = True
                    if m.first_start is None:
                        m.first_start = t
                m.place = p
                m.view = None
                now_running.append(m)
        keep = {id(m) for m in now_running}
        for j in self.running:
            if id(j) not in keep:  # preempted: progress is kept (checkpoint), GPUs released
                j.running = False
                j.status = "pending"
                j.place = None
                j.warm = 0.0
                j.view = None
        self.running = now_running
        rules_wall = compat and self.rules.progress == "wall"
        for j in now_running:
            if rules_wall:
                j.predicted = max(float(int(t + j.dur - j.executed)), t)
            elif compat:
                j.predicted = t + max(j.total - j.done, 0.0) * j.period
            else:
                j.predicted = t + j.warm + max(j.total - j.done, 0.0) * j.period
