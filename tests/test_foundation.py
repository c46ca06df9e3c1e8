"""Model, cluster spec, results and metrics on tiny cases checkable by hand, and on trace3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from hpcsched.cluster_spec import read_cluster_spec
from hpcsched.errors import InputError
from hpcsched.metrics import summarize
from hpcsched.model import ScalingCurve
from hpcsched.results import JobResult, read_results, write_results
from hpcsched.traces import read_jobs

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "trace-data"


def test_scaling_curve_interpolates_non_concave() -> None:
    c = ScalingCurve((0, 1, 2, 4), (0.0, 10.0, 15.0, 40.0))
    assert c.rate(3) == pytest.approx(27.5)
    assert c.rate(1.5) == pytest.approx(12.5)
    assert c.rate(10) == 40.0


def test_scaling_curve_rejects_unsorted() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        ScalingCurve((0, 2, 1), (0, 1, 2))


def test_cluster_spec_csv_and_yaml(tmp_path: Path) -> None:
    spec = read_cluster_spec(ROOT / "cluster_spec" / "n8g8.csv")
    assert (spec.nodes, spec.gpus, spec.cpus_per_node) == (8, 64, 92)
    y = tmp_path / "c.yaml"
    y.write_text("switches: 2\nnodes_per_switch: 4\ngpus_per_node: 4\n")
    assert read_cluster_spec(y).gpus == 32
    y.write_text("switches: 2\nnodes_per_switch: x\ngpus_per_node: 4\n")
    with pytest.raises(InputError, match="nodes_per_switch must be a number"):
        read_cluster_spec(y)


def test_muri_reader_converts_ms_to_seconds() -> None:
    jobs = read_jobs(DATA / "muri" / "trace3.csv")
    assert len(jobs) == 992
    j1 = jobs[1]  # 1,4,1456000,1005573,resnet18,128,926133000,1456000,921,723,113,73,1
    assert (j1.gpus, j1.submit, j1.iterations, j1.model) == (4, 1456.0, 1005573, "resnet18")
    assert j1.duration == pytest.approx(926133.0)
    assert j1.profile is not None and j1.profile.stages() == pytest.approx((0.723, 0.113, 0.073))


def test_summary_by_hand(tmp_path: Path) -> None:
    # JCTs 10, 20, 30, 40 on a 4-GPU cluster; job 4 never finished.
    rows = [JobResult(str(i), submit=0.0, start=0.0, end=10.0 * i, gpus=1, gpu_seconds=10.0 * i) for i in range(1, 5)]
    rows.append(JobResult("5", submit=5.0, start=None, end=None, gpus=1, status="unfinished"))
    write_results(tmp_path, rows, {"policy": "p", "capacity_gpus": 4})
    df, meta = read_results(tmp_path)
    s = summarize(df, meta)
    assert s["jobs"] == 4 and s["unfinished"] == 1
    assert s["avg_jct"] == 25.0 and s["p99_jct"] == 40.0 and s["makespan"] == 40.0
    assert s["utilization"] == pytest.approx(100.0 / (4 * 40.0))


def test_calc_cli_json_and_bad_input(tmp_path: Path) -> None:
    write_results(tmp_path / "r", [JobResult("a", 0.0, 1.0, 3.0, gpus=2, gpu_seconds=4.0)], {"capacity_gpus": 2})
    exe = [sys.executable, "-m", "hpcsched.cli"]
    out = subprocess.run([*exe, "calc", str(tmp_path / "r"), "--json"], capture_output=True, text=True, check=True)
    s = json.loads(out.stdout)
    assert {"jobs", "avg_jct", "p50_jct", "p95_jct", "p99_jct", "makespan", "utilization"} <= set(s)
    assert s["avg_jct"] == 3.0
    (tmp_path / "bad").mkdir()
    pd.DataFrame({"job_id": ["x"], "submit": ["zero"], "start": [1], "end": [2]}).to_csv(
        tmp_path / "bad" / "jobs.csv", index=False)
    bad = subprocess.run([*exe, "calc", str(tmp_path / "bad")], capture_output=True, text=True)
    assert bad.returncode == 2 and "jobs.csv:2: column submit holds a non-number" in bad.stderr
    assert "Traceback" not in bad.stderr
