"""The replayer at machine size (issue 17): node sets are runs of node indices, and give the node-by-node answer.

Two kinds of checks. Equality: the run-based log placement, pool and mapping reproduce, bit for bit, what the
node-by-node code gives on the bundled 40-node case, a Theta slice and real SWF logs (live against the kept
node-by-node reference where it still exists, against pinned figures of the node-by-node replayer otherwise).
Scale: what is built for a log grows with its jobs and events, not with the machine's node count (sizes and
allocations, never timings).
"""

from __future__ import annotations

import gzip
import hashlib
import random
import tracemalloc
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from first_fit_oracle import place_first_fit, reference_runs
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcsched.harvest import replay as replay_mod
from hpcsched.harvest.log_checks import busy_steps, warmup_check
from hpcsched.harvest.pool import (
    NumberedNodes,
    PoolEvent,
    PoolTimeline,
    RangeEvents,
    _timeline,
    timeline_from_intervals,
    timeline_from_log,
)
from hpcsched.harvest.replay import ReplayConfig, ReplayResult, replay
from hpcsched.harvest.run import shift_into_log
from hpcsched.milp import MilpJob
from hpcsched.milp.mapping import NodeRuns, Run, map_nodes, runs_of
from hpcsched.model import ElasticJob, ScalingCurve
from hpcsched.traces import open_trace
from hpcsched.traces.bftrainer import read_elastic_jobs, read_idle_intervals, read_node_order

DATA = Path("trace-data")
BF = DATA / "bftrainer"
JOBS10 = (BF / "hps-shufflenet-Jbnd-10J.csv", BF / "hps-shufflenet-JNPs-10J.csv")
JOBS1000 = (BF / "hps-shufflenet-Jbnd-1000J.csv", BF / "hps-shufflenet-JNPs-1000J.csv")
KTH = DATA / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz"
THETA = DATA / "cobalt" / "theta-2022-2023.csv.gz"


def _theta_slice(tmp: Path, rows: int = 3000) -> Path:
    """The bundled Theta log's first ``rows`` jobs, named so the reader knows Theta's 4,392 nodes."""
    with gzip.open(THETA, "rt") as f:
        lines = [next(f) for _ in range(rows + 1)]
    path = tmp / "theta-slice.csv"
    path.write_text("".join(lines))
    return path


# -- the node-by-node references ---------------------------------------------------------------------------------


def node_by_node_timeline(path: Path, machine: int | None = None, start: float | None = None,
                          skip_warmup: bool = False) -> tuple[PoolTimeline, dict[str, int], dict[str, object]]:
    """A log's pool as it was built before issue 17: ``FirstFit`` node by node, one mark per node change, the
    marks netted per (node, second) by ``_timeline``. Sizes and start come from the run-based notes."""
    notes = timeline_from_log(path, machine).notes
    jobs = list(open_trace(path))
    cpn, m = int(notes["cores_per_node"]), int(notes["machine_nodes"])  # type: ignore[call-overload]
    runs, skipped = reference_runs(((j.start, j.end, j.nodes, j.procs) for j in jobs), cpn)
    first = min(s for s, _, _ in runs)
    ff = place_first_fit(runs, m, cpn, skipped)
    bt, bl = busy_steps(ff.times, ff.deltas)
    start = first if start is None else start
    warm = warmup_check(bt, bl, start)
    if skip_warmup:
        start = float(warm["warmup_end"])  # type: ignore[arg-type]
    times = np.concatenate([np.full(m, first), np.array(ff.times, dtype=float)])
    deltas = np.concatenate([np.ones(m, dtype=np.int8), np.array(ff.deltas, dtype=np.int8)])
    idx = np.concatenate([np.arange(m), np.array(ff.nodes, dtype=np.int64)])
    return _timeline(times, deltas, idx, NumberedNodes(m), start), skipped, warm


def node_by_node_map(jobs: Sequence[MilpJob], pool: Sequence[str],
                     counts: Sequence[int]) -> dict[str, tuple[str, ...]]:
    """``map_nodes`` as it was before issue 17 (lists of node names; O(pool) per growing job)."""
    held = {n for s in jobs for n in s.nodes}
    free = [n for n in pool if n not in held]
    released: list[str] = []
    out: dict[str, tuple[str, ...]] = {}
    growing: list[tuple[MilpJob, int]] = []
    for s, want in zip(jobs, counts, strict=True):
        if want <= s.count:
            out[s.job.id] = s.nodes[:want]
            released.extend(s.nodes[want:])
        else:
            out[s.job.id] = s.nodes
            growing.append((s, want))
    free.extend(released)
    growing.sort(key=lambda sw: not sw[0].lost)
    taken: set[str] = set()
    for s, want in growing:
        extra = [n for n in free if n not in taken and n not in s.lost][: want - s.count]
        if s.count + len(extra) < s.job.jmin:
            out[s.job.id] = ()
            free.extend(s.nodes)
            continue
        taken.update(extra)
        out[s.job.id] = s.nodes + tuple(extra)
    return out


class NodePool:
    """The idle pool as the node-by-node replayer kept it: a dict of nodes in join order (longest idle first)."""

    def __init__(self) -> None:
        self.joined: dict[int, float | None] = {}

    @property
    def size(self) -> int:
        return len(self.joined)

    def add(self, runs: Sequence[Run], now: float | None, names: Sequence[str]) -> None:
        for lo, hi in runs:
            for x in range(lo, hi):
                assert x not in self.joined
                self.joined[x] = now

    def remove(self, a: int, b: int) -> list[tuple[int, int, float | None]]:
        return [(x, x + 1, self.joined.pop(x)) for x in range(a, b) if x in self.joined]

    def covers(self, a: int, b: int) -> bool:
        return all(x in self.joined for x in range(a, b))

    def walk(self) -> Iterator[Run]:
        return ((x, x + 1) for x in self.joined)


def _same(a: PoolTimeline, b: PoolTimeline) -> None:
    assert a.initial == b.initial
    assert a.start == b.start and a.end == b.end
    assert len(a.events) == len(b.events)
    for x, y in zip(a.events, b.events, strict=True):
        assert (x.time, x.joined, x.left) == (y.time, y.joined, y.left)


def _digest(res: ReplayResult) -> str:
    """Every event row but its timing column, every job's outcome and progress: the whole trajectory."""
    rows = [tuple(v for i, v in enumerate(e) if i != 14) for e in res.events]
    jobs = [(r.job_id, r.start, r.end, r.nodes, r.node_seconds) for r in res.jobs]
    return hashlib.sha256(repr((rows, jobs, res.per_job)).encode()).hexdigest()[:16]


# -- log placement and events ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["theta-slice", "kth", "kth-start", "kth-skip-warmup", "alea"])
def test_log_timelines_equal_the_node_by_node_ones_on_real_logs(tmp_path: Path, case: str) -> None:
    path = {"theta-slice": _theta_slice(tmp_path), "alea": DATA / "swf" / "alea-wagap-2013.swf.gz"}.get(case, KTH)
    kw: dict[str, object] = {}
    if case == "kth-start":
        kw["start"] = 850_000_000.0
    if case == "kth-skip-warmup":
        kw["skip_warmup"] = True
    new = timeline_from_log(path, **kw)  # type: ignore[arg-type]
    ref, skipped, warm = node_by_node_timeline(path, **kw)  # type: ignore[arg-type]
    _same(new, ref)
    assert new.notes["skipped_no_room"] == skipped["no_room"]
    assert {k: v for k, v in new.notes["warmup"].items() if k != "skipped_from"} == warm  # type: ignore[union-attr]


# -- mapping and the pool ----------------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_mapping_over_runs_equals_the_node_by_node_mapping(seed: int) -> None:
    """Random holdings, exclusions (some on nodes outside the pool), shrinks, growths and Jmin failures."""
    rng = random.Random(seed)
    n = rng.randint(0, 30)
    names = [f"x{k}" for k in range(n + 5)]
    rng.shuffle(names)
    pool, outside = names[:n], names[n:]
    free = list(pool)
    rng.shuffle(free)
    states, counts = [], []
    for j in range(rng.randint(1, 5)):
        c = rng.randint(0, min(6, len(free)))
        held, free = tuple(free[:c]), free[c:]
        if rng.random() < 0.1 and outside:
            held += (outside.pop(),)
        lost = frozenset(rng.sample(names, rng.randint(0, 3))) - set(held) if rng.random() < 0.4 else frozenset()
        jmin = rng.randint(1, 3)
        jmax = rng.randint(jmin, 10)
        job = ElasticJob(f"j{j}", 0.0, jmin, jmax, ScalingCurve((0.0, 1.0), (0.0, 1.0)), 10.0, 1.0, 1.0)
        states.append(MilpJob(job, held, lost))
        counts.append(rng.choice([0, rng.randint(jmin, jmax)]))
    assert map_nodes(states, tuple(pool), counts) == node_by_node_map(states, tuple(pool), counts)


@pytest.fixture(scope="module")
def forty() -> tuple[list[ElasticJob], PoolTimeline]:
    nodes = read_node_order(BF / "node-order.txt")[:40]
    jobs = read_elastic_jobs(*JOBS10)
    return jobs, timeline_from_intervals(read_idle_intervals(BF / "idle-intervals.csv.gz"), nodes,
                                         start=min(j.submit for j in jobs))


@pytest.fixture(scope="module")
def theta(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[ElasticJob], PoolTimeline]:
    tl = timeline_from_log(_theta_slice(tmp_path_factory.mktemp("theta")))
    jobs, _ = shift_into_log(read_elastic_jobs(*JOBS1000)[:100], tl.start, tl.end)
    return jobs, tl


CONFIGS = {
    "dp 1": ReplayConfig(tfwd=1.0, solver="dp"),
    "dp 10": ReplayConfig(tfwd=10.0, solver="dp"),
    "dp 60": ReplayConfig(tfwd=60.0, solver="dp"),
    "dp 300": ReplayConfig(tfwd=300.0, solver="dp"),
    "predicted, exact, restart": ReplayConfig(tfwd=10.0, solver="dp", predict_tfwd=True, exact_events=True,
                                              accounting="restart"),
    "greedy 60": ReplayConfig(tfwd=60.0, solver="greedy"),
}
# The node-by-node replayer (commit e7b3392: a dict of node names as the pool, map_nodes over name lists) on the
# same inputs: utilisation, decisions, rescales, preemptions, samples lost to preemption and _digest of the run.
NODE_BY_NODE = {
    ("forty", "dp 1"): (0.8490223325400917, 575, 469, 474, 22492335.45, "69c704c02de17050"),
    ("forty", "dp 10"): (0.9618614934548445, 567, 472, 464, 24148714.499999993, "70f506e633860ecd"),
    ("forty", "dp 60"): (0.9976072770813186, 563, 498, 470, 25178812.799999997, "8ffd7b8ed70aa30e"),
    ("forty", "dp 300"): (1.0, 563, 552, 472, 26457792.45, "52ef4e30f43dffad"),
    ("forty", "predicted, exact, restart"): (0.9915018144144342, 581, 558, 471, 0.0, "e61e0f9f314e00df"),
    ("theta", "dp 10"): (0.8229145554492868, 51, 231, 150, 196185546.90000004, "c8819259a358e6e6"),
    ("theta", "predicted, exact, restart"): (0.6972566245888869, 134, 198, 84, 0.0, "c32f67e18761f9ea"),
    ("theta", "greedy 60"): (0.833333183013857, 37, 208, 103, 130652680.5, "1874beac23fd8645"),
}


@pytest.mark.parametrize(("data", "config"), list(NODE_BY_NODE))
def test_replays_give_the_node_by_node_replayers_figures_bit_for_bit(data: str, config: str, forty, theta) -> None:
    """The BFTrainer points (40 nodes, DP: 0.849 / 0.962 / 0.998 / 1.000 in bench/RESULTS.md) and a Theta slice
    with 100 elastic jobs: every event row, job and figure as the node-by-node replayer gave them."""
    jobs, tl = forty if data == "forty" else theta
    res = replay(tl, jobs, CONFIGS[config])
    s = res.summary
    got = (s["utilization"], s["decisions"], s["rescales"], s["preemptions"], s["samples_lost_preemption"],
           _digest(res))
    assert got == NODE_BY_NODE[(data, config)]


@pytest.mark.parametrize("data", ["forty", "theta"])
def test_the_run_pool_hands_out_nodes_as_a_node_by_node_pool(data: str, forty, theta,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The same replay with the pool swapped for a dict of single nodes (join order, as before issue 17)."""
    jobs, tl = forty if data == "forty" else theta
    config = ReplayConfig(tfwd=10.0, solver="dp", predict_tfwd=True)
    runs = replay(tl, jobs, config)
    monkeypatch.setattr(replay_mod, "IdleRuns", NodePool)
    nodes = replay(tl, jobs, config)
    assert _digest(runs) == _digest(nodes) and runs.summary["preemptions"] > 0


def test_a_timeline_of_named_nodes_replays_as_its_runs(forty) -> None:
    """PoolEvents holding tuples of names (a hand-made or live timeline) take the same path to the same result."""
    jobs, tl = forty
    named = PoolTimeline(tl.start, tuple(tl.initial), [PoolEvent(e.time, tuple(e.joined), tuple(e.left))
                                                       for e in tl.events], tuple(tl.nodes), tl.end)
    config = ReplayConfig(tfwd=60.0, solver="dp")
    assert _digest(replay(named, jobs, config)) == _digest(replay(tl, jobs, config))


def test_a_timeline_that_adds_an_idle_node_or_removes_a_busy_one_is_refused() -> None:
    job = ElasticJob("j", 0.0, 1, 4, ScalingCurve((1.0, 4.0), (1.0, 4.0)), 4000.0, 0.0, 0.0)
    nodes = ("a", "b", "c")
    twice = PoolTimeline(0.0, ("a", "b"), [PoolEvent(10.0, ("b",), ())], nodes, 10.0)
    with pytest.raises(ValueError, match="node b joins the idle pool at 10.0 but is already in it"):
        replay(twice, [job], ReplayConfig(solver="dp"))
    busy = PoolTimeline(0.0, ("a",), [PoolEvent(10.0, (), ("c",))], nodes, 10.0)
    with pytest.raises(ValueError, match="leave the idle pool at 10.0 but were not in it"):
        replay(busy, [job], ReplayConfig(solver="dp"))


def test_node_runs_stand_for_tuples_of_names() -> None:
    names = NumberedNodes(100)
    runs = NodeRuns([(3, 5), (0, 1)], names)
    assert runs == ("n00003", "n00004", "n00000") and len(runs) == 3 and runs[-1] == "n00000"
    assert runs[1:] == ("n00004", "n00000") and runs != ("n00003",)
    assert runs == NodeRuns([(3, 4), (4, 5), (0, 1)], names)
    assert names.index("n00042") == 42 and "n00100" not in names and names[99] == "n00099"
    assert runs_of([5, 6, 7, 2, 3, 9]) == [(5, 8), (2, 4), (9, 10)]


# -- cost follows jobs and events, not nodes -----------------------------------------------------------------------


def _peak(fn):  # type: ignore[no-untyped-def]
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_log_costs_the_same_on_a_thousand_and_on_ten_million_nodes(tmp_path: Path) -> None:
    """The same 3,000 Theta jobs on 4,392 and on 10,000,000 nodes: the same events, runs and memory, give or
    take the one run of nodes no job ever reaches (node by node, the big machine was 2,300x the work)."""
    log = _theta_slice(tmp_path)
    small, small_peak = _peak(lambda: timeline_from_log(log, 4392))
    big, big_peak = _peak(lambda: timeline_from_log(log, 10_000_000))
    assert isinstance(big.events, RangeEvents) and isinstance(big.nodes, NumberedNodes)
    assert len(big.events) == len(small.events)
    for part in ("joined", "left"):
        assert [a.size for a in getattr(big.events, part)] == [a.size for a in getattr(small.events, part)]
    assert isinstance(big.initial, NodeRuns) and len(big.initial.runs) <= len(small.initial.runs) + 1
    assert len(big.initial) == len(small.initial) + 10_000_000 - 4392
    assert big_peak < small_peak + 1_000_000  # bytes; one name per node alone would be 600 MB
    jobs, _ = shift_into_log(read_elastic_jobs(*JOBS10), small.start, small.end)
    for tl in (small, big):
        state = replay_mod._Replay(tl, jobs, ReplayConfig(tfwd=10.0, solver="dp"))
        state.run(None)
        # the pool is runs: at most those that joined it, plus one per run that left from inside one of them
        bound = len(tl.initial.runs) + len(tl.events.joined[1]) + len(tl.events.left[1])  # type: ignore[attr-defined]
        assert len(state.pool.starts) <= bound


def test_replay_memory_does_not_follow_the_machine_size(tmp_path: Path) -> None:
    log = _theta_slice(tmp_path, 1000)
    config = ReplayConfig(tfwd=10.0, solver="dp")
    peaks = []
    for machine in (4392, 5_000_000):
        tl = timeline_from_log(log, machine)
        jobs, _ = shift_into_log(read_elastic_jobs(*JOBS10), tl.start, tl.end)
        res, peak = _peak(lambda tl=tl, jobs=jobs: replay(tl, jobs, config))  # type: ignore[misc]
        assert res.summary["decisions"] > 0
        peaks.append(peak)
    assert peaks[1] < peaks[0] + 1_000_000


def test_run_replay_reports_progress_over_the_events(tmp_path: Path) -> None:
    from hpcsched.harvest.run import ReplayRequest, run_replay

    seen: list[tuple[int, int]] = []
    req = ReplayRequest(*JOBS10, log=KTH, config=ReplayConfig(solver="dp"))
    run = run_replay(req, tmp_path / "out", progress=lambda k, n: seen.append((k, n)))
    total = len(run.timeline.events)
    assert seen[0] == (0, total) and seen[-1] == (total, total)
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:], strict=False))
