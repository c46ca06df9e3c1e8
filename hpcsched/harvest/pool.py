"""Idle-pool events for the harvesting replayer: from BFTrainer idle intervals or from any job log.

An event is the set of nodes that joined and left the idle pool at one instant. A node whose idle
interval ends at the same second another begins never left (the reference's node table shows no
change there either), so deltas are netted per node and instants with no net change are dropped.

From a job log (SWF, Slurm, Cobalt, ... via ``hpcsched.traces.open_trace``) the log is replayed on a
machine of its size: each job takes the lowest-numbered free nodes (first fit) from its recorded
start to its recorded end; every node not running a log job is idle. Ends are applied before starts
at the same second, so a node handed from one job to the next never shows as idle.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpcsched.errors import InputError
from hpcsched.model import IdleInterval, Job


@dataclass(frozen=True, slots=True)
class PoolEvent:
    time: float
    joined: tuple[str, ...]
    left: tuple[str, ...]


@dataclass(slots=True)
class PoolTimeline:
    """The idle pool at ``start`` and every change after it, in time order."""

    start: float
    initial: tuple[str, ...]
    events: list[PoolEvent]
    nodes: tuple[str, ...]  # every node the machine has, in its numbering order
    end: float  # last instant the data covers
    notes: dict[str, object] = field(default_factory=dict)


def _timeline(times: np.ndarray, deltas: np.ndarray, node_idx: np.ndarray, names: Sequence[str],
              start: float | None) -> PoolTimeline:
    """Turn (time, +1 idle / -1 busy, node index) deltas into netted events after ``start``.

    Vectorised: deltas are summed per (node, second), a per-node running sum gives the idle level
    before and after each second, and a node joins or leaves the pool only where that level crosses 0.
    """
    if start is None:
        start = float(times.min()) if len(times) else 0.0
    order = np.lexsort((times, node_idx))
    t, d, x = times[order], deltas[order].astype(np.int64), node_idx[order]
    if len(t) == 0:
        return PoolTimeline(start, (), [], tuple(names), start)
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
    initial = tuple(names[k] for k in np.sort(gx[last_pre & up]))
    change = ~pre & (up != was)
    ct, cx, cj = gt[change], gx[change], up[change]
    o = np.lexsort((cx, ct))
    ct, cx, cj = ct[o], cx[o], cj[o]
    cuts = np.flatnonzero(np.diff(ct)) + 1
    events = []
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(ct)], strict=True):
        if hi <= lo:
            continue
        xs, js = cx[lo:hi], cj[lo:hi]
        events.append(PoolEvent(float(ct[lo]), tuple(names[k] for k in xs[js]), tuple(names[k] for k in xs[~js])))
    return PoolTimeline(start, initial, events, tuple(names), max(float(t.max()), start))


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
    names = list(index)
    return _timeline(np.array(times, dtype=float), np.array(deltas, dtype=np.int8), np.array(idx, dtype=np.int64),
                     names, start)


def log_runs(jobs: Iterable[Job], cores_per_node: int) -> tuple[list[tuple[float, float, int]], dict[str, int]]:
    """(start, end, cores) per log job that ran; jobs without times or size are counted, not kept.

    Sizes are in cores (``procs``) when the machine has several cores per node, so small jobs can
    share a node as they did on the real machine; otherwise in nodes.
    """
    runs = []
    skipped = {"no_times": 0, "no_size": 0, "no_room": 0, "truncated": 0}
    for j in jobs:
        if j.start is None or j.end is None or j.end <= j.start:
            skipped["no_times"] += 1
            continue
        size = (j.procs or j.nodes * cores_per_node) if cores_per_node > 1 else (j.nodes or j.procs)
        if size <= 0:
            skipped["no_size"] += 1
            continue
        runs.append((j.start, j.end, size))
    return runs, skipped


def peak_use(runs: Sequence[tuple[float, float, int]]) -> int:
    """Most units in use at once (ends before starts at the same second)."""
    marks = sorted([(s, k) for s, _, k in runs] + [(e, -k) for _, e, k in runs], key=lambda m: (m[0], m[1]))
    level = peak = 0
    for _, k in marks:
        level += k
        peak = max(peak, level)
    return peak


class FirstFit:
    """Nodes of ``cpn`` cores; a job takes whole free nodes lowest-numbered first, and a remainder of
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
    """Replay the log's runs on the machine; runs that do not fit are counted (the log overlaps itself)."""
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


# Reader anomaly kinds that drop the row; every other kind flags a row that is kept (hpcsched.traces.base).
DROPPING_KINDS = frozenset({"malformed_row"})
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
    text += ", ".join(f"{n:,} {k} (unparsable)" for k, n in dropped.items()) if dropped else "none"
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
                      start: float | None = None, skip_warmup: bool = False) -> PoolTimeline:
    """Idle-pool events of a batch log replayed first-fit on a machine of ``machine`` nodes.

    The machine is ``machine`` (``--nodes``) when given, else the size the reader knows (an SWF header's
    MaxNodes, a known Cobalt machine named in the file name), else the log's peak concurrent use; the
    size and where it came from are in ``notes`` (``machine_nodes``, ``machine_nodes_source``), since a
    wrong size silently skips jobs (too small) or invents idle nodes (too large). Jobs smaller than a
    node share nodes by cores. Jobs without start/end or size, or that find the machine full, are
    counted in ``notes``, as are the reader's dropped and flagged rows and the warm-up check
    (``warmup_check``). The replay starts at ``start`` (default: the log's first job start), or with
    ``skip_warmup`` where the log's use first reaches its typical level.
    """
    from hpcsched.traces import open_trace

    trace = open_trace(path, fmt)
    if trace.format.kind != "jobs":
        raise InputError(path, f"--log needs a job log; {trace.format.name} holds {trace.format.kind} records")
    jobs = list(trace)
    meta = trace.report.meta
    cpn_raw = meta.get("cores_per_node")
    cpn = int(cpn_raw) if isinstance(cpn_raw, int | float) and cpn_raw >= 1 and cpn_raw == int(cpn_raw) else 1
    runs, skipped = log_runs(jobs, cpn)
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
    ff = place_first_fit(runs, machine, cpn, skipped)
    bt, bl = busy_steps(ff.times, ff.deltas)
    if start is None:
        start = first
    elif start < first or start >= bt[-1]:
        raise InputError(path, f"--start {start:.0f} is outside the log's replayable span [{first:.0f}, {bt[-1]:.0f})")
    warm = warmup_check(bt, bl, start)
    if skip_warmup:
        warm["skipped_from"] = start
        start = float(warm["warmup_end"])  # type: ignore[arg-type]
    names = [f"n{k:05d}" for k in range(machine)]
    times = np.concatenate([np.full(machine, first), np.array(ff.times, dtype=float)])
    deltas = np.concatenate([np.ones(machine, dtype=np.int8), np.array(ff.deltas, dtype=np.int8)])
    idx = np.concatenate([np.arange(machine), np.array(ff.nodes, dtype=np.int64)])
    tl = _timeline(times, deltas, idx, names, start)
    dropped, flagged = split_rows(trace.report.anomalies)
    tl.notes = {"machine_nodes": machine, "machine_nodes_source": source, "log_peak_nodes": peak_nodes,
                "cores_per_node": cpn, "log_jobs": len(jobs), "log_jobs_placed": len(runs) - skipped["no_room"]}
    tl.notes.update({f"skipped_{k}": v for k, v in skipped.items() if k != "truncated"})
    tl.notes.update({"log_rows_dropped": dropped, "log_rows_flagged": flagged,
                     "log_rows_summary": describe_rows(len(jobs), trace.report.anomalies), "warmup": warm})
    return tl
