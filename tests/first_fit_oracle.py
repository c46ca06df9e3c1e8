"""The node-by-node first fit the replayer used before issue 17: one object per node, O(nodes) per job, and the
row-by-row sizing of a log's jobs. Kept as the reference that the replayer's first fit (``hpcsched.harvest.
log_stream``: ``sized`` and ``place_stream`` over ``first_fit.RangeFirstFit``'s ranges of node indices) is checked
against."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable


def reference_runs(rows: Iterable[tuple[float | None, float | None, int, int]],
                   cpn: int) -> tuple[list[tuple[float, float, int]], dict[str, int]]:
    """(start, end, size) of each (start, end, nodes, procs) row that ran, and the others counted by why: sizes in
    cores when nodes have several (small jobs share nodes), else in nodes. A missing time is None or NaN."""
    runs = []
    skipped = {"no_times": 0, "zero_run": 0, "no_size": 0, "no_room": 0, "truncated": 0}
    for start, end, nodes, procs in rows:
        if start is None or end is None or math.isnan(start) or math.isnan(end) or end < start:
            skipped["no_times"] += 1
        elif end == start:
            skipped["zero_run"] += 1
        elif (size := (procs or nodes * cpn) if cpn > 1 else (nodes or procs)) <= 0:
            skipped["no_size"] += 1
        else:
            runs.append((start, end, size))
    return runs, skipped


class FirstFit:
    """The node-by-node reference of ``harvest.first_fit.RangeFirstFit`` (O(nodes) per job: tests only).

    Nodes of ``cpn`` cores; a job takes whole free nodes lowest-numbered first, and a remainder of
    fewer than ``cpn`` cores goes to the lowest-numbered node with that many cores free.

    Per-free-count heaps (lazily cleaned) keep each placement O(cpn log nodes). A node is idle when
    all its cores are free: ``busy``/``idle`` record those transitions as (time, node) pairs.
    """

    def __init__(self, nodes: int, cpn: int) -> None:
        self.cpn = cpn
        self.free = [cpn] * nodes
        self.heaps: list[list[int]] = [[] for _ in range(cpn + 1)]  # heaps[f]: nodes with f free cores
        self.heaps[cpn] = list(range(nodes))
        self.whole = nodes  # nodes with every core free
        self.times: list[float] = []
        self.deltas: list[int] = []
        self.nodes: list[int] = []

    def _top(self, f: int) -> int | None:
        h = self.heaps[f]
        while h and self.free[h[0]] != f:
            heapq.heappop(h)
        return h[0] if h else None

    def _take(self, node: int, cores: int, now: float) -> None:
        if self.free[node] == self.cpn:
            self.whole -= 1
            self.times.append(now)
            self.deltas.append(-1)
            self.nodes.append(node)
        self.free[node] -= cores
        if self.free[node] > 0:
            heapq.heappush(self.heaps[self.free[node]], node)

    def place(self, cores: int, now: float) -> list[tuple[int, int]] | None:
        whole, rest = divmod(cores, self.cpn)
        if whole > self.whole:
            return None
        got = []
        for _ in range(whole):
            node = self._top(self.cpn)
            assert node is not None
            heapq.heappop(self.heaps[self.cpn])
            self._take(node, self.cpn, now)
            got.append((node, self.cpn))
        if rest:
            best = None
            for f in range(rest, self.cpn + 1):
                n = self._top(f)
                if n is not None and (best is None or n < best):
                    best = n
            if best is None:
                for node, c in got:
                    self.release(node, c, now, record=False)
                return None
            self._take(best, rest, now)  # its old heap entry goes stale: heaps are cleaned lazily
            got.append((best, rest))
        return got

    def release(self, node: int, cores: int, now: float, record: bool = True) -> None:
        self.free[node] += cores
        heapq.heappush(self.heaps[self.free[node]], node)
        if self.free[node] == self.cpn:
            self.whole += 1
            if record:
                self.times.append(now)
                self.deltas.append(1)
                self.nodes.append(node)
            else:  # undo of a failed placement: drop the busy mark it recorded
                self.times.pop()
                self.deltas.pop()
                self.nodes.pop()


def place_first_fit(runs: list[tuple[float, float, int]], machine: int, cpn: int,
                    skipped: dict[str, int]) -> FirstFit:
    """Replay the log's runs on the machine; runs that do not fit are counted (the log overlaps itself).
    The node-by-node reference of ``harvest.log_stream.place_stream``."""
    runs.sort(key=lambda r: r[0])
    ff = FirstFit(machine, cpn)
    ending: list[tuple[float, int]] = []
    held: list[list[tuple[int, int]]] = []
    for s, e, k in runs:
        while ending and ending[0][0] <= s:
            t_end, i = heapq.heappop(ending)
            for node, c in held[i]:
                ff.release(node, c, t_end)
            held[i] = []
        got = ff.place(k, s)
        if got is None:
            skipped["no_room"] += 1
            continue
        held.append(got)
        heapq.heappush(ending, (e, len(held) - 1))
    while ending:
        t_end, i = heapq.heappop(ending)
        for node, c in held[i]:
            ff.release(node, c, t_end)
    return ff
