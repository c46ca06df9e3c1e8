"""Every figure simulate / compare / calc / report print says what it is (issue 14, item 6).

- makespan counts from the first submit on a trace with calendar times (not an epoch timestamp);
- runs sharing a policy name get labels that tell them apart, in tables and legends;
- every plot's title names the trace and the cluster, its axes say their units, value axes start at 0.

Figures are checked through the matplotlib objects saved (titles, labels, limits), not pixels.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from hpcsched.cli import app
from hpcsched.metrics import summarize
from hpcsched.metrics.labels import run_labels, runs_subject
from hpcsched.results import JobResult, read_results, write_results

ROOT = Path(__file__).resolve().parents[1]
TRACE3 = ROOT / "trace-data" / "muri" / "trace3.csv"
N8G8 = ROOT / "cluster_spec" / "n8g8.csv"
WIDE = {"COLUMNS": "250"}  # rich wraps long column labels at 80 columns; the tests read whole labels
# Philly-derived CSV (Sia): calendar timestamps, so submit times are Unix seconds around 1.5e9.
PHILLY = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 06:00:00,3600.0,2,7200.0,a
2017-10-09 06:10:00,1800.0,4,7200.0,a
2017-10-09 06:20:00,600.0,8,4800.0,a
2017-10-09 07:00:00,7200.0,1,7200.0,a
2017-10-09 07:30:00,300.0,8,2400.0,a
"""


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """What every figure saved during the test showed, by file name: titles, axis labels, limits, legends."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    seen: dict[str, dict[str, Any]] = {}
    original = Figure.savefig

    def record(self: Figure, fname: Any, *args: Any, **kwargs: Any) -> Any:
        axes = [ax for ax in self.axes if ax.axison]
        legends = [leg for leg in [*self.legends, *(ax.get_legend() for ax in axes)] if leg is not None]
        seen[Path(fname).name] = {
            "suptitle": self.get_suptitle(),
            "titles": [ax.get_title() for ax in axes],
            "xlabels": [ax.get_xlabel() for ax in axes],
            "ylabels": [ax.get_ylabel() for ax in axes],
            "ylims": [ax.get_ylim() for ax in axes],
            "legend": [t.get_text() for leg in legends for t in leg.get_texts()],
        }
        return original(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    return seen


def _invoke(*args: str) -> Any:
    r = CliRunner().invoke(app, list(args), env=WIDE)
    assert r.exit_code == 0, r.output
    return r


# -- makespan counts from the first submit ------------------------------------------------------------

def test_summary_makespan_is_last_end_minus_first_submit(tmp_path: Path) -> None:
    t0 = 1_507_528_800.0  # 2017-10-09 06:00 UTC
    rows = [JobResult("a", submit=t0, start=t0, end=t0 + 100.0, gpus=1, gpu_seconds=100.0),
            JobResult("b", submit=t0 + 50.0, start=t0 + 50.0, end=t0 + 400.0, gpus=1, gpu_seconds=350.0)]
    write_results(tmp_path, rows, {"policy": "p", "capacity_gpus": 2})
    s = summarize(*read_results(tmp_path))
    assert s["makespan"] == pytest.approx(400.0) and s["span"] == pytest.approx(400.0)
    assert s["first_submit"] == t0 and s["last_end"] == t0 + 400.0  # the trace clock, as extra keys
    assert s["utilization"] == pytest.approx(450.0 / (2 * 400.0))


def test_simulate_calc_and_compare_report_makespan_from_the_first_submit(tmp_path: Path,
                                                                          figures: dict[str, dict[str, Any]]) -> None:
    trace = tmp_path / "philly_small.csv"
    trace.write_text(PHILLY)
    r = _invoke("simulate", "--trace", str(trace), "--cluster", str(N8G8), "--policy", "srsf",
                "--out", str(tmp_path / "sim"), "--json")
    s = json.loads(r.stdout.strip().splitlines()[-1])
    jobs = pd.read_csv(tmp_path / "sim" / "jobs.csv")
    assert jobs["submit"].min() > 1e9  # the trace really has absolute times
    expected = jobs["end"].max() - jobs["submit"].min()
    assert s["makespan"] == pytest.approx(expected) and s["span"] == pytest.approx(expected)
    assert s["makespan"] < 1e6 and s["last_end"] == pytest.approx(jobs["end"].max())
    calc = json.loads(_invoke("calc", str(tmp_path / "sim"), "--json").stdout)
    assert calc["makespan"] == pytest.approx(expected) and calc["last_end"] == pytest.approx(jobs["end"].max())
    # the tables print the relative figure, and the trace-clock time beside it, labelled
    table = _invoke("simulate", "--trace", str(trace), "--cluster", str(N8G8), "--policy", "srsf",
                    "--out", str(tmp_path / "sim2")).stdout
    assert f"{expected:,.2f}" in table and "last end (s, trace clock)" in table
    assert "makespan = last end - first submit" in table
    table = _invoke("calc", str(tmp_path / "sim")).stdout
    assert re.search(rf"makespan \(s, from first submit\) +│ +{expected:,.2f} ", table), table
    compare = _invoke("compare", "--trace", str(trace), "--cluster", str(N8G8), "--policies", "fifo,srsf",
                      "--out", str(tmp_path / "cmp")).stdout
    assert f"{expected:,.2f}" in compare and f"{jobs['end'].max():,.2f}" in compare
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    assert [x["makespan"] for x in summary] == pytest.approx([expected, expected])


def test_muri_trace_makespan_is_unchanged_by_the_new_definition() -> None:
    """Every bundled Muri trace starts at 0, so the published makespans (last end) are ours too."""
    for name in ("trace1", "trace2", "trace3", "trace4"):
        for suffix in ("", "_pr"):
            head = pd.read_csv(ROOT / "trace-data" / "muri" / f"{name}{suffix}.csv", usecols=["submit_time"])
            assert head["submit_time"].min() == 0, f"{name}{suffix}"


# -- labels that tell runs apart -------------------------------------------------------------------------

def test_run_labels_name_what_differs() -> None:
    replay = {"policy": "bftrainer-highs", "trace": "x/idle-intervals.csv.gz", "cluster": "40 nodes"}
    assert run_labels([replay | {"tfwd": 1.0}, replay | {"tfwd": 10.0}, {"policy": "srsf"}]) == [
        "bftrainer-highs (tfwd=1)", "bftrainer-highs (tfwd=10)", "srsf"]
    assert run_labels([{"policy": "srsf", "trace": "a/trace1.csv", "cluster": "n8g8"},
                       {"policy": "srsf", "trace": "a/trace3.csv", "cluster": "n8g8"}]) == [
        "srsf (trace1)", "srsf (trace3)"]
    # nothing in meta.json differs: the folders do; the same folder twice: numbered
    assert run_labels([{"policy": "p", "dir": "out/a"}, {"policy": "p", "dir": "out/b"}]) == ["p (a)", "p (b)"]
    assert run_labels([{"policy": "p", "dir": "out/a"}, {"policy": "p", "dir": "out/a"}]) == [
        "p (out/a, #1)", "p (out/a, #2)"]
    assert run_labels([{"dir": "runs/first"}, {"dir": "runs/second"}]) == ["first", "second"]


def test_calc_labels_duplicate_policies_apart_in_table_json_and_legend(tmp_path: Path,
                                                                        figures: dict[str, dict[str, Any]]) -> None:
    dirs = []
    for tfwd in (1.0, 10.0, 60.0):  # three replays of one policy: the bftrainer-highs x3
        d = tmp_path / f"replay-{tfwd:g}"
        write_results(d, [JobResult("j", submit=100.0, start=100.0, end=200.0 + tfwd, nodes=2, node_seconds=10.0)],
                      {"tool": "replay", "policy": "bftrainer-highs", "trace": "idle-intervals.csv.gz",
                       "cluster": "40 nodes", "capacity_nodes": 40, "tfwd": tfwd})
        dirs.append(str(d))
    out = _invoke("calc", *dirs, "--plot", str(tmp_path / "cdf.png")).stdout
    labels = ["bftrainer-highs (tfwd=1)", "bftrainer-highs (tfwd=10)", "bftrainer-highs (tfwd=60)"]
    for label in labels:
        assert out.count(label) == 1
    assert [s["label"] for s in json.loads(_invoke("calc", *dirs, "--json").stdout)] == labels
    fig = figures["cdf.png"]
    assert fig["legend"] == labels
    assert "idle-intervals on 40 nodes" in fig["titles"][0]
    assert "(s, log scale)" in fig["xlabels"][0] and fig["ylims"][0][0] == 0


# -- plots name trace and cluster -------------------------------------------------------------------------

def test_compare_plot_names_trace_cluster_and_mode(tmp_path: Path, figures: dict[str, dict[str, Any]]) -> None:
    trace = tmp_path / "trace3_head.csv"
    trace.write_text("\n".join(TRACE3.read_text().splitlines()[:31]) + "\n")
    out = _invoke("compare", "--trace", str(trace), "--cluster", str(N8G8), "--policies", "fifo,srsf,srsf",
                  "--out", str(tmp_path / "cmp"), "--compat", "muri")
    assert "repeats srsf" in out.stderr  # a repeated policy runs once, with a warning
    fig = figures["jct_cdf.png"]
    assert fig["titles"] == ["JCT CDF: trace3_head on n8g8 (64 GPUs), compat=muri"]
    assert fig["legend"] == ["fifo", "srsf"]
    assert fig["xlabels"] == ["job completion time (s, log scale)"] and fig["ylims"][0][0] == 0
    assert "trace3_head on n8g8 (64 GPUs), compat=muri" in out.stdout  # the table's title too


def test_runs_subject_names_every_trace_cluster_and_mode() -> None:
    muri = {"trace": "t/trace3.csv", "cluster": "n8g8", "capacity_gpus": 64, "compat": "muri"}
    assert runs_subject([muri]) == "trace3 on n8g8 (64 GPUs), compat=muri"
    assert runs_subject([muri, muri | {"compat": None}]) == "trace3 on n8g8 (64 GPUs), compat=muri/default"
    assert runs_subject([{}]) == "trace unknown on cluster unknown"


def test_report_plots_name_traces_and_cluster_and_start_at_zero(tmp_path: Path,
                                                                 figures: dict[str, dict[str, Any]]) -> None:
    from hpcsched.report import make_report
    from hpcsched.sweep import load_config, run_sweep

    trace = tmp_path / "trace3_head.csv"
    trace.write_text("\n".join(TRACE3.read_text().splitlines()[:31]) + "\n")
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"name: t\nreport:\n  baseline: srtf\ngrid:\n  kind: simulate\n  policy: [srtf, fifo]\n"
                   f"  trace: {trace.name}\n  cluster: {N8G8}\n  compat: muri\n")
    out = tmp_path / "sweep"
    assert run_sweep(load_config(cfg), out, workers=1, progress=False).failed == []
    readme = make_report(out, tmp_path / "report")
    assert "makespan is the last end minus the first submit" in readme.read_text()
    ctx = "all"  # one context: nothing but trace and policy varies
    for name in (f"bars_{ctx}.png", f"cdf_{ctx}.png", f"util_{ctx}.png"):
        fig = figures[name]
        assert "cluster=n8g8" in fig["suptitle"] and "compat=muri" in fig["suptitle"], name
        assert "trace3_head" in fig["suptitle"] + " ".join(fig["titles"]), name
        assert all(lo == 0 for lo, _ in fig["ylims"]), name
        assert all(x for x in fig["xlabels"]) and any(y for y in fig["ylabels"]), name
    assert sorted(figures[f"cdf_{ctx}.png"]["legend"]) == ["fifo", "srtf"]
    assert "(h)" in figures[f"util_{ctx}.png"]["xlabels"][0]


def test_harvest_plot_starts_node_hours_at_zero_and_names_the_pool(tmp_path: Path,
                                                                    figures: dict[str, dict[str, Any]]) -> None:
    from hpcsched.report.plots import harvest_vs_tfwd

    rep = pd.DataFrame({"context": ["all"] * 3, "tfwd": [1.0, 10.0, 60.0], "utilization": [0.97, 0.98, 0.99],
                        "used_node_hours": [254.0, 257.0, 260.0]})
    harvest_vs_tfwd(rep, tmp_path / "h.png", "idle=idle-intervals, nodes=40")
    fig = figures["h.png"]
    assert "idle=idle-intervals, nodes=40" in fig["suptitle"]
    assert [lo for lo, _ in fig["ylims"]] == [0, 0] and fig["ylims"][1][1] > 260.0
    assert fig["ylabels"][1] == "harvested node-hours (node-h)"
