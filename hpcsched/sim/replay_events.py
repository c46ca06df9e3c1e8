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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

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


def _timeline(deltas: list[tuple[float, int, str]], nodes: Sequence[str], start: float | None) -> PoolTimeline:
    """Turn (time, +1 idle / -1 busy, node) deltas into netted events after ``start``.

    Sorting puts -1 before +1 at equal times; per node the idle count is what matters, so the order
    within an instant does not change the net result, only keeps the counts from dipping below 0.
    """
    deltas.sort(key=lambda d: (d[0], d[1]))
    if start is None:
        start = deltas[0][0] if deltas else 0.0
    idle: dict[str, int] = dict.fromkeys(nodes, 0)
    events: list[PoolEvent] = []
    i, n = 0, len(deltas)
    while i < n and deltas[i][0] <= start:
        idle[deltas[i][2]] += deltas[i][1]
        i += 1
    order = {name: k for k, name in enumerate(nodes)}
    initial = tuple(sorted((x for x, c in idle.items() if c > 0), key=order.__getitem__))
    while i < n:
        t = deltas[i][0]
        touched: dict[str, bool] = {}
        while i < n and deltas[i][0] == t:
            _, d, x = deltas[i]
            if x not in touched:
                touched[x] = idle[x] > 0
            idle[x] += d
            i += 1
        joined = tuple(sorted((x for x, was in touched.items() if not was and idle[x] > 0), key=order.__getitem__))
        left = tuple(sorted((x for x, was in touched.items() if was and idle[x] <= 0), key=order.__getitem__))
        if joined or left:
            events.append(PoolEvent(t, joined, left))
    end = deltas[-1][0] if deltas else start
    return PoolTimeline(start, initial, events, tuple(nodes), max(end, start))


def timeline_from_intervals(
    intervals: Iterable[IdleInterval], nodes: Sequence[str] | None = None, start: float | None = None
) -> PoolTimeline:
    """Events for the given nodes only (all nodes seen when None), starting at ``start``.

    Intervals still open at the end of the data (``end`` None) stay idle to the end.
    """
    keep = set(nodes) if nodes is not None else None
    deltas: list[tuple[float, int, str]] = []
    seen: dict[str, None] = {}
    for iv in intervals:
        if keep is not None and iv.node not in keep:
            continue
        seen.setdefault(iv.node, None)
        deltas.append((iv.start, 1, iv.node))
        if iv.end is not None:
            deltas.append((iv.end, -1, iv.node))
    names = list(nodes) if nodes is not None else list(seen)
    return _timeline(deltas, names, start)


def _job_size(job: Job) -> int:
    return job.nodes if job.nodes > 0 else job.procs


def busy_intervals_first_fit(
    jobs: Iterable[Job], machine: int | None = None
) -> tuple[list[tuple[float, float, list[int]]], int, dict[str, int]]:
    """Place each log job on the lowest-numbered free nodes over its recorded [start, end).

    Returns (start, end, node indices) per placed job, the machine size, and counts of jobs skipped
    (no start/end, zero size, or, when ``machine`` is given, no room: the log overlaps itself).
    """
    runs = []
    skipped = {"no_times": 0, "no_size": 0, "no_room": 0, "truncated": 0}
    for j in jobs:
        if j.start is None or j.end is None or j.end <= j.start:
            skipped["no_times"] += 1
            continue
        size = _job_size(j)
        if size <= 0:
            skipped["no_size"] += 1
            continue
        runs.append((j.start, j.end, size))
    if not runs:
        return [], machine or 0, skipped
    if machine is None:  # the log's own peak concurrency is the machine's size
        marks = sorted([(s, k) for s, _, k in runs] + [(e, -k) for _, e, k in runs], key=lambda m: (m[0], m[1]))
        level = peak = 0
        for _, k in marks:
            level += k
            peak = max(peak, level)
        machine = peak
    runs.sort(key=lambda r: r[0])
    free = list(range(machine))  # a heap of free node indices: first fit = smallest index
    ending: list[tuple[float, int]] = []  # heap of (end, run index)
    placed: list[tuple[float, float, list[int]]] = []
    for s, e, k in runs:
        while ending and ending[0][0] <= s:
            _, idx = heapq.heappop(ending)
            for x in placed[idx][2]:
                heapq.heappush(free, x)
        if k > len(free):
            if not free:
                skipped["no_room"] += 1
                continue
            skipped["truncated"] += 1
            k = len(free)
        got = [heapq.heappop(free) for _ in range(k)]
        placed.append((s, e, got))
        heapq.heappush(ending, (e, len(placed) - 1))
    return placed, machine, skipped


def timeline_from_log(path: str | Path, machine: int | None = None, fmt: str | None = None) -> PoolTimeline:
    """Idle-pool events of a batch log replayed first-fit on a machine of ``machine`` nodes.

    The machine size defaults to the log's peak concurrent use, so the busiest moment leaves no node
    idle. Jobs without recorded start/end or size are skipped and counted in ``notes``.
    """
    from hpcsched.traces import open_trace

    trace = open_trace(path, fmt)
    if trace.format.kind != "jobs":
        raise InputError(path, f"--log needs a job log; {trace.format.name} holds {trace.format.kind} records")
    placed, size, skipped = busy_intervals_first_fit(trace, machine)
    if not placed:
        raise InputError(path, "no job in the log has a start, an end and a size: nothing to replay")
    names = [f"n{k:05d}" for k in range(size)]
    first = min(s for s, _, _ in placed)
    deltas: list[tuple[float, int, str]] = [(first, 1, x) for x in names]  # empty machine at the start
    for s, e, got in placed:
        for x in got:
            deltas.append((s, -1, names[x]))
            deltas.append((e, 1, names[x]))
    tl = _timeline(deltas, names, first)
    tl.notes = {"machine_nodes": size, "log_jobs_placed": len(placed)}
    tl.notes.update({f"skipped_{k}": v for k, v in skipped.items()})
    return tl

