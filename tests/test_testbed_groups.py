"""Testbed (issue 9), interleaved groups: the group size of each report window (from a real controller store),
the group factors fitted from it, the per-group-size table, the engine's factor override, and the simulated
controller's view of declared profiles and of co-located groups. All hand-checkable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcsched.allocator import Group, Snapshot
from hpcsched.errors import InputError
from hpcsched.model import ClusterSpec, Job, ResourceProfile
from hpcsched.primitives.speed import SOLO_FACTOR, group_factor
from hpcsched.results import JobResult, write_results
from hpcsched.runtime.jobfile import parse_job_spec
from hpcsched.runtime.store import Store
from hpcsched.sim.engine import simulate
from hpcsched.testbed import feedback
from hpcsched.testbed.compare import ITERATIONS_FILE, compare_runs, render_markdown
from hpcsched.testbed.groupfit import (
    MIN_WINDOWS,
    fit_group_factors,
    read_group_factors,
    read_group_fits,
    write_group_factors,
)
from hpcsched.testbed.measure import read_measurements


def _grouped_run(store: Store) -> None:
    """Four jobs as the controller writes them. On worker w1: a (launched alone at 100), b joining a's slots at
    104.5 (co-location key j0001, a's), d on w1's other slot (its own key); c alone on w2. Stage seconds per step:
    a and d (0.05, 0.1, 0.05), b (0.1, 0.05, 0.05)."""
    runs = (("a", 100.0, "w1", "j0001", [(102.0, 0), (104.0, 10), (110.0, 20)], (0.05, 0.1, 0.05)),
            ("b", 104.5, "w1", "j0001", [(105.0, 0), (109.0, 10)], (0.1, 0.05, 0.05)),
            ("c", 100.0, "w2", "j0003", [(101.0, 0), (103.0, 10)], (0.05, 0.1, 0.05)),
            ("d", 104.0, "w1", "j0004", [(105.0, 0), (108.0, 10)], (0.05, 0.1, 0.05)))
    for name, launch, worker, key, reports, (ds, cs, ms) in runs:
        jid = store.add_job(parse_job_spec(f"name: {name}\ncommand: [x.py]\nsteps: 20\n", "j.yaml"), launch - 1)
        store._event(launch, jid, "start", {"generation": 1, "procs": 1, "workers": [worker], "group": key})
        for t, step in reports:
            store.add_progress(jid, 1, {"time": t, "step": step, "data_s": ds, "compute_s": cs, "comm_s": ms,
                                        "world_size": 1})
        store._event(reports[-1][0] + 1.0, jid, "completed", {"steps": reports[-1][1]})


@pytest.fixture
def grouped(tmp_path: Path) -> dict:
    store = Store(tmp_path / "state.db")
    _grouped_run(store)
    store.close()
    return read_measurements(tmp_path / "state.db", {"j0001", "j0002", "j0003", "j0004"})


def test_group_size_per_window(grouped: dict) -> None:
    a, b, c, d = (grouped[f"j000{i}"] for i in range(1, 5))
    # a: 102-104 (mid 103) alone on w1; 104-110 (mid 107) with b (same key) and d (other slot) on w1
    assert [(w.sharing, w.group_size) for w in a.windows] == [(1, 1), (3, 2)]
    assert a.windows[1].members == ("j0001", "j0002")
    assert [(w.sharing, w.group_size, w.members) for w in b.windows] == [(3, 2, ("j0001", "j0002"))]
    assert [(w.sharing, w.group_size) for w in d.windows] == [(3, 1)]  # shares w1, not a's slots
    assert [(w.sharing, w.group_size) for w in c.windows] == [(1, 1)]
    # solo pace: a's window alone (0.2 s/step); b never ran outside its group: its own stage time per step
    assert a.solo_pace() == pytest.approx(0.2) and b.solo_pace() == pytest.approx(0.2)
    assert d.solo_pace() == pytest.approx(3 / 10)  # not alone on w1, but alone in its group: that window


def test_a_mate_still_starting_is_no_group_member(tmp_path: Path) -> None:
    """A mate launched on the same slots counts for sharing from its launch (its start-up loads the cores), but
    as a group member only from its first report: before that it takes no stage turn, and its partner trains
    at its solo pace (issue 14: counting it made a 'pair' run at 0.42 of the pair's pipeline period). a reports
    at 101, 103, 105, 107; b (a's key) is launched at 101.5 and first reports at 104.5."""
    store = Store(tmp_path / "state.db")
    for name, launch, reports in (("a", 100.0, [(101.0, 0), (103.0, 10), (105.0, 20), (107.0, 30)]),
                                  ("b", 101.5, [(104.5, 0), (106.0, 10)])):
        jid = store.add_job(parse_job_spec(f"name: {name}\ncommand: [x.py]\nsteps: 30\n", "j.yaml"), launch - 1)
        store._event(launch, jid, "start", {"generation": 1, "procs": 1, "workers": ["w1"], "group": "j0001"})
        for t, step in reports:
            store.add_progress(jid, 1, {"time": t, "step": step, "data_s": 0.05, "compute_s": 0.1, "comm_s": 0.05,
                                        "world_size": 1})
    store.close()
    m = read_measurements(tmp_path / "state.db", {"j0001", "j0002"})
    # a: mid 102 and 104, b launched but not training yet: sharing 2, alone in its group; mid 106: a pair
    assert [(w.sharing, w.group_size) for w in m["j0001"].windows] == [(2, 1), (2, 1), (2, 2)]
    assert m["j0001"].windows[2].members == ("j0001", "j0002")
    assert [(w.sharing, w.group_size) for w in m["j0002"].windows] == [(2, 2)]  # mid 105.25: a trains
    # nor are windows beside a starting mate solo ones (its start-up loads the slot): a has none, so its own
    # stage time per step stands for its solo pace
    assert [w.starting for w in m["j0001"].windows] == [1, 1, 0] and m["j0001"].solo_windows() == []
    assert m["j0001"].solo_pace() == pytest.approx(0.2)


def test_group_factor_fit(grouped: dict, tmp_path: Path) -> None:
    """Solo stages as the measured simulation has them: a (0.05, 0.1, 0.05) and b (0.1, 0.05, 0.05), each
    / 1.015. Their best 3-slot pipeline (a first): slots max(.05,.05) + max(.1,.1) + max(.05,.05) = 0.2 / 1.015.
    Windows of group size 2: a at 0.6 s/step, b at 0.4: ratios 3.045 and 2.03, median 2.5375. Two windows are
    fewer than MIN_WINDOWS: the default factor is used, and the file says so."""
    median = (0.6 + 0.4) / 2 * SOLO_FACTOR / 0.2
    (fit,) = fit_group_factors(grouped, min_windows=2)
    assert (fit.k, fit.windows, fit.groups, fit.source) == (2, 2, 1, "fit")
    assert fit.factor == pytest.approx(median) and fit.median == pytest.approx(median)
    assert fit.q25 == pytest.approx(2.03 + (3.045 - 2.03) / 4) and fit.q75 == pytest.approx(3.045 - (3.045 - 2.03) / 4)
    (few,) = fit_group_factors(grouped)
    assert 2 < MIN_WINDOWS and few.source == "default" and few.factor == group_factor(2)
    assert few.median == pytest.approx(median) and few.windows == 2
    path = write_group_factors(tmp_path / "profile" / "group-factors.csv", [fit])
    assert read_group_factors(path) == {2: pytest.approx(fit.factor, rel=1e-6)}
    write_group_factors(path, [few])
    assert read_group_factors(path) == {}  # a fallback is reported, not read back as measured
    assert [(g.k, g.source, g.windows) for g in read_group_fits(path)] == [(2, "default", 2)]
    assert read_group_factors(tmp_path / "none.csv") == {} and read_group_fits(tmp_path / "none.csv") == []
    path.write_text("k,factor,windows\n2,1.5,3\n7,1.2,1\n")  # before the fallback; more than 4 co-located
    assert read_group_factors(path) == {2: 1.5, 7: 1.2}
    path.write_text("k,factor,windows\n2,1.5,3\n1,1.2,1\n")
    with pytest.raises(InputError, match="k must be >= 2") as e:
        read_group_factors(path)
    assert e.value.line == 3
    path.write_text("k,factor,windows,source\n2,1.5,3,guess\n")
    with pytest.raises(InputError, match="source must be fit or default"):
        read_group_factors(path)


def _results(d: Path, rows: list[tuple[str, float, float, float]], tool: str, meta: dict | None = None) -> Path:
    write_results(d, [JobResult(j, s, st, e, 1) for j, s, st, e in rows],
                  {"tool": tool, "capacity_gpus": 4} | (meta or {}))
    return d


def test_per_group_size_rows(tmp_path: Path) -> None:
    """Job 1 (stages 3, 3, 3 s) and job 2 (1, 4, 1 s) interleaved: the best pipeline is 3 + 3 + 4 = 10 s either
    order; the simulation ran pairs at factor 2.5, so it assumed 25 s per step; measured 30 and 20: median 25."""
    real = _results(tmp_path / "real", [("1", 0, 0, 100), ("2", 0, 0, 100)], "testbed")
    sim = _results(tmp_path / "sim", [("1", 0, 0, 100), ("2", 0, 0, 100)], "simulate",
                   {"group_factors": {"2": 2.5, "3": 1.4, "4": 1.3}})
    (real / ITERATIONS_FILE).write_text("job_id,sharing,pace_s,group_size,group_members\n"
                                        "1,1,10,1,1\n1,2,30,2,1;2\n2,2,20,2,1;2\n")
    (real / "profile").mkdir()
    (real / "profile" / "group-factors.csv").write_text("k,factor,windows\n2,2.4,2\n")
    (sim / "trace.csv").write_text(",".join(feedback.MURI_HEADER) + "\n"
                                   "1,1,0,10,vgg16,0,90000,0,9000,3000,3000,3000,0\n"
                                   "2,1,0,10,vgg16,0,60000,0,6000,1000,4000,1000,0\n")
    rows = {r["group_size"]: r for r in compare_runs(sim, real)["groups"]}
    assert rows[1]["measured_s"] == 10 and rows[1]["sim_s"] == pytest.approx(9 * SOLO_FACTOR)
    assert rows[2]["windows"] == 2 and rows[2]["jobs"] == 2 and rows[2]["measured_s"] == 25
    # the error is window by window: 25 against 30 and against 20, median (-1/6 + 1/4) / 2; the medians agree
    assert rows[2]["sim_s"] == pytest.approx(25.0) and rows[2]["error"] == pytest.approx((-1 / 6 + 1 / 4) / 2)
    assert rows[2]["medians_error"] == pytest.approx(0.0)
    assert rows[2]["sim_factor"] == 2.5 and rows[2]["measured_factor"] == 2.4 and rows[2]["fit_windows"] == 2
    (sim / "meta.json").write_text(json.dumps({"tool": "simulate", "capacity_gpus": 4}))  # default factors
    res = compare_runs(sim, real)
    assert res["groups"][1]["sim_s"] == pytest.approx(10 * group_factor(2))
    md = render_markdown([res], ["sim"])
    assert "| 2 interleaved | 2 | 25.0 | 2.400 |" in md and "| solo | 1 | 10.0 |" in md
    # a size with too few windows to fit: its median is shown, with the default the simulation ran instead
    (real / "profile" / "group-factors.csv").write_text("k,factor,windows,median,q25,q75,groups,source\n"
                                                        f"2,{group_factor(2)},2,2.4,2.0,2.8,1,default\n")
    res = compare_runs(sim, real)
    assert res["groups"][1]["measured_factor"] is None and res["groups"][1]["fit_source"] == "default"
    assert "| 2 interleaved | 2 | 25.0 | 2.400 (2 windows: default used) |" in render_markdown([res], ["sim"])


def test_engine_group_factor_override() -> None:
    """Two 1-GPU jobs grouped on 1 GPU at a raw period of 3 s: a (10 iterations) ends at 10 s start-up +
    10 x 3 x factor; then b (20) runs its last 10 alone at 3 x 1.015 s."""
    prof = ResourceProfile(1.0, 1.0, 1.0)
    jobs = [Job(id="a", submit=0.0, gpus=1, iterations=10, iteration_time=3.0, duration=30.0, profile=prof, model="m"),
            Job(id="b", submit=0.0, gpus=1, iterations=20, iteration_time=3.0, duration=60.0, profile=prof, model="m")]

    def pair(s: Snapshot) -> list[Group]:
        ids = tuple(v.id for v in s.jobs)
        return [Group(ids, 3.0)] if len(ids) > 1 else [Group(ids)]

    default = {r.job_id: r.end for r in simulate(jobs, ClusterSpec(1, 1, 1), pair).results}
    assert default["a"] == pytest.approx(10 + 30 * group_factor(2))
    r = simulate(jobs, ClusterSpec(1, 1, 1), pair, group_factors={2: 2.0})
    ends = {x.job_id: x.end for x in r.results}
    assert ends["a"] == pytest.approx(70.0) and ends["b"] == pytest.approx(70.0 + 10 * 3 * SOLO_FACTOR)
    assert r.meta["group_factors"] == {"2": 2.0, "3": group_factor(3), "4": group_factor(4)}
    assert "group_factors" not in simulate(jobs, ClusterSpec(1, 1, 1), pair).meta


def test_learned_profiles_of_jobs_that_only_ran_interleaved(tmp_path: Path) -> None:
    """--profiles-from: a workload never alone on its worker nor in its group has no solo pace; its own stage
    time per step (no waiting for a turn) stands for it, as in the measured simulation."""
    from hpcsched.sim.runs import load_jobs
    from hpcsched.testbed.driver import Replay, write_real
    from hpcsched.testbed.mapping import Scaling, scale_jobs
    from hpcsched.testbed.profiles import learn

    jobs, _ = load_jobs(Path(__file__).resolve().parents[1] / "trace-data/muri/cluster_trace.csv")
    scaled = scale_jobs(sorted(jobs, key=lambda j: j.submit)[:2], ClusterSpec(1, 2, 2), Scaling(100.0, max_procs=1))
    write_real(tmp_path, scaled, Replay(1000.0, 0.0, 100.0, {s.trace_id: f"j{i}" for i, s in enumerate(scaled)}),
               {"policy": "muri-s"})
    (tmp_path / ITERATIONS_FILE).write_text(  # gpt2 (job 0) in a pair only; vgg16 (job 1) alone in its group once
        "job_id,runtime_id,generation,steps,sharing,pace_s,data_s,compute_s,comm_s,startup_s,group_size,group_members\n"
        "0,j0,1,5,2,9,1,4,1,300,2,0;1\n0,j0,1,5,2,11,1,6,1,300,2,0;1\n"
        "1,j1,1,5,2,12,2,2,2,300,2,0;1\n1,j1,1,5,2,7,2,3,2,300,1,1\n")
    learned = learn(tmp_path)
    by_model = {s.model: s.workload for s in scaled}
    assert learned.pace_s[by_model["gpt2"]] == pytest.approx(0.07)  # median(1+4+1, 1+6+1) / 100
    assert learned.pace_s[by_model["vgg16"]] == pytest.approx(0.07)  # its group-size-1 window's pace
