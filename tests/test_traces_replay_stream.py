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
from first_fit_oracle import place_first_fit
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
    ref_runs = []
    ref_skip = {"no_times": 0, "zero_run": 0, "no_size": 0, "no_room": 0, "truncated": 0}
    for s, e, nodes, procs in rows:  # harvest.first_fit.sized_runs, row by row
        if np.isnan(s) or e < s:
            ref_skip["no_times"] += 1
        elif e == s:
            ref_skip["zero_run"] += 1
        elif (k := (procs or nodes * cpn) if cpn > 1 else (nodes or procs)) <= 0:
            ref_skip["no_size"] += 1
        else:
            ref_runs.append((s, e, k))
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
