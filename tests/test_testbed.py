"""Testbed (issue 9): trace -> real jobs mapping, measurements from a real controller store, the sim-vs-real
table on hand-checkable runs. The end-to-end run through real processes is in test_testbed_e2e.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcsched.errors import InputError
from hpcsched.model import ClusterSpec
from hpcsched.primitives.speed import SOLO_FACTOR
from hpcsched.results import JobResult, write_results
from hpcsched.runtime.jobfile import parse_job_spec
from hpcsched.runtime.store import Store
from hpcsched.sim.runs import load_jobs
from hpcsched.testbed import feedback
from hpcsched.testbed.compare import ITERATIONS_FILE, compare_runs, render_markdown
from hpcsched.testbed.mapping import (
    BALANCED,
    COMPUTE_HEAVY,
    DATA_HEAVY,
    Scaling,
    job_yaml,
    pick_scale,
    real_to_trace,
    scale_jobs,
)
from hpcsched.testbed.measure import read_measurements

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "trace-data/muri/cluster_trace.csv"
SPEC = ClusterSpec(1, 2, 2, name="l2x2")


def _first(n: int):
    jobs, _ = load_jobs(TRACE)
    return sorted(jobs, key=lambda j: j.submit)[:n]


def test_scaling_the_bundled_trace() -> None:
    jobs = _first(12)
    scaled = scale_jobs(jobs, SPEC, Scaling(scale=1000.0, min_steps=40, max_steps=400, max_procs=2))
    assert [s.trace_id for s in scaled] == [j.id for j in jobs]
    by = {s.trace_id: s for s in scaled}
    # job 1: vgg16, 281 s alone -> 0.281 real s / 0.040 s nominal = 7 steps -> lengthened to 40
    assert by["1"].workload == BALANCED and by["1"].steps == 40
    # job 0: gpt2, 5095 s -> 5.095 s / 0.050 = 102 steps, inside the bounds
    assert by["0"].workload == COMPUTE_HEAVY and by["0"].steps == round(5095 / 1000 / 0.050)
    # job 2: a2c, 255697 s -> far more than 400 steps -> shortened
    assert by["2"].workload == DATA_HEAVY and by["2"].steps == 400
    # 8-GPU trace jobs get the 2 slots of one worker; gaps divide by the scale
    assert all(s.procs == 2 for s in scaled)
    assert by["1"].submit_offset == pytest.approx(1534.0 / 1000)
    assert by["11"].submit_offset == pytest.approx(7371.0 / 1000)
    # the job file is one the runtime accepts, with the steps and the workload's flags
    spec = parse_job_spec(job_yaml(by["2"], ROOT), "job.yaml")
    assert spec.steps == 400 and spec.procs == 2 and spec.launcher == "torchrun"
    assert spec.command[:7] == ("workloads/ddp_train.py", "--model", "cnn", "--batch", "16", "--io-latency-ms", "30")
    assert spec.profile is None  # declared only on request: --declare-profiles
    # it declares the trace's stage proportions at the workload's real pace, so muri-s can group it at once
    spec = parse_job_spec(job_yaml(by["2"], ROOT, declare_profile=True), "job.yaml")
    tp = by["2"].trace_profile
    assert sum(spec.profile) == pytest.approx(DATA_HEAVY.nominal_iteration_s, rel=1e-4)
    assert spec.profile[0] / sum(spec.profile) == pytest.approx(tp.data_s / tp.total_s, rel=1e-3)


def test_time_scale_auto_and_bad() -> None:
    jobs = _first(3)  # 5095, 281, 255697 s alone: median 5095
    assert pick_scale("auto", jobs, 40, 160) == pytest.approx(5095 / (80 * BALANCED.nominal_iteration_s))
    assert pick_scale("250", jobs, 40, 160) == 250.0
    for bad in ("fast", "0", "-3", "nan"):
        with pytest.raises(InputError, match="time-scale"):
            pick_scale(bad, jobs, 40, 160)


def test_time_mapping_round_trip() -> None:
    assert real_to_trace(110.5, real_start=100.0, trace_start=7000.0, scale=1000.0) == pytest.approx(17500.0)
    assert real_to_trace(0.0, 100.0, 0.0, 10.0) is None  # the runtime's "not yet" is 0, not a time
    assert real_to_trace(None, 100.0, 0.0, 10.0) is None


def test_sim_jobs_keep_the_replayed_jobs_and_fold_in_measured_overhead(tmp_path: Path) -> None:
    scaled = scale_jobs(_first(3), SPEC, Scaling(scale=1000.0, max_procs=1))
    trace_jobs = feedback.trace_jobs(scaled, 1000.0)
    for s, j in zip(scaled, trace_jobs, strict=True):
        assert j.iterations == s.steps and j.gpus == 1 and j.submit == s.trace_submit
        assert j.iteration_time == pytest.approx(s.workload.nominal_iteration_s * 1000.0)
        # stage split in the trace's proportions
        assert j.profile.total_s == pytest.approx(j.iteration_time)
        p = s.trace_profile
        assert j.profile.data_s / j.profile.total_s == pytest.approx(p.data_s / p.total_s)
    # the Muri CSV written for the simulator reads back as the same jobs
    back, _ = load_jobs(feedback.write_muri_trace(tmp_path / "t.csv", trace_jobs))
    for a, b in zip(trace_jobs, back, strict=True):
        assert (a.id, a.gpus, a.iterations) == (b.id, b.gpus, b.iterations)
        assert b.iteration_time == pytest.approx(a.iteration_time, rel=1e-6)
        assert b.submit == pytest.approx(a.submit, abs=1e-3)


def test_measured_overhead_is_the_restart_cost_and_the_cli_reproduces_the_simulation(tmp_path: Path) -> None:
    """The measured start-up + tear-down is every job's restart cost (cluster median, trace seconds), not extra
    iterations; it is in the simulation's meta.json, and `hpcsched simulate --restart-s` on the trace.csv
    written beside it gives the same results (a policy that groups nothing, run with full knowledge)."""
    from hpcsched.results import read_results
    from hpcsched.testbed.measure import Measured

    scaled = scale_jobs(_first(3), SPEC, Scaling(scale=1000.0, max_procs=1))
    ms = {s.trace_id: Measured(f"j{i}", startup_s=[x], teardown_s=1.0) for i, (s, x) in enumerate(zip(
        scaled, (2.0, 5.0, 30.0), strict=True))}
    assert feedback.cluster_overhead_s(ms) == 6.0  # median(3, 6, 31): one slow start does not set it
    assert feedback.measured_restart_s(ms, 1000.0) == 6000.0 and feedback.measured_restart_s({}, 1000.0) is None
    jobs = feedback.measured_jobs(scaled, 1000.0, ms)  # no windows: nominal paces, and no extra iterations
    assert [j.iterations for j in jobs] == [s.steps for s in scaled]
    sim = tmp_path / "sim"
    feedback.run_sim(jobs, SPEC, "fifo", sim, "t", flatten=False, restart_s=6000.0)
    meta = json.loads((sim / "meta.json").read_text())
    assert meta["restart_s"] == 6000.0
    spec, again = tmp_path / "l2x2.yaml", tmp_path / "again"
    spec.write_text("name: l2x2\nswitches: 1\nnodes_per_switch: 2\ngpus_per_node: 2\n")  # SPEC
    p = subprocess.run([sys.executable, "-m", "hpcsched.cli", "simulate", "--trace", str(sim / "trace.csv"),
                        "--cluster", str(spec), "--policy", "fifo", "--restart-s", str(meta["restart_s"]),
                        "--out", str(again)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    a, _ = read_results(sim)
    b, _ = read_results(again)
    assert list(a["end"]) == pytest.approx(list(b["end"]))
    first = a.set_index("job_id")
    assert (first["start"] - first["submit"]).min() >= 0 and (first["end"] - first["start"]).min() > 6000.0


def _fake_run(store: Store) -> None:
    """Two jobs on worker w1, written through the runtime's own store as the controller writes them."""
    for name, t_launch, reports in (("a", 100.0, [(103.0, 0), (104.0, 10), (105.0, 20)]),
                                    ("b", 104.5, [(106.0, 0), (108.0, 10)])):
        jid = store.add_job(parse_job_spec(f"name: {name}\ncommand: [x.py]\nsteps: 20\n", "j.yaml"), t_launch - 1)
        store._event(t_launch, jid, "start", {"generation": 1, "procs": 1, "workers": ["w1"]})
        for t, step in reports:
            store.add_progress(jid, 1, {"time": t, "step": step, "data_s": 0.02, "compute_s": 0.06, "comm_s": 0.02,
                                        "world_size": 1})
        store._event(reports[-1][0] + 2.0, jid, "completed", {"steps": reports[-1][1]})


def test_measurements_from_a_real_store(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    _fake_run(store)
    store.close()
    m = read_measurements(tmp_path / "state.db", {"j0001", "j0002"})
    a, b = m["j0001"], m["j0002"]
    assert a.startup_s == [3.0] and a.teardown_s == 2.0 and a.overhead_s() == 5.0
    # a: window 103-104 alone (b launched at 104.5), 104-105 shared with b; solo pace = 1 s / 10 steps
    assert [w.sharing for w in a.windows] == [1, 2]
    assert a.solo_pace() == pytest.approx(0.1)
    # b: its one window (106-108) is after a's last report (105): alone
    assert [w.sharing for w in b.windows] == [1] and b.solo_pace() == pytest.approx(0.2)
    assert a.profile().stages() == pytest.approx((0.02, 0.06, 0.02))


def _results(d: Path, rows: list[tuple[str, float, float, float]], tool: str) -> Path:
    write_results(d, [JobResult(j, s, st, e, 1) for j, s, st, e in rows], {"tool": tool, "capacity_gpus": 4})
    return d


def test_compare_hand_checked(tmp_path: Path) -> None:
    real = _results(tmp_path / "real", [("1", 0, 0, 100), ("2", 10, 10, 210)], "testbed")
    sim = _results(tmp_path / "sim", [("1", 0, 0, 110), ("2", 10, 10, 190)], "simulate")
    (real / ITERATIONS_FILE).write_text("job_id,sharing,pace_s\n1,1,10\n1,2,12\n2,1,20\n")
    (sim / "trace.csv").write_text(",".join(feedback.MURI_HEADER) + "\n"
                                   "1,1,0,10,vgg16,0,100000,0,9000,3000,3000,3000,0\n"
                                   "2,1,10000,10,vgg16,0,200000,0,20000,5000,10000,5000,0\n")
    res = compare_runs(sim, real)
    errs = {j["job_id"]: j["error"] for j in res["jobs"]}
    assert errs["1"] == pytest.approx(0.10) and errs["2"] == pytest.approx(-0.10)
    assert res["summary"]["avg JCT"]["real"] == pytest.approx(150.0)
    assert res["summary"]["avg JCT"]["sim"] == pytest.approx(145.0)  # (110 + 180) / 2
    assert res["summary"]["avg JCT"]["error"] == pytest.approx(-5 / 150)
    assert res["summary"]["makespan"]["error"] == pytest.approx((190 - 210) / 210)  # span: first submit 0 to last end
    assert res["mean_abs_job_error"] == pytest.approx(0.10)
    rows = {r["sharing"]: r for r in res["iterations"]}
    # alone: measured median(10, 20) = 15 s; assumed median(9, 20) x 1.015
    assert rows[1]["measured_s"] == 15.0 and rows[1]["profiled_s"] == pytest.approx(14.5 * SOLO_FACTOR)
    assert rows[2]["measured_s"] == 12.0 and rows[2]["profiled_s"] == pytest.approx(9 * SOLO_FACTOR)
    md = render_markdown([res], ["sim"])
    assert "| avg JCT (s) | 150 | 145 | -3.3% |" in md


def test_compare_cli_and_bad_input(tmp_path: Path) -> None:
    real = _results(tmp_path / "real", [("1", 0, 0, 100)], "testbed")
    sim = _results(tmp_path / "sim", [("1", 0, 0, 120)], "simulate")
    out = subprocess.run([sys.executable, "-m", "hpcsched.cli", "testbed", "--compare", str(sim), str(real), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["summary"]["avg JCT"]["error"] == pytest.approx(0.2)
    other = _results(tmp_path / "other", [("9", 0, 0, 100)], "simulate")
    bad = subprocess.run([sys.executable, "-m", "hpcsched.cli", "testbed", "--compare", str(other), str(real)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no job ids in common" in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "hpcsched.cli", "testbed", "--trace", str(TRACE)],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "--cluster" in missing.stderr and "Traceback" not in missing.stderr


def test_profiles_learned_from_an_earlier_run(tmp_path: Path) -> None:
    from hpcsched.testbed.driver import Replay, write_real
    from hpcsched.testbed.profiles import learn, predicted_jobs

    scaled = scale_jobs(_first(3), SPEC, Scaling(scale=100.0, max_procs=1))  # gpt2, vgg16, a2c
    rep = Replay(real_start=1000.0, trace_start=0.0, scale=100.0, runtime_ids={s.trace_id: f"j{i}" for i, s in
                                                                               enumerate(scaled)})
    write_real(tmp_path, scaled, rep, {"policy": "fifo"})
    # windows in trace seconds (x100): vgg16 alone at 4 and 6 s/step, shared at 9 (ignored); gpt2 shared only
    (tmp_path / ITERATIONS_FILE).write_text(
        "job_id,runtime_id,generation,steps,sharing,pace_s,data_s,compute_s,comm_s,startup_s\n"
        "1,j1,1,10,1,4,1,2,1,500\n1,j1,1,10,1,6,1,4,1,500\n1,j1,1,10,2,9,3,3,3,500\n"
        "0,j0,1,10,2,8,0,6,2,700\n")
    learned = learn(tmp_path)
    by_model = {s.model: s.workload for s in scaled}
    assert learned.pace_s[by_model["vgg16"]] == pytest.approx(0.05)  # median(4, 6) / 100
    assert learned.pace_s[by_model["gpt2"]] == pytest.approx(0.08)  # no solo window: all of its windows
    assert learned.stages_s[by_model["vgg16"]].stages() == pytest.approx((0.01, 0.03, 0.01))
    assert learned.overhead_s == pytest.approx(6.0)  # median(500, 700) / 100
    jobs = {j.id: j for j in predicted_jobs(scaled, 100.0, learned)}
    vgg = next(s for s in scaled if s.model == "vgg16")
    it = 0.05 / SOLO_FACTOR
    assert jobs[vgg.trace_id].iteration_time == pytest.approx(it * 100.0)
    assert jobs[vgg.trace_id].iterations == vgg.steps  # start-up is the restart cost, not extra iterations
    assert learned.restart_s(100.0) == pytest.approx(600.0)  # 6 real s per launch, in trace seconds
    a2c = next(s for s in scaled if s.model == "a2c")  # never measured: nominal
    assert jobs[a2c.trace_id].iteration_time == pytest.approx(a2c.workload.nominal_iteration_s * 100.0)


def test_overheads_per_launch_and_scaled_by_the_probe(tmp_path: Path) -> None:
    from hpcsched.runtime.profile import write_overheads
    from hpcsched.testbed.profiles import LearnedProfiles

    store = Store(tmp_path / "state.db")
    _fake_run(store)
    write_overheads(store, tmp_path / "overheads.csv")
    store.close()
    # a: launched 100, first report 103, last 105, completed 107; b: 104.5, 106, 108, 110
    assert (tmp_path / "overheads.csv").read_text().splitlines() == [
        "job_id,attempts,startup_s,teardown_s", "j0001,1,3.0,2.0", "j0002,1,1.5,2.0"]
    learned = LearnedProfiles({}, {}, 9.0, "run", startup_s=3.0, teardown_s=2.0, probe_s=2.0)
    assert learned.overhead_at(None) == 5.0  # no probe now: as measured then
    assert learned.overhead_at(3.0) == pytest.approx(7.5)  # the machine starts processes 1.5x slower now
    assert LearnedProfiles({}, {}, 9.0, "old run").overhead_at(3.0) == 9.0  # no overheads.csv, no probe
