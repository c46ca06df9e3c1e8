"""A job log turned into the replay pool's busy and idle changes in bounded memory: numbers in flat arrays, never
one Python object per job or per change.

A 10^7-job log kept as one tuple per job, one mark tuple per node-run change and one list per second needed
~200 bytes a job (2 GB). Here the log is read into four arrays (a clean SWF by columns, at the parser's speed;
any other log row by row into the same arrays), first fit walks it in chunks, and each second's changes are
netted as they happen and written as runs into flat arrays: about 24 bytes a job for the log and 25 a second
of changes. The placements and events are those of a node-by-node first fit, each second's node changes netted
(the tests compare them with that reference, ``tests/first_fit_oracle.py``).
"""

from __future__ import annotations

import ctypes
import heapq
import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcsched.harvest.first_fit import RangeFirstFit
from hpcsched.milp.mapping import Run

_CHUNK = 65_536  # jobs turned into Python numbers at a time


@dataclass
class LogRuns:
    """Each job's start and end (NaN: unknown), nodes and procs, in file order."""

    start: np.ndarray
    end: np.ndarray
    nodes: np.ndarray
    procs: np.ndarray


def read_log_runs(trace: Any) -> LogRuns:
    """The jobs of an opened job trace (``hpcsched.traces.open_trace``) as arrays; the trace's report is filled
    as a pass over it would fill it. A clean SWF log is read by columns (``traces.swf_columns``), others by rows;
    either calls the report's ``progress`` with the bytes read."""
    if trace.format.name == "swf" and not trace.report.options.get("rows"):
        from hpcsched.traces.swf_columns import summarise

        cols = summarise(trace.path, trace.report, keep_runs=True)
        if cols is not None and cols.runs is not None:
            s, e, n, p = cols.runs
            return LogRuns(np.frombuffer(s, dtype=np.float64), np.frombuffer(e, dtype=np.float64),
                           np.frombuffer(n, dtype=np.int64), np.frombuffer(p, dtype=np.int64))
    st, en, nd, pr = array("d"), array("d"), array("q"), array("q")
    nan = math.nan
    for j in trace:
        st.append(nan if j.start is None else j.start)
        en.append(nan if j.end is None else j.end)
        nd.append(j.nodes)
        pr.append(j.procs)
    return LogRuns(np.frombuffer(st, dtype=np.float64), np.frombuffer(en, dtype=np.float64),
                   np.frombuffer(nd, dtype=np.int64), np.frombuffer(pr, dtype=np.int64))


def sized(log: LogRuns, cpn: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """(start, end, size) of the jobs that ran, sorted by start (stable), and the others counted by why.

    The reference's row-by-row sizing (``tests/first_fit_oracle.py``) as array operations: sizes in cores when
    nodes have several (so small jobs share nodes), else in nodes. ``log`` is consumed (its arrays are reused and
    dropped as the sorted ones are made), so a 10^7-job log never holds more than about 48 bytes a job here."""
    for name in ("start", "nodes", "procs"):  # reused in place below
        if not getattr(log, name).flags.writeable:
            setattr(log, name, getattr(log, name).copy())
    s, e = log.start, log.end
    no_times = np.isnan(s) | np.isnan(e) | (e < s)
    zero = ~no_times & (e == s)
    if cpn > 1:  # procs, else whole nodes' cores
        size, other = log.procs, log.nodes
        np.multiply(other, cpn, out=other)
    else:  # nodes, else procs
        size, other = log.nodes, log.procs
    np.copyto(size, other, where=size == 0)
    no_size = ~no_times & ~zero & (size <= 0)
    skipped = {"no_times": int(no_times.sum()), "zero_run": int(zero.sum()), "no_size": int(no_size.sum()),
               "no_room": 0, "truncated": 0}
    drop = no_times | zero | no_size
    del no_times, zero, no_size
    kept = len(s) - int(drop.sum())
    key = s
    key[drop] = np.inf  # sorted after every real start, in file order among themselves
    del drop
    order = np.argsort(key, kind="stable")[:kept]
    del key
    empty = np.zeros(0)
    start = s[order]  # the dropped rows' inf is not among them
    log.start = empty
    del s
    end = e[order]
    log.end = empty
    del e
    out = size[order]
    log.nodes = log.procs = empty
    return start, end, out, skipped


def peak(start: np.ndarray, end: np.ndarray, size: np.ndarray) -> int:
    """Most units in use at once, ends before starts at the same second by sorting:
    after every start at second t the level is the sizes started by t less those ended by t. ``start`` sorted."""
    if len(start) == 0:
        return 0
    last = np.r_[start[1:] != start[:-1], True]
    started = np.cumsum(size)[last]
    o = np.argsort(end, kind="stable")
    ended_cum = np.r_[0, np.cumsum(size[o])]
    ended = ended_cum[np.searchsorted(end[o], start[last], side="right")]
    return int(max(0, (started - ended).max()))


@dataclass
class Seconds:
    """Every second at which the replayed machine changed, netted: joined and left runs per second as offsets
    into flat run arrays (second k's joined runs are ``jlo/jhi[joff[k]:joff[k + 1]]``), whether first fit
    marked anything then (the all-idle start is not a mark), and the nodes partly used after it (some of their
    cores held by jobs smaller than a node: neither idle nor full)."""

    t: np.ndarray
    marked: np.ndarray
    partly: np.ndarray
    joff: np.ndarray
    jlo: np.ndarray
    jhi: np.ndarray
    loff: np.ndarray
    llo: np.ndarray
    lhi: np.ndarray

    def runs(self, k: int) -> tuple[list[Run], list[Run]]:
        a, b, c, d = int(self.joff[k]), int(self.joff[k + 1]), int(self.loff[k]), int(self.loff[k + 1])
        return (list(zip(self.jlo[a:b].tolist(), self.jhi[a:b].tolist(), strict=True)),
                list(zip(self.llo[c:d].tolist(), self.lhi[c:d].tolist(), strict=True)))


class SecondsWriter:
    """A ``Seconds`` as it is made: a builder appends a second's joined runs to ``jlo``/``jhi`` and its left runs
    to ``llo``/``lhi`` (bound to locals on its hot path), then ``close``s the second; ``seconds`` gives the arrays.
    Node numbers are 32-bit unless the machine needs more."""

    def __init__(self, machine: int) -> None:
        self._code = "i" if machine < 2**31 - 1 else "q"
        self.t, self.marked, self.partly = array("d"), array("b"), array("i")
        self.joff, self.loff = array("q", [0]), array("q", [0])
        self.jlo, self.jhi, self.llo, self.lhi = (array(self._code) for _ in range(4))

    def close(self, t: float, marked: bool, partly: int) -> None:
        """End the second ``t``: whether a placement marked anything in it, and the nodes partly used after it."""
        self.t.append(t)
        self.marked.append(1 if marked else 0)
        self.partly.append(partly)
        self.joff.append(len(self.jlo))
        self.loff.append(len(self.llo))

    def seconds(self) -> Seconds:
        ints = np.int32 if self._code == "i" else np.int64
        return Seconds(np.frombuffer(self.t, dtype=np.float64), np.frombuffer(self.marked, dtype=np.int8),
                       np.frombuffer(self.partly, dtype=np.int32), np.frombuffer(self.joff, dtype=np.int64),
                       np.frombuffer(self.jlo, dtype=ints), np.frombuffer(self.jhi, dtype=ints),
                       np.frombuffer(self.loff, dtype=np.int64), np.frombuffer(self.llo, dtype=ints),
                       np.frombuffer(self.lhi, dtype=ints))


def _sums(lo: np.ndarray, hi: np.ndarray, off: np.ndarray) -> np.ndarray:
    """Nodes in each second's runs."""
    cum = np.r_[0, np.cumsum(hi - lo)]
    return cum[off[1:]] - cum[off[:-1]]


def busy_of(sec: Seconds, machine: int) -> tuple[np.ndarray, np.ndarray]:
    """Busy nodes as ``log_checks.busy_steps`` gives them from the marks: one step per marked second. The first
    second's joined nodes include the whole machine's (the all-idle start), so busy = machine - idle."""
    busy = machine - np.cumsum(_sums(sec.jlo, sec.jhi, sec.joff) - _sums(sec.llo, sec.lhi, sec.loff))
    m = sec.marked.astype(bool)
    return sec.t[m], busy[m].astype(np.int64)


def net_marks(marks: list[tuple[float, int, int, int]], up: list[Run]) -> tuple[list[Run], list[Run]] | None:
    """One second's marks (time, +1 idle / -1 busy, lo, hi) and runs ``up`` that also went idle, netted: the
    runs that joined the pool (idle, not taken again) and that left it (taken, not released), ascending and merged
    where they touch; None where a node went idle twice or busy twice. A sweep over the runs' ends: this runs for
    a third of a 10^7-row log's seconds, and two ``Spans`` and their differences cost twice as much."""
    pts = [(lo, 1, 0) for lo, _ in up] + [(hi, -1, 0) for _, hi in up]
    for _, sign, lo, hi in marks:
        if sign > 0:
            pts.append((lo, 1, 0))
            pts.append((hi, -1, 0))
        else:
            pts.append((lo, 0, 1))
            pts.append((hi, 0, -1))
    pts.sort()  # at one index the ends (-1) come before the starts: touching runs of one kind never count twice
    joined: list[Run] = []
    left: list[Run] = []
    cu = cd = 0
    prev = pts[0][0] if pts else 0
    for x, du, dd in pts:
        if x > prev and cu != cd:  # [prev, x) went idle only (cu) or busy only (cd)
            out = joined if cu else left
            if out and out[-1][1] == prev:
                out[-1] = (out[-1][0], x)
            else:
                out.append((prev, x))
        cu += du
        cd += dd
        if cu > 1 or cd > 1:
            return None
        prev = x
    return joined, left


def place_stream(start: np.ndarray, end: np.ndarray, size: np.ndarray, machine: int, cpn: int,
                 skipped: dict[str, int], tick: Callable[[int], None] | None = None) -> Seconds:
    """First fit of the sorted jobs (``first_fit.RangeFirstFit``), each second's changes netted as they happen.

    At one second a node may be released by one job and taken by the next: it never left. So per second the
    joined nodes are the released runs less the taken ones, the left nodes the reverse (as ``pool``'s netting
    of the marks). The first second also holds the whole machine joining (every node idle at the first start).
    """
    ff = RangeFirstFit(machine, cpn)
    out = SecondsWriter(machine)
    jlo, jhi, llo, lhi = out.jlo, out.jhi, out.llo, out.lhi
    first = float(start[0]) if len(start) else 0.0
    pending_up: list[Run] = [(0, machine)] if machine > 0 else []
    cur = first

    def flush(t: float) -> None:
        marks = ff.marks
        if not marks and not pending_up:
            return
        if len(marks) == 1 and not pending_up:  # the common second: one job's run starts or ends
            _, sign, lo, hi = marks[0]
            if sign > 0:
                jlo.append(lo)
                jhi.append(hi)
            else:
                llo.append(lo)
                lhi.append(hi)
        else:
            netted = net_marks(marks, pending_up)
            if netted is None:
                raise RuntimeError(f"first fit changed a node twice the same way at t={t}: a placement bug")
            for lo, hi in netted[0]:
                jlo.append(lo)
                jhi.append(hi)
            for lo, hi in netted[1]:
                llo.append(lo)
                lhi.append(hi)
        out.close(t, bool(marks), len(ff.partial))
        marks.clear()
        pending_up.clear()

    ending: list[tuple[float, int]] = []
    held: dict[int, tuple[list[Run], tuple[int, int] | None]] = {}
    release, place, push, pop, marks = ff.release, ff.place, heapq.heappush, heapq.heappop, ff.marks
    i = 0
    for a in range(0, len(start), _CHUNK):
        for s, e, k in zip(start[a:a + _CHUNK].tolist(), end[a:a + _CHUNK].tolist(), size[a:a + _CHUNK].tolist(),
                           strict=True):
            while ending and ending[0][0] <= s:
                t_end, j = pop(ending)
                if t_end != cur:
                    flush(cur)
                    cur = t_end
                release(*held.pop(j), t_end)
            if s != cur:
                if marks or pending_up:  # a second in which only jobs found no room changed nothing
                    flush(cur)
                cur = s
            placed = place(k, s)
            if placed is None:
                skipped["no_room"] += 1
            else:
                held[i] = placed
                push(ending, (e, i))
            i += 1
        if tick is not None:
            tick(i)
    while ending:
        t_end, j = pop(ending)
        if t_end != cur:
            flush(cur)
            cur = t_end
        release(*held.pop(j), t_end)
    flush(cur)
    return out.seconds()


def partly_used(sec: Seconds, start: float, end: float) -> dict[str, float]:
    """Nodes partly used (some cores held, some free) over [start, end]: the most at once, the mean and the
    node-hours. The idle pool holds wholly idle nodes only, so these are what a core-level harvester could add."""
    t, n = sec.t, sec.partly.astype(np.float64)
    if len(t) == 0 or end <= start:
        return {"peak_nodes": 0, "mean_nodes": 0.0, "node_hours": 0.0}
    k = max(int(np.searchsorted(t, start, side="right")) - 1, 0)
    inside = (t > start) & (t < end)
    edges = np.r_[start, t[inside], end]
    level = np.r_[n[k] if t[k] <= start else 0.0, n[inside]]
    area = float((level * np.diff(edges)).sum())
    return {"peak_nodes": int(level.max()), "mean_nodes": area / (end - start), "node_hours": area / 3600.0}


def give_back_freed_memory() -> None:
    """Return the heap pages the pool build freed to the OS (glibc's ``malloc_trim``).

    glibc keeps freed heap memory for reuse, so after a 10^7-row build (770 MB at its peak) the process stayed at
    ~550 MB resident with ~320 MB of it free, and the replay's own memory came on top of that. Elsewhere (no
    glibc) nothing is trimmed: the figures are the same, only the resident size is larger.
    """
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)
