"""Muri-S, Muri-L and Muri-S+: order the jobs, pick candidates, group them by matching.

Per scheduling event (all three):

1. Order the active jobs: Muri-S by remaining GPU-time (remaining solo seconds x GPUs, shortest first:
   needs durations; jobs without one go last), Muri-L by attained GPU-time (least first: needs none).
   Ties keep arrival order.
2. Candidates (the reference's rule): walk the order, placing each not-yet-chosen job on an empty
   cluster with consolidated placement; every job that fits opens a slot for itself and the next
   three jobs of the same GPU count in the order. Up to four jobs per slot are what matching may fold
   together; jobs that open no slot do not run this round.
3. Group the candidates (``grouping.form_groups``), merging only while they need more GPUs than the
   cluster has.
4. Return the groups, the one holding the highest-priority job first; the simulator places them.

Jobs without a stage profile (e.g. Philly) are never grouped: with nothing known about their stages
any partner could only slow them down. They still run alone in their slot, in order.

Muri-S and Muri-L follow the reference (``simulator/run_sim.py``, ``matching.py``): same-GPU groups,
efficiency weights, merges in priority order. Its published Muri-S figures were run with
``--noautopack``, its Muri-L figures with the default ``--autopack`` (groups slower than their members
apart are split again, then the plan is re-ranked and re-fitted: ``autopack``); compat Muri-L does that
too (trace3: +0.55% average JCT against the published figure, +2.05% without it). Under
``Snapshot.compat == "muri"`` they use the reference's four-slot cycle model, in default mode the exact
pipeline model (``period``).

Muri-S+ keeps Muri-S's order and candidates and changes which groups form: an edge weighs the GPU-time a
merge gains over the members taking turns on the GPUs, and only merges that gain get an edge, so no
group runs slower than its members would apart (the reference groups any pair, and the efficiency of
two compute-bound jobs is as high as that of a complementary pair). ``MIXED_RULES`` additionally lets
GPU counts mix once same-GPU groups cannot make the candidates fit; it measured worse on trace3
(bench/RESULTS.md), so Muri-S+ does not use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hpcsched.allocator import Group, JobView, Snapshot
from hpcsched.interleave.grouping import Candidate, Formed, GroupingRules, Scorer, form_groups
from hpcsched.interleave.period import PeriodModel
from hpcsched.primitives import placement as pl
from hpcsched.primitives.speed import SOLO_FACTOR, group_factor

SLOT_JOBS = 4  # jobs considered for each placeable slot (the reference's packing_num)

COMPAT_RULES = GroupingRules(model=PeriodModel("muri4"))
REFERENCE_RULES = GroupingRules(model=PeriodModel("pipeline"))
PLUS_RULES = GroupingRules(model=PeriodModel("pipeline"), weight="gain")
MIXED_RULES = GroupingRules(model=PeriodModel("pipeline"), weight="gain", mixed_gpus=True)


def remaining_gpu_s(v: JobView) -> float:
    return v.remaining_s * v.gpus if v.remaining_s is not None else float("inf")


def attained_gpu_s(v: JobView) -> float:
    return v.attained_gpu_s


def candidates(order: list[JobView], snapshot: Snapshot) -> list[JobView]:
    """Jobs offered for grouping, in priority order (step 2 of the module docstring)."""
    c = snapshot.cluster
    free = [c.gpus_per_node] * c.nodes
    nps = c.nodes_per_switch if c.switches > 1 else None
    by_gpus: dict[int, list[int]] = {}
    for pos, v in enumerate(order):
        by_gpus.setdefault(v.gpus, []).append(pos)
    taken_upto: dict[int, int] = dict.fromkeys(by_gpus, 0)
    chosen = [False] * len(order)
    failed: set[int] = set()  # reservations only grow: a size that did not fit never will this round
    left = c.gpus
    for pos, v in enumerate(order):
        if left <= 0:
            break
        if chosen[pos] or v.gpus in failed or v.gpus <= 0 or v.gpus > left:
            continue
        p = pl.place_consolidated(free, v.gpus, c.gpus_per_node, nps)
        if p is None:
            failed.add(v.gpus)
            continue
        pl.apply(free, p)
        left -= v.gpus
        same = by_gpus[v.gpus]
        lo = taken_upto[v.gpus]
        hi = min(lo + SLOT_JOBS, len(same))
        for q in same[lo:hi]:
            chosen[q] = True
        taken_upto[v.gpus] = hi
    return [v for v, ok in zip(order, chosen, strict=True) if ok]


def autopack(formed: list[Formed], cands: list[Candidate], snapshot: Snapshot) -> list[Formed]:
    """The reference's ``--autopack`` pass (on by default in its code; Muri-L's published run used it).

    A group whose slowed-down period exceeds its members' solo periods summed runs slower than the
    members taking turns, so it is split back into single jobs. The groups and singles are then ranked
    by their best member (``cands`` is in priority order, so by its smallest index) and placed on an empty
    cluster in that order; whatever no longer fits does not run this round (splitting can make the plan too
    big).
    """
    units: list[Formed] = []
    for f in formed:
        k = len(f.members)
        apart = sum(cands[i].solo_s for i in f.members)
        if k > 1 and f.raw_period is not None and f.raw_period * group_factor(k) > apart:
            units.extend(Formed((i,), None, 1.0, 0.0) for i in f.members)
        else:
            units.append(f)
    units.sort(key=lambda f: min(f.members))
    c = snapshot.cluster
    free = [c.gpus_per_node] * c.nodes
    nps = c.nodes_per_switch if c.switches > 1 else None
    kept = []
    for f in units:
        g = max(cands[i].gpus for i in f.members)
        p = pl.place_consolidated(free, g, c.gpus_per_node, nps)
        if p is not None:
            pl.apply(free, p)
            kept.append(f)
    return kept


def _candidate(v: JobView) -> Candidate:
    it = v.iteration_time if v.iteration_time is not None and v.iteration_time > 0 else 1.0
    stages = v.profile.stages() if v.profile is not None else None
    return Candidate(v.id, v.gpus, stages, it * SOLO_FACTOR)


def _cached_candidate(v: JobView, memo: dict[str, tuple[tuple, Candidate]]) -> Candidate:
    """A job's Candidate changes only if its profile, size or speed do (re-profiling): memoised per job id."""
    key = (v.gpus, v.profile, v.iteration_time)
    hit = memo.get(v.id)
    if hit is None or hit[0] != key:
        hit = memo[v.id] = (key, _candidate(v))
    return hit[1]


@dataclass
class InterleavingPolicy:
    """A Muri-style policy: ``key`` orders jobs, ``rules`` (and ``compat_rules`` under compat) group them.

    Calling it is a pure function of the snapshot; the scorers only memoise group scores and matchings.
    """

    name: str
    key: Callable[[JobView], float]
    rules: GroupingRules
    compat_rules: GroupingRules = COMPAT_RULES
    compat_autopack: bool = False  # under compat: split groups slower than their members apart (Muri-L)
    _scorers: dict[str, Scorer] = field(default_factory=dict, repr=False)
    _cands: dict[str, tuple[tuple, Candidate]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.__name__ = self.name

    def scorer(self, compat: str | None) -> Scorer:
        mode = compat or "default"
        s = self._scorers.get(mode)
        if s is None:
            s = self._scorers[mode] = Scorer(self.compat_rules if compat == "muri" else self.rules)
        return s

    def __call__(self, snapshot: Snapshot) -> list[Group]:
        order = sorted(snapshot.jobs, key=self.key)  # stable: arrival order on ties
        cands = candidates(order, snapshot)
        if not cands:
            return []
        if len(self._cands) > 4 * len(snapshot.jobs) + 10_000:
            self._cands.clear()  # finished jobs' entries
        memo = self._cands
        cand_objs = [_cached_candidate(v, memo) for v in cands]
        formed = form_groups(cand_objs, snapshot.cluster.gpus, self.scorer(snapshot.compat))
        if self.compat_autopack and snapshot.compat == "muri":
            formed = autopack(formed, cand_objs, snapshot)
        # candidates are in priority order, so a group's rank is its smallest member index
        formed.sort(key=lambda f: min(f.members))
        out = []
        for f in formed:
            members = tuple(cands[i].id for i in sorted(f.members))
            out.append(Group(members, f.raw_period, f.efficiency if len(members) > 1 else 1.0))
        return out


def muri_s() -> InterleavingPolicy:
    return InterleavingPolicy("muri-s", remaining_gpu_s, REFERENCE_RULES)


def muri_l() -> InterleavingPolicy:
    return InterleavingPolicy("muri-l", attained_gpu_s, REFERENCE_RULES, compat_autopack=True)


def muri_s_plus() -> InterleavingPolicy:
    return InterleavingPolicy("muri-s+", remaining_gpu_s, PLUS_RULES, compat_rules=PLUS_RULES)
