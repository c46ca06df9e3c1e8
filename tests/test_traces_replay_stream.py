"""``replay --log`` on a large log in bounded memory: the log read into arrays (a clean SWF by columns) and first
fit's changes netted per second into flat arrays (``hpcsched.harvest.log_stream``) give the node-by-node answer,
whichever way the log was read, and memory grows by a few dozen bytes a job, not by Python objects per job."""

from __future__ import annotations

import random
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from first_fit_oracle import place_first_fit, reference_runs
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcsched.harvest.log_checks import busy_steps
from hpcsched.harvest.log_stream import LogRuns, busy_of, peak, place_stream, sized
from hpcsched.harvest.pool import NumberedNodes, _timeline, pool_at, timeline_from_log

ROOT = Path(__file__).resolve().parents[1]
KTH = ROOT / "trace-data" / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz"
sys.path.insert(0, str(ROOT / "bench"))


def _events(tl):  # type: ignore[no-untyped-def]
    return [(e.time, tuple(e.joined), tuple(e.left)) for e in tl.events]


@settings(max_examples=300, deadline=None)
@given(cpn=st.sampled_from([1, 2, 3, 4, 8]), machine=st.integers(1, 12), seed=st.integers(0, 10**6),
       n=st.integers(1, 30), later=st.integers(0, 30))
def test_streamed_first_fit_gives_the_node_by_node_pool(cpn: int, machine: int, seed: int, n: int,
                                                        later: int) -> None:
    """Random jobs (some without times, 0 s or size, some too big): the same skips, busy steps, idle pool at
    the start and every netted event as the node-by-node first fit."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        s = float(rng.randint(0, 40))
        e = s + rng.choice([0, rng.randint(1, 15), rng.randint(1, 15)])
        rows.append((s if rng.random() > 0.05 else np.nan, e, rng.randint(0, machine + 1),
                     rng.randint(0, cpn * machine + 2)))
    log = LogRuns(*(np.array(c, dtype=t) for c, t in zip(zip(*rows, strict=True),
                                                         (float, float, np.int64, np.int64), strict=True)))
    start, end, size, skipped = sized(log, cpn)
    ref_runs, ref_skip = reference_runs(rows, cpn)
    assert skipped == ref_skip
    if not ref_runs:
        assert len(start) == 0
        return
    ff = place_first_fit(list(ref_runs), machine, cpn, ref_skip)
    sec = place_stream(start, end, size, machine, cpn, skipped)
    assert skipped == ref_skip
    levels = np.cumsum([k for _, _, k in sorted(ref_runs)])
    assert peak(start, end, size) >= 0 and peak(start, end, size) <= levels[-1]
    bt, bl = busy_steps(ff.times, ff.deltas)
    rt, rl = busy_of(sec, machine)
    assert np.array_equal(bt, rt) and np.array_equal(bl, rl)
    first = float(start[0])
    names = NumberedNodes(machine)
    at = first + later
    times = np.concatenate([np.full(machine, first), np.array(ff.times, dtype=float)])
    deltas = np.concatenate([np.ones(machine, dtype=np.int8), np.array(ff.deltas, dtype=np.int8)])
    idx = np.concatenate([np.arange(machine), np.array(ff.nodes, dtype=np.int64)])
    ref = _timeline(times, deltas, idx, names, at)
    initial, events = pool_at(sec, at, names)
    assert initial == ref.initial
    assert [(e.time, e.joined, e.left) for e in events] == [(e.time, e.joined, e.left) for e in ref.events]


def test_peak_use_counts_ends_before_starts_at_one_second() -> None:
    s, e, k = np.array([0.0, 0.0, 10.0, 10.0]), np.array([10.0, 20.0, 30.0, 15.0]), np.array([3, 2, 4, 1])
    assert peak(s, e, k) == 7  # at 10: job 1 (3) has left, jobs 2, 3, 4 hold 2 + 4 + 1


def test_columns_and_rows_give_the_same_replay_pool_on_a_real_log() -> None:
    """The real KTH SP2 log, read by columns (the clean-SWF path) and row by row: the same pool, events, notes."""
    by_cols = timeline_from_log(KTH)
    by_rows = timeline_from_log(KTH, options={"rows": True})
    assert by_cols.notes == by_rows.notes
    assert by_cols.initial == by_rows.initial and _events(by_cols) == _events(by_rows)
    assert by_cols.notes["log_jobs"] == 28_476 and len(by_cols.events) > 10_000


def test_a_large_log_costs_bytes_a_job_not_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SWF logs of 60,000 and 180,000 rows (the bench's generator; 20,000-row parser chunks so both read alike):
    what Python and numpy hold at the peak of building the pool grows by under 80 bytes a job (the arrays are
    24-48; one tuple per job and per mark, as before, was ~200), and the figures equal the row reader's."""
    from bench_traces import write_big_swf

    from hpcsched.traces import swf_columns

    monkeypatch.setattr(swf_columns, "_RUNS_CHUNK", 20_000)
    peaks = []
    for n in (60_000, 180_000):
        log = write_big_swf(n, tmp_path / f"big{n}.swf")
        tracemalloc.start()
        try:
            tl = timeline_from_log(log)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert tl.notes["log_jobs"] == n
        assert tl.notes["log_jobs_placed"] + tl.notes["skipped_no_room"] == n
        assert tl.notes["cores_per_node"] == 8 and tl.notes["machine_nodes"] == 4096
    growth = (peaks[1] - peaks[0]) / 120_000
    assert growth < 80, f"{growth:.0f} bytes a job"
    rows = timeline_from_log(log, options={"rows": True})
    assert rows.notes == tl.notes and len(rows.events) == len(tl.events)


# sacct -P of a 3-node, 32-core machine: four 8-CPU jobs fill c1 for 2 h, a 64-CPU job holds c[2-3]; then one
# 16-CPU job uses half of c2 for 2 h and one 8-CPU job a quarter of c3 for the first of those hours.
SHARED = """JobID|Partition|Submit|Start|End|ElapsedRaw|NNodes|NCPUS|State|NodeList
1|p|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T02:00:00|7200|1|8|COMPLETED|c1
2|p|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T02:00:00|7200|1|8|COMPLETED|c1
3|p|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T02:00:00|7200|1|8|COMPLETED|c1
4|p|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T02:00:00|7200|1|8|COMPLETED|c1
5|p|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T02:00:00|7200|2|64|COMPLETED|c[2-3]
6|p|2021-01-01T02:00:00|2021-01-01T02:00:00|2021-01-01T04:00:00|7200|1|16|COMPLETED|c2
7|p|2021-01-01T02:00:00|2021-01-01T02:00:00|2021-01-01T03:00:00|3600|1|8|COMPLETED|c3
"""


def test_sacct_nodes_are_idle_partly_used_or_full_and_the_replay_says_so(tmp_path: Path) -> None:
    """00:00-02:00 every node full; 02:00-03:00 job 6 on c2 and job 7 on c3, as the log names them: two nodes
    partly used, c1 idle; 03:00-04:00 job 6 alone: one node partly used, two idle; then all idle."""
    import json
    import subprocess

    log = tmp_path / "shared.sacct"
    log.write_text(SHARED)
    tl = timeline_from_log(log)
    assert (tl.notes["machine_nodes"], tl.notes["cores_per_node"]) == (3, 32)
    partly = tl.notes["partly_used_nodes"]
    assert partly["peak_nodes"] == 2 and partly["node_hours"] == pytest.approx(3.0)  # type: ignore[index]
    assert partly["mean_nodes"] == pytest.approx(0.75)  # type: ignore[index]  # 3 node-h over the 4 h replayed
    idle = set(tl.initial)
    seen = []
    for e in tl.events:
        idle = (idle | set(e.joined)) - set(e.left)
        seen.append((e.time - tl.start, len(idle)))
    assert seen == [(7200.0, 1), (10800.0, 2), (14400.0, 3)]  # a partly used node joins the pool once empty
    out = tmp_path / "r"
    p = subprocess.run([sys.executable, "-m", "hpcsched.cli", "replay", "--log", str(log), "--jobs",
                        str(ROOT / "trace-data/bftrainer/hps-shufflenet-Jbnd-10J.csv"), "--curves",
                        str(ROOT / "trace-data/bftrainer/hps-shufflenet-JNPs-10J.csv"), "--out", str(out), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    said = json.loads(p.stdout)
    assert said["nodes"] == 3
    assert any("partly used" in n and "up to 2 nodes" in n and "3.0 node-h" in n for n in said["notes"]), said["notes"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["partly_used_nodes"]["peak_nodes"] == 2


def test_reading_a_gzipped_log_reports_its_compressed_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real gzipped KTH log, by columns (5,000-row chunks) and by rows: progress climbs through the
    compressed file's bytes to its size (the uncompressed size is unknown), then first fit counts the jobs."""
    from hpcsched.traces import swf_columns

    monkeypatch.setattr(swf_columns, "_RUNS_CHUNK", 5_000)
    size = KTH.stat().st_size
    for options in ({}, {"rows": True}):
        seen: list[tuple[int, int, str]] = []
        tl = timeline_from_log(KTH, options=options, progress=lambda d, n, what, seen=seen: seen.append((d, n, what)))
        read = [(d, n) for d, n, what in seen if what.startswith("reading KTH")]
        placed = [(d, n) for d, n, what in seen if what.startswith("first fit")]
        assert len(read) >= 3, options
        assert all(n == size for _, n in read) and read[-1][0] == size and 0 < read[0][0] < size
        assert [d for d, _ in read] == sorted(d for d, _ in read)
        jobs = tl.notes["log_jobs"] - tl.notes["skipped_no_times"] - tl.notes["skipped_zero_run"]  # type: ignore[operator]
        assert placed and placed[-1] == (jobs - tl.notes["skipped_no_size"], placed[-1][1])  # type: ignore[operator]
        assert placed[-1][0] == placed[-1][1]


@settings(max_examples=400, deadline=None)
@given(up=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 4)), max_size=5),
       down=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 4)), max_size=5), whole=st.booleans())
def test_a_seconds_marks_net_as_their_spans_do(up: list[tuple[int, int]], down: list[tuple[int, int]],
                                               whole: bool) -> None:
    """``net_marks``' sweep against the sets it stands for: joined = went idle less taken, left = taken less
    released, as merged runs; None exactly where a node went idle twice or busy twice."""
    from hpcsched.harvest.log_stream import net_marks
    from hpcsched.milp.mapping import Spans

    ups = [(a, a + n) for a, n in up] + ([(0, 25)] if whole else [])
    downs = [(a, a + n) for a, n in down]
    marks = [(7.0, 1, a, b) for a, b in ups[:len(up)]] + [(7.0, -1, a, b) for a, b in downs]
    got = net_marks(marks, [(0, 25)] if whole else [])
    su, sd = Spans(ups), Spans(downs)
    if len(su) != sum(b - a for a, b in ups) or len(sd) != sum(b - a for a, b in downs):
        assert got is None
        return
    assert got == ([r for a, b in su.runs() for r in sd.minus(a, b)], [r for a, b in sd.runs() for r in su.minus(a, b)])
