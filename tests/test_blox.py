"""``--compat blox`` and ``trace generate blox`` held against Blox's own outputs (trace-data/blox/README.md).

Blox (msr-fiddle/blox c8851b2) was run here on its own workload; its per-job submit and finish times,
responsiveness and per-round preemptions for the job window 300-500 are shipped in trace-data/blox/. These
tests run our generator and our loop through the real CLI and compare every job to the second.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from hpcsched.traces.blox import count_passing, generate, write_trace

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "trace-data" / "blox"
CLUSTER = ROOT / "cluster_spec" / "n32g4.csv"


def _blox_results() -> dict[tuple[str, str], dict[str, tuple[float, float, float]]]:
    out: dict[tuple[str, str], dict[str, tuple[float, float, float]]] = defaultdict(dict)
    with open(DATA / "blox-results-300-500.csv") as f:
        for r in csv.DictReader(f):
            out[(r["policy"], r["load"])][r["job_id"]] = (float(r["submit"]), float(r["finish"]),
                                                          float(r["responsiveness"]))
    return out


def _blox_preemptions() -> dict[tuple[str, str], dict[str, str]]:
    with open(DATA / "blox-preemptions-300-500.csv") as f:
        return {(r["policy"], r["load"]): r for r in csv.DictReader(f)}


RESULTS = _blox_results()
RUNS = sorted(RESULTS)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcsched.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


@pytest.mark.parametrize("load,shipped", [("8", "blox-stream-L8-cached-first600.csv")])
def test_generator_is_blox_stream_byte_for_byte(tmp_path: Path, load: str, shipped: str) -> None:
    out = tmp_path / "t.csv"
    r = _cli("trace", "generate", "blox", "--seed", "1", "--jobs-per-hour", load, "--jobs", "600", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == (DATA / shipped).read_bytes()


def test_generator_first_run_stream_depends_on_the_log(tmp_path: Path) -> None:
    """Without Blox's pickle cache the arrivals follow the parse's draws: 31,725 jobs passed its filter here."""
    out = tmp_path / "t.csv"
    write_trace(generate(300, 6, passing=31725), out)
    assert out.read_bytes() == (DATA / "blox-stream-L6-nocache-first300.csv").read_bytes()


def test_count_passing_applies_blox_filter(tmp_path: Path) -> None:
    def job(attempts: list[tuple[str, str, int]]) -> dict:
        return {"jobid": "x", "user": "u", "vc": "v", "submitted_time": "2017-10-01 00:00:00",
                "attempts": [{"start_time": s, "end_time": e, "detail": [{"ip": "m", "gpus": ["g"] * g}]}
                             for s, e, g in attempts]}
    log = [
        job([("2017-10-01 00:00:00", "2017-10-01 01:00:00", 1)]),  # 3,600 s: passes
        job([("2017-10-01 00:00:00", "2017-10-01 00:10:00", 1)]),  # 600 s: too short
        job([("2017-10-01 00:00:00", "2017-10-01 00:20:00", 1),
             ("2017-10-01 00:30:00", "2017-10-01 00:45:00", 2)]),  # summed 2,100 s: passes
        job([("2017-10-01 00:00:00", "2017-10-01 02:00:00", 1),
             ("2017-10-01 03:00:00", "None", 1)]),  # last attempt skipped: Blox drops the job
        job([]),
    ]
    path = tmp_path / "cluster_job_log"
    path.write_text(json.dumps(log))
    assert count_passing(path) == 2
    bad = tmp_path / "bad"
    bad.write_text("{not json")
    r = _cli("trace", "generate", "blox", "--seed", "1", "--cluster-job-log", str(bad), "--out",
             str(tmp_path / "o.csv"))
    assert r.returncode == 2 and str(bad) in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("policy,load", RUNS)
def test_compat_blox_equals_blox_per_job(tmp_path: Path, policy: str, load: str) -> None:
    trace = tmp_path / f"L{load}.csv"
    made = _cli("trace", "generate", "blox", "--seed", "1", "--jobs-per-hour", load, "--out", str(trace))
    assert made.returncode == 0, made.stderr
    out = tmp_path / "run"
    args = ["simulate", "--trace", str(trace), "--cluster", str(CLUSTER), "--policy", policy, "--compat", "blox",
            "--window", "300-500", "--out", str(out), "--json"]
    if policy == "optimus":
        args += ["--blox-optimus-load", load]
    r = _cli(*args)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    blox = RESULTS[(policy, load)]
    with open(out / "jobs.csv") as f:
        ours = {row["job_id"]: row for row in csv.DictReader(f) if 300 <= int(row["job_id"]) <= 500}
    assert set(ours) == set(blox)
    for jid, (submit, finish, _) in blox.items():
        assert (float(ours[jid]["submit"]), float(ours[jid]["end"])) == (submit, finish), jid
    with open(out / "responsiveness.csv") as f:
        resp = {row["job_id"]: float(row["responsiveness"]) for row in csv.DictReader(f)}
    assert all(resp[jid] == blox[jid][2] for jid in blox)
    assert summary["jobs"] == 201 and summary["window"] == "300-500"
    assert summary["avg_jct"] == pytest.approx(sum(f - s for s, f, _ in blox.values()) / len(blox), rel=1e-12)
    pre = _blox_preemptions()[(policy, load)]
    with open(out / "rounds.csv") as f:
        rounds = list(csv.DictReader(f))
    assert len(rounds) == int(pre["rounds"]) and float(rounds[-1]["time"]) == float(pre["last_round"])
    nonzero = " ".join(f"{int(float(r['time']))}:{r['preemptions']}" for r in rounds if int(r["preemptions"]))
    assert nonzero == pre["nonzero_rounds"]


def test_window_summarises_only_the_window_in_default_mode(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,num_gpu,submit_time,duration\n" + "".join(
        f"{i},1,{i * 10},{1000 + 100 * i}\n" for i in range(10)))
    full = _cli("simulate", "--trace", str(trace), "--cluster", str(CLUSTER), "--policy", "fifo", "--out",
                str(tmp_path / "a"), "--json")
    win = _cli("simulate", "--trace", str(trace), "--cluster", str(CLUSTER), "--policy", "fifo", "--out",
               str(tmp_path / "b"), "--json", "--window", "2-4")
    assert full.returncode == 0 and win.returncode == 0, win.stderr
    f, w = json.loads(full.stdout), json.loads(win.stdout)
    assert f["jobs"] == 10 and w["jobs"] == 3 and w["jobs_simulated"] == 10
    with open(tmp_path / "b" / "jobs.csv") as fh:
        rows = {r["job_id"]: r for r in csv.DictReader(fh)}
    expected = sum(float(rows[str(i)]["end"]) - float(rows[str(i)]["submit"]) for i in (2, 3, 4)) / 3
    assert w["avg_jct"] == pytest.approx(expected)
    bad = _cli("simulate", "--trace", str(trace), "--cluster", str(CLUSTER), "--policy", "fifo", "--out",
               str(tmp_path / "c"), "--window", "5-2")
    assert bad.returncode == 2 and "A <= B" in bad.stderr


def test_compat_blox_rejects_unknown_policy_clearly(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,num_gpu,submit_time,duration\n0,1,0,100\n")
    r = _cli("simulate", "--trace", str(trace), "--cluster", str(CLUSTER), "--policy", "themis", "--compat",
             "blox", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "fifo, srtf, optimus, las, tiresias" in r.stderr and "Traceback" not in r.stderr


def test_default_mode_names_its_slowdown_and_restart_cost(tmp_path: Path) -> None:
    """The 1.5% step overhead and the restart cost are named options of the default mode: defaults unchanged and
    shown in meta.json; 1.0 and 0 give every job exactly its duration on an idle cluster."""
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,num_gpu,submit_time,duration\n0,1,0,1000\n1,2,5,2000\n")
    base = _cli("simulate", "--trace", str(trace), "--cluster", str(CLUSTER), "--policy", "fifo", "--out",
                str(tmp_path / "a"), "--json")
    off = _cli("simulate", "--trace", str(trace), "--cluster", str(CLUSTER), "--policy", "fifo", "--out",
               str(tmp_path / "b"), "--json", "--slowdown-factor", "1.0", "--restart-s", "0")
    assert base.returncode == 0 and off.returncode == 0, base.stderr + off.stderr
    meta_a = json.loads((tmp_path / "a" / "meta.json").read_text())
    meta_b = json.loads((tmp_path / "b" / "meta.json").read_text())
    assert (meta_a["slowdown_factor"], meta_a["restart_cost"]) == (1.015, "per-model table")
    assert (meta_b["slowdown_factor"], meta_b["restart_cost"]) == (1.0, 0.0)
    assert json.loads(off.stdout)["avg_jct"] == 1500.0
    assert json.loads(base.stdout)["avg_jct"] > 1500 * 1.015  # the overhead and a restart per start
    bad = _cli("simulate", "--trace", str(trace), "--cluster", str(CLUSTER), "--policy", "fifo", "--out",
               str(tmp_path / "c"), "--compat", "muri", "--slowdown-factor", "1.0")
    assert bad.returncode == 2 and "--slowdown-factor" in bad.stderr


def test_blox_walk_by_hand() -> None:
    """Blox's placement quirks, which its 1-GPU workload never exercises, worked out by hand.

    Scattered placement takes up to the job's count from EACH node and succeeds only on an exact total: a 2-GPU
    job facing 1 free GPU on node 0 and 2 on node 1 gathers 3 and does not fit; it can preempt only jobs below
    it in the order, and the walk stops there (no backfill), so it waits for the 1-GPU job to finish."""
    from hpcsched.compat.blox import simulate_blox
    from hpcsched.model import ClusterSpec, Job

    jobs = [Job("0", 0.0, gpus=1, duration=1000.0), Job("1", 0.0, gpus=2, duration=100.0)]
    res = {r.job_id: r for r in simulate_blox(jobs, ClusterSpec(1, 2, 2), "fifo").results}
    assert (res["0"].start, res["0"].end) == (0.0, 1200.0)  # four full rounds: 1200 >= 1000
    assert (res["1"].start, res["1"].end) == (1200.0, 1500.0)
    # LAS re-sorts every round by wall-clock attained service: the newcomer preempts the job that has run
    jobs = [Job("0", 0.0, gpus=1, duration=900.0), Job("1", 1.0, gpus=1, duration=300.0)]
    out = simulate_blox(jobs, ClusterSpec(1, 1, 1), "las")
    res = {r.job_id: r for r in out.results}
    assert (res["1"].start, res["1"].end, res["0"].end) == (300.0, 600.0, 1200.0)
    assert [p for _, p, *_ in out.rounds] == [0, 1, 0, 0]  # rounds 0, 300, 600, 900; stops at 1200
    assert out.responsiveness == {"0": 300.0, "1": 599.0}


def test_compare_refuses_compat_blox(tmp_path: Path) -> None:
    """``compare`` runs the event engine; Blox's loop runs through ``simulate`` only, never silently replaced."""
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,num_gpu,submit_time,duration\n0,1,0,100\n")
    r = _cli("compare", "--trace", str(trace), "--cluster", str(CLUSTER), "--policies", "fifo", "--compat", "blox",
             "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "simulate --compat blox" in r.stderr and "Traceback" not in r.stderr
