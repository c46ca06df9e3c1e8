"""Pool events with no elastic job to decide for are replayed in bulk (``hpcsched.harvest.quiet_gap``): the rows,
jobs and summary are those of the per-event walk, on a log whose elastic jobs leave long stretches without a job
(before the first submit, between one job's end and the next submit, after the last)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hpcsched.harvest.quiet_gap as qg
import hpcsched.harvest.replay as rp
from hpcsched.harvest.idle_runs import IdleRuns
from hpcsched.harvest.pool import NumberedNodes, PoolTimeline, RangeEvents, timeline_from_log
from hpcsched.harvest.replay import ReplayConfig, ReplayResult, replay
from hpcsched.milp.mapping import NodeRuns
from hpcsched.model import ElasticJob, ScalingCurve

SOLVE_S = 14  # the events' solve_s column: timing, the one value the two walks may differ in


def _log(path: Path, n: int = 1500, seed: int = 5) -> Path:
    """A seeded SWF of ``n`` jobs on a 48-node, 2-core machine: sizes 1-40 procs, so nodes go idle, partly used and
    full, and many seconds change the pool."""
    rng = np.random.default_rng(seed)
    submit = np.cumsum(rng.integers(0, 600, n))
    run = rng.integers(1, 3000, n)
    procs = rng.integers(1, 41, n)
    minus = -np.ones(n, dtype=np.int64)
    cols = [np.arange(1, n + 1), submit, rng.integers(0, 300, n), run, procs, minus, minus, procs, run + 60, minus,
            np.ones(n, dtype=np.int64), np.ones(n, dtype=np.int64), minus, minus, np.ones(n, dtype=np.int64), minus,
            minus, minus]
    with path.open("w") as f:
        f.write("; Version: 2.2\n; UnixStartTime: 1600000000\n; MaxNodes: 48\n; MaxProcs: 96\n")
        np.savetxt(f, np.column_stack(cols), fmt="%d")
    return path


def _fractional(tl: PoolTimeline) -> PoolTimeline:
    """The log's timeline with every time stretched off whole seconds, so the idle node-seconds are inexact sums
    and their order of addition shows."""
    ev = tl.events
    assert isinstance(ev, RangeEvents) and len(ev) > 500

    def f(t: float) -> float:  # from 17 s on (an epoch's ~2e-7 s resolution would keep these sums exact)
        return (t - tl.start) * 1.3713 + 17.123

    return PoolTimeline(f(tl.start), tl.initial, RangeEvents(f(ev.times), ev.joined, ev.left, ev.names), tl.nodes,
                        f(tl.end))


def _random(seed: int, nodes: int = 64, events: int = 1500) -> PoolTimeline:
    """A seeded pool that changes at every event by a few random nodes leaving and joining: a pool of many
    batches, fragmented, so the order nodes are handed out in shows."""
    rng = np.random.default_rng(seed)
    names = NumberedNodes(nodes)
    idle = np.ones(nodes, dtype=bool)
    times, joined, left = [], [], []

    def runs(x: np.ndarray) -> list[tuple[int, int]]:
        x = np.sort(x)
        return [(int(p[0]), int(p[-1]) + 1) for p in np.split(x, np.flatnonzero(np.diff(x) != 1) + 1) if len(p)]

    for k in range(events):
        times.append(10.0 + k * 7.31 + float(rng.random()))
        go = np.flatnonzero(idle & (rng.random(nodes) < 0.04))  # about half the machine idle
        come = np.flatnonzero(~idle & (rng.random(nodes) < 0.04))
        idle[go], idle[come] = False, True
        joined.append(runs(come))
        left.append(runs(go))
    return PoolTimeline(5.0, NodeRuns([(0, nodes)], names), RangeEvents.build(times, joined, left, names), names,
                        times[-1])


def _jobs(tl: PoolTimeline, pmax: float) -> list[ElasticJob]:
    """Jobs submitted at 30%, 55% (two) and 90% of the timeline, of ``pmax`` samples and more: preempted often (the
    nodes a job is handed, the pool's order, decide which), most done before the next arrive."""
    span = tl.end - tl.start
    curve = ScalingCurve((0.0, 1.0, 2.0, 4.0, 8.0), (0.0, 10.0, 19.0, 35.0, 60.0))
    at = [0.30, 0.55, 0.55, 0.90]
    return [ElasticJob(f"j{i}", tl.start + f * span, 1, 8, curve, pmax * (1 + i), 4.0, 3.0)
            for i, f in enumerate(at)]


def _without_timing(res: ReplayResult) -> tuple[list[str], object, object, dict[str, object]]:
    rows = [repr(r[:SOLVE_S] + r[SOLVE_S + 1:]) for r in res.events]  # repr: the types too (an int 0 rate stays int)
    summary = {k: v for k, v in res.summary.items() if k != "solve_seconds"}
    return rows, res.jobs, res.per_job, summary


def _timeline(kind: str, tmp_path: Path) -> PoolTimeline:
    return _fractional(timeline_from_log(_log(tmp_path / "log.swf"))) if kind == "log" else _random(11)


@pytest.mark.parametrize("kind,cfg", [("log", ReplayConfig()), ("random", ReplayConfig()),
                                      ("log", ReplayConfig(solver="dp", exact_events=True, tfwd=10)),
                                      ("random", ReplayConfig(solver="dp", no_pause=True, max_jobs=2))],
                         ids=["log", "random", "log-exact-int-tfwd", "random-no-pause-small-cache"])
def test_bulk_stretches_give_the_per_event_replay(kind: str, cfg: ReplayConfig, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    tl = _timeline(kind, tmp_path)
    jobs = _jobs(tl, 150_000.0 if kind == "log" else 30_000.0)
    if cfg.no_pause:  # the decisions' cache emptied again and again, inside bulk stretches too
        monkeypatch.setattr(rp, "CACHE_LIMIT", 3)
    monkeypatch.setattr(qg, "MIN_EVENTS", 10**9)
    walked = replay(tl, jobs, cfg)
    bulk_events = []
    real = rp.replay_quiet

    def counted(*args, **kw):  # type: ignore[no-untyped-def]
        got = real(*args, **kw)
        if got is not None:
            bulk_events.append(len(got.times))
        return got

    monkeypatch.setattr(rp, "replay_quiet", counted)
    monkeypatch.setattr(qg, "MIN_EVENTS", 2)
    monkeypatch.setattr(qg, "MAX_EVENTS", 97)  # long stretches in several passes
    bulk = replay(tl, jobs, cfg)
    assert _without_timing(bulk) == _without_timing(walked)
    if type(cfg.tfwd) is int:  # an int in a float column reads back as itself (it read back as 0)
        assert {(type(r[13]), r[13]) for r in bulk.events if r[-1] != "finished"} == {(int, cfg.tfwd)}
    assert walked.summary["jobs_done"] >= 1 and walked.summary["preemptions"] > 20
    # most events had no job: they went in bulk, in passes of at most MAX_EVENTS
    assert sum(bulk_events) > 0.5 * len(walked.events) and max(bulk_events) <= 97 and len(bulk_events) > 4


def _walk(pool: IdleRuns) -> list[tuple[float | None, list[tuple[int, int]]]]:
    """The pool in hand-out order: each batch's join time and runs."""
    return [(pool.joined_at[b], [(lo, pool.run[lo][0]) for lo in los]) for b, los in pool.batches.items()]


@pytest.mark.parametrize("kind,a,b", [("log", 0, 400), ("log", 300, 700), ("random", 0, 500),
                                      ("random", 57, 301), ("random", 600, 1500)])
def test_a_bulk_stretch_leaves_the_pool_the_walk_leaves(kind: str, a: int, b: int, tmp_path: Path) -> None:
    """The idle pool after events a..b-1, one by one (the walk's remove, then add) and in bulk: the same batches in
    the same order with the same join times and runs (the nodes a job is handed next), and the same counts."""
    tl = _timeline(kind, tmp_path)
    ev = tl.events
    assert isinstance(ev, RangeEvents)
    one, bulk = IdleRuns(), IdleRuns()
    for pool in (one, bulk):
        pool.add(list(tl.initial.runs), None, tl.nodes)  # type: ignore[attr-defined]
        for k in range(a):
            t, joined, left = ev.runs(k)
            for lo, hi in left:
                pool.remove(lo, hi)
            pool.add(joined, t, tl.nodes)
    sizes = []
    for k in range(a, b):
        t, joined, left = ev.runs(k)
        for lo, hi in left:
            one.remove(lo, hi)
        one.add(joined, t, tl.nodes)
        sizes.append(one.size)
    got = qg.replay_quiet(ev, a, b, float(ev.times[a - 1]) if a else tl.start, 0.0, bulk, len(tl.nodes))
    assert got is not None
    assert _walk(bulk) == _walk(one) and len(_walk(one)) > (0 if kind == "log" else 5)
    assert got.size.tolist() == sizes and bulk.size == one.size


def test_an_inconsistent_stretch_is_left_to_the_walk_and_its_error() -> None:
    """A hand-made timeline where node 3 joins while idle in the middle of a quiet stretch: the walk's error, at
    that event, not a bulk pool that silently differs."""
    names = NumberedNodes(8)
    times, joined, left = [], [], []
    for k in range(200):
        times.append(100.0 + k)
        if k == 120:
            joined.append([(3, 4)])  # node 3 is idle already (it left at 118 and came back at 119)
            left.append([])
        else:
            joined.append([(3, 4)] if k % 2 else [])
            left.append([] if k % 2 else [(3, 4)])
    tl = PoolTimeline(100.0, NodeRuns([(0, 8)], names), RangeEvents.build(times, joined, left, names), names, 400.0)
    job = ElasticJob("late", 350.0, 1, 2, ScalingCurve((0.0, 1.0, 2.0), (0.0, 1.0, 2.0)), 10.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="n00003 joins the idle pool at 220.0 but is already in it"):
        replay(tl, [job], ReplayConfig(solver="dp"))
