"""Reports: normalised bars on a hand-checkable table, and every file produced from a real sweep."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hpcsched.report import make_report, published
from hpcsched.report.frames import normalized
from hpcsched.report.plots import normalized_bars
from hpcsched.sweep import load_config, run_sweep

ROOT = Path(__file__).resolve().parents[1]
TRACE3 = ROOT / "trace-data" / "muri" / "trace3.csv"
CLUSTER = ROOT / "cluster_spec" / "n8g8.csv"


def _row(policy: str, trace: str, avg: float, p99: float, mk: float, seed: int = 0, compat: str = "muri") -> dict:
    return {"cell_id": f"{policy}-{trace}-{seed}-{compat}", "kind": "simulate", "status": "ok", "policy": policy,
            "trace": f"trace-data/muri/{trace}.csv", "cluster": "cluster_spec/n8g8.csv", "compat": compat,
            "arrival_scale": 1.0, "seed": seed, "avg_jct": avg, "p99_jct": p99, "makespan": mk}


def _hand_table() -> pd.DataFrame:
    return pd.DataFrame([
        _row("srtf", "trace1", 100.0, 1000.0, 5000.0),
        _row("muri-s", "trace1", 40.0, 500.0, 4000.0, seed=0),
        _row("muri-s", "trace1", 60.0, 700.0, 4000.0, seed=1),  # seeds average to 50 / 600 / 4000
        _row("srtf", "trace2", 200.0, 800.0, 1000.0),
        _row("muri-s", "trace2", 300.0, 400.0, 1000.0),
        _row("muri-s", "trace2", 30.0, 40.0, 100.0, compat="default"),  # another context: no srtf there
    ])


def test_normalised_values_are_ratios_to_the_baseline_within_trace_and_context() -> None:
    norm = normalized(_hand_table(), "srtf").set_index(["context", "trace_name", "policy"])
    muri = norm.loc[("compat=muri", "trace1", "muri-s")]
    assert (muri["avg_jct"], muri["p99_jct"], muri["makespan"]) == pytest.approx((0.5, 0.6, 0.8))
    assert norm.loc[("compat=muri", "trace2", "muri-s"), "avg_jct"] == pytest.approx(1.5)
    assert norm.loc[("compat=muri", "trace2", "muri-s"), "p99_jct"] == pytest.approx(0.5)
    assert norm.loc[("compat=muri", "trace1", "srtf")].tolist() == [1.0, 1.0, 1.0]
    # No baseline cell in that context: shown as missing, never normalised to something else.
    assert np.isnan(norm.loc[("compat=default", "trace2", "muri-s"), "avg_jct"])


def test_bars_drawn_have_the_normalised_heights(tmp_path: Path) -> None:
    norm = normalized(_hand_table(), "srtf")
    norm = norm[norm["context"] == "compat=muri"]
    drawn = normalized_bars(norm, "srtf", "hand", tmp_path / "bars.png")
    assert drawn["avg_jct"] == pytest.approx({("trace1", "srtf"): 1.0, ("trace1", "muri-s"): 0.5,
                                              ("trace2", "srtf"): 1.0, ("trace2", "muri-s"): 1.5})
    assert drawn["makespan"][("trace1", "muri-s")] == pytest.approx(0.8)
    assert (tmp_path / "bars.png").stat().st_size > 5000


def test_report_of_a_real_sweep_writes_markdown_and_plots(tmp_path: Path) -> None:
    trace = tmp_path / "trace3_head.csv"
    trace.write_text("\n".join(TRACE3.read_text().splitlines()[:31]) + "\n")
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"name: rep\nreport:\n  baseline: srtf\n  published:\n    source: a paper\n    trace: trace3_head\n"
                   "    compat: muri\n    avg_jct: {srtf: 1000, fifo: 3000}\n"
                   f"grid:\n  kind: simulate\n  policy: [srtf, fifo]\n"
                   f"  trace: {trace.name}\n  cluster: {CLUSTER}\n  compat: [default, muri]\n")
    out = tmp_path / "sweep"
    assert run_sweep(load_config(cfg), out, workers=1, progress=False).failed == []
    readme = make_report(out, tmp_path / "report", command=["hpcsched", "report", str(out)])
    text = readme.read_text()
    files = {p.name for p in readme.parent.iterdir()}
    for ctx in ("compat_default", "compat_muri"):
        assert {f"bars_{ctx}.png", f"cdf_{ctx}.png", f"util_{ctx}.png"} <= files
        assert f"![normalised bars](bars_{ctx}.png)" in text
    assert "results.csv" in files and "results.parquet" not in files
    assert f"hpcsched report {out}" in text and "divided by `srtf`" in text
    table = pd.read_csv(readme.parent / "results.csv")
    fifo = table[(table["policy"] == "fifo") & (table["compat"] == "muri")]["avg_jct"].item()
    srtf = table[(table["policy"] == "srtf") & (table["compat"] == "muri")]["avg_jct"].item()
    assert f"| trace3_head | 1 | {fifo / srtf:.3f} |" in text  # the avg-JCT ratio table under the bars
    # the published figures beside ours, with the difference in %, raw and normalised to the baseline
    assert "## Published vs ours: trace3_head, compat=muri" in text and "Published: a paper." in text
    assert f"| srtf | 1000 | {srtf:,.2f} | {100 * (srtf - 1000) / 1000:+.2f} |" in text
    assert f"| fifo | 3 | {fifo / srtf:.3f} |" in text
    assert "makespan is the last end minus the first submit" in text
    # A table from before makespan counted from the first submit (no first_submit column, makespan = some
    # other figure): the report recomputes it from each cell's jobs.csv rather than mixing definitions.
    results = pd.read_csv(out / "results.csv")
    true_makespan = results.set_index("cell_id")["makespan"]
    results.drop(columns=["first_submit", "last_end"]).assign(makespan=results["makespan"] + 12345.0).to_csv(
        out / "results.csv", index=False)
    readme = make_report(out, tmp_path / "report2")
    again = pd.read_csv(readme.parent / "results.csv").set_index("cell_id")
    assert again["makespan"].to_dict() == pytest.approx(true_makespan.to_dict())
    assert (again["first_submit"] == 0).all() and "Makespan of" not in readme.read_text()


def test_published_figures_are_matched_to_trace_mode_and_seed_means() -> None:
    block = {"source": "s", "trace": "trace1", "compat": "muri", "avg_jct": {"muri-s": 40.0, "srtf": 80.0},
             "p99_jct": {"muri-s": 600.0}}
    (ctx, ours), = published.ours_for(_hand_table(), block).items()
    assert ctx == "compat=muri" and ours.at["muri-s", "avg_jct"] == pytest.approx(50.0)  # seeds averaged
    table = published.comparison(ours, block).set_index("policy")
    assert table.at["muri-s", "avg JCT diff %"] == pytest.approx(25.0)  # (50 - 40) / 40
    assert table.at["srtf", "avg JCT diff %"] == pytest.approx(25.0)  # (100 - 80) / 80
    assert table.at["muri-s", "p99 JCT diff %"] == pytest.approx(0.0) and np.isnan(table.at["srtf", "p99 JCT diff %"])
    norm = published.normalised_comparison(ours, block, "muri-s").set_index("policy")
    assert norm.at["srtf", "avg JCT published"] == pytest.approx(2.0) and norm.at["srtf", "avg JCT ours"] == 2.0
    assert published.ours_for(_hand_table(), block | {"compat": "default"}) == {}  # no trace1 cell there


def test_published_makespan_is_muris_last_end_where_the_trace_starts_late() -> None:
    """Muri printed its last end time as the makespan; ours counts from the first submit. On a trace whose
    first submit is not 0 a compat=muri comparison takes our last end, and says so; otherwise ours."""
    late = _hand_table().assign(first_submit=1000.0)
    late["last_end"] = late["makespan"] + 1000.0
    block = {"source": "s", "trace": "trace1", "compat": "muri", "makespan": {"srtf": 6000.0, "muri-s": 5000.0}}
    (_, ours), = published.ours_for(late, block).items()
    table = published.comparison(ours, block).set_index("policy")
    assert table.at["srtf", "makespan ours"] == 6000.0 and table.at["srtf", "makespan diff %"] == 0.0
    assert "Muri's definition" in published.makespan_note(late, block) and "1,000.00 s" in published.makespan_note(
        late, block)
    # the default mode keeps ours (last end - first submit) and says how far a time-0 figure would be
    default = late.assign(compat="default")
    (_, ours), = published.ours_for(default, block | {"compat": "default"}).items()
    assert ours.at["srtf", "makespan"] == 5000.0
    assert "differs by that much" in published.makespan_note(default, block | {"compat": "default"})
    # a trace starting at 0 (every bundled Muri trace): both definitions agree, and the note says that
    zero = _hand_table().assign(first_submit=0.0)
    zero["last_end"] = zero["makespan"]
    (_, ours), = published.ours_for(zero, block).items()
    assert ours.at["srtf", "makespan"] == 5000.0
    assert "first submit is 0, so it is also Muri's" in published.makespan_note(zero, block)


def test_replay_sweep_and_its_report(tmp_path: Path) -> None:
    bft = ROOT / "trace-data" / "bftrainer"
    # The first two shufflenet jobs, shortened so they finish within hours of the real idle log.
    (tmp_path / "b.csv").write_text(
        "\n".join(line.replace("130000000.0", "2000000.0")
                  for line in (bft / "hps-shufflenet-Jbnd-10J.csv").read_text().splitlines()[:3]) + "\n")
    (tmp_path / "c.csv").write_text("\n".join((bft / "hps-shufflenet-JNPs-10J.csv").read_text().splitlines()[:3]))
    cfg = tmp_path / "r.yaml"
    cfg.write_text(f"grid:\n  kind: replay\n  idle: {bft / 'idle-intervals.csv.gz'}\n  nodes: 8\n"
                   "  bounds: b.csv\n  curves: c.csv\n  tfwd: [10, 300]\n  solver: greedy\n")
    out = tmp_path / "sweep"
    assert run_sweep(load_config(cfg), out, workers=1, progress=False).failed == []
    table = pd.read_csv(out / "results.csv")
    assert table["tfwd"].tolist() == [10.0, 300.0]
    assert (table["jobs_done"] == 2).all() and (table["pool_nodes"] == 8).all()
    assert ((table["utilization"] > 0) & (table["utilization"] <= 1)).all()
    assert table["utilization"].to_numpy() == pytest.approx(
        (table["used_node_hours"] / table["idle_node_hours"]).to_numpy(), rel=1e-6)
    # One code path: `hpcsched replay` with the first cell's parameters writes the same files and summary.
    from typer.testing import CliRunner

    from hpcsched.cli import app

    cli_out = tmp_path / "cli"
    r = CliRunner().invoke(app, ["replay", "--idle", str(bft / "idle-intervals.csv.gz"), "--nodes", "8", "--jobs",
                                 str(tmp_path / "b.csv"), "--curves", str(tmp_path / "c.csv"), "--tfwd", "10",
                                 "--solver", "greedy", "--out", str(cli_out), "--json"])
    assert r.exit_code == 0, r.output
    cell_out = out / "cells" / table["cell_id"].iloc[0]
    for name in ("jobs.csv", "job_progress.csv"):
        assert (cli_out / name).read_text() == (cell_out / name).read_text()
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("events", "jobs_done", "idle_node_hours", "used_node_hours", "utilization", "rescales"):
        assert summary[key] == pytest.approx(table[key].iloc[0], rel=1e-9)
    readme = make_report(out, tmp_path / "report")
    files = {p.name for p in readme.parent.iterdir()}
    assert {"harvest_vs_tfwd.png", "util_replay.png", "README.md"} <= files
    assert "## Idle-node harvesting replays" in readme.read_text()
