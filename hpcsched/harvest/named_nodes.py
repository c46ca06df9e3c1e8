"""A job log replayed on the nodes it names: each job holds the nodes its row names (Slurm NodeList, PBS
exec_host/exec_vnode, LSF execHosts, Grid Engine's host of a serial job), not the lowest-numbered free ones.

First fit on anonymous nodes keeps the machine's busy count but not which nodes are busy: a 1-node job the log
ran on ``c7`` lands on ``c1``, so the idle stretches of each node (what a harvester gets, and how fragmented it
is) are not the real machine's. Here a node's use is the sum of the cores the jobs named on it hold (a job's
cores spread evenly over its named nodes; a whole node each when cores are unknown), so a node is idle (nothing
on it), partly used or full at every second as it was; a node whose GPUs are all taken (``gres/gpu``, spread
the same way, against the most GPUs per node any job held) is full whatever cores are left. Rows without names
(a Grid Engine parallel job, a row whose NodeList was lost or cut short) are placed first fit by cores on what
the named jobs leave free, preferring nodes no named job starts on during the row's run (else the row would sit
where the log puts a job next, and a node busy on the machine would look idle), and counted.

A log that names a node twice over its capacity (cores per node is an estimate: the most CPUs per node any job
held) keeps both jobs on it, as the log says; the node is busy either way, and such rows are counted. Memory is
arrays: the node lists as one flat index array with offsets (4 bytes a named node a job, 8 a job), per node one
used-core count, and the netted changes per second in ``log_stream.Seconds``' flat arrays.
"""

from __future__ import annotations

import functools
import heapq
import math
import re
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcsched.harvest.log_stream import LogRuns, Seconds, SecondsWriter, read_log_runs
from hpcsched.milp.mapping import Run, Spans, runs_of

_CHUNK = 65_536  # jobs between progress ticks
_DIGITS = re.compile(r"(\d+)")


@dataclass
class NodeLists:
    """The nodes each job names: job k's node indices are ``idx[off[k]:off[k + 1]]`` (none: no names), indices
    into ``names``, the distinct names in natural order (``c2`` before ``c10``, so a hostlist's nodes are runs)."""

    names: list[str]
    off: np.ndarray
    idx: np.ndarray
    gpus: np.ndarray  # each job's GPUs (0: none or unknown), so a node whose GPUs are all taken counts as full
    short: int = 0  # jobs naming fewer nodes than their node count: placed first fit, their names not kept

    def named(self) -> np.ndarray:
        """Whether each job names its nodes."""
        return np.diff(self.off) > 0


def _natural(name: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(name))


def read_named_log(trace: Any) -> tuple[LogRuns, NodeLists | None]:
    """The jobs of an opened job trace as ``log_stream.LogRuns`` and, when any job names its nodes
    (``Job.extra['nodelist']``), their node lists; ``None`` for a log that names none (an SWF: read by columns)."""
    if trace.format.name == "swf" and not trace.report.options.get("rows"):
        return read_log_runs(trace), None
    st, en, nd, pr = array("d"), array("d"), array("q"), array("q")
    off, idx, gp = array("q", [0]), array("i"), array("q")
    index: dict[str, int] = {}
    nan = math.nan
    short = 0
    for j in trace:
        names = j.extra.get("nodelist") if j.extra else None
        if names:
            distinct = dict.fromkeys(names)  # a node named twice in one job is one node
            if j.nodes > len(distinct):
                short += 1
                distinct = {}
            for name in distinct:
                k = index.get(name)
                if k is None:
                    k = index[name] = len(index)
                idx.append(k)
        off.append(len(idx))
        st.append(nan if j.start is None else j.start)
        en.append(nan if j.end is None else j.end)
        nd.append(j.nodes or (off[-1] - off[-2]))  # a job naming its nodes but not their count
        pr.append(j.procs)
        gp.append(j.gpus)
    log = LogRuns(np.frombuffer(st, dtype=np.float64), np.frombuffer(en, dtype=np.float64),
                  np.frombuffer(nd, dtype=np.int64), np.frombuffer(pr, dtype=np.int64))
    if not index:
        return log, None
    first_seen = list(index)
    order = sorted(range(len(first_seen)), key=lambda k: _natural(first_seen[k]))
    remap = np.empty(len(order), dtype=np.int32)
    remap[order] = np.arange(len(order), dtype=np.int32)
    return log, NodeLists([first_seen[k] for k in order], np.frombuffer(off, dtype=np.int64),
                          remap[np.frombuffer(idx, dtype=np.int32)], np.frombuffer(gp, dtype=np.int64), short)


def sized_named(log: LogRuns, cpn: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """``log_stream.sized`` keeping each kept job's row index: (start, end, size, row, skipped), sorted by start
    (stable). The same rules: sizes in cores when nodes have several, jobs without times, 0 s runs and sizes
    counted, not kept."""
    s, e = log.start, log.end
    no_times = np.isnan(s) | np.isnan(e) | (e < s)
    zero = ~no_times & (e == s)
    if cpn > 1:
        size = np.where(log.procs > 0, log.procs, log.nodes * cpn)
    else:
        size = np.where(log.nodes > 0, log.nodes, log.procs)
    no_size = ~no_times & ~zero & (size <= 0)
    skipped = {"no_times": int(no_times.sum()), "zero_run": int(zero.sum()), "no_size": int(no_size.sum()),
               "no_room": 0, "truncated": 0}
    rows = np.flatnonzero(~(no_times | zero | no_size))
    rows = rows[np.argsort(s[rows], kind="stable")]
    return s[rows], e[rows], size[rows], rows, skipped


def named_machine(machine: int | None, header: object, header_source: str, distinct: int) -> tuple[int, str]:
    """The machine for a replay by name: ``--nodes`` (at least the named nodes: the caller checks), else the
    header's size where it holds every named node, else the named nodes."""
    if machine is not None:
        return machine, "--nodes"
    if isinstance(header, int | float) and header >= distinct:
        return int(header), header_source
    said = f" (not {int(header):,}: {header_source})" if isinstance(header, int | float) and header > 0 else ""
    return distinct, f"the {distinct:,} distinct nodes its jobs name{said}"


def node_names(lists: NodeLists, machine: int) -> tuple[str, ...]:
    """The named nodes, then the machine's nodes no job named (``--nodes`` or a header larger than the log's)."""
    extra = machine - len(lists.names)
    return (*lists.names, *(f"unnamed-{k:05d}" for k in range(extra)))


class _Machine:
    """Per-node used cores (and GPUs), the wholly idle nodes as runs, the partly used ones, and this second's
    transitions between idle and busy."""

    def __init__(self, machine: int, cpn: int, gpn: int) -> None:
        self.cpn, self.gpn = cpn, gpn
        self.used = [0] * machine
        self.used_g = [0] * machine if gpn else []
        self.free = Spans([(0, machine)] if machine > 0 else [])  # nodes with nothing on them
        self.partial: set[int] = set()  # something on them, neither their cores nor their GPUs all taken
        self.flipped: dict[int, bool] = {}  # node -> idle at the start of this second, for nodes that flipped

    def _sort(self, x: int, v: int) -> None:
        if 0 < v < self.cpn and not (self.gpn and self.used_g[x] >= self.gpn):
            self.partial.add(x)
        else:
            self.partial.discard(x)

    def take(self, x: int, c: int, g: int = 0) -> bool:
        """Put c cores and g GPUs on node x; False when it had fewer free (kept anyway: the log says it ran there)."""
        u = self.used[x]
        if u == 0:
            self.free.remove(x, x + 1)
            self.flipped.setdefault(x, True)
        v = u + c
        self.used[x] = v
        ok = v <= self.cpn
        if g and self.gpn:
            self.used_g[x] += g
            ok = ok and self.used_g[x] <= self.gpn
        self._sort(x, v)
        return ok

    def give(self, x: int, c: int, g: int = 0) -> None:
        v = self.used[x] - c
        self.used[x] = v
        if g and self.gpn:
            self.used_g[x] -= g
        if v == 0:
            self.free.add(x, x + 1)
            self.flipped.setdefault(x, False)
        self._sort(x, v)

    def first_fit(self, size: int, ok: Callable[[int], bool] | None = None) -> list[tuple[int, int]] | None:
        """(node, cores) for a job without names: whole nodes from the lowest wholly idle ones, the remainder on
        the lowest node with room for it (a partly used one or the next idle one); None when it does not fit.
        ``ok`` (when given) must accept each node chosen."""
        whole, rest = divmod(size, self.cpn)
        if whole > len(self.free):
            return None
        nodes: list[int] = []
        spare: int | None = None  # the lowest acceptable idle node after the whole ones
        for lo, hi in zip(self.free.lo, self.free.hi, strict=True):
            if ok is None:
                nodes.extend(range(lo, min(hi, lo + whole - len(nodes))))
            else:
                for x in range(lo, hi):
                    if len(nodes) == whole and (spare is not None or not rest):
                        break
                    if ok(x):
                        if len(nodes) < whole:
                            nodes.append(x)
                        else:
                            spare = x
            if len(nodes) == whole and (ok is None or spare is not None or not rest):
                break
        if len(nodes) < whole:
            return None
        got = [(x, self.cpn) for x in nodes]
        if rest:
            best = min((x for x in self.partial if self.cpn - self.used[x] >= rest and (ok is None or ok(x))),
                       default=None)
            nxt = self.free.nth(whole) if ok is None else spare
            if nxt is not None and (best is None or nxt < best):
                best = nxt
            if best is None:
                return None
            got.append((best, rest))
        for x, c in got:
            self.take(x, c)
        return got


def _named_starts(start: np.ndarray, rows: np.ndarray, lists: NodeLists,
                  machine: int) -> tuple[np.ndarray, np.ndarray]:
    """Per node the starts of the named jobs on it, ascending: node x's are ``starts[at[x]:at[x + 1]]``."""
    lengths = np.diff(lists.off)[rows]
    total = int(lengths.sum())
    first = np.repeat(lists.off[rows], lengths)
    within = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    node = lists.idx[first + within]
    when = np.repeat(start, lengths)
    o = np.lexsort((when, node))
    at = np.searchsorted(node[o], np.arange(machine + 1), side="left")
    return at, when[o]


def place_by_name(start: np.ndarray, end: np.ndarray, size: np.ndarray, rows: np.ndarray, lists: NodeLists,
                  machine: int, cpn: int, skipped: dict[str, int],
                  tick: Callable[[int], None] | None = None) -> tuple[Seconds, dict[str, int]]:
    """Replay the sorted jobs (``sized_named``) on their named nodes, rows without names first fit, and net each
    second's changes as ``log_stream.place_stream`` does (a node released and taken at one second never left;
    the first second holds the whole machine joining). Returns the seconds and the placement counts."""
    off, idx, gpus = lists.off, lists.idx, lists.gpus
    counts_per_job = np.diff(off)
    has = counts_per_job > 0
    gpn = int((-(-gpus[has] // counts_per_job[has])).max()) if has.any() else 0  # GPUs a node: the most any job held
    m = _Machine(machine, cpn, gpn)
    unnamed_rows = bool((~has[rows]).any()) and bool(has.any())
    at, starts = _named_starts(start, rows, lists, machine) if unnamed_rows else (np.zeros(1, np.int64), start[:0])

    def _clear(x: int, s: float, e: float) -> bool:
        """No named job starts on node x during [s, e)."""
        a, b = int(at[x]), int(at[x + 1])
        k = a + int(np.searchsorted(starts[a:b], s, side="left"))
        return k == b or float(starts[k]) >= e

    out = SecondsWriter(machine)
    jlo, jhi, llo, lhi = out.jlo, out.jhi, out.llo, out.lhi
    counts = {"by_name": 0, "first_fit": 0, "over_capacity": 0, "names_short": lists.short}
    first = [True]

    def flush(t: float) -> None:
        flipped = m.flipped
        if not flipped and not first[0]:
            return
        used = m.used
        if first[0]:  # every node joins at the first second, less those taken in it
            joined: list[Run] = m.free.runs()
            left: list[Run] = []
            first[0] = False
        else:
            joined = runs_of(sorted(x for x, was in flipped.items() if not was and used[x] == 0))
            left = runs_of(sorted(x for x, was in flipped.items() if was and used[x] > 0))
        for lo, hi in joined:
            jlo.append(lo)
            jhi.append(hi)
        for lo, hi in left:
            llo.append(lo)
            lhi.append(hi)
        out.close(t, bool(flipped), len(m.partial))
        flipped.clear()

    def per_node(k: int, r: int) -> tuple[list[int], int, int]:
        """A named job's nodes, and the cores and GPUs it holds on each (spread evenly, rounded up)."""
        nodes = idx[off[r]:off[r + 1]].tolist()
        return nodes, (-(-k // len(nodes)) if cpn > 1 else 1), -(-int(gpus[r]) // len(nodes))

    ending: list[tuple[float, int]] = []
    held: dict[int, list[tuple[int, int]]] = {}  # first-fit jobs running: their (node, cores); GPUs not counted
    sizes: dict[int, int] = {}  # named jobs running: their size (their nodes are in ``lists``)
    cur = float(start[0]) if len(start) else 0.0

    def release(t_end: float, i: int) -> None:
        got = held.pop(i, None)
        if got is not None:
            for x, c in got:
                m.give(x, c)
            return
        nodes, c, g = per_node(sizes.pop(i), int(rows[i]))
        for x in nodes:
            m.give(x, c, g)

    for a in range(0, len(start), _CHUNK):
        for i, (s, e, k) in enumerate(zip(start[a:a + _CHUNK].tolist(), end[a:a + _CHUNK].tolist(),
                                          size[a:a + _CHUNK].tolist(), strict=True), a):
            while ending and ending[0][0] <= s:
                t_end, j = heapq.heappop(ending)
                if t_end != cur:
                    flush(cur)
                    cur = t_end
                release(t_end, j)
            if s != cur:
                flush(cur)
                cur = s
            r = int(rows[i])
            if off[r + 1] > off[r]:
                nodes, c, g = per_node(k, r)
                fits = True
                for x in nodes:
                    fits &= m.take(x, c, g)
                counts["by_name"] += 1
                counts["over_capacity"] += not fits
                sizes[i] = k
            else:
                # nodes no named job starts on during its run, so it does not sit where the log puts a job next;
                # plain first fit when there are none (a collision the named job then counts as over_capacity)
                got = m.first_fit(k, functools.partial(_clear, s=s, e=e)) if unnamed_rows else None
                got = got or m.first_fit(k)
                if got is None:
                    skipped["no_room"] += 1
                    continue
                counts["first_fit"] += 1
                held[i] = got
            heapq.heappush(ending, (e, i))
        if tick is not None:
            tick(min(a + _CHUNK, len(start)))
    while ending:
        t_end, j = heapq.heappop(ending)
        if t_end != cur:
            flush(cur)
            cur = t_end
        release(t_end, j)
    flush(cur)
    return out.seconds(), counts


def placement_note(counts: dict[str, int], cpn: int, why_first_fit: str = "") -> str:
    """One sentence on how the log's jobs were placed, for the replay's notes."""
    by, ff, over = counts.get("by_name", 0), counts.get("first_fit", 0), counts.get("over_capacity", 0)
    if not by:
        return (f"log jobs placed first fit on the lowest-numbered free nodes ({ff:,} rows): "
                + (why_first_fit or "the log names no nodes"))
    text = (f"log jobs on the nodes their rows name: {by:,} placed by name, {ff:,} without names placed first fit "
            "on what the named jobs left free")
    if counts.get("names_short"):
        text += (f" ({counts['names_short']:,} rows named fewer nodes than they ran on, a cut node list: placed "
                 "first fit)")
    if over:
        text += (f"; {over:,} rows found a named node already full (a row without names placed there first fit, "
                 f"or more than the {cpn} cores a node estimated as the most any job held per node): kept there as "
                 "the log says, the node busy")
    return text
