"""Counts to node ids: jobs keep the nodes they hold, shrink from their newest, grow from free nodes.

Keeping nodes avoids migrations (a job only grows or only shrinks). A job never gets back a node
the batch scheduler took from it at this event (``MilpJob.lost``), even if that node is listed as
idle again: the job's workers there were just killed. Jobs with such exclusions pick first, so the
others absorb the nodes they may not take; if a job still cannot get its count, it gets what it can
(0 if that is below its Jmin) and the caller sees the corrected count.

The rules live once, in ``map_runs``, over *runs* of node indices (half-open ``(lo, hi)`` ranges):
a replay of a 49,152-node machine keeps its idle pool as a few hundred runs, and a decision only
walks the pool as far as the nodes it hands out, so its cost does not grow with the machine.
``map_nodes`` is the same rules for callers that name their nodes (the live harvester, the
runtime): the pool's position is the index, so both give the same answer by construction.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from hpcsched.milp.problem import MilpJob

Run = tuple[int, int]  # node indices lo, lo + 1, ..., hi - 1


def runs_of(indices: Iterable[int]) -> list[Run]:
    """Indices in their order as runs: a run grows while the next index is the previous one + 1."""
    out: list[Run] = []
    lo = hi = -1
    for k in indices:
        if k == hi:
            hi += 1
            continue
        if hi > lo:
            out.append((lo, hi))
        lo, hi = k, k + 1
    if hi > lo:
        out.append((lo, hi))
    return out


def merged(runs: Iterable[Run]) -> list[Run]:
    """An ordered run list with touching neighbours joined (the same nodes, in the same order)."""
    out: list[Run] = []
    for lo, hi in runs:
        append_run(out, lo, hi)
    return out


def runs_len(runs: Iterable[Run]) -> int:
    return sum(hi - lo for lo, hi in runs)


def append_run(out: list[Run], lo: int, hi: int) -> None:
    """Append [lo, hi) to an ordered run list, merged with the last run where they touch."""
    if hi <= lo:
        return
    if out and out[-1][1] == lo:
        out[-1] = (out[-1][0], hi)
    else:
        out.append((lo, hi))


def split_runs(runs: Sequence[Run], k: int) -> tuple[list[Run], list[Run]]:
    """The first ``k`` nodes of an ordered run list, and the rest."""
    head: list[Run] = []
    for i, (lo, hi) in enumerate(runs):
        if k <= 0:
            return head, list(runs[i:])
        if hi - lo <= k:
            head.append((lo, hi))
            k -= hi - lo
        else:
            head.append((lo, lo + k))
            return head, [(lo + k, hi), *runs[i + 1:]]
    return head, []


class Spans:
    """A set of node indices as sorted, disjoint, non-touching runs (bisect on run starts)."""

    __slots__ = ("lo", "hi")

    def __init__(self, runs: Iterable[Run] = ()) -> None:
        self.lo: list[int] = []
        self.hi: list[int] = []
        for a, b in sorted(runs):
            if b <= a:
                continue
            if self.hi and a <= self.hi[-1]:
                self.hi[-1] = max(self.hi[-1], b)
            else:
                self.lo.append(a)
                self.hi.append(b)

    def __len__(self) -> int:
        return sum(self.hi) - sum(self.lo)

    def __bool__(self) -> bool:
        return bool(self.lo)

    def runs(self) -> list[Run]:
        return list(zip(self.lo, self.hi, strict=True))

    def add(self, a: int, b: int) -> None:
        """Insert [a, b), merging with every run it overlaps or touches."""
        if b <= a:
            return
        i = bisect.bisect_left(self.hi, a)  # first run that ends at or after a: the first it may touch
        j = bisect.bisect_right(self.lo, b)  # runs before j start at or before b
        if i < j:
            a, b = min(a, self.lo[i]), max(b, self.hi[j - 1])
        self.lo[i:j] = [a]
        self.hi[i:j] = [b]

    def remove(self, a: int, b: int) -> None:
        """Take [a, b) out of the set (what of it is in the set)."""
        if b <= a:
            return
        i = bisect.bisect_right(self.hi, a)  # first run ending after a
        j = bisect.bisect_left(self.lo, b)  # runs before j start before b
        if i >= j:
            return
        keep_lo: list[int] = []
        keep_hi: list[int] = []
        if self.lo[i] < a:
            keep_lo.append(self.lo[i])
            keep_hi.append(a)
        if self.hi[j - 1] > b:
            keep_lo.append(b)
            keep_hi.append(self.hi[j - 1])
        self.lo[i:j] = keep_lo
        self.hi[i:j] = keep_hi

    def minus(self, a: int, b: int) -> Iterator[Run]:
        """The parts of [a, b) not in the set, ascending."""
        i = bisect.bisect_right(self.hi, a)  # first run ending after a
        while a < b:
            if i >= len(self.lo) or self.lo[i] >= b:
                yield a, b
                return
            if self.lo[i] > a:
                yield a, self.lo[i]
            a = max(a, self.hi[i])
            i += 1

    def covers(self, a: int, b: int) -> bool:
        i = bisect.bisect_right(self.lo, a) - 1
        return i >= 0 and self.hi[i] >= b

    def intersect(self, a: int, b: int) -> Iterator[Run]:
        """The parts of [a, b) in the set, ascending."""
        i = bisect.bisect_right(self.hi, a)
        while i < len(self.lo) and self.lo[i] < b:
            lo, hi = max(a, self.lo[i]), min(b, self.hi[i])
            if hi > lo:
                yield lo, hi
            i += 1

    def nth(self, k: int) -> int | None:
        """The k-th (0-based) member, lowest first; None when the set has no more than k."""
        for lo, hi in zip(self.lo, self.hi, strict=True):
            if k < hi - lo:
                return lo + k
            k -= hi - lo
        return None


class _Free:
    """Free nodes in hand-out order: the pool's runs not held by a job, then runs appended at the end.

    The pool is walked lazily, only as far as the nodes handed out, and runs before ``start`` are
    known to be taken entirely, so a decision's cost follows the nodes it moves, not the pool size.
    """

    def __init__(self, pool: Iterable[Run], held: Spans) -> None:
        self._pool = iter(pool)
        self._held = held
        self._pool_done = False
        self.runs: list[Run] = []  # the pool's free runs walked so far
        self.tail: list[Run] = []  # after the whole pool: runs released by shrinking jobs, then by failed ones
        self._start = 0  # runs before this one are taken entirely

    def _run(self, i: int) -> Run | None:
        """The i-th free run (pool runs, then the tail), walking the pool as far as needed."""
        while i >= len(self.runs) and not self._pool_done:
            nxt = next(self._pool, None)
            if nxt is None:
                self._pool_done = True
            else:
                self.runs.extend(self._held.minus(*nxt))
        if i < len(self.runs):
            return self.runs[i]
        i -= len(self.runs)
        return self.tail[i] if i < len(self.tail) else None

    def append(self, runs: Iterable[Run]) -> None:
        self.tail.extend(runs)

    def first(self, k: int, taken: Spans, lost: Spans) -> list[Run]:
        """The first ``k`` free nodes neither taken at this decision nor in ``lost``."""
        out: list[Run] = []
        i = self._start
        while k > 0 and (run := self._run(i)) is not None:
            if i == self._start and taken.covers(*run):
                self._start += 1
            for a, b in taken.minus(*run):
                for c, d in (lost.minus(a, b) if lost else ((a, b),)):
                    n = min(d - c, k)
                    append_run(out, c, c + n)
                    k -= n
                    if k == 0:
                        return out
            i += 1
        return out


def map_runs(held: Sequence[Sequence[Run]], lost: Sequence[Sequence[Run]], jmins: Sequence[int],
             counts: Sequence[int], pool: Iterable[Run]) -> list[list[Run]]:
    """The new runs of each job: ``held[j]`` in the job's order (newest last), ``lost[j]`` the nodes it may
    not get back, ``pool`` every idle node in hand-out order (held ones included: they are skipped).

    Jobs that shrink keep their oldest nodes and release the newest after the truly idle nodes; jobs that
    grow take the first free nodes, those with exclusions first (stable otherwise); a job that cannot
    reach its Jmin gets nothing and its nodes go to the jobs after it.
    """
    held_all = Spans(r for h in held for r in h)
    out: list[list[Run]] = [[] for _ in counts]
    released: list[Run] = []
    growing: list[int] = []
    have = [runs_len(h) for h in held]
    for j, want in enumerate(counts):
        if want <= have[j]:
            out[j], rest = split_runs(held[j], want)
            released.extend(rest)
        else:
            out[j] = list(held[j])
            growing.append(j)
    free = _Free(pool, held_all)
    free.append(released)  # truly idle nodes first; nodes just released by a shrinking job after
    growing.sort(key=lambda j: not lost[j])  # stable: jobs with exclusions choose first
    taken = Spans()
    for j in growing:
        extra = free.first(counts[j] - have[j], taken, Spans(lost[j]))
        if have[j] + runs_len(extra) < jmins[j]:  # cannot run at all: give everything back
            out[j] = []
            free.append(held[j])
            continue
        for a, b in extra:
            taken.add(a, b)
        for a, b in extra:
            append_run(out[j], a, b)
    return out


class NodeRuns(Sequence[str]):
    """Node names as runs of indices into ``names``, in order: a sequence of names whose memory is per
    run, not per node (a job's nodes, an event's nodes, a 49,152-node idle pool).

    Compares equal to any sequence of the same names in the same order, so it stands wherever a tuple
    of names did (``MilpJob.nodes``, ``PoolEvent.joined``); iterating it makes the names one by one.
    """

    __slots__ = ("runs", "names", "_n")

    def __init__(self, runs: Iterable[Run], names: Sequence[str]) -> None:
        self.runs: tuple[Run, ...] = tuple(runs)
        self.names = names
        self._n = runs_len(self.runs)

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[str]:
        names = self.names
        for lo, hi in self.runs:
            for k in range(lo, hi):
                yield names[k]

    def indices(self) -> Iterator[int]:
        for lo, hi in self.runs:
            yield from range(lo, hi)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...

    def __getitem__(self, i: int | slice) -> str | tuple[str, ...]:
        if isinstance(i, slice):
            return tuple(self.names[k] for k in list(self.indices())[i])
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("NodeRuns index out of range")
        for lo, hi in self.runs:
            if i < hi - lo:
                return self.names[lo + i]
            i -= hi - lo
        raise IndexError("NodeRuns index out of range")  # pragma: no cover - guarded above

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NodeRuns) and other.names is self.names:
            return self._n == other._n and merged(self.runs) == merged(other.runs)
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to tuples, whose hash it cannot match cheaply

    def __repr__(self) -> str:
        shown = ", ".join(f"{self.names[lo]}..{self.names[hi - 1]}" if hi - lo > 1 else self.names[lo]
                          for lo, hi in self.runs[:4])
        more = ", ..." if len(self.runs) > 4 else ""
        return f"NodeRuns({self._n} nodes in {len(self.runs)} runs: {shown}{more})"


def map_nodes(jobs: Sequence[MilpJob], pool: Sequence[str], counts: Sequence[int]) -> dict[str, tuple[str, ...]]:
    """``map_runs`` for named nodes: a node's index is its position in ``pool`` (held or lost nodes missing
    from the pool are numbered after it, so they are kept or released but never handed out)."""
    index = {n: k for k, n in enumerate(pool)}
    names = list(pool)
    for s in jobs:
        for n in (*s.nodes, *sorted(s.lost)):
            if n not in index:
                index[n] = len(names)
                names.append(n)
    held = [runs_of(index[n] for n in s.nodes) for s in jobs]
    lost = [runs_of(sorted(index[n] for n in s.lost)) for s in jobs]
    new = map_runs(held, lost, [s.job.jmin for s in jobs], counts, [(0, len(pool))] if pool else [])
    return {s.job.id: tuple(names[k] for lo, hi in runs for k in range(lo, hi))
            for s, runs in zip(jobs, new, strict=True)}
