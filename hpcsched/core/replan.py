"""Re-planning: the rule that turns a policy's ordered groups into placements when running jobs MAY move.

The shared decision core has two ways to make a policy's groups runnable. The controller's (``decide``'s
default, ``DecideOptions(regroup="keep")``) never moves a running job to form a group. This one
(``regroup="replan"``, the simulator's default mode and the testbed's sim-grouped) runs the policy as designed:
groups are chosen in priority order on an empty cluster, chosen running groups stay on their GPUs where those
are free (sticky), the rest are placed first fit, and whoever lands elsewhere is restarted. An in-place pass
comes first as a shortcut that returns the same answer when it can tell (rules on ``place_in_place``); the
compat rules (two passes, count-only placement) are the reference simulator's variants of the fresh plan.

``Planner`` is written over a small contract, not over one executor's records: the state it reads (below)
and members that have ``id``, ``gpus``, ``running``, ``place`` (a placement tuple; co-located members share
the SAME tuple object) and ``group`` (the ids of the jobs sharing its GPUs). The simulator's engine is a
``Planner`` over its own job records (the hot path, no copying); ``decide`` builds one over ``JobState``s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from hpcsched.allocator import Group
from hpcsched.primitives import placement as pl

if TYPE_CHECKING:
    from hpcsched.compat.muri import CompatRules

_INF = float("inf")


class Member(Protocol):
    """What re-planning reads of a job (the simulator's ``EngineJob`` is one)."""

    id: str
    gpus: int
    running: bool
    place: Any  # tuple of (node, GPUs) while running; co-located members share the same object
    group: tuple[str, ...]  # ids of the jobs sharing its GPUs (empty: alone)


Planned = tuple[Group, tuple[Any, ...], int, Any]
"""(group, member states, GPUs it needs, placement or None for count-only)."""


def _taken(sizes: dict[int, int], members: tuple[Any, ...], min_need: float) -> float:
    """Count ``members`` as placed in ``sizes`` (GPU demand -> jobs still to place); the smallest
    demand left, so a placement loop stops as soon as nothing left can fit (inf: nothing left)."""
    for m in members:
        c = sizes.get(m.gpus, 0) - 1
        if c > 0:
            sizes[m.gpus] = c
        else:
            sizes.pop(m.gpus, None)
    return min_need if min_need in sizes else min(sizes, default=_INF)


def _stuck(sizes: dict[int, int], free: list[int], left: int, gpn: int) -> bool:
    """True when no demand in ``sizes`` can be placed in ``free``, by conditions every consolidated
    placement needs (enough GPUs left; one node with that many free, or a wholly idle node for a job
    wider than a node), so a placement loop may stop: no later group can fit."""
    big = max(free, default=0)
    whole = big == gpn
    return not any(g <= left and (g <= big or (g > gpn and whole)) for g in sizes)


def _packs(need: int, gpn: int) -> bool:
    """True for GPU counts that first-fit-decreasing always packs when their total fits (sizes that
    divide the node, or whole nodes): the compat second pass, largest first, then places every group
    the first pass chose, so it can be skipped (placements do not carry over between compat events)."""
    return (need <= gpn and gpn % need == 0) or need % gpn == 0


class Planner:
    """Re-planning over an executor's state (the attributes below; the engine is one, ``decide`` builds one)."""

    name: str  # the policy's, for errors
    capacity: list[int]  # GPUs (slots) per node, node order
    total: int  # sum(capacity)
    gpn: int  # the largest node's: consolidated placement's node size
    nps: int | None  # nodes per switch (None: one switch)
    compat: bool
    rules: CompatRules
    by_id: dict[str, Any]  # active job id -> member
    running: dict[int, Any]  # running members
    wsizes: dict[int, int]  # GPU demand -> number of waiting members asking that many
    free: list[int]  # GPUs per node not held by running placements

    def _members(self, g: Group) -> tuple[tuple[Any, ...], int]:
        try:
            members = tuple(self.by_id[i] for i in g.job_ids)
        except KeyError as e:
            raise ValueError(f"policy {self.name!r} returned job {e.args[0]!r}, which is not active") from None
        if len(members) == 1:
            return members, members[0].gpus
        if members and g.period_s is None:
            raise ValueError(f"policy {self.name!r}: group {g.job_ids} of {len(members)} jobs has no period_s")
        return members, max((m.gpus for m in members), default=0)

    def place_in_place(self, groups: Iterable[Group], dead: set[int] | None = None) -> list[Planned] | None:
        """Default mode, the common case: running groups stay where they are and new ones fit beside.

        Walks the groups in priority order; an unchanged running group keeps its GPUs, a new group
        takes first fit among the GPUs nobody holds. Returns None (re-plan from scratch) as soon as
        the answer could differ from a fresh plan: a group changed members, or one did not fit while
        a lower-priority running group could still have yielded its GPUs, or a running job was left out.
        A new group wider than the GPUs the groups before it leave is skipped, not re-planned: even if
        every lower-priority group yielded it could not fit (a fresh plan skips it by count alone).
        """
        avail = list(self.free)
        left = sum(avail)
        room = self.total  # GPUs not claimed by the groups planned so far (running or new)
        unclaimed = len(self.running)
        used: set[str] = set()
        plan: list[Planned] = []
        sizes = dict(self.wsizes)  # GPU demands of the waiting jobs not placed yet
        stuck: bool | None = None  # nothing waiting can fit in avail any more (None: check after a miss)
        checked = False  # a check said "not stuck" and nothing was placed since: a miss cannot change that
        by_id, gpn = self.by_id, self.gpn
        for g in groups:
            if unclaimed == 0:
                if stuck is None:
                    stuck = _stuck(sizes, avail, left, gpn)
                    checked = True
                if stuck:
                    break
            ids = g.job_ids
            if len(ids) == 1:
                j = by_id.get(ids[0])
                if j is not None and j.running and not j.group:  # a running solo job staying as it is: the
                    if j.id in used:  # most common group of all, kept without building anything
                        raise ValueError(f"policy {self.name!r} put job {j.id!r} in two groups")
                    used.add(j.id)
                    plan.append((g, (j,), j.gpus, j.place))
                    unclaimed -= 1
                    room -= j.gpus
                    continue
                # deep queues: skip what cannot fit without building it
                if j is not None and not j.running and (j.gpus > room or (unclaimed == 0 and j.gpus > left)):
                    if dead is not None:
                        dead.add(j.gpus)
                    stuck = stuck if checked else None
                    continue
            members, need = self._members(g)
            if not members:
                continue
            for m in members:
                if m.id in used:
                    raise ValueError(f"policy {self.name!r} put job {m.id!r} in two groups")
                used.add(m.id)
            first = members[0]
            if first.running:
                same = len(members) == 1 and not first.group or (
                    len(members) > 1 and set(first.group) == set(g.job_ids)
                    and all(m.running and m.place is first.place for m in members)
                )
                if not same:
                    return None
                plan.append((g, members, need, first.place))
                unclaimed -= len(members)
                room -= need
                continue
            if any(m.running for m in members):
                return None
            if need > room:
                continue
            got = pl.place_consolidated(avail, need, self.gpn, self.nps) if need <= left else None
            if got is None:
                if unclaimed:
                    return None
                if dead is not None and len(members) == 1:
                    dead.add(need)
                stuck = stuck if checked else None
                continue
            pl.apply(avail, got)
            checked = False
            left -= need
            room -= need
            plan.append((g, members, need, tuple(got)))
            _taken(sizes, members, 0)
        return plan if unclaimed == 0 else None

    def place_fresh(self, groups: Iterable[Group], dead: set[int] | None = None) -> list[Planned]:
        """Take the policy's groups in order while GPUs are left; each is checked as it is considered."""
        by_id, name = self.by_id, self.name
        count = self.rules.placement == "count"  # compat Tiresias: counting only, no nodes
        free = list(self.capacity)
        left = self.total
        used: set[str] = set()
        first: list[Planned] = []
        sizes = dict(self.wsizes)  # GPU demands of the active jobs not chosen yet
        for j in self.running.values():
            sizes[j.gpus] = sizes.get(j.gpus, 0) + 1
        min_need = min(sizes, default=_INF)
        stuck: bool | None = False  # None: a group just missed, check whether anything can still fit
        checked = False  # a check said "not stuck" and nothing was placed since: a miss cannot change that
        for g in groups:
            if left < min_need:
                break  # no active job can fit any more
            if not count:
                if stuck is None:
                    stuck = _stuck(sizes, free, left, self.gpn)
                    checked = True
                if stuck:
                    break
            ids = g.job_ids
            j = by_id.get(ids[0]) if len(ids) == 1 else None
            if j is not None:  # the common case (every baseline): one job, no tuple building
                need = j.gpus
                if need > left:
                    if dead is not None:
                        dead.add(need)
                    stuck = stuck if checked else None
                    continue
                members: tuple[Any, ...] = (j,)
            else:
                members, need = self._members(g)
                if not members:
                    continue
            if need > left:
                continue
            if count:
                p = None
            else:
                got = pl.place_consolidated(free, need, self.gpn, self.nps)
                if got is None:
                    if dead is not None and len(members) == 1:
                        dead.add(need)
                    stuck = stuck if checked else None
                    continue
                pl.apply(free, got)
                p = tuple(got)
            for i in ids:
                if i in used:
                    raise ValueError(f"policy {name!r} put job {i!r} in two groups")
                used.add(i)
            left -= need
            checked = False
            first.append((g, members, need, p))
            min_need = _taken(sizes, members, min_need)
        if count:
            return first
        if self.compat:
            if not self.rules.two_pass:
                return first
            if self.nps is None and all(_packs(c[2], self.gpn) for c in first):
                return first  # largest-first re-placement would fit every chosen group: same outcome
            free = list(self.capacity)
            out = []
            for g, members, need, _ in sorted(first, key=lambda c: -c[2]):
                got = pl.place_consolidated(free, need, self.gpn, self.nps)
                if got is not None:
                    pl.apply(free, got)
                    out.append((g, members, need, tuple(got)))
            return out
        return self._sticky(first)

    def _sticky(self, first: list[Planned]) -> list[Planned]:
        """Keep running groups on their GPUs where possible; fall back to the fresh plan."""
        free = list(self.capacity)
        out: list[Any] = [None] * len(first)
        rest = []
        for i, (g, members, need, _fresh) in enumerate(first):
            if len(members) == 1:
                m = members[0]
                old = m.place if m.running else None
            else:
                old = next((m.place for m in members if m.running and m.place is not None), None)
            if old is not None and len(old) == 1:  # one node: the usual case, checked without generators
                n, k = old[0]
                if k == need and free[n] >= k:
                    free[n] -= k
                    out[i] = (g, members, need, old)
                else:
                    rest.append(i)
            elif old is not None and sum(k for _, k in old) == need and all(free[n] >= k for n, k in old):
                pl.apply(free, old)
                out[i] = (g, members, need, old)
            else:
                rest.append(i)
        for i in rest:
            g, members, need, _ = first[i]
            got = pl.place_consolidated(free, need, self.gpn, self.nps)
            if got is None:
                return first  # fragmentation: the fresh plan is feasible by construction
            pl.apply(free, got)
            out[i] = (g, members, need, tuple(got))
        return out
