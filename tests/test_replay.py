"""The harvesting replayer: idle-pool events, a real 40-node replay with checkable invariants, the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from first_fit_oracle import FirstFit

from hpcsched.harvest.pool import PoolTimeline, timeline_from_intervals, timeline_from_log
from hpcsched.harvest.replay import ReplayConfig, replay
from hpcsched.milp import Objective
from hpcsched.model import ElasticJob, IdleInterval, ScalingCurve
from hpcsched.results import read_results
from hpcsched.traces.bftrainer import read_elastic_jobs, read_idle_intervals, read_node_order

BF = Path("trace-data/bftrainer")
IDLE = BF / "idle-intervals.csv.gz"
JOBS10 = (BF / "hps-shufflenet-Jbnd-10J.csv", BF / "hps-shufflenet-JNPs-10J.csv")
REFERENCE_UTIL = {1.0: 0.731, 10.0: 0.952}  # BFTrainer's replay, 40 nodes, 10 shufflenet jobs


def test_events_net_out_back_to_back_intervals_and_start_from_the_pool_at_start() -> None:
    ivs = [
        IdleInterval("a", 0, 10), IdleInterval("a", 10, 20),  # a stays idle across 10: no event there
        IdleInterval("b", 5, 15), IdleInterval("c", 12, None), IdleInterval("z", 0, 30),
    ]
    tl = timeline_from_intervals(ivs, nodes=["a", "b", "c"], start=6)
    assert tl.initial == ("a", "b")
    assert [(e.time, e.joined, e.left) for e in tl.events] == [(12, ("c",), ()), (15, (), ("b",)), (20, (), ("a",))]


def test_first_fit_packs_cores_and_reports_node_idle_transitions() -> None:
    ff = FirstFit(nodes=3, cpn=4)
    assert ff.place(6, 1.0) == [(0, 4), (1, 2)]  # a whole node, then the rest on the lowest node with room
    assert ff.place(2, 2.0) == [(1, 2)]  # shares node 1
    assert ff.place(8, 3.0) is None  # only node 2 is whole
    ff.release(1, 2, 4.0)
    ff.release(1, 2, 5.0)  # node 1 idle again only once both jobs left
    assert list(zip(ff.times, ff.deltas, ff.nodes, strict=True)) == [(1.0, -1, 0), (1.0, -1, 1), (5.0, 1, 1)]


def test_log_replay_turns_a_small_swf_into_idle_events(tmp_path: Path) -> None:
    swf = tmp_path / "tiny.swf"
    swf.write_text(
        "; UnixStartTime: 0\n; MaxNodes: 2\n; MaxProcs: 4\n"
        # id submit wait run alloc cpu mem req_procs req_time req_mem status user group exe queue part prev think
        "1 0 0 100 2 -1 -1 2 100 -1 1 1 1 1 1 1 -1 -1\n"
        "2 10 0 50 1 -1 -1 1 100 -1 1 1 1 1 1 1 -1 -1\n"
        "3 20 0 30 2 -1 -1 2 100 -1 1 1 1 1 1 1 -1 -1\n"
    )
    tl = timeline_from_log(swf)
    assert tl.notes["machine_nodes"] == 2 and tl.notes["cores_per_node"] == 2
    assert tl.initial == ("n00001",)  # job 1 holds node 0 from t=0
    # job 2 (1 core) takes node 1 at 10; job 3 (2 cores) finds no whole node and no 2 free cores: skipped
    assert [(e.time, e.joined, e.left) for e in tl.events] == [(10, (), ("n00001",)), (60, ("n00001",), ()),
                                                                (100, ("n00000",), ())]
    assert tl.notes["skipped_no_room"] == 1
    # elastic jobs from another era are moved to the log's start, then harvest its idle node
    from hpcsched.harvest.run import shift_into_log

    jobs, shift = shift_into_log(read_elastic_jobs(*JOBS10), tl.start, tl.end)
    assert jobs[0].submit == tl.start and shift < 0
    res = replay(tl, jobs, ReplayConfig(tfwd=300.0, solver="dp"))
    assert res.summary["idle_node_hours"] == pytest.approx((10 + 40) / 3600)  # n00001 idle 0-10 and 60-100
    assert res.summary["used_node_hours"] <= res.summary["idle_node_hours"]
    assert res.summary["jobs_done"] == 0 and not res.summary["finished"]


@pytest.fixture(scope="module")
def forty() -> tuple:
    nodes = read_node_order(BF / "node-order.txt")[:40]
    jobs = read_elastic_jobs(*JOBS10)
    tl = timeline_from_intervals(read_idle_intervals(IDLE), nodes, start=min(j.submit for j in jobs))
    return nodes, jobs, tl


def _events(res) -> pd.DataFrame:
    from hpcsched.harvest.replay import EVENT_COLUMNS

    return pd.DataFrame(res.events, columns=list(EVENT_COLUMNS))


def test_real_replay_on_40_nodes_meets_reference_and_conserves_work(forty) -> None:
    nodes, jobs, tl = forty
    raw = pd.read_csv(IDLE)
    raw = raw[raw.node.isin(nodes)]
    for tfwd, ref in REFERENCE_UTIL.items():
        res = replay(tl, jobs, ReplayConfig(tfwd=tfwd, solver="dp"))
        s, ev = res.summary, _events(res)
        assert s["finished"] and s["jobs_done"] == 10
        assert s["utilization"] >= ref
        # idle node-hours, recomputed independently from the raw intervals over the replayed span
        end = np.where(raw.idle_end < 0, np.inf, raw.idle_end)
        overlap = np.clip(np.minimum(end, s["end"]) - np.maximum(raw.idle_start, s["start"]), 0, None)
        assert s["idle_node_hours"] == pytest.approx(overlap.sum() / 3600, rel=1e-9)
        # nodes used never exceed the pool; node-seconds per job add up to the used total
        assert (ev.used <= ev.pool).all()
        assert sum(j.node_seconds for j in res.jobs) == pytest.approx(s["used_node_hours"] * 3600, rel=1e-9)
        # work conserved: samples = integral of rate - rescale and preemption losses - work past Pmax
        rate_prev, loss_prev = ev.rate.shift(1).fillna(0), ev.rescale_loss.shift(1).fillna(0)
        produced = (ev.dt * rate_prev - loss_prev - ev.preempt_loss).sum()
        assert s["samples"] + s["samples_past_pmax"] == pytest.approx(produced, rel=1e-9)
        assert s["samples"] == pytest.approx(sum(j.total_samples for j in jobs))
        # held node-time = useful + held past Pmax (jobs finish only at the next pool change: a few %)
        assert s["useful_node_hours"] + s["held_past_pmax_node_hours"] == pytest.approx(s["used_node_hours"])
        assert 0 < s["held_past_pmax_node_hours"] < 0.05 * s["used_node_hours"]
        assert sum(p["node_seconds_past_pmax"] for p in res.per_job) == pytest.approx(
            s["held_past_pmax_node_hours"] * 3600)
        assert s["decisions"] > 0 and s["nonoptimal_decisions"] == 0 and res.nonoptimal_by_status == {}
        for r in res.jobs:
            assert r.status == "completed" and r.start >= r.submit and r.end > r.start
            assert 1 <= r.nodes <= 64


def test_replay_is_deterministic_and_solvers_reach_the_same_decision_value(forty) -> None:
    nodes, jobs, tl = forty
    a = replay(tl, jobs, ReplayConfig(tfwd=60.0, solver="dp"))
    b = replay(tl, jobs, ReplayConfig(tfwd=60.0, solver="dp"))
    timing = {"solve_seconds"}
    assert _events(a).drop(columns="solve_s").equals(_events(b).drop(columns="solve_s"))
    assert {k: v for k, v in a.summary.items() if k not in timing} == {
        k: v for k, v in b.summary.items() if k not in timing}
    assert [(r.start, r.end, r.node_seconds) for r in a.jobs] == [(r.start, r.end, r.node_seconds) for r in b.jobs]
    # HiGHS drives the same replay (a slice, to keep the test fast): every decision is exact, so its
    # per-event objective is the DP's; ties may pick other counts, so only aggregate figures are compared
    part = PoolTimeline(tl.start, tl.initial, tl.events[:120], tl.nodes, tl.events[119].time)
    h = replay(part, jobs, ReplayConfig(tfwd=60.0, solver="highs", time_limit=600))  # a hang guard, not a bound
    d = replay(part, jobs, ReplayConfig(tfwd=60.0, solver="dp"))
    assert set(_events(h).status) == {"optimal"}
    assert h.summary["utilization"] == pytest.approx(d.summary["utilization"], abs=0.02)


def test_extensions_run_and_restart_accounting_charges_starts(forty) -> None:
    _, jobs, tl = forty
    ref = replay(tl, jobs, ReplayConfig(tfwd=60.0, solver="dp", accounting="restart"))
    win = replay(tl, jobs, ReplayConfig(tfwd=60.0, solver="dp", accounting="restart", objective=Objective.WINDOW))
    pred = replay(tl, jobs, ReplayConfig(tfwd=10.0, solver="dp", predict_tfwd=True))
    exact = replay(tl, jobs, ReplayConfig(tfwd=60.0, solver="dp", exact_events=True))
    for r in (ref, win, pred, exact):
        assert r.summary["jobs_done"] == 10
    assert (_events(pred).tfwd > 10.0).any()  # the predictor took over from the fixed window
    # exact completions: no work past Pmax, and the books still balance with the extra decision rows
    s, ev = exact.summary, _events(exact)
    assert abs(s["samples_past_pmax"]) < 1e-6 * s["samples"]
    assert s["held_past_pmax_node_hours"] < 1e-6 * s["used_node_hours"]
    produced = (ev.dt * ev.rate.shift(1).fillna(0) - ev.rescale_loss.shift(1).fillna(0) - ev.preempt_loss).sum()
    assert s["samples"] + s["samples_past_pmax"] == pytest.approx(produced, rel=1e-9)
    pool_times = {e.time for e in tl.events}
    assert any(r.end not in pool_times for r in exact.jobs)  # completions between pool changes
    assert (ev.used <= ev.pool).all()


def test_replay_cli_writes_results_that_calc_reads(tmp_path: Path, forty) -> None:
    from typer.testing import CliRunner

    from hpcsched.cli import app

    nodes = forty[0]
    raw = pd.read_csv(IDLE)  # a slice of the real data: the 40 nodes' intervals, and their order
    idle = tmp_path / "idle.csv"
    raw[raw.node.isin(nodes)].to_csv(idle, index=False)
    (tmp_path / "node-order.txt").write_text("\n".join(nodes) + "\n")
    out = tmp_path / "r"
    args = ["replay", "--idle", str(idle), "--nodes", "40", "--jobs", str(JOBS10[0]), "--curves", str(JOBS10[1]),
            "--tfwd", "10", "--solver", "dp", "--out", str(out), "--json"]
    p = CliRunner().invoke(app, args)
    assert p.exit_code == 0, p.output
    s = json.loads(p.stdout.strip().splitlines()[-1])
    for key in ("events", "jobs_done", "idle_node_hours", "used_node_hours", "utilization", "rescales", "samples"):
        assert key in s
    df, meta = read_results(out)
    assert len(df) == 10 and (df.status == "completed").all()
    assert meta["capacity_node_seconds"] == pytest.approx(s["idle_node_hours"] * 3600)
    from hpcsched.metrics import summarize

    assert summarize(df, meta)["utilization"] == pytest.approx(s["utilization"], rel=1e-6)
    assert len(pd.read_csv(out / "events.csv")) == s["events"] + 1
    assert s["utilization"] >= REFERENCE_UTIL[10.0]


def test_replay_cli_rejects_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "b.csv"
    bad.write_text("job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\nJ00000,18,12,9,4,1000,0\n")
    cmd = [sys.executable, "-m", "hpcsched.cli", "replay", "--idle", str(IDLE), "--jobs", str(bad),
           "--curves", str(JOBS10[1]), "--out", str(tmp_path / "o")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "b.csv:2" in p.stderr and "Traceback" not in p.stderr
    from typer.testing import CliRunner

    from hpcsched.cli import app

    r = CliRunner().invoke(app, cmd[3:4] + ["--log", str(IDLE)] + cmd[4:])
    assert r.exit_code == 2 and "exactly one" in r.output


def test_bad_curves_refused_before_replaying(forty) -> None:
    _, _, tl = forty
    good = ElasticJob("x", tl.start, 1, 4, ScalingCurve((0.0, 1.0), (0.0, 1.0)), 10.0, 1.0, 1.0)
    bad = object.__new__(ElasticJob)
    for f in ElasticJob.__slots__:
        object.__setattr__(bad, f, getattr(good, f))
    object.__setattr__(bad, "jmin", 8)
    with pytest.raises(ValueError, match="Jmin"):
        replay(tl, [bad], ReplayConfig())
    assert math.isfinite(replay(tl, [good], ReplayConfig(solver="dp")).summary["utilization"])


def test_a_small_job_on_epoch_times_completes_when_it_reaches_pmax() -> None:
    """Found by the harvesting end-to-end test's replay (epoch-second times, Pmax 1600 samples at 20/s): the
    completion event landed a hair short of Pmax, closer than the clock can tell apart from the event, so the job
    held its nodes until the next pool change (the end of the data, an hour later) instead of completing."""
    from hpcsched.harvest.replay import replay as run

    t0 = 1795759517.9103096
    rows = [("n1", 1795759521.3396788, 1795759570.0), ("n1", 1795759598.4293692, 1795759622.0),
            ("n1", 1795759644.4293692, t0 + 3600), ("n2", 1795759521.3396788, 1795759539.685329),
            ("n2", 1795759560.666765, 1795759570.0), ("n2", 1795759598.4293692, 1795759622.0),
            ("n2", 1795759644.4293692, t0 + 3600), ("n3", 1795759521.3396788, 1795759622.0),
            ("n3", 1795759644.4293692, t0 + 3600), ("n4", 1795759521.3396788, 1795759622.0),
            ("n4", 1795759644.4293692, t0 + 3600)]
    tl = timeline_from_intervals([IdleInterval(*r) for r in rows], nodes=["n1", "n2", "n3", "n4"], start=t0)
    curve = ScalingCurve((0.0, 1.0, 2.0), (0.0, 10.0, 20.0))
    jobs = [ElasticJob("a", t0, 1, 2, curve, 1600.0, 3.0, 3.0), ElasticJob("b", 1795759517.921099, 1, 2, curve,
                                                                           1600.0, 3.0, 3.0)]
    res = run(tl, jobs, ReplayConfig(tfwd=10.0, exact_events=True))
    ends = {j.job_id: j.end for j in res.jobs}
    assert ends["a"] == pytest.approx(1795759673.189, abs=0.01) and ends["b"] < ends["a"], ends


def test_no_pause_holds_an_admitted_job_at_its_minimum_as_the_controller_does() -> None:
    """Found by the harvesting end-to-end test: when a batch job took both nodes of one of two elastic jobs, the live
    controller ran both at 1 node (core.decide never pauses an admitted job) while the replay, in BFTrainer's model,
    paused the preempted job and kept the other at 2, and the replay's JCT and utilisation drifted 17% from live.
    ``no_pause`` decides as the controller does; the default stays BFTrainer's."""
    from hpcsched.harvest.replay import replay as run

    t0 = 1000.0
    rows = [("n1", t0, t0 + 30.0), ("n2", t0, t0 + 30.001), ("n3", t0, t0 + 600), ("n4", t0, t0 + 600)]
    tl = timeline_from_intervals([IdleInterval(*r) for r in rows], nodes=["n1", "n2", "n3", "n4"], start=t0)
    jobs = [ElasticJob("a", t0, 1, 2, ScalingCurve((0.0, 1.0, 2.0), (0.0, 9.9, 19.16)), 1300.0, 5.18, 5.18),
            ElasticJob("b", t0, 1, 2, ScalingCurve((0.0, 1.0, 2.0), (0.0, 9.93, 19.25)), 1300.0, 3.24, 3.24)]

    def after_the_batch_job(res) -> list[tuple]:  # (pool, used) at the events once n1 and n2 are gone
        ev = _events(res)
        return [(int(r.pool), int(r.used)) for r in ev.itertuples() if t0 + 30.001 <= r.time < t0 + 40]

    paused = run(tl, jobs, ReplayConfig(tfwd=60.0, solver="dp", exact_events=True))
    held = run(tl, jobs, ReplayConfig(tfwd=60.0, solver="dp", exact_events=True, no_pause=True))
    assert after_the_batch_job(paused) == [(2, 2)] and after_the_batch_job(held) == [(2, 2)]

    def rate(res) -> float:  # samples/s of the jobs together once n1 and n2 are gone
        return float(_events(res).query(f"time >= {t0 + 30.001}").iloc[0]["rate"])

    assert rate(paused) in (pytest.approx(19.25), pytest.approx(19.16))  # one job at 2, the other paused
    assert rate(held) == pytest.approx(9.9 + 9.93)  # both at their minimum
    assert paused.summary["held_at_minimum"] == 0 and held.summary["held_at_minimum"] >= 1  # counted, not silent
    assert all(j.end is not None for j in held.jobs)
