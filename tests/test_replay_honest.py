"""The replayer prints only true, complete figures (issue 14, item 6): each test reproduces one report.

1. a Cobalt log of another machine was replayed on Theta's 4,392 nodes, skipping jobs as "no room" silently;
2. the default accounting booked node-time held after Pmax as used (37,221 vs 19,513 node-h);
3. a log starting on an empty machine replayed as a huge idle window without a word;
4. flagged-but-kept rows read as dropped;
5. ``--json`` must leave only JSON on stdout;
6. ``calc`` reports replay/harvest figures, and non-optimal decisions are counted and warned about.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcsched.harvest.log_checks import busy_steps, describe_rows, warmup_check
from hpcsched.harvest.pool import PoolEvent, PoolTimeline, timeline_from_log
from hpcsched.harvest.replay import ReplayConfig, replay
from hpcsched.model import ElasticJob, ScalingCurve
from hpcsched.results import JobResult, read_results, write_results

DATA = Path("trace-data")
BF = DATA / "bftrainer"
JOBS10 = (BF / "hps-shufflenet-Jbnd-10J.csv", BF / "hps-shufflenet-JNPs-10J.csv")
KTH = DATA / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz"
THETA = DATA / "cobalt" / "theta-2022-2023.csv.gz"
COBALT_HEAD = (",job,user,project,state,gpu_num,cpu_num,node_num,submit_time,wait_time,run_time,wall_time,node_hour,"
               "new_status")
T0 = 1_700_000_000


def _cobalt(path: Path, rows: list[tuple[str, int, int, int, int]]) -> Path:
    """A Cobalt (DIR-LAB/lumos) CSV: rows of (job, nodes, submit offset, wait, run)."""
    lines = [COBALT_HEAD] + [f"{k},{j},u,p,s,0,0,{n},{T0 + sub},{wait},{run},{run},1,Pass"
                             for k, (j, n, sub, wait, run) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


# A machine larger than Theta: 6,000 + 3,000 nodes busy at once, then 2,000.
BIG_ROWS = [("1", 6000, 0, 0, 3600), ("2", 3000, 100, 0, 1800), ("3", 2000, 4000, 0, 3600)]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcsched.cli", *args], capture_output=True, text=True, timeout=300)


def _replay_args(out: Path, *source: str) -> list[str]:
    return ["replay", *source, "--jobs", str(JOBS10[0]), "--curves", str(JOBS10[1]), "--out", str(out), "--json"]


# 1. machine size: from --nodes, the log's header, a known machine, or the log's peak use; always said


def test_cobalt_log_of_another_machine_uses_its_peak_use_not_thetas_size(tmp_path: Path) -> None:
    tl = timeline_from_log(_cobalt(tmp_path / "othermachine-2024.csv", BIG_ROWS))
    # before: 4,392 nodes (Theta's) for every Cobalt log, and job 1 (6,000 nodes) skipped as no room
    assert tl.notes["machine_nodes"] == 9000 == len(tl.nodes)
    assert tl.notes["machine_nodes_source"] == "the log's peak concurrent use"
    assert tl.notes["skipped_no_room"] == 0 and tl.notes["log_jobs_placed"] == 3
    # a file named after a known Cobalt machine gets that machine's size, and says so
    theta = timeline_from_log(_cobalt(tmp_path / "theta-2024.csv", BIG_ROWS))
    assert theta.notes["machine_nodes"] == 4392 and "Theta" in str(theta.notes["machine_nodes_source"])
    assert theta.notes["skipped_no_room"] == 1 and theta.notes["log_peak_nodes"] == 9000
    given = timeline_from_log(tmp_path / "othermachine-2024.csv", 5000)
    assert given.notes["machine_nodes_source"] == "--nodes" and given.notes["skipped_no_room"] == 1
    # the bundled Theta log keeps Theta's size; KTH's SWF header gives 100
    assert timeline_from_log(THETA).notes["machine_nodes"] == 4392
    kth = timeline_from_log(KTH)
    assert kth.notes["machine_nodes"] == 100 and kth.notes["machine_nodes_source"] == "the log's header"


def test_machine_size_and_skipped_jobs_are_said_on_stderr(tmp_path: Path) -> None:
    log = _cobalt(tmp_path / "othermachine-2024.csv", BIG_ROWS)
    p = _cli(*_replay_args(tmp_path / "a", "--log", str(log), "--nodes", "5000"))
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)  # the whole of stdout is one JSON object
    assert s["nodes"] == 5000 and s["machine_nodes_source"] == "--nodes"
    assert "machine: 5,000 nodes, from --nodes; the log's peak concurrent use is 9,000 nodes" in p.stderr
    assert "1 of 3 log jobs (33.3%) were not replayed" in p.stderr and "1 found no room on 5,000 nodes" in p.stderr
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["machine_nodes"] == 5000 and meta["machine_nodes_source"] == "--nodes"
    assert meta["skipped_no_room"] == 1 and any("no room" in w for w in meta["warnings"])
    # the elastic jobs outlast this 2-hour log: said, not hidden behind "jobs done"
    assert "the idle data ran out" in p.stderr and not s["finished"]


# 2. accounting: node-time held after Pmax is not work


def _one_job_on_four_nodes(exact: bool) -> dict[str, object]:
    """One job, 4 samples/s on 4 nodes, Pmax 400: done at t = 100; the pool next changes at t = 1000."""
    job = ElasticJob("j", 0.0, 1, 4, ScalingCurve((1.0, 4.0), (1.0, 4.0)), 400.0, 0.0, 0.0)
    nodes = ("a", "b", "c", "d", "e")
    tl = PoolTimeline(0.0, nodes[:4], [PoolEvent(1000.0, ("e",), ())], nodes, 1000.0)
    return replay(tl, [job], ReplayConfig(tfwd=10.0, solver="dp", exact_events=exact)).summary


def test_default_and_exact_accounting_agree_on_useful_node_hours_by_hand() -> None:
    ref, exact = _one_job_on_four_nodes(False), _one_job_on_four_nodes(True)
    # by hand: 400 samples at 4/s on 4 nodes = 100 s x 4 nodes = 400 node-s of work, in both semantics
    assert exact["used_node_hours"] == pytest.approx(400 / 3600) == exact["useful_node_hours"]
    assert exact["held_past_pmax_node_hours"] == 0.0 and exact["end"] == pytest.approx(100.0)
    # the reference rule sees the completion at t = 1000: 4,000 node-s held, 3,600 of them past Pmax
    assert ref["used_node_hours"] == pytest.approx(4000 / 3600) and ref["end"] == 1000.0
    assert ref["held_past_pmax_node_hours"] == pytest.approx(3600 / 3600)
    assert ref["useful_node_hours"] == pytest.approx(exact["useful_node_hours"])
    assert ref["samples_past_pmax"] == pytest.approx(3600.0)  # 900 s x 4 samples/s, 9x the job's own 400
    # both at utilisation 1 (BFTrainer's held / idle), as reported; only the useful figure tells them apart
    assert ref["utilization"] == pytest.approx(1.0) == exact["utilization"]
    assert ref["useful_utilization"] == pytest.approx(0.1) and exact["useful_utilization"] == pytest.approx(1.0)


# 3. a log that starts on an empty machine


def test_warmup_of_a_log_that_starts_empty_is_detected_on_real_kth_data() -> None:
    tl = timeline_from_log(KTH)
    warm = tl.notes["warmup"]
    assert isinstance(warm, dict) and warm["detected"]
    # KTH's first job starts with the machine empty: ~52 h pass before its use reaches the typical 83 nodes
    assert warm["typical_busy_nodes"] == 83 and 50 < warm["warmup_hours"] < 55
    assert warm["warmup_mean_busy_nodes"] < 0.5 * warm["typical_busy_nodes"]
    skipped = timeline_from_log(KTH, skip_warmup=True)
    assert skipped.start == warm["warmup_end"] and skipped.notes["warmup"]["skipped_from"] == tl.start
    assert len(skipped.initial) < len(tl.initial)  # the replay starts on a busy machine
    # Theta's bundled log starts busy (a 4,096-node job in its first minutes): no warning
    assert not timeline_from_log(THETA).notes["warmup"]["detected"]


def test_warmup_check_by_hand() -> None:
    # 1 node busy for 10 h, then 80 from 10 h to 100 h: typical 80, warm-up 10 h at a mean of 1
    times, level = busy_steps([0.0, 36000.0, 360000.0], [-1, -79, 80])
    assert list(level) == [1, 80, 0]
    warm = warmup_check(times, level, 0.0)
    assert warm["detected"] and warm["typical_busy_nodes"] == 80 and warm["warmup_hours"] == pytest.approx(10.0)
    assert warm["warmup_mean_busy_nodes"] == pytest.approx(1.0)
    assert not warmup_check(times, level, 36000.0)["detected"]


# 4. flagged rows are kept; only dropped rows are lost


def test_flagged_rows_are_not_reported_as_dropped(tmp_path: Path) -> None:
    text = describe_rows(14374, {"unsorted_submit": 9812})
    assert text.startswith("14,374 jobs read; rows dropped: none; kept but flagged (nothing dropped): 9,812 unsorted")
    assert "skipped" not in text
    log = _cobalt(tmp_path / "small.csv", BIG_ROWS[::-1])  # reversed: 2 rows submitted before one above them
    log.write_text(log.read_text() + "9,bad,u,p,s,0,0,x,1,0,1,1,1,Pass\n")
    tl = timeline_from_log(log)
    assert tl.notes["log_rows_dropped"] == {"malformed_row": 1}
    assert tl.notes["log_rows_flagged"] == {"unsorted_submit": 2}
    assert "rows dropped: 1 malformed_row" in str(tl.notes["log_rows_summary"])


# 5. --json: stdout holds one JSON object; notes and warnings go to stderr


def test_json_stdout_is_pure_for_the_readme_replay_commands(tmp_path: Path) -> None:
    # README/RESULTS: the 40-node BFTrainer point (default solver, HiGHS), and --log on a real log
    runs = {
        "idle": ["--idle", str(BF / "idle-intervals.csv.gz"), "--nodes", "40", "--tfwd", "10"],
        "log": ["--log", str(KTH)],
    }
    for name, source in runs.items():
        p = _cli(*_replay_args(tmp_path / name, *source))
        assert p.returncode == 0, p.stderr
        s = json.loads(p.stdout)  # fails on any banner, progress or note on stdout
        assert s["out"] == str(tmp_path / name) and "machine:" in p.stderr
        assert s["warnings"] == json.loads((tmp_path / name / "meta.json").read_text())["warnings"]
    assert "the log starts with the machine nearly empty" in p.stderr and "--skip-warmup" in p.stderr
    assert "machine: 100 nodes, from the log's header" in p.stderr


# 6. non-optimal decisions counted and warned about; calc reports the replay and harvest figures


def test_nonoptimal_decisions_counted_warned_and_reported_by_calc(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hpcsched.cli import app

    log = _cobalt(tmp_path / "othermachine-2024.csv", BIG_ROWS)
    out = tmp_path / "g"
    r = CliRunner().invoke(app, [*_replay_args(out, "--log", str(log))[:-1], "--solver", "greedy"])
    assert r.exit_code == 0, r.output
    meta = json.loads((out / "meta.json").read_text())
    s = meta["summary"]
    assert s["decisions"] > 0 and s["nonoptimal_decisions"] == s["decisions"]
    assert meta["nonoptimal_by_status"] == {"heuristic": s["decisions"]}
    assert f"{s['decisions']} of {s['decisions']} allocator decisions were not proven optimal" in r.output
    c = CliRunner().invoke(app, ["calc", str(out), "--json"])
    assert c.exit_code == 0, c.output
    got = json.loads(c.stdout)
    for key in ("jobs", "avg_jct", "p99_jct", "makespan", "utilization", "policy"):  # the existing contract
        assert key in got
    assert got["nonoptimal_decisions"] == s["decisions"]
    assert got["nonoptimal_by_status"] == {"heuristic": s["decisions"]}
    for key in ("idle_node_hours", "used_node_hours", "useful_node_hours", "held_past_pmax_node_hours", "rescales",
                "preemptions", "useful_utilization"):
        assert got[key] == s[key], key
    assert got["idle_pool_utilization"] == pytest.approx(s["utilization"])
    assert got["lost_samples"] == pytest.approx(s["samples_lost_preemption"] + s["samples_lost_restart"])
    table = CliRunner().invoke(app, ["calc", str(out)])
    assert "nonoptimal_decisions" in table.stdout and "idle_node_hours" in table.stdout


def test_calc_reports_a_slurm_harvest_dir(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hpcsched.cli import app

    write_results(tmp_path, [JobResult("a", 0.0, 1.0, 50.0, nodes=2, node_seconds=72.0)],
                  {"tool": "slurm-harvest", "capacity_node_seconds": 90.0, "harvested_node_hours": 0.02,
                   "preemptions": 2, "lost_steps": [3, 5], "max_lost_steps": 5, "nonoptimal_decisions": 1})
    read_results(tmp_path)
    got = json.loads(CliRunner().invoke(app, ["calc", str(tmp_path), "--json"]).stdout)
    assert got["idle_node_hours"] == pytest.approx(0.025) and got["used_node_hours"] == 0.02
    assert got["idle_pool_utilization"] == pytest.approx(0.8) and got["utilization"] == pytest.approx(0.8)
    assert got["lost_steps"] == 8 and got["max_lost_steps"] == 5 and got["nonoptimal_decisions"] == 1
    assert got["preemptions"] == 2
