"""Idle-pool events for the harvesting replayer: from BFTrainer idle intervals or from any job log.

An event is the set of nodes that joined and left the idle pool at one instant. A node whose idle
interval ends at the same second another begins never left (the reference's node table shows no
change there either), so deltas are netted per node and instants with no net change are dropped.

From a job log (SWF, Slurm, Cobalt, ... via ``hpcsched.traces.open_trace``) the log is replayed on a
machine of its size: each job takes the lowest-numbered free nodes (first fit) from its recorded
start to its recorded end; every node not running a log job is idle. Ends are applied before starts
at the same second, so a node handed from one job to the next never shows as idle.

Node sets are runs of node indices (``hpcsched.milp.mapping.NodeRuns``), never one object per node:
first fit keeps the free nodes as runs (``RangeFirstFit``), an event holds the runs that joined and
left, and the timeline stores every event's runs in flat arrays (``RangeEvents``). A 49,152-node
machine costs what its jobs and events cost, not what its nodes do. The node-by-node original the tests
compare the runs against is ``tests/first_fit_oracle.py``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

import numpy as np

from hpcsched.errors import InputError
from hpcsched.harvest.sparse import empty_stretches
from hpcsched.milp.mapping import NodeRuns, Run, Spans
from hpcsched.model import IdleInterval, Job


@dataclass(frozen=True, slots=True)
class PoolEvent:
    """Nodes that joined and left the idle pool at ``time``: tuples of names (a live Slurm's poll) or
    ``NodeRuns`` (a replayed log), which compare equal to the tuples they stand for."""

    time: float
    joined: Sequence[str]
    left: Sequence[str]


@dataclass(slots=True)
class PoolTimeline:
    """The idle pool at ``start`` and every change after it, in time order."""

    start: float
    initial: Sequence[str]
    events: Sequence[PoolEvent]
    nodes: Sequence[str]  # every node the machine has, in its numbering order
    end: float  # last instant the data covers
    notes: dict[str, object] = field(default_factory=dict)


class NumberedNodes(Sequence[str]):
    """The names ``n00000``, ``n00001``, ... of a machine replayed from a log, made on demand.

    A tuple of 160,000 names would be the one per-node structure left in a log replay; this answers
    ``len``, indexing and ``index`` by arithmetic.
    """

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, k: int) -> str: ...

    @overload
    def __getitem__(self, k: slice) -> tuple[str, ...]: ...

    def __getitem__(self, k: int | slice) -> str | tuple[str, ...]:
        if isinstance(k, slice):
            return tuple(f"n{i:05d}" for i in range(*k.indices(self.size)))
        if k < 0:
            k += self.size
        if not 0 <= k < self.size:
            raise IndexError("node index out of range")
        return f"n{k:05d}"

    def index(self, name: str, start: int = 0, stop: int | None = None) -> int:
        k = int(name[1:]) if name[:1] == "n" and name[1:].isdigit() else -1
        if 0 <= k < self.size and self[k] == name and start <= k < (self.size if stop is None else stop):
            return k
        raise ValueError(f"{name!r} is not a node of this {self.size}-node machine")

    def __contains__(self, name: object) -> bool:
        try:
            self.index(str(name))
        except ValueError:
            return False
        return isinstance(name, str)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NumberedNodes):
            return other.size == self.size
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == self.size and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"NumberedNodes({self.size})"


class RangeEvents(Sequence[PoolEvent]):
    """Events stored as flat arrays: times, and per event the offsets of its joined and left runs.

    Memory is a few numbers per event and per run; a ``PoolEvent`` (with ``NodeRuns``) is made only
    when one is read, so a replay walking 100,000 events holds one at a time.
    """

    def __init__(self, times: np.ndarray, joined: tuple[np.ndarray, np.ndarray, np.ndarray],
                 left: tuple[np.ndarray, np.ndarray, np.ndarray], names: Sequence[str]) -> None:
        self.times = times
        self.joined = joined  # (offsets, run starts, run ends): event k's runs are [off[k], off[k + 1])
        self.left = left
        self.names = names

    def __len__(self) -> int:
        return len(self.times)

    @staticmethod
    def _runs(part: tuple[np.ndarray, np.ndarray, np.ndarray], k: int) -> list[Run]:
        off, lo, hi = part
        a, b = int(off[k]), int(off[k + 1])
        return list(zip(lo[a:b].tolist(), hi[a:b].tolist(), strict=True))

    def runs(self, k: int) -> tuple[float, list[Run], list[Run]]:
        """Event k as (time, joined runs, left runs), without making names."""
        return float(self.times[k]), self._runs(self.joined, k), self._runs(self.left, k)

    @overload
    def __getitem__(self, k: int) -> PoolEvent: ...

    @overload
    def __getitem__(self, k: slice) -> RangeEvents: ...

    def __getitem__(self, k: int | slice) -> PoolEvent | RangeEvents:
        if isinstance(k, slice):
            a, b, step = k.indices(len(self))
            if step != 1:
                raise ValueError("RangeEvents slices take consecutive events")
            b = max(a, b)
            return RangeEvents(self.times[a:b], (self.joined[0][a:b + 1], *self.joined[1:]),
                               (self.left[0][a:b + 1], *self.left[1:]), self.names)
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError("event index out of range")
        t, joined, left = self.runs(k)
        return PoolEvent(t, NodeRuns(joined, self.names), NodeRuns(left, self.names))

    def __iter__(self) -> Iterator[PoolEvent]:
        for k in range(len(self)):
            yield self[k]

    @classmethod
    def build(cls, times: Sequence[float], joined: Sequence[Sequence[Run]], left: Sequence[Sequence[Run]],
              names: Sequence[str]) -> RangeEvents:
        def flat(parts: Sequence[Sequence[Run]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            off = np.zeros(len(parts) + 1, dtype=np.int64)
            off[1:] = np.cumsum([len(p) for p in parts])
            pairs = np.array([r for p in parts for r in p], dtype=np.int64).reshape(-1, 2)
            return off, pairs[:, 0].copy(), pairs[:, 1].copy()

        return cls(np.asarray(times, dtype=float), flat(joined), flat(left), names)


def _index_runs(t: np.ndarray, x: np.ndarray, event_times: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Node indices ``x`` at times ``t`` (sorted by time, then index) as runs per event time: a run breaks
    where the time changes or the index is not the previous one + 1."""
    if len(x) == 0:
        return np.zeros(len(event_times) + 1, dtype=np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    head = np.ones(len(x), dtype=bool)
    head[1:] = (t[1:] != t[:-1]) | (x[1:] != x[:-1] + 1)
    starts = np.flatnonzero(head)
    ends = np.r_[starts[1:], len(x)] - 1
    off = np.searchsorted(t[starts], event_times, side="left")
    return np.r_[off, len(starts)].astype(np.int64), x[starts].astype(np.int64), x[ends].astype(np.int64) + 1


def _sorted_runs(x: np.ndarray) -> list[Run]:
    """Ascending distinct indices as runs, vectorised."""
    if len(x) == 0:
        return []
    cut = np.flatnonzero(np.diff(x) != 1) + 1
    return list(zip(x[np.r_[0, cut]].tolist(), (x[np.r_[cut - 1, len(x) - 1]] + 1).tolist(), strict=True))


def _timeline(times: np.ndarray, deltas: np.ndarray, node_idx: np.ndarray, names: Sequence[str],
              start: float | None) -> PoolTimeline:
    """Turn (time, +1 idle / -1 busy, node index) deltas into netted events after ``start``.

    Vectorised: deltas are summed per (node, second), a per-node running sum gives the idle level
    before and after each second, and a node joins or leaves the pool only where that level crosses 0.
    One delta per node change, so this is for data that is per node anyway (idle intervals) and for
    the node-by-node reference of a log replay; the events it returns are runs.
    """
    if start is None:
        start = float(times.min()) if len(times) else 0.0
    order = np.lexsort((times, node_idx))
    t, d, x = times[order], deltas[order].astype(np.int64), node_idx[order]
    if len(t) == 0:
        return PoolTimeline(start, NodeRuns((), names), [], names, start)
    head = np.ones(len(t), dtype=bool)
    head[1:] = (x[1:] != x[:-1]) | (t[1:] != t[:-1])
    starts = np.flatnonzero(head)
    net = np.add.reduceat(d, starts)
    gt, gx = t[starts], x[starts]
    level = np.cumsum(net)
    first_of_node = np.ones(len(gx), dtype=bool)
    first_of_node[1:] = gx[1:] != gx[:-1]
    base = np.maximum.accumulate(np.where(first_of_node, np.arange(len(gx)), 0))  # index of node's first group
    after = level - (level[base] - net[base])
    before = after - net
    up, was = after > 0, before > 0
    pre = gt <= start
    last_pre = pre & np.append((gx[1:] != gx[:-1]) | ~pre[1:], True)
    initial = NodeRuns(_sorted_runs(np.sort(gx[last_pre & up])), names)
    change = ~pre & (up != was)
    ct, cx, cj = gt[change], gx[change], up[change]
    o = np.lexsort((cx, ct))
    ct, cx, cj = ct[o], cx[o], cj[o]
    event_times = np.unique(ct)
    events = RangeEvents(event_times, _index_runs(ct[cj], cx[cj], event_times),
                         _index_runs(ct[~cj], cx[~cj], event_times), names)
    return PoolTimeline(start, initial, events, names, max(float(t.max()), start))


def timeline_from_intervals(
    intervals: Iterable[IdleInterval], nodes: Sequence[str] | None = None, start: float | None = None
) -> PoolTimeline:
    """Events for the given nodes only (all nodes seen when None), starting at ``start``.

    Intervals still open at the end of the data (``end`` None) stay idle to the end.
    """
    index: dict[str, int] = {n: k for k, n in enumerate(nodes)} if nodes is not None else {}
    fixed = nodes is not None
    times: list[float] = []
    deltas: list[int] = []
    idx: list[int] = []
    for iv in intervals:
        k = index.get(iv.node)
        if k is None:
            if fixed:
                continue
            k = index[iv.node] = len(index)
        times.append(iv.start)
        deltas.append(1)
        idx.append(k)
        if iv.end is not None:
            times.append(iv.end)
            deltas.append(-1)
            idx.append(k)
    names = tuple(index)
    return _timeline(np.array(times, dtype=float), np.array(deltas, dtype=np.int8), np.array(idx, dtype=np.int64),
                     names, start)


def log_runs(jobs: Iterable[Job], cores_per_node: int) -> tuple[list[tuple[float, float, int]], dict[str, int]]:
    """(start, end, cores) per log job that ran; jobs without times or size are counted, not kept.

    Sizes are in cores (``procs``) when the machine has several cores per node, so small jobs can
    share a node as they did on the real machine; otherwise in nodes.
    """
    return _sized_runs(((j.start, j.end, j.nodes, j.procs) for j in jobs), cores_per_node)


def _sized_runs(records: Iterable[tuple[float | None, float | None, int, int]],
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
        self.marks: list[tuple[float, int, int, int]] = []

    def _top(self, f: int) -> int | None:
        h = self.heaps[f]
        while h and self.partial.get(h[0]) != f:
            heapq.heappop(h)
        return h[0] if h else None

    def _nth_free(self, k: int) -> int | None:
        """The k-th (0-based) wholly free node, lowest first."""
        for lo, hi in zip(self.free.lo, self.free.hi, strict=True):
            if k < hi - lo:
                return lo + k
            k -= hi - lo
        return None

    def place(self, cores: int, now: float) -> tuple[list[Run], tuple[int, int] | None] | None:
        """(whole-node runs, (node, cores) of the remainder or None), or None when the job does not fit."""
        whole, rest = divmod(cores, self.cpn)
        if whole > self.whole:
            return None
        best = None
        if rest:  # the lowest node with room for the remainder once the whole nodes are taken
            for f in range(rest, self.cpn):
                n = self._top(f)
                if n is not None and (best is None or n < best):
                    best = n
            nxt = self._nth_free(whole)
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
        left -= rest
        if left > 0:
            self.partial[best] = left
            heapq.heappush(self.heaps[left], best)
        return got, (best, rest)

    def release(self, whole: Sequence[Run], rest: tuple[int, int] | None, now: float) -> None:
        for lo, hi in whole:
            self.free.add(lo, hi)
            self.whole += hi - lo
            self.marks.append((now, 1, lo, hi))
        if rest is not None:
            node, cores = rest
            left = self.partial.pop(node, 0) + cores
            if left == self.cpn:
                self.free.add(node, node + 1)
                self.whole += 1
                self.marks.append((now, 1, node, node + 1))
            else:
                self.partial[node] = left
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


def _events_from_marks(marks: Sequence[tuple[float, int, int, int]], machine: int, first: float, start: float,
                       names: Sequence[str]) -> tuple[NodeRuns, RangeEvents]:
    """The idle pool at ``start`` and the netted events after it, from run marks (every node idle at ``first``).

    At one second a node may be released by one job and taken by the next: it never left. So per second
    the joined nodes are the released runs less the taken ones, the left nodes the reverse.
    """
    idle = Spans()
    times: list[float] = []
    joined_all: list[list[Run]] = []
    left_all: list[list[Run]] = []
    seconds = [(first, [(0, machine)], [])] if machine > 0 else []
    i = 0
    while i < len(marks):
        t = marks[i][0]
        up: list[Run] = []
        down: list[Run] = []
        while i < len(marks) and marks[i][0] == t:
            _, sign, lo, hi = marks[i]
            (up if sign > 0 else down).append((lo, hi))
            i += 1
        if seconds and seconds[-1][0] == t:
            seconds[-1][1].extend(up)
            seconds[-1][2].extend(down)
        else:
            seconds.append((t, up, down))
    for t, up, down in seconds:
        ups, downs = Spans(up), Spans(down)
        if len(ups) != sum(hi - lo for lo, hi in up) or len(downs) != sum(hi - lo for lo, hi in down):
            raise RuntimeError(f"first fit changed a node twice the same way at t={t}: a placement bug")
        joined = [r for a, b in ups.runs() for r in downs.minus(a, b)]
        left = [r for a, b in downs.runs() for r in ups.minus(a, b)]
        if t <= start:
            for a, b in left:
                idle.remove(a, b)
            for a, b in joined:
                idle.add(a, b)
        elif joined or left:
            times.append(t)
            joined_all.append(joined)
            left_all.append(left)
    return NodeRuns(idle.runs(), names), RangeEvents.build(times, joined_all, left_all, names)


# Reader anomaly kinds that drop the row; every other kind flags a row that is kept (hpcsched.traces.base).
DROPPING_KINDS = frozenset({"malformed_row", "duplicate_job"})
_FLAG_MEANING = {
    "unsorted_submit": "submitted before a row above it; order does not matter here",
    "runtime_over_request": "ran longer than it requested",
    "unknown_field": "a field is unknown (-1/empty); a job without start, end or size is not replayed",
    "zero_runtime": "ran 0 s",
    "negative_runtime": "end before start: its run time became unknown, so it is not replayed",
    "duplicate_id": "repeated id, renamed id#n",
    "larger_than_machine": "larger than the machine the reader assumed",
    "censored": "no end at the log's end",
}
WARMUP_RATIO = 0.75  # a start window whose mean use is below this share of the typical use is a warm-up
WARMUP_MIN_S = 3600.0  # shorter low-use stretches at the start are not worth a warning


def split_rows(anomalies: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(dropped, flagged-but-kept) row counts by anomaly kind, from a reader's anomaly counts."""
    dropped = {k: int(n) for k, n in anomalies.items() if k in DROPPING_KINDS and n}
    flagged = {k: int(n) for k, n in anomalies.items() if k not in DROPPING_KINDS and n}
    return dropped, flagged


def describe_rows(records: int, anomalies: Mapping[str, int]) -> str:
    """One sentence that keeps dropped rows and flagged-but-kept rows apart (a flag drops nothing).

    'skipped/flagged rows {'unsorted_submit': 9812}' read as if 9,812 rows were lost; this says
    '14,374 jobs read, 0 rows dropped; kept but flagged: 9,812 unsorted_submit (submitted before ...)'.
    """
    dropped, flagged = split_rows(anomalies)
    text = f"{records:,} jobs read; rows dropped: "
    text += ", ".join(f"{n:,} {k} ({'a second record of one job' if k == 'duplicate_job' else 'unparsable'})"
                      for k, n in dropped.items()) if dropped else "none"
    if flagged:
        text += "; kept but flagged (nothing dropped): " + ", ".join(
            f"{n:,} {k} ({_FLAG_MEANING.get(k, 'see hpcsched trace inspect')})" for k, n in flagged.items())
    return text


def busy_steps(times: Sequence[float], deltas: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Busy nodes as a step function from (time, -1 busy / +1 idle) marks: ``level[k]`` holds from
    ``times[k]`` to ``times[k + 1]``; nothing is busy before the first mark."""
    t = np.asarray(times, dtype=float)
    if len(t) == 0:
        return t, np.zeros(0, dtype=np.int64)
    o = np.argsort(t, kind="stable")
    t, level = t[o], np.cumsum(-np.asarray(deltas, dtype=np.int64)[o])
    last = np.r_[t[1:] != t[:-1], True]  # one value per instant: the level after all of its changes
    return t[last], level[last]


def _integral(times: np.ndarray, level: np.ndarray, a: float, b: float) -> float:
    """Integral of the step function over [a, b] (0 before the first step)."""
    if b <= a or len(times) == 0:
        return 0.0
    edges = np.clip(np.r_[times, max(b, times[-1])], a, b)
    return float((level * np.diff(edges)).sum())


def warmup_check(times: np.ndarray, level: np.ndarray, start: float) -> dict[str, object]:
    """Does the replay start on a machine far emptier than the log's typical use?

    A log cut out of a longer history lacks the jobs already running when it begins, so its first
    hours show the machine nearly empty and a replay counts them as a huge idle window. The typical
    use is the time-weighted median of busy nodes over the whole log; the warm-up lasts from
    ``start`` until use first reaches it. It is reported (``detected``) when it lasts at least
    ``WARMUP_MIN_S`` and its mean use is below ``WARMUP_RATIO`` of the typical use.
    """
    if len(times) < 2:
        return {"detected": False, "typical_busy_nodes": 0.0, "warmup_end": start, "warmup_hours": 0.0,
                "warmup_mean_busy_nodes": 0.0}
    dur, lv = np.diff(times), level[:-1]
    order = np.argsort(lv, kind="stable")
    cum = np.cumsum(dur[order])
    typical = float(lv[order][min(int(np.searchsorted(cum, cum[-1] / 2)), len(order) - 1)])
    k = int(np.searchsorted(times, start, side="right")) - 1
    if k >= 0 and level[k] >= typical:
        end = start
    else:
        later = np.flatnonzero((times > start) & (level >= typical))
        end = float(times[later[0]]) if len(later) else float(times[-1])
    mean = _integral(times, level, start, end) / (end - start) if end > start else float(level[max(k, 0)])
    detected = end - start >= WARMUP_MIN_S and mean < WARMUP_RATIO * typical
    return {"detected": bool(detected), "typical_busy_nodes": typical, "warmup_end": end,
            "warmup_hours": (end - start) / 3600.0, "warmup_mean_busy_nodes": mean}


def timeline_from_log(path: str | Path, machine: int | None = None, fmt: str | None = None, *,
                      start: float | None = None, skip_warmup: bool = False,
                      options: Mapping[str, object] | None = None) -> PoolTimeline:
    """Idle-pool events of a batch log replayed first-fit on a machine of ``machine`` nodes.

    The machine is ``machine`` (``--nodes``) when given, else the size the reader knows (an SWF header's
    MaxNodes, a known Cobalt machine named in the file name), else the log's peak concurrent use; the
    size and where it came from are in ``notes`` (``machine_nodes``, ``machine_nodes_source``), since a
    wrong size silently skips jobs (too small) or invents idle nodes (too large). Jobs smaller than a
    node share nodes by cores. Jobs without start/end or size, or that find the machine full, are
    counted in ``notes``, as are the reader's dropped and flagged rows and the warm-up check
    (``warmup_check``). The replay starts at ``start`` (default: the log's first job start), or with
    ``skip_warmup`` where the log's use first reaches its typical level.

    The log is read in one streaming pass that keeps four numbers per job; placement and events are
    runs of node indices (``RangeFirstFit``), so neither time nor memory grows with the machine's size.
    """
    from hpcsched.traces import open_trace

    trace = open_trace(path, fmt, options=dict(options or {}))
    if trace.format.kind != "jobs":
        raise InputError(path, f"--log needs a job log; {trace.format.name} holds {trace.format.kind} records")
    records = [(j.start, j.end, j.nodes, j.procs) for j in trace]  # the Job objects are not kept
    n_jobs = len(records)
    meta = trace.report.meta
    cpn_raw = meta.get("cores_per_node")
    cpn = int(cpn_raw) if isinstance(cpn_raw, int | float) and cpn_raw >= 1 and cpn_raw == int(cpn_raw) else 1
    runs, skipped = _sized_runs(records, cpn)
    del records
    if not runs:
        raise InputError(path, "no job in the log has a start, an end and a size: nothing to replay")
    peak_nodes = -(-peak_use(runs) // cpn)
    header = meta.get("machine_nodes")
    if machine is not None:
        if machine < 1:
            raise InputError(path, f"--nodes {machine}: the machine needs at least 1 node")
        source = "--nodes"
    elif isinstance(header, int | float) and header > 0:
        machine = int(header)
        source = str(meta.get("machine_nodes_source") or "the log's header")
    else:
        machine, source = peak_nodes, "the log's peak concurrent use"
    first = min(s for s, _, _ in runs)
    n_runs = len(runs)
    ff = place_ranges(runs, machine, cpn, skipped)
    marks = sorted(ff.marks, key=lambda m: m[0])  # already in time order; stable, so releases stay first
    bt, bl = busy_steps([m[0] for m in marks], [m[1] * (m[3] - m[2]) for m in marks])
    if start is None:
        start = first
    elif start < first or start >= bt[-1]:
        raise InputError(path, f"--start {start:.0f} is outside the log's replayable span [{first:.0f}, {bt[-1]:.0f})")
    warm = warmup_check(bt, bl, start)
    if skip_warmup:
        warm["skipped_from"] = start
        start = float(warm["warmup_end"])  # type: ignore[arg-type]
    names = NumberedNodes(machine)
    initial, events = _events_from_marks(marks, machine, first, start, names)
    end = max(first, start, marks[-1][0] if marks else first)
    tl = PoolTimeline(start, initial, events, names, end)
    dropped, flagged = split_rows(trace.report.anomalies)
    tl.notes = {"machine_nodes": machine, "machine_nodes_source": source, "log_peak_nodes": peak_nodes,
                "cores_per_node": cpn, "log_jobs": n_jobs, "log_jobs_placed": n_runs - skipped["no_room"]}
    tl.notes.update({f"skipped_{k}": v for k, v in skipped.items() if k != "truncated"})
    tl.notes.update({"log_rows_dropped": dropped, "log_rows_flagged": flagged,
                     "log_rows_summary": describe_rows(n_jobs, trace.report.anomalies), "warmup": warm,
                     "log_notes": list(trace.report.notes)})
    empty = empty_stretches(bt, bl, start, end)
    if empty is not None:
        tl.notes["log_empty"] = empty
    return tl
