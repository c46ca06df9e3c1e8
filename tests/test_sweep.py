"""Sweep configs (expansion, ids, errors at file:line) and real resumable sweeps on a slice of trace3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcsched.errors import InputError
from hpcsched.sweep import load_config, read_table, run_sweep
from hpcsched.sweep.execute import RECORD_FILE, scale_arrivals
from hpcsched.traces import read_jobs

ROOT = Path(__file__).resolve().parents[1]
TRACE3 = ROOT / "trace-data" / "muri" / "trace3.csv"
CLUSTER = ROOT / "cluster_spec" / "n8g8.csv"


def _slice(tmp_path: Path, jobs: int = 30) -> Path:
    """The first ``jobs`` jobs of the real trace3: a small real workload that simulates in well under 1 s."""
    lines = TRACE3.read_text().splitlines()[: jobs + 1]
    p = tmp_path / "trace3_head.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def _write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _tiny_config(tmp_path: Path, policies: str = "[srtf, fifo]") -> Path:
    trace = _slice(tmp_path)
    return _write(tmp_path, f"""\
name: tiny
grid:
  kind: simulate
  policy: {policies}
  trace: {trace.name}
  cluster: {CLUSTER}
""")


def test_grid_expands_to_the_cartesian_product_with_stable_ids(tmp_path: Path) -> None:
    trace = _slice(tmp_path)
    cfg_path = _write(tmp_path, f"""\
grids:
  - kind: simulate
    policy: [srtf, srsf, tiresias]
    trace: {trace.name}
    cluster: {CLUSTER}
    compat: [default, muri]
    seed: [0, 1]
""")
    cfg = load_config(cfg_path)
    assert len(cfg.cells) == 3 * 2 * 2
    assert len({c.id for c in cfg.cells}) == 12
    assert {c.params["policy"] for c in cfg.cells} == {"srtf", "srsf", "tiresias"}
    assert all(c.params["arrival_scale"] == 1.0 for c in cfg.cells)  # default filled in
    assert all(c.params["trace"] == "trace3_head.csv" for c in cfg.cells)  # relative to the config's root
    assert [c.id for c in load_config(cfg_path).cells] == [c.id for c in cfg.cells]
    # Writing a default explicitly names the same cells (so a resume still finds them).
    text = cfg_path.read_text().replace("    seed:", "    arrival_scale: 1.0\n    seed:")
    explicit = _write(tmp_path, text, "e.yaml")
    assert {c.id for c in load_config(explicit).cells} == {c.id for c in cfg.cells}
    # Two overlapping grids run their shared cells once.
    twice = _write(tmp_path, cfg_path.read_text() + cfg_path.read_text().split("grids:\n", 1)[1], "t.yaml")
    assert len(load_config(twice).cells) == 12


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("grid:\n  kind: simulate\n  policy: [srtf, srtff]\n  trace: T\n  cluster: C\n", 3, "unknown policy 'srtff'"),
        ("grid:\n  kind: simulate\n  policy: srtf\n  trace: T\n  cluster: C\n  arival_scale: 2\n", 6,
         "unknown simulate parameter 'arival_scale'"),
        ("grid:\n  kind: simulate\n  policy: srtf\n  trace: T\n  cluster: C\n  arrival_scale: [1, -2]\n", 6,
         "finite number > 0"),
        ("grid:\n  kind: simulate\n  policy: srtf\n  trace: nope.csv\n  cluster: C\n", 4, "no such file"),
        ("grid:\n  kind: simulate\n  policy: srtf\n  cluster: C\n", 2, "lacks required parameter 'trace'"),
        ("grid:\n  kind: simulat\n", 2, "unknown kind 'simulat'"),
        ("name: x\nbogus: 1\ngrid:\n  kind: simulate\n", 2, "unknown key 'bogus'"),
        ("grid:\n  kind: simulate\n  policy: [srtf\n", 4, "invalid YAML"),
        ("grid:\n  kind: simulate\n  policy: srtf\n  trace: T\n  cluster: C\n  seed: 1.5\n", 6, "integer"),
        ("grid:\n  kind: replay\n  bounds: T\n  curves: T\n", 2, "exactly one of 'idle'"),
        ("grid:\n  kind: simulate\n  policy: []\n  trace: T\n  cluster: C\n", 3, "empty list"),
        ("report:\n  published:\n    source: x\n    trace: t\n    avg_jct: {srtf: -3}\n", 5, "number > 0"),
        ("report:\n  published:\n    trace: t\n", 3, "needs 'source'"),
        ("report:\n  published:\n    source: x\n    trace: t\n    compat: Muri\n", 5, "published compat"),
        ("report:\n  published:\n    source: x\n    trace: t\n    avg_jct: {srtf: 1, muri-z: 2}\n", 5,
         "unknown policy 'muri-z'"),
    ],
)
def test_bad_configs_name_file_and_line(tmp_path: Path, body: str, line: int, message: str) -> None:
    (tmp_path / "T").write_text("x")
    (tmp_path / "C").write_text("x")
    p = _write(tmp_path, body)
    with pytest.raises(InputError) as err:
        load_config(p)
    assert err.value.path == str(p)
    assert err.value.line == line
    assert message in err.value.message


def test_cli_reports_config_errors_as_file_line(tmp_path: Path) -> None:
    p = _write(tmp_path, "grid:\n  kind: simulate\n  policy: nosuch\n")
    r = subprocess.run([sys.executable, "-m", "hpcsched.cli", "sweep", str(p), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert f"error: {p}:3: policy: unknown policy 'nosuch'" in r.stderr
    assert "Traceback" not in r.stderr


def test_only_selects_cells_by_value_or_file_stem(tmp_path: Path) -> None:
    from hpcsched.sweep.cell import cell_filter

    cfg = load_config(_write(tmp_path, f"""\
grid:
  kind: simulate
  policy: [srtf, srsf, fifo]
  trace: [{TRACE3}, {_slice(tmp_path)}]
  cluster: {CLUSTER}
  compat: [default, muri]
"""))
    pick = cell_filter(["trace=trace3", "policy=srtf", "policy=fifo"])
    chosen = [c for c in cfg.cells if pick(c)]
    assert len(chosen) == 4
    assert {c.params["policy"] for c in chosen} == {"srtf", "fifo"}
    assert all(c.params["trace"].endswith("/trace3.csv") for c in chosen)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        cell_filter(["trace"])


def test_arrival_scale_multiplies_inter_arrival_times() -> None:
    jobs = read_jobs(TRACE3)[:50]
    scaled = scale_arrivals(jobs, 0.5)
    gaps = [b.submit - a.submit for a, b in zip(jobs, jobs[1:], strict=False)]
    new_gaps = [b.submit - a.submit for a, b in zip(scaled, scaled[1:], strict=False)]
    assert scaled[0].submit == jobs[0].submit
    assert new_gaps == pytest.approx([g * 0.5 for g in gaps])
    assert [j.duration for j in scaled] == [j.duration for j in jobs]


def test_sweep_runs_real_cells_and_resumes_without_redoing_them(tmp_path: Path) -> None:
    cfg = load_config(_tiny_config(tmp_path))
    out = tmp_path / "out"
    first = run_sweep(cfg, out, workers=2, progress=False)
    assert (first.ran, first.skipped, first.failed) == (2, 0, [])
    table = read_table(out)
    assert list(table["policy"]) == ["srtf", "fifo"]
    assert (table["status"] == "ok").all() and (table["jobs"] == 30).all()
    # SRTF minimises average JCT better than FIFO on this slice; both finish the same work.
    srtf, fifo = (table.set_index("policy").loc[p] for p in ("srtf", "fifo"))
    assert srtf["avg_jct"] < fifo["avg_jct"]
    for c in cfg.cells:
        d = out / "cells" / c.id
        assert {"jobs.csv", "meta.json", "timeline.csv", RECORD_FILE} <= {p.name for p in d.iterdir()}
    stamps = {c.id: (out / "cells" / c.id / RECORD_FILE).stat().st_mtime_ns for c in cfg.cells}

    second = run_sweep(cfg, out, workers=2, progress=False)
    assert (second.ran, second.skipped) == (0, 2)
    assert {c.id: (out / "cells" / c.id / RECORD_FILE).stat().st_mtime_ns for c in cfg.cells} == stamps
    assert read_table(out)[["cell_id", "avg_jct"]].equals(table[["cell_id", "avg_jct"]])

    # A cell interrupted before it marked itself finished is the only one redone.
    (out / "cells" / cfg.cells[1].id / RECORD_FILE).unlink()
    third = run_sweep(cfg, out, workers=1, progress=False)
    assert (third.ran, third.skipped) == (1, 1)
    # Growing the grid runs only the new cell.
    bigger = load_config(_tiny_config(tmp_path, "[srtf, fifo, srsf]"))
    fourth = run_sweep(bigger, out, workers=1, progress=False)
    assert (fourth.ran, fourth.skipped) == (1, 2)
    assert len(read_table(out)) == 3
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["status"] == "done" and len(manifest["cells"]) == 3


def test_a_failing_cell_is_recorded_and_retried(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(TRACE3.read_text().splitlines()[0] + "\n")  # a header and no jobs
    cfg = load_config(_write(tmp_path, f"grid:\n  kind: simulate\n  policy: srtf\n  trace: bad.csv\n"
                                       f"  cluster: {CLUSTER}\n"))
    out = tmp_path / "out"
    outcome = run_sweep(cfg, out, workers=1, progress=False)
    assert outcome.ran == 1 and len(outcome.failed) == 1
    assert "bad.csv" in outcome.failed[0]["error"] and "no jobs" in outcome.failed[0]["error"]
    assert read_table(out)["status"].tolist() == ["failed"]
    assert run_sweep(cfg, out, workers=1, progress=False).ran == 1  # failed cells are not 'finished'


def test_cli_sweep_json_and_dry_run(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hpcsched.cli import app

    cfg = _tiny_config(tmp_path, "[srtf]")
    out = tmp_path / "out"
    runner = CliRunner()
    dry = runner.invoke(app, ["sweep", str(cfg), "--out", str(out), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert [c["policy"] for c in json.loads(dry.stdout)] == ["srtf"] and not out.exists()
    run = runner.invoke(app, ["sweep", str(cfg), "--out", str(out), "--json", "-j", "1"])
    assert run.exit_code == 0, run.output
    summary = json.loads(run.stdout)
    assert (summary["cells"], summary["ran"], summary["failed"]) == (1, 1, 0)
    assert (out / "results.csv").is_file()
    again = json.loads(runner.invoke(app, ["sweep", str(cfg), "--out", str(out), "--json"]).stdout)
    assert (again["ran"], again["skipped"]) == (0, 1)


def test_a_cell_over_the_time_limit_is_stopped_recorded_and_the_grid_goes_on(tmp_path: Path) -> None:
    # Muri-S on the whole trace2 (5,755 jobs) needs tens of CPU seconds; the 30-job slice well under one.
    trace2 = ROOT / "trace-data" / "muri" / "trace2.csv"
    slice_ = _slice(tmp_path)
    cfg = load_config(_write(tmp_path, f"""\
grids:
  - kind: simulate
    policy: muri-s
    trace: {trace2}
    cluster: {CLUSTER}
  - kind: simulate
    policy: srtf
    trace: {slice_.name}
    cluster: {CLUSTER}
"""))
    out = tmp_path / "out"
    outcome = run_sweep(cfg, out, workers=2, progress=False, timeout_s=4.0)
    assert outcome.ran == 2 and len(outcome.failed) == 1
    assert "timed out" in outcome.failed[0]["error"] and outcome.failed[0]["id"] == cfg.cells[0].id
    table = read_table(out).set_index("policy")
    assert table.loc["muri-s", "status"] == "failed" and table.loc["srtf", "status"] == "ok"
    assert table.loc["srtf", "jobs"] == 30 and table.loc["muri-s", "wall_s"] >= 4.0  # stopped at its limit, not before
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["status"] == "failed" and manifest["outcome"]["failed"] == 1
    # resume retries only the stopped cell
    again = run_sweep(cfg, out, workers=1, progress=False, timeout_s=1.0,
                      only=lambda c: c.params["policy"] == "muri-s")
    assert (again.ran, again.skipped) == (1, 1) and len(again.failed) == 1


def test_a_cell_whose_process_dies_is_recorded_with_how_it_died(tmp_path: Path) -> None:
    import multiprocessing
    import os
    import signal

    from hpcsched.sweep.local import _finished
    from hpcsched.sweep.store import read_record

    cell = load_config(_tiny_config(tmp_path, "[srtf]")).cells[0]
    out = tmp_path / "out"
    ctx = multiprocessing.get_context("spawn")
    quiet = ctx.Process(target=_sleep, args=(0,))  # a real child that exits cleanly but leaves no record
    quiet.start()
    quiet.join()
    rec = _finished(quiet, cell, out, 1.0)
    assert rec["status"] == "failed" and "exit code 0" in rec["error"]  # never a silent 'ok'
    killed = ctx.Process(target=_sleep, args=(60,))
    killed.start()
    os.kill(killed.pid, signal.SIGKILL)  # what the kernel's out-of-memory killer does
    killed.join()
    rec = _finished(killed, cell, out, 1.0)
    assert "SIGKILL" in rec["error"] and "out of memory" in rec["error"]
    stored = read_record(out, cell)
    assert stored is not None and stored["error"] == rec["error"] and stored["status"] == "failed"


def _sleep(seconds: float) -> None:
    import time

    time.sleep(seconds)
