"""One scheduling decision as a pure function: ``decide(DecideRequest) -> Plan``.

The body is a list of named steps over one context, in the order the architecture names:

- ``order``: the policy's groups, highest priority first (a job the policy leaves out is appended, never lost);
- ``group``: those groups made runnable from where jobs are now (``runnable_units``, rules below);
- ``admit``: protected units (young attempts, hysteresis) first, then every unit at its minimum footprint
  while slots are left; the others wait, each with the reason;
- ``size``: the MILP sizes the elastic jobs that declare a scaling curve, the others grow greedily;
- ``place``: running elastic Horovod jobs resize in place where they can, pending units are placed
  consolidated (a group joins its running anchor's slots), only on workers that have their launcher and a GPU
  type they accept (``JobState.gpu_types``; empty: any);
- ``diff``: what changes against what runs now: starts, stops (preempt / resize), in-place resizes.

No RPC, no database, no clock: the controller builds a ``ClusterState`` under its lock, calls ``decide`` and
applies the result, so the decision is tested on hand-checkable cases alone. Where executors must differ
the difference is a named field of ``DecideOptions``, never a copy of a step.

Interleaving groups (a policy's ``Group`` of several jobs, muri-s / muri-l) are honoured: the members run
co-located on the SAME slots (the worker gives them the same devices), and the group counts once in slot
accounting, with the footprint max(member procs). Members of a group are rigid (their ``min_procs``);
only jobs that run alone grow elastically. Jobs already running are not moved to form a group: a group
whose first running member (the anchor) runs somewhere keeps it there, and its pending members join the
anchor's slots when they need no more procs than the anchor has and the slots hold fewer than four jobs
(Muri's largest group: the anchor's co-located mates count, even those the policy has since regrouped);
running members co-located elsewhere,
and pending ones too big to join, become units of their own, right after it. Jobs co-located earlier
stay together whatever the policy says now (they share devices; only a stop separates them).

Hysteresis (``min_runtime_s``): the controller re-plans every tick, and LAS / Tiresias priorities cross
over continuously while muri-l regroups, so without a brake the order flips back and forth and every flip
is a checkpoint-stop-restore. Rule: a running job whose current attempt started less than
``min_runtime_s`` ago is protected: it keeps its slots at its size (its unit is admitted before all
others) and is neither preempted nor resized. So each job is stopped at most once per ``min_runtime_s``
and every attempt outlives its restore cost; the policy's order still decides everything else.

Sizes of elastic jobs that declare a scaling curve come from the MILP allocator (``hpcsched.milp``, the
one the harvesting simulator uses): after admission, the slots left plus those jobs' minimum sizes form
the pool, each job's value is its throughput over ``tfwd_s`` less its resize cost (BFTrainer's reference
objective), and the solver picks the counts. Elastic jobs without a curve then grow greedily, in priority
order, into what is left.

A resize normally stops the job (checkpoint) and places it again at its new size. An elastic Horovod job
(``in_place``) whose first node stays and whose growth fits in free slots (on its nodes, then on other workers)
is resized in place instead (``Plan.resizes``, over one worker or several; ``hpcsched.core.in_place``): the
controller sends its workers the new host list and Horovod re-forms the ranks. A grow that fits only once slots
held by stopping jobs are free waits for them at its current size (``Plan.grow_waits``) rather than relaunching.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import cast

from hpcsched.allocator import Group, JobView, Snapshot, policy_name
from hpcsched.core.in_place import resize_in_place
from hpcsched.interleave.period import MAX_GROUP
from hpcsched.model import ClusterSpec, ElasticJob, ScalingCurve
from hpcsched.placements import PlacementView, get_placement
from hpcsched.primitives.placement import first_slots
from hpcsched.primitives.state import ClusterState, DecideOptions, DecideRequest, JobState, Plan, WorkerState

__all__ = ["ClusterState", "DecideOptions", "DecideRequest", "JobState", "Plan", "WorkerState", "decide",
           "runnable_units"]

log = logging.getLogger(__name__)


def _views(state: ClusterState) -> tuple[JobView, ...]:
    out = []
    for j in state.jobs:
        size = j.procs if j.running else j.min_procs
        remaining = None
        if j.steps_total is not None and j.iteration_s is not None:
            remaining = max(0, j.steps_total - j.steps_done) * j.iteration_s
        out.append(JobView(
            id=j.id, submit=j.submit, gpus=size, iterations_total=j.steps_total, iterations_done=j.steps_done,
            iteration_time=j.iteration_s, attained_gpu_s=j.attained_s, executed_s=j.executed_s,
            remaining_s=remaining, profile=j.profile, running=j.running, first_start=j.first_start,
        ))
    return tuple(out)


def runnable_units(order: list[str], policy_groups: list[tuple[str, ...]], by_id: dict[str, JobState]
                   ) -> list[list[str]]:
    """The policy's groups made runnable from where jobs are now (rules in the module docstring): the
    ``group`` step, public because the testbed's simulations run policies through it too."""
    pos = {jid: k for k, jid in enumerate(order)}
    mates: dict[str, list[str]] = {}
    for j in by_id.values():
        if j.running and j.group and j.id in pos:
            mates.setdefault(j.group, []).append(j.id)
    for m in mates.values():
        m.sort(key=pos.__getitem__)  # policy order; one sort per group, not a scan of ``order`` per job
    units: list[list[str]] = []
    taken: set[str] = set()

    def with_mates(jid: str) -> list[str]:
        j = by_id[jid]
        return list(mates.get(j.group or "", ())) if j.running and j.group else [jid]

    def emit(unit: list[str]) -> None:
        unit = [i for i in unit if i not in taken]
        if unit:
            units.append(unit)
            taken.update(unit)

    for g in policy_groups:
        members = [i for i in g if i not in taken]
        running = [i for i in members if by_id[i].running]
        pending = [i for i in members if not by_id[i].running]
        if not running:
            emit(pending)
            continue
        anchor = by_id[running[0]]
        here = with_mates(anchor.id)
        room = MAX_GROUP - len(here)  # mates the policy has since regrouped still share the slots: count them
        joiners = [i for i in pending if by_id[i].min_procs <= anchor.procs][:max(0, room)]
        emit(here + joiners)
        for r in running[1:]:
            emit(with_mates(r))
        for i in pending:
            emit([i])
    return units


def _footprint(unit: list[str], by_id: dict[str, JobState]) -> int:
    """Slots a unit needs at least: a lone job its minimum (it may shrink), a running group its anchor's."""
    running = [by_id[i].procs for i in unit if by_id[i].running]
    return max(running) if running and len(unit) > 1 else max(by_id[i].min_procs for i in unit)


def _milp_sizes(ids: list[str], sizes: dict[str, int], left: int, by_id: dict[str, JobState],
                tfwd_s: float, first: str = "highs") -> tuple[int, str]:
    """Resize the curve jobs ``ids`` (admitted at ``sizes``) with the MILP over their slots plus ``left``;
    returns the slots left and how the sizes were reached (the allocator's status, or why it was not used).

    The MILP may pause a job (0 nodes: BFTrainer's model), but every job here was admitted and runs at least
    at its minimum. A job the answer pauses is held at its minimum and the others are sized again over what
    is left (at most once per job); the status then says how many were held, since the result is the best
    for the others, not the joint optimum. Keeps the admitted sizes if no solver runs."""
    from hpcsched.milp import MilpJob, Problem, SolverUnavailable, allocate

    free, held_at_min = list(ids), 0
    while free:
        pool_n = left + sum(sizes[i] for i in free)
        pool = tuple(f"s{k}" for k in range(pool_n))
        states, k = [], 0
        for i in free:
            j = by_id[i]
            now = min(j.procs if j.running else 0, pool_n - k)  # its current count: resizes cost it resize_s
            # ``ids`` are curve jobs (see above): the curve is there
            ej = ElasticJob(i, j.submit, j.min_procs, j.max_procs, cast(ScalingCurve, j.curve), 1.0, j.resize_s,
                            j.resize_s)
            states.append(MilpJob(ej, nodes=pool[k:k + now]))
            k += now
        problem = Problem(tuple(states), pool, tfwd=tfwd_s)
        for solver in dict.fromkeys((first, "dp")):  # the chosen one, else the exact dynamic programme (no package)
            try:
                d = allocate(problem, solver, time_limit=2.0)
                break
            except SolverUnavailable:
                continue
        else:
            return left, "no solver: minimum sizes"
        paused = [i for i in free if d.counts[i] < sizes[i]]
        if paused:  # admitted jobs run: hold them at their minimum, size the rest over what is left
            held_at_min += len(paused)
            free = [i for i in free if i not in paused]
            continue
        if sum(d.counts[i] for i in free) > pool_n:
            return left, f"{d.solver} {d.status} answer does not fit: minimum sizes"
        sizes.update({i: d.counts[i] for i in free})
        left = pool_n - sum(d.counts[i] for i in free)
        status = d.status if d.status == "optimal" else f"{d.solver} {d.status}"
        return left, status if not held_at_min else f"{status}, {held_at_min} held at their minimum"
    return left, f"every job held at its minimum ({held_at_min})"


@dataclass(slots=True)
class _Context:
    """What the steps share within one decision."""

    request: DecideRequest
    state: ClusterState
    by_id: dict[str, JobState]
    workers: list[WorkerState]
    total: int  # slots of the live workers
    gpn: int  # slots of the largest worker: consolidated placement's node size
    out: Plan = field(default_factory=lambda: Plan())
    order: list[str] = field(default_factory=list)  # job ids, highest priority first
    groups: list[tuple[str, ...]] = field(default_factory=list)  # the policy's groups, over known jobs only
    policy_groups: list[Group] = field(default_factory=list)  # the same as the policy gave them (periods kept)
    units: list[list[str]] = field(default_factory=list)  # runnable units, protected ones first after admit
    keep_ids: set[str] = field(default_factory=set)  # first id of each protected unit (units are disjoint)
    admitted: list[list[str]] = field(default_factory=list)
    left: int = 0  # slots not yet given to an admitted unit
    free: dict[str, int] = field(default_factory=dict)  # worker -> free slots, as placement takes them


def _accept(ctx: _Context) -> None:
    from hpcsched.admission import AdmissionView, get_admission

    opts = ctx.request.options
    if opts.admission == "accept-all":
        return
    held = get_admission(opts.admission)(AdmissionView(ctx.state.now, ctx.state.jobs, ctx.total, opts.load_threshold))
    if held:
        ctx.out.waiting.update(held)
        ctx.state = replace(ctx.state, jobs=tuple(j for j in ctx.state.jobs if j.id not in held))


def _order(ctx: _Context) -> None:
    state = ctx.state
    spec = ClusterSpec(switches=1, nodes_per_switch=max(1, len(ctx.workers)), gpus_per_node=ctx.gpn)
    snap = Snapshot(now=state.now, jobs=_views(state), cluster=spec,
                    free_gpus=max(0, ctx.total - sum(state.used.values())))
    seen: set[str] = set()
    for g in ctx.request.policy(snap):
        ids = tuple(i for i in g.job_ids if i in ctx.by_id and i not in seen)
        seen.update(ids)
        if ids:
            ctx.groups.append(ids)
            ctx.policy_groups.append(g if ids == g.job_ids else Group(ids, g.period_s))
    ctx.groups += [(j.id,) for j in state.jobs if j.id not in seen]  # a policy that drops a job must not lose it
    ctx.order = [i for g in ctx.groups for i in g]


def _group(ctx: _Context) -> None:
    ctx.units = runnable_units(ctx.order, ctx.groups, ctx.by_id)


def _admit(ctx: _Context) -> None:
    by_id, now, young = ctx.by_id, ctx.state.now, ctx.request.options.min_runtime_s

    def protected(unit: list[str]) -> bool:
        return any(by_id[i].running and (began := by_id[i].attempt_start) is not None and now - began < young
                   for i in unit)

    kept = [protected(u) for u in ctx.units]
    ctx.keep_ids = {u[0] for u, k in zip(ctx.units, kept, strict=True) if k}
    ctx.units = ([u for u, k in zip(ctx.units, kept, strict=True) if k]
                 + [u for u, k in zip(ctx.units, kept, strict=True) if not k])
    left, out = ctx.total, ctx.out
    typed: dict[str, int] | None = None  # GPU type -> slots left of it, made at the first typed unit (none: untyped)
    for unit in ctx.units:  # admit at minimum size, highest priority first; a group needs its footprint once
        is_kept = unit[0] in ctx.keep_ids
        fixed = len(unit) > 1 or is_kept  # groups and protected jobs keep their running size
        need = max(by_id[i].procs for i in unit) if is_kept else _footprint(unit, by_id)
        types = _gpu_types(unit, by_id)
        if types is not None and typed is None:
            typed = _typed_slots(ctx.workers)
        # A typed unit also needs that many slots of its types: admitted against every type's slots, a backlog of
        # jobs of a type few workers have took the whole budget and held the runnable jobs behind it
        room = left if types is None or typed is None else min(left, sum(typed.get(t, 0) for t in types))
        if need <= room:
            ctx.admitted.append(unit)
            for i in unit:
                out.sizes[i] = by_id[i].procs if by_id[i].running and fixed else by_id[i].min_procs
            left -= need
            if types is not None and typed is not None:
                _take_typed(typed, sorted(types), need)
        elif room < left and types is not None:
            for i in unit:
                out.waiting[i] = (f"needs {need} slots of GPU type {'/'.join(sorted(types)) or '(none in common)'}, "
                                  f"{room} left after higher-priority jobs")
        else:
            for i in unit:
                out.waiting[i] = f"needs {need} slots, {left} left after higher-priority jobs"
    ctx.left = left


def _typed_slots(workers: list[WorkerState]) -> dict[str, int]:
    """Slots per advertised GPU type (what typed units are admitted against)."""
    out: dict[str, int] = {}
    for w in workers:
        out[w.gpu_type] = out.get(w.gpu_type, 0) + w.slots
    return out


def _take_typed(typed: dict[str, int], types: list[str], need: int) -> None:
    """Count ``need`` slots as taken from these types, in name order (the unit's placement picks which later)."""
    for t in types:
        k = min(need, typed.get(t, 0))
        if k:
            typed[t] -= k
            need -= k
        if not need:
            return


def _size(ctx: _Context) -> None:
    by_id, out = ctx.by_id, ctx.out
    lone = [u[0] for u in ctx.admitted if len(u) == 1 and u[0] not in ctx.keep_ids]
    curved = [i for i in lone if by_id[i].curve is not None and by_id[i].max_procs > by_id[i].min_procs]
    if curved:
        opts = ctx.request.options
        ctx.left, how = _milp_sizes(curved, out.sizes, ctx.left, by_id, opts.tfwd_s, opts.solver)
        out.sizing = dict.fromkeys(curved, how)
    for jid in lone:  # then grow elastic jobs without a curve into what is left
        if jid not in curved and ctx.left > 0:
            grow = min(by_id[jid].max_procs - out.sizes[jid], ctx.left)
            out.sizes[jid] += grow
            ctx.left -= grow


def _place(ctx: _Context) -> None:
    by_id, out = ctx.by_id, ctx.out
    ctx.free = {w.id: w.slots - ctx.state.used.get(w.id, 0) for w in ctx.workers}
    resize_in_place(out, ctx.order, by_id, ctx.free, ctx.workers, ctx.state.used)
    free, workers = ctx.free, ctx.workers
    gpu_type = {w.id: w.gpu_type for w in workers}
    place = get_placement(ctx.request.options.placement)
    first_fit = ctx.request.options.placement == "consolidated"  # its one-worker answer, without a view (below)
    cpus_used, mem_used = _resources_used(ctx.state.jobs)
    # The candidate workers of a unit depend only on its launchers and GPU types: found once per kind, not once per
    # unit (at 1,000 workers a step placing 2,800 units spent most of its time rebuilding these lists)
    candidates: dict[tuple[frozenset[str], frozenset[str] | None], _Candidates] = {}
    shown: list = [-1, ""]  # (units placed when it was made, the free slots as a waiting note shows them)
    placed = 0
    for unit in ctx.admitted:
        pending = [i for i in unit if not by_id[i].running]
        if not pending:
            continue
        anchor = next((by_id[i] for i in unit if by_id[i].running and _keeps_running(by_id[i], out)), None)
        types = _gpu_types(pending, by_id)  # None: any type
        if anchor is not None:  # join the anchor's slots: no new slots are used
            where = list(anchor.placement)
            key = anchor.group or anchor.id
            if not where:  # the snapshot does not say where it runs: nothing to join yet
                for i in pending:
                    out.waiting[i] = f"its group's running job {anchor.id} has no known placement"
                continue
            if types is not None and any(gpu_type.get(wid) not in types for wid, _ in where):
                for i in pending:
                    out.waiting[i] = f"its group's running job {anchor.id} runs on GPU types it does not accept"
                continue
        else:
            need = max(out.sizes[i] for i in pending)
            launchers = frozenset(by_id[i].launcher for i in pending)
            c = candidates.get((launchers, types))
            if c is None:
                c = candidates[launchers, types] = _Candidates(
                    [w for w in workers if launchers <= set(w.launchers) and (types is None or w.gpu_type in types)])
            able = c.able

            def fit(need: int, c: _Candidates = c, pending: list[str] = pending) -> list[tuple[int, int]] | None:
                if first_fit and 0 < need <= ctx.gpn:  # what consolidated answers, without an O(workers) view per unit
                    k = c.first_fit(free, need)
                    return None if k is None else [(k, need)]
                able = c.able
                return place(PlacementView(
                    need, tuple(free[w.id] for w in able), ctx.gpn,
                    c.nones if c.no_cpus else
                    tuple(None if w.cpus is None else w.cpus - cpus_used.get(w.id, 0.0) for w in able),
                    c.nones if c.no_mem else
                    tuple(None if w.mem_gb is None else w.mem_gb - mem_used.get(w.id, 0.0) for w in able),
                    max(by_id[i].cpus_per_proc for i in pending), max(by_id[i].mem_per_proc_gb for i in pending),
                    c.gpu_types, next((by_id[i].model for i in pending if by_id[i].model), None)))

            got = fit(need)
            if got is None and ctx.request.options.shrink_to_fit and len(unit) == 1:
                # an elastic job grown past what fits in one place (2 slots wanted, 1 free on each of two workers)
                # starts at the largest smaller size that fits rather than waiting with slots free
                for smaller in range(need - 1, by_id[pending[0]].min_procs - 1, -1):
                    got = fit(smaller)
                    if got is not None:
                        out.shrunk_to_fit[pending[0]] = need
                        need = out.sizes[pending[0]] = smaller
                        break
            if got is None:
                typed = "" if types is None else f" of GPU type {'/'.join(sorted(types)) or '(none in common)'}"
                if shown[0] != placed:  # made once per change of the free slots, not once per unit that does not fit
                    shown[:] = placed, _free_note(free)
                for i in pending:
                    out.waiting[i] = f"{need} slots{typed} do not fit on free slots {shown[1]}"
                continue
            placed += 1
            where = [(able[i].id, k) for i, k in got]
            for wid, k in where:
                free[wid] -= k
                cpus_used[wid] = cpus_used.get(wid, 0.0) + k * max(by_id[i].cpus_per_proc for i in pending)
                mem_used[wid] = mem_used.get(wid, 0.0) + k * max(by_id[i].mem_per_proc_gb for i in pending)
            key = "+".join(pending) if len(pending) > 1 else pending[0]
        for i in pending:
            out.starts[i] = first_slots(where, out.sizes[i])
            out.groups[i] = key


def _free_note(free: dict[str, int]) -> str:
    """The free slots as a waiting note shows them: every worker's on a small cluster, a summary on a large one
    (the whole dict at 10,000 workers was 200 KB a job, made for every job that did not fit)."""
    if len(free) <= 32:
        return str(free)
    return f"(at most {max(free.values(), default=0)} on any of {len(free)} workers, {sum(free.values())} in all)"


class _Candidates:
    """The workers a kind of unit may go to, with what does not change while a step places units."""

    __slots__ = ("able", "cursor", "gpu_types", "no_cpus", "no_mem", "nones")

    def __init__(self, able: list[WorkerState]) -> None:
        self.able = able
        self.gpu_types = tuple(w.gpu_type for w in able)
        self.no_cpus = all(w.cpus is None for w in able)  # then free CPUs are None whatever is placed
        self.no_mem = all(w.mem_gb is None for w in able)
        self.nones = (None,) * len(able)
        self.cursor: dict[int, int] = {}  # need -> index before which no worker has that many free slots

    def first_fit(self, free: dict[str, int], need: int) -> int | None:
        """Consolidated placement of a unit that fits one worker (``place_consolidated``: the first of these workers
        with ``need`` free slots), or None. Free slots only shrink while a step places units, so a worker passed
        over for ``need`` stays passed over: each search resumes where the last one for that need stopped, and a
        step scans the workers once per distinct need, not once per unit (at 10,000 workers and 1,024 units the
        per-unit view was 10 million reads, seconds of a step)."""
        k, able = self.cursor.get(need, 0), self.able
        while k < len(able) and free[able[k].id] < need:
            k += 1
        self.cursor[need] = k
        return k if k < len(able) else None


def _diff(ctx: _Context) -> None:
    by_id, out = ctx.by_id, ctx.out
    stops: dict[str, str] = {}
    for jid in ctx.order:  # running jobs, in priority order
        j = by_id[jid]
        if not j.running or jid in out.resizes:
            continue
        if jid not in out.sizes:
            stops[jid] = "preempt"
        elif out.sizes[jid] != j.procs:
            stops[jid] = "resize"
    out.stops = stops


_STEPS: tuple[Callable[[_Context], None], ...] = (_accept, _order, _group, _admit, _size, _place, _diff)


def decide(request: DecideRequest) -> Plan:
    """Which jobs run, at which size, and where new ones go (the steps in the module docstring)."""
    state = request.state
    if not state.jobs:
        return Plan()
    workers = sorted(state.workers, key=lambda w: w.id)
    ctx = _Context(request=request, state=state, by_id={j.id: j for j in state.jobs}, workers=workers,
                   total=sum(w.slots for w in workers),
                   gpn=max((w.slots for w in workers), default=1) or 1)
    if request.options.regroup == "replan":  # the policy as designed: ``hpcsched.core.regroup``
        from hpcsched.core.regroup import replan

        _accept(ctx)
        _order(ctx)
        return replan(ctx.state, ctx.policy_groups, ctx.workers, ctx.out, policy_name(request.policy))
    if request.options.regroup != "keep":
        raise ValueError(f"unknown regroup {request.options.regroup!r}: 'keep' or 'replan'")
    for step in _STEPS:
        step(ctx)
    return ctx.out


def _resources_used(jobs: tuple[JobState, ...]) -> tuple[dict[str, float], dict[str, float]]:
    """CPUs and memory the running jobs hold per worker (their per-process needs x their slots there)."""
    cpus: dict[str, float] = {}
    mem: dict[str, float] = {}
    for j in jobs:
        if j.running and (j.cpus_per_proc or j.mem_per_proc_gb):
            for wid, k in j.placement:
                cpus[wid] = cpus.get(wid, 0.0) + k * j.cpus_per_proc
                mem[wid] = mem.get(wid, 0.0) + k * j.mem_per_proc_gb
    return cpus, mem


def _gpu_types(pending: list[str], by_id: dict[str, JobState]) -> frozenset[str] | None:
    """The GPU types every pending member of a unit accepts (they share slots), None when none restricts it."""
    out: frozenset[str] | None = None
    for i in pending:
        if by_id[i].gpu_types:
            mine = frozenset(by_id[i].gpu_types)
            out = mine if out is None else out & mine
    return out


def _keeps_running(j: JobState, out: Plan) -> bool:
    """A running job that this decision neither preempts nor stops to resize (an in-place resize keeps it)."""
    return j.id in out.resizes or (j.id in out.sizes and out.sizes[j.id] == j.procs)
