"""Goodput as the harvesting MILP's value (hpcsched.harvest.goodput) on the bundled real idle log."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("scipy", reason="the goodput extra (scipy) is needed to fit the Pollux profiles")

from hpcsched.errors import InputError  # noqa: E402
from hpcsched.harvest.goodput import GoodputProfile, GoodputValuation, read_goodput_profiles  # noqa: E402
from hpcsched.harvest.pool import timeline_from_intervals  # noqa: E402
from hpcsched.harvest.replay import EVENT_COLUMNS, ReplayConfig, replay  # noqa: E402
from hpcsched.traces.bftrainer import read_elastic_jobs, read_idle_intervals, read_node_order  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BF = ROOT / "trace-data" / "bftrainer"
JOBS10 = (BF / "hps-shufflenet-Jbnd-10J.csv", BF / "hps-shufflenet-JNPs-10J.csv")
JOBS1000 = (BF / "hps-shufflenet-Jbnd-1000J.csv", BF / "hps-shufflenet-JNPs-1000J.csv")


@pytest.fixture(scope="module")
def idle() -> list:
    return list(read_idle_intervals(BF / "idle-intervals.csv.gz"))


def _timeline(idle: list, nodes: int, start: float):  # noqa: ANN202
    return timeline_from_intervals(idle, read_node_order(BF / "node-order.txt")[:nodes], start)


def test_curves_are_throughput_times_efficiency_and_the_target_is_the_profiles_progress() -> None:
    v = GoodputValuation({"a": GoodputProfile("cifar10", 4, 30)})
    first, last = v.curves(v.profiles["a"], 0, 16), v.curves(v.profiles["a"], 29, 16)
    for c in (first, last):
        # efficiency <= 1 at batches >= B0: goodput never above the throughput of the same configuration
        assert all(g <= t * (1 + 1e-9) for g, t in zip(c.goodput.rates, c.throughput.rates, strict=True))
        assert all(b >= 128 for b in c.batch)  # cifar10's B0
    # early in training a big allocation's batch is statistically wasteful; later the noise scale has grown and
    # the best batch on 16 nodes is larger and buys more goodput (Pollux's observation)
    assert first.goodput.rates[-1] < first.throughput.rates[-1] / 2
    assert last.batch[-1] > first.batch[-1] and last.goodput.rates[-1] > first.goodput.rates[-1]
    assert v.target("a") == pytest.approx(30 * 50_000, rel=1e-3)  # 30 epochs of cifar10's 50,000 images
    assert v.epoch_at("a", 0) == 0 and v.epoch_at("a", v.target("a")) == 29


def test_profiles_file_errors_name_the_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "g.csv"
    p.write_text("job,application,gpus_per_node,epochs\nJ1,cifar10,4,10\nJ2,alexnet,4,\n")
    with pytest.raises(InputError, match=r"g\.csv:3: .*alexnet"):
        read_goodput_profiles(p)
    p.write_text("job,application,gpus_per_node,epochs\nJ1,cifar10,4,1000\n")
    with pytest.raises(InputError, match=r"g\.csv:2: .*epochs <= 100"):
        read_goodput_profiles(p)
    p.write_text("job,application\nJ1,ncf\n")
    assert read_goodput_profiles(p) == {"J1": GoodputProfile("ncf", 4, None)}
    v = GoodputValuation(read_goodput_profiles(p))
    with pytest.raises(ValueError, match="not in the job list: J1"):  # a typo must not leave a job unprofiled
        v.prepare(read_elastic_jobs(*JOBS10))


def test_jobs_without_a_profile_replay_exactly_as_before(idle: list) -> None:
    jobs = read_elastic_jobs(*JOBS10)
    tl = _timeline(idle, 40, min(j.submit for j in jobs))
    cfg = ReplayConfig(tfwd=10.0, solver="dp")
    plain = replay(tl, jobs, cfg)
    none = GoodputValuation({})
    valued = replay(tl, none.prepare(jobs), cfg, valuation=none)
    timed = EVENT_COLUMNS.index("solve_s")  # wall time: the one thing allowed to differ

    def same(res) -> tuple:  # noqa: ANN001
        return ({k: v for k, v in res.summary.items() if k != "solve_seconds"},
                [e[:timed] + e[timed + 1:] for e in res.events], res.jobs, res.per_job)

    assert same(valued) == same(plain)


def test_goodput_valued_sizing_beats_throughput_valued_on_useful_work(idle: list, tmp_path: Path) -> None:
    """12 BFTrainer jobs training Pollux applications on 100 nodes of the real log: the same progress model, the
    MILP valuing sizes by goodput vs by throughput at the same batch. Goodput finishes the jobs sooner and
    does more useful (target-bound) work per node-hour held."""
    mix = (("cifar10", 30), ("bert", None), ("ncf", None), ("deepspeech2", 10))
    jobs = read_elastic_jobs(*JOBS1000)[:12]
    profiles = {j.id: GoodputProfile(mix[k % len(mix)][0], epochs=mix[k % len(mix)][1]) for k, j in enumerate(jobs)}
    tl = _timeline(idle, 100, min(j.submit for j in jobs))
    out = {}
    for value in ("throughput", "goodput"):
        v = GoodputValuation(profiles, value)
        prepared = v.prepare(jobs)
        res = replay(tl, prepared, ReplayConfig(tfwd=10.0, exact_events=True), valuation=v)
        s = res.summary
        assert s["jobs_done"] == 12 and s["finished"]
        # every job stops exactly at its useful-sample target: progress is counted in the same units either way
        assert s["samples"] == pytest.approx(sum(v.target(j.id) for j in jobs), rel=1e-6)
        jct = statistics.fmean(r.end - r.submit for r in res.jobs)
        out[value] = (jct, float(s["samples"]) / float(s["used_node_hours"]))
    assert out["goodput"][0] < 0.95 * out["throughput"][0], out  # 0.41 h vs 0.47 h here
    assert out["goodput"][1] > 1.3 * out["throughput"][1], out  # 2.33e7 vs 1.38e7


def test_replay_cli_takes_goodput_profiles(tmp_path: Path) -> None:
    prof = tmp_path / "prof.csv"
    prof.write_text("job,application,gpus_per_node,epochs\nJ00000,cifar10,4,5\nJ00001,bert,4,\n")
    done = subprocess.run(
        [sys.executable, "-m", "hpcsched.cli", "replay", "--idle", str(BF / "idle-intervals.csv.gz"), "--nodes", "40",
         "--jobs", str(JOBS10[0]), "--curves", str(JOBS10[1]), "--out", str(tmp_path / "out"), "--goodput", str(prof),
         "--value", "goodput", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    s = json.loads(done.stdout)
    assert s["jobs_done"] == 10
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["goodput"]["value"] == "goodput" and meta["goodput"]["profiled_jobs"] == 2
    bad = subprocess.run(
        [sys.executable, "-m", "hpcsched.cli", "replay", "--idle", str(BF / "idle-intervals.csv.gz"), "--nodes", "40",
         "--jobs", str(JOBS10[0]), "--curves", str(JOBS10[1]), "--out", str(tmp_path / "o2"), "--goodput",
         str(prof), "--value", "speed"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--value must be goodput or throughput" in bad.stderr
