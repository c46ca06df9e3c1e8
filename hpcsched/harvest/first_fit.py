"""A job log replayed on a machine of its size: each job on the lowest-numbered free nodes (first fit), the free
nodes kept as runs of node indices so neither time nor memory grows with the machine's size. The node-by-node
original it is checked against is ``tests/first_fit_oracle.py``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from hpcsched.milp.mapping import Run, Spans
from hpcsched.model import Job


def log_runs(jobs: Iterable[Job], cores_per_node: int) -> tuple[list[tuple[float, float, int]], dict[str, int]]:
    """(start, end, cores) per log job that ran; jobs without times or size are counted, not kept.

    Sizes are in cores (``procs``) when the machine has several cores per node, so small jobs can
    share a node as they did on the real machine; otherwise in nodes.
    """
    return sized_runs(((j.start, j.end, j.nodes, j.procs) for j in jobs), cores_per_node)


def sized_runs(records: Iterable[tuple[float | None, float | None, int, int]],
                cores_per_node: int) -> tuple[list[tuple[float, float, int]], dict[str, int]]:
    runs = []
    skipped = {"no_times": 0, "zero_run": 0, "no_size": 0, "no_room": 0, "truncated": 0}
    for start, end, nodes, procs in records:
        if start is None or end is None or end < start:
            skipped["no_times"] += 1
            continue
        if end == start:  # ran 0 s: it held no node-time, so there is nothing to replay (not a missing time)
            skipped["zero_run"] += 1
            continue
        size = (procs or nodes * cores_per_node) if cores_per_node > 1 else (nodes or procs)
        if size <= 0:
            skipped["no_size"] += 1
            continue
        runs.append((start, end, size))
    return runs, skipped


def peak_use(runs: Sequence[tuple[float, float, int]]) -> int:
    """Most units in use at once (ends before starts at the same second)."""
    marks = sorted([(s, k) for s, _, k in runs] + [(e, -k) for _, e, k in runs], key=lambda m: (m[0], m[1]))
    level = peak = 0
    for _, k in marks:
        level += k
        peak = max(peak, level)
    return peak


class RangeFirstFit:
    """Node-by-node first fit's placements (``tests/first_fit_oracle.py``) with the free nodes kept as runs:
    the same nodes for every job, at a cost per run instead of per node.

    Wholly free nodes are a ``Spans`` of indices (a job's whole nodes are the lowest of them: a prefix of
    the runs); nodes with some cores in use are few (at most one per running job with a remainder) and
    keep ``FirstFit``'s per-free-count heaps. ``marks`` records each change of idle nodes as
    (time, +1 idle / -1 busy, lo, hi) for the node run [lo, hi).
    """

    def __init__(self, nodes: int, cpn: int) -> None:
        self.cpn = cpn
        self.free = Spans([(0, nodes)] if nodes > 0 else [])  # nodes with every core free
        self.whole = nodes
        self.partial: dict[int, int] = {}  # node -> free cores, for 0 < free < cpn
        self.heaps: list[list[int]] = [[] for _ in range(cpn)]  # heaps[f]: partial nodes with f free (lazy)
        self.count = [0] * cpn  # count[f]: partial nodes with f free, exact (a job skips the heaps with none)
        self.marks: list[tuple[float, int, int, int]] = []

    def _top(self, f: int) -> int | None:
        h = self.heaps[f]
        while h and self.partial.get(h[0]) != f:
            heapq.heappop(h)
        return h[0] if h else None

    def place(self, cores: int, now: float) -> tuple[list[Run], tuple[int, int] | None] | None:
        """(whole-node runs, (node, cores) of the remainder or None), or None when the job does not fit."""
        whole, rest = divmod(cores, self.cpn)
        if whole > self.whole:
            return None
        best = None
        if rest:  # the lowest node with room for the remainder once the whole nodes are taken
            count = self.count
            for f in range(rest, self.cpn):
                if count[f]:
                    n = self._top(f)
                    if n is not None and (best is None or n < best):
                        best = n
            nxt = self.free.nth(whole)
            if nxt is not None and (best is None or nxt < best):
                best = nxt
            if best is None:
                return None
        got: list[Run] = []
        k = whole
        while k > 0:
            lo, hi = self.free.lo[0], self.free.hi[0]
            b = min(hi, lo + k)
            got.append((lo, b))
            self.free.remove(lo, b)
            k -= b - lo
        self.whole -= whole
        for lo, hi in got:
            self.marks.append((now, -1, lo, hi))
        if best is None:
            return got, None
        left = self.partial.pop(best, None)
        if left is None:  # a wholly free node
            self.free.remove(best, best + 1)
            self.whole -= 1
            self.marks.append((now, -1, best, best + 1))
            left = self.cpn
        else:
            self.count[left] -= 1
        left -= rest
        if left > 0:
            self.partial[best] = left
            self.count[left] += 1
            heapq.heappush(self.heaps[left], best)
        return got, (best, rest)

    def release(self, whole: Sequence[Run], rest: tuple[int, int] | None, now: float) -> None:
        for lo, hi in whole:
            self.free.add(lo, hi)
            self.whole += hi - lo
            self.marks.append((now, 1, lo, hi))
        if rest is not None:
            node, cores = rest
            was = self.partial.pop(node, 0)
            if was:
                self.count[was] -= 1
            left = was + cores
            if left == self.cpn:
                self.free.add(node, node + 1)
                self.whole += 1
                self.marks.append((now, 1, node, node + 1))
            else:
                self.partial[node] = left
                self.count[left] += 1
                heapq.heappush(self.heaps[left], node)


def place_ranges(runs: list[tuple[float, float, int]], machine: int, cpn: int,
                 skipped: dict[str, int]) -> RangeFirstFit:
    """``place_first_fit`` with ``RangeFirstFit``: the same jobs placed on the same nodes, marks as runs."""
    runs.sort(key=lambda r: r[0])
    ff = RangeFirstFit(machine, cpn)
    ending: list[tuple[float, int]] = []
    held: list[tuple[list[Run], tuple[int, int] | None] | None] = []
    for s, e, k in runs:
        while ending and ending[0][0] <= s:
            t_end, i = heapq.heappop(ending)
            got = held[i]
            assert got is not None
            ff.release(*got, t_end)
            held[i] = None
        placed = ff.place(k, s)
        if placed is None:
            skipped["no_room"] += 1
            continue
        held.append(placed)
        heapq.heappush(ending, (e, len(held) - 1))
    while ending:
        t_end, i = heapq.heappop(ending)
        got = held[i]
        assert got is not None
        ff.release(*got, t_end)
    return ff


