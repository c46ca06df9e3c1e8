"""Idle-pool events for the harvesting replayer: from BFTrainer idle intervals or from any job log.

An event is the set of nodes that joined and left the idle pool at one instant. A node whose idle
interval ends at the same second another begins never left (the reference's node table shows no
change there either), so deltas are netted per node and instants with no net change are dropped.

From a job log (SWF, Slurm, Cobalt, ... via ``hpcsched.traces.open_trace``) the log is replayed on a
machine of its size: each job holds, from its recorded start to its recorded end, the nodes its row
names where the log names them (``harvest.named_nodes``), else the lowest-numbered free nodes (first
fit); every node not running a log job is idle. Ends are applied before starts at the same second, so a
node handed from one job to the next never shows as idle.

Node sets are runs of node indices (``hpcsched.milp.mapping.NodeRuns``), never one object per node:
first fit keeps the free nodes as runs (``harvest.first_fit.RangeFirstFit``), an event holds the runs that joined and
left, and the timeline stores every event's runs in flat arrays (``RangeEvents``). A 49,152-node
machine costs what its jobs and events cost, not what its nodes do. The node-by-node original the tests
compare the runs against is ``tests/first_fit_oracle.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

import numpy as np

from hpcsched.errors import InputError
from hpcsched.harvest.log_checks import describe_rows, split_rows, warmup_check
from hpcsched.harvest.log_stream import (
    Seconds,
    busy_of,
    give_back_freed_memory,
    partly_used,
    peak,
    place_stream,
    sized,
)
from hpcsched.harvest.named_nodes import (
    named_machine,
    node_names,
    place_by_name,
    placement_note,
    read_named_log,
    sized_named,
)
from hpcsched.harvest.sparse import empty_stretches
from hpcsched.milp.mapping import NodeRuns, Run, Spans
from hpcsched.model import IdleInterval


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


def _gather(off: np.ndarray, lo: np.ndarray, hi: np.ndarray,
            sel: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The runs of the selected seconds, as (offsets, run starts, run ends) of their own."""
    lengths = off[sel + 1] - off[sel]
    new_off = np.zeros(len(sel) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_off[1:])
    idx = np.repeat(off[sel] - new_off[:-1], lengths) + np.arange(new_off[-1])
    return new_off, lo[idx], hi[idx]


def pool_at(sec: Seconds, start: float, names: Sequence[str]) -> tuple[NodeRuns, RangeEvents]:
    """The idle pool at ``start`` (every change at or before it applied) and the changes after it."""
    k0 = int(np.searchsorted(sec.t, start, side="right"))
    idle = Spans()
    for k in range(k0):
        joined, left = sec.runs(k)
        for a, b in left:
            idle.remove(a, b)
        for a, b in joined:
            idle.add(a, b)
    changed = (np.diff(sec.joff) > 0) | (np.diff(sec.loff) > 0)
    changed[:k0] = False
    sel = np.flatnonzero(changed)
    return NodeRuns(idle.runs(), names), RangeEvents(sec.t[sel], _gather(sec.joff, sec.jlo, sec.jhi, sel),
                                                     _gather(sec.loff, sec.llo, sec.lhi, sel), names)


def timeline_from_log(path: str | Path, machine: int | None = None, fmt: str | None = None, *,
                      start: float | None = None, skip_warmup: bool = False,
                      options: Mapping[str, object] | None = None,
                      progress: Callable[[int, int, str], None] | None = None) -> PoolTimeline:
    """Idle-pool events of a batch log replayed first-fit on a machine of ``machine`` nodes.

    The machine is ``machine`` (``--nodes``) when given, else the size the reader knows (an SWF header's
    MaxNodes, a known Cobalt machine named in the file name), else the log's peak concurrent use; the
    size and where it came from are in ``notes`` (``machine_nodes``, ``machine_nodes_source``), since a
    wrong size silently skips jobs (too small) or invents idle nodes (too large). A log that names its
    jobs' nodes is replayed on them, on a machine of at least the named nodes, rows without names first
    fit (``log_placement`` in ``notes`` counts each; ``options['placement'] = 'first-fit'`` places every
    row first fit). Jobs smaller than a node share nodes by cores. Jobs without start/end or size, or
    that find the machine full, are
    counted in ``notes``, as are the reader's dropped and flagged rows and the warm-up check
    (``warmup_check``). The replay starts at ``start`` (default: the log's first job start), or with
    ``skip_warmup`` where the log's use first reaches its typical level.

    The log is read into arrays (a clean SWF by columns) and first fit streams through it, writing each
    second's netted changes as runs into flat arrays (``harvest.log_stream``): memory is about 24 bytes a
    job and 25 a changed second, and neither time nor memory grows with the machine's size. ``progress(done,
    total, what)`` follows the read (bytes of the file: a gzipped log's compressed offset) and first fit (jobs).
    """
    from hpcsched.traces import open_trace

    trace = open_trace(path, fmt, options=dict(options or {}))
    if trace.format.kind != "jobs":
        raise InputError(path, f"--log needs a job log; {trace.format.name} holds {trace.format.kind} records")
    if progress is not None:
        name = Path(path).name
        trace.report.progress = lambda done, total: progress(done, total, f"reading {name}")
    log, lists = read_named_log(trace)
    n_jobs = len(log.start)
    meta = trace.report.meta
    cpn_raw = meta.get("cores_per_node")
    cpn = int(cpn_raw) if isinstance(cpn_raw, int | float) and cpn_raw >= 1 and cpn_raw == int(cpn_raw) else 1
    why_not = ""  # why a log that names its nodes is placed first fit all the same
    if lists is not None and (options or {}).get("placement") == "first-fit":
        why_not = "placement=first-fit asked"
    elif lists is not None and machine is not None and machine < len(lists.names):
        why_not = f"--nodes {machine} is fewer than the {len(lists.names):,} nodes the log names"
    by_name = lists is not None and not why_not
    rows = None
    if by_name:
        st, en, size, rows, skipped = sized_named(log, cpn)
    else:
        st, en, size, skipped = sized(log, cpn)
    del log
    if not len(st):
        raise InputError(path, "no job in the log has a start, an end and a size: nothing to replay")
    peak_nodes = -(-peak(st, en, size) // cpn)
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
    first = float(st[0])
    n_runs = len(st)
    n_placed = len(st)
    if lists is not None and by_name:
        machine, source = named_machine(None if source != "--nodes" else machine, header,
                                        str(meta.get("machine_nodes_source") or "the log's header"), len(lists.names))
        assert rows is not None
        sec, placement = place_by_name(st, en, size, rows, lists, machine, cpn, skipped, None if progress is None else (
            lambda k: progress(k, n_placed, "placing the log's jobs on their named nodes")))
        names: Sequence[str] = node_names(lists, machine)
    else:
        sec = place_stream(st, en, size, machine, cpn, skipped, None if progress is None else (
            lambda k: progress(k, n_placed, "first fit of the log's jobs")))
        placement = {"by_name": 0, "first_fit": n_runs - skipped["no_room"], "over_capacity": 0,
                     "names_short": 0}
        names = NumberedNodes(machine)
    del st, en, size, rows
    bt, bl = busy_of(sec, machine)
    last_mark = float(bt[-1]) if len(bt) else first
    if start is None:
        start = first
    elif start < first or start >= last_mark:
        raise InputError(path, f"--start {start:.0f} is outside the log's replayable span "
                         f"[{first:.0f}, {last_mark:.0f})")
    warm = warmup_check(bt, bl, start)
    if skip_warmup:
        warm["skipped_from"] = start
        start = float(warm["warmup_end"])  # type: ignore[arg-type]
    initial, events = pool_at(sec, start, names)
    end = max(first, start, last_mark)
    tl = PoolTimeline(start, initial, events, names, end)
    dropped, flagged = split_rows(trace.report.anomalies)
    tl.notes = {"machine_nodes": machine, "machine_nodes_source": source, "log_peak_nodes": peak_nodes,
                "cores_per_node": cpn, "log_jobs": n_jobs, "log_jobs_placed": n_runs - skipped["no_room"],
                "log_placement": {**placement, "note": placement_note(placement, cpn, why_not)}}
    if cpn > 1:  # nodes shared by cores: partly used ones are busy for the pool, and said
        tl.notes["partly_used_nodes"] = partly_used(sec, start, end)
    tl.notes.update({f"skipped_{k}": v for k, v in skipped.items() if k != "truncated"})
    tl.notes.update({"log_rows_dropped": dropped, "log_rows_flagged": flagged,
                     "log_rows_summary": describe_rows(n_jobs, trace.report.anomalies), "warmup": warm,
                     "log_notes": list(trace.report.notes)})
    empty = empty_stretches(bt, bl, start, end)
    if empty is not None:
        tl.notes["log_empty"] = empty
    del sec, bt, bl
    give_back_freed_memory()
    return tl
