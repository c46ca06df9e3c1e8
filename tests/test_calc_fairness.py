"""``hpcsched calc``'s fairness and accounting figures (issue 19), on real simulator results.

Every expected value is derived here from the files the runs wrote (csv module, numpy) and from the
traces themselves (json), not from hpcsched.metrics.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hpcsched.cli import app
from hpcsched.metrics import SUMMARY_KEYS

TRACE3 = "trace-data/muri/trace3.csv"
PHILLY = "trace-data/philly/philly-joblog-readme.json"
N8G8 = "cluster_spec/n8g8.csv"


def _run(*args: str) -> str:
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def _simulate(out: Path, trace: str, policy: str) -> Path:
    _run("simulate", "--trace", trace, "--cluster", N8G8, "--policy", policy, "--out", str(out), "--json")
    return out


def _calc(*args: str) -> dict:
    return json.loads(_run("calc", *args, "--json"))


def _rows(d: Path) -> dict[str, dict[str, str]]:
    with open(d / "jobs.csv", newline="") as f:
        return {r["job_id"]: r for r in csv.DictReader(f)}


def _jct(r: dict[str, str]) -> float:
    return float(r["end"]) - float(r["submit"])


def _jain(x: np.ndarray) -> float:
    return float(x.sum() ** 2 / (len(x) * (x**2).sum()))


@pytest.fixture(scope="module")
def trace3_runs(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("calc")
    return _simulate(tmp / "srsf", TRACE3, "srsf"), _simulate(tmp / "fifo", TRACE3, "fifo")


def test_finish_time_fairness_jain_and_cost_on_trace3(trace3_runs) -> None:
    srsf, fifo = trace3_runs
    s = _calc(str(srsf), "--isolated", str(fifo), "--price", "2.5")
    a, b = _rows(srsf), _rows(fifo)
    assert len(a) == 992 and set(a) == set(b)
    rho = {i: _jct(a[i]) / _jct(b[i]) for i in a}
    values = np.array(sorted(rho.values()))
    assert s["ftf_jobs"] == 992 and s["ftf_unmatched"] == 0 and s["ftf_baseline"] == str(fifo)
    assert s["ftf_rho_max"] == pytest.approx(values.max(), rel=1e-12)
    assert s["ftf_rho_worst_job"] == max(rho, key=rho.get)
    for q in (50, 90, 99):
        assert s[f"ftf_rho_p{q}"] == pytest.approx(np.percentile(values, q), rel=1e-12)
    assert s["ftf_rho_mean"] == pytest.approx(values.mean(), rel=1e-12)
    # SRSF serves short jobs first: most jobs finish far sooner than under FIFO, a few long ones later
    assert s["ftf_rho_p50"] < 1 < s["ftf_rho_max"]
    shares = np.array([float(r["gpu_seconds"]) / (int(r["gpus"]) * _jct(r)) for r in a.values()])
    assert s["jain_share"] == pytest.approx(_jain(shares), rel=1e-12) and s["jain_jobs"] == 992
    gpu_h = sum(float(r["gpu_seconds"]) for r in a.values()) / 3600
    assert s["gpu_hours"] == pytest.approx(gpu_h, rel=1e-12)
    assert s["cost"] == pytest.approx(2.5 * gpu_h, rel=1e-12)
    assert s["price_per_gpu_hour"] == {"*": 2.5}
    # trace3 names no users, and jobs.csv has no user or project column: said, not guessed
    assert "gpu_hours_by_entity" not in s and "--trace" in s["unavailable"]["gpu_hours_by_entity"]
    assert set(SUMMARY_KEYS) <= set(s)  # the old --json keys are all still there


def test_a_run_against_itself_has_rho_one_and_missing_inputs_are_reasons(trace3_runs) -> None:
    srsf, _ = trace3_runs
    same = _calc(str(srsf), "--isolated", str(srsf))
    assert same["ftf_rho_max"] == 1.0 and same["ftf_rho_p50"] == 1.0
    bare = _calc(str(srsf))
    assert not any(k.startswith("ftf_rho") for k in bare)
    assert "--isolated" in bare["unavailable"]["ftf_rho"]
    assert "--price" in bare["unavailable"]["cost"] and "cost" not in bare
    assert "jain_share" in bare and "gpu_hours" in bare  # what the results do hold is still reported
    table = _run("calc", str(srsf))
    assert "ftf_rho: unavailable" in table and "jain_share" in table


def test_gpu_hours_and_cost_per_user_from_the_philly_trace(tmp_path: Path) -> None:
    run = _simulate(tmp_path / "ph", PHILLY, "fifo")
    s = _calc(str(run), "--trace", PHILLY, "--price", "1.5")
    users = {j["jobid"]: j["user"] for j in json.loads(Path(PHILLY).read_text())}
    hours: dict[str, float] = {}
    for i, r in _rows(run).items():
        hours[users[i]] = hours.get(users[i], 0.0) + float(r["gpu_seconds"]) / 3600
    assert len(hours) == 2
    assert s["entity"] == "user" and s["entity_source"] == PHILLY and s["entity_unknown_jobs"] == 0
    assert s["gpu_hours_by_entity"] == pytest.approx(hours, rel=1e-12)
    assert s["cost_by_entity"] == pytest.approx({u: 1.5 * h for u, h in hours.items()}, rel=1e-12)
    assert s["jain_entity_gpu_hours"] == pytest.approx(_jain(np.array(list(hours.values()))), rel=1e-12)
    assert "ftf_rho" in s["unavailable"] and "gpu_hours_by_entity" not in s["unavailable"]


def _write(d: Path, header: str, rows: list[str], meta: dict) -> Path:
    d.mkdir()
    (d / "jobs.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    (d / "meta.json").write_text(json.dumps({"schema": "hpcsched.jobs/1", **meta}))
    return d


def test_project_column_prices_per_gpu_type_and_node_only_runs(tmp_path: Path) -> None:
    head = "job_id,submit,start,end,gpus,nodes,gpu_seconds,node_seconds,status,project,gpu_seconds_v100,gpu_seconds_k80"
    rows = ["a,0,0,100,2,0,200,0,completed,p1,200,0",  # 2 GPUs for its whole 100 s: share 1
            "b,0,50,100,1,0,50,0,completed,p1,20,30",  # 1 GPU for 50 of 100 s: share 0.5
            "c,10,20,,4,0,3600,0,unfinished,p2,0,3600"]
    run = _write(tmp_path / "h", head, rows, {"tool": "simulate", "cluster": "v100=1@3.0,k80=4@0.5"})
    s = _calc(str(run))  # prices from the cluster string
    assert s["jain_share"] == pytest.approx(1.5**2 / (2 * 1.25)) and s["jain_jobs"] == 2
    assert s["entity"] == "project" and s["entity_source"] == "jobs.csv"
    assert s["gpu_hours_by_entity"] == pytest.approx({"p1": 250 / 3600, "p2": 1.0})
    assert s["cost_by_entity"] == pytest.approx({"p1": (220 * 3.0 + 30 * 0.5) / 3600, "p2": 0.5})
    assert s["price_per_gpu_hour"] == {"v100": 3.0, "k80": 0.5}
    # a price for one type only: the k80 hours have none, so there is no cost
    s = _calc(str(run), "--price", "v100=3")
    assert "cost" not in s and "k80" in s["unavailable"]["cost"]
    # per-type prices without per-type columns cannot be split: unavailable, not spread evenly
    plain = _write(tmp_path / "p", "job_id,submit,start,end,gpus,nodes,gpu_seconds,node_seconds,status",
                   ["a,0,0,100,2,0,200,0,completed"], {"tool": "simulate", "cluster": "v100=1,k80=4"})
    s = _calc(str(plain), "--price", "v100=3,k80=0.5")
    assert "cost" not in s and "gpu_seconds_<type>" in s["unavailable"]["cost"]
    # a replay holds nodes, not GPUs: Jain's index over node shares, no GPU-hours or cost
    nodes = _write(tmp_path / "r", "job_id,submit,start,end,gpus,nodes,gpu_seconds,node_seconds,status",
                   ["a,0,0,100,0,4,0,400,completed", "b,0,0,100,0,4,0,100,completed"],
                   {"tool": "replay", "capacity_node_seconds": 1000})
    s = _calc(str(nodes), "--price", "1")
    assert s["jain_share"] == pytest.approx(1.25**2 / (2 * (1 + 0.0625)))
    assert "GPU-seconds" in s["unavailable"]["cost"] and "gpu_hours" not in s


def test_bad_price_is_a_usage_error(trace3_runs) -> None:
    r = CliRunner().invoke(app, ["calc", str(trace3_runs[0]), "--price", "v100=cheap"])
    assert r.exit_code == 2 and "--price" in r.output


def _fluid_reference(jobs: list[tuple[str, float, int, float]], capacity: float) -> dict[str, float]:
    """Gavel's isolated policy as a fluid, written plainly: (id, submit, gpus, solo seconds) -> JCT. While m
    jobs are in the system each runs at min(1, C / (m g)) of its solo speed."""
    pending = sorted(jobs, key=lambda j: j[1])
    left = {}  # id -> (submit, gpus, remaining solo seconds)
    out, t = {}, pending[0][1]
    while pending or left:
        while pending and pending[0][1] <= t:
            i, s, g, w = pending.pop(0)
            left[i] = (s, g, w)
        if not left:
            t = pending[0][1]
            continue
        rates = {i: min(1.0, capacity / (len(left) * g)) for i, (_, g, _) in left.items()}
        step = min(w / rates[i] for i, (_, _, w) in left.items())
        if pending and pending[0][1] - t < step:
            step = pending[0][1] - t
        t += step
        for i in list(left):
            s, g, w = left[i]
            w -= rates[i] * step
            if w <= 1e-9 * max(1.0, t):
                out[i] = t - s
                del left[i]
            else:
                left[i] = (s, g, w)
    return out


def test_isolated_fluid_by_hand_and_against_a_plain_reference_on_trace3(tmp_path: Path, trace3_runs) -> None:
    from hpcsched.metrics.fairness import isolated_jcts
    from hpcsched.traces import read_jobs

    # 8 GPUs; A (8 GPUs) and B (4 GPUs), 100 s each alone (x 1.015, the simulator's solo factor), both at t=0:
    # A gets 8/2 of its 8 GPUs (half speed), B its 4 (full speed): B ends at 101.5, A has half left, ends at 152.25
    trace = tmp_path / "tiny.csv"
    trace.write_text("job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
                     "A,8,0,100,vgg19,100,0\nB,4,0,100,vgg19,100,0\n")
    assert isolated_jcts(read_jobs(trace), 8) == pytest.approx({"A": 152.25, "B": 101.5}, rel=1e-12)
    run = _write(tmp_path / "r", "job_id,submit,start,end,gpus,nodes,gpu_seconds,node_seconds,status",
                 ["A,0,101.5,203,8,0,812,0,completed", "B,0,0,101.5,4,0,406,0,completed"],
                 {"tool": "simulate", "capacity_gpus": 8, "trace": str(trace)})
    s = _calc(str(run), "--isolated", "fluid")
    assert s["ftf_rho_max"] == pytest.approx(203 / 152.25) and s["ftf_rho_worst_job"] == "A"
    assert s["ftf_rho_p50"] == pytest.approx((1 + 203 / 152.25) / 2)
    assert "fluid" in s["ftf_baseline"] and str(trace) in s["ftf_baseline"]
    # trace3 on 64 GPUs: the plain reference from the CSV itself (times in ms, as the Muri format has them)
    with open(TRACE3, newline="") as f:
        rows = [(r["job_id"], int(r["submit_time"]) / 1000, int(r["num_gpu"]),
                 int(r["iterations"]) * int(r["iteration_time"]) / 1000 * 1.015) for r in csv.DictReader(f)]
    ref = _fluid_reference(rows, 64)
    got = isolated_jcts(read_jobs(TRACE3), 64)
    assert got == pytest.approx(ref, rel=1e-9)
    srsf = trace3_runs[0]
    s = _calc(str(srsf), "--isolated", "fluid")  # the trace is the one meta.json names
    a = _rows(srsf)
    rho = np.array(sorted(_jct(a[i]) / ref[i] for i in a))
    assert s["ftf_rho_max"] == pytest.approx(rho.max(), rel=1e-9)
    assert s["ftf_rho_p99"] == pytest.approx(np.percentile(rho, 99), rel=1e-9)
    # without the trace or the capacity there is no fluid baseline, and calc says why
    bare = _write(tmp_path / "b", "job_id,submit,start,end,gpus,nodes,gpu_seconds,node_seconds,status",
                  ["A,0,0,10,1,0,10,0,completed"], {"tool": "simulate", "capacity_gpus": 8})
    assert "--trace" in _calc(str(bare), "--isolated", "fluid")["unavailable"]["ftf_rho"]
