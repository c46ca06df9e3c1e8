"""``simulate(..., restart_s=S)`` / ``hpcsched simulate --restart-s S``: one restart cost for every job.

A testbed measures start-up + tear-down per launch as wall-clock seconds; the engine must charge them as
wall time at each start (a group member's included), not per model and not as iterations at a group's pace.
Hand-checked on one or two jobs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sim_cases import ONE_NODE, ends, muri_csv, pair_policy
from sim_cases import R as TABLE_R  # the per-model table's cost for a model it does not know ('toy')

from hpcsched.model import ClusterSpec
from hpcsched.primitives.speed import GROUP_FACTOR, SOLO_FACTOR
from hpcsched.sim import simulate
from hpcsched.traces import read_jobs


def test_restart_s_replaces_the_table_at_every_start(tmp_path: Path) -> None:
    # SRTF: A starts (pays 3 s), B arrives at 1 s and preempts it (pays 3 s), A restarts after B (3 s again)
    jobs = read_jobs(muri_csv(tmp_path, [("A", 4, 0, 100, 1.0), ("B", 1, 1, 10, 1.0)]))
    r = simulate(jobs, ONE_NODE, "srtf", restart_s=3.0)
    e = ends(r)
    b_end = 1 + 3 + 10 * SOLO_FACTOR
    assert e["B"] == pytest.approx(b_end)
    assert e["A"] == pytest.approx(b_end + 3 + 100 * SOLO_FACTOR)
    assert r.meta["restart_s"] == 3.0
    assert "restart_s" not in simulate(jobs, ONE_NODE, "srtf").meta  # the table: nothing recorded
    assert ends(simulate(jobs, ONE_NODE, "srtf", restart_s=0.0))["B"] == pytest.approx(1 + 10 * SOLO_FACTOR)


def test_a_joining_member_pays_restart_s_as_wall_time_not_at_the_group_pace(tmp_path: Path) -> None:
    # P runs alone from 0 (5 s start-up, then 20 s solo at 1 s/iter); Q arrives at 25 s and joins P's GPUs:
    # Q pays its 5 s as wall time while P goes on at the pair's pace; both then run at 1 s x factor per iteration
    jobs = read_jobs(muri_csv(tmp_path, [("P", 2, 0, 100, 1.0), ("Q", 1, 25, 10, 1.0)]))
    e = ends(simulate(jobs, ClusterSpec(1, 1, 2, name="n1g2"), pair_policy, restart_s=5.0))
    pair = GROUP_FACTOR[2]
    p_done_at_25 = 20 / SOLO_FACTOR
    assert e["Q"] == pytest.approx(25 + 5 + 10 * pair)
    p_left = 100 - p_done_at_25 - (5 + 10 * pair) / pair
    assert e["P"] == pytest.approx(e["Q"] + p_left * SOLO_FACTOR)


def test_compat_ignores_restart_s(tmp_path: Path) -> None:
    jobs = read_jobs(muri_csv(tmp_path, [("A", 4, 0, 100, 1.0), ("B", 1, 1, 10, 1.0)]))
    ref = simulate(jobs, ONE_NODE, "fifo", compat="muri")
    r = simulate(jobs, ONE_NODE, "fifo", compat="muri", restart_s=99.0)
    assert ends(r) == ends(ref)
    assert "restart_s" not in r.meta
    with pytest.raises(ValueError, match="restart_s"):
        simulate(jobs, ONE_NODE, "fifo", restart_s=-1.0)


def test_cli_restart_s_is_charged_and_recorded(tmp_path: Path) -> None:
    trace = muri_csv(tmp_path, [("A", 1, 0, 10, 1.0)])
    spec = tmp_path / "c.yaml"
    spec.write_text("name: n1g1\nswitches: 1\nnodes_per_switch: 1\ngpus_per_node: 1\n")

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hpcsched.cli", "simulate", "--trace", str(trace), "--cluster",
                               str(spec), "--policy", "fifo", "--out", str(tmp_path / "o"), "--json", *extra],
                              capture_output=True, text=True)

    p = run("--restart-s", "7.5")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["avg_jct"] == pytest.approx(7.5 + 10 * SOLO_FACTOR)
    assert json.loads((tmp_path / "o" / "meta.json").read_text())["restart_s"] == 7.5
    table = run()
    assert json.loads(table.stdout)["avg_jct"] == pytest.approx(TABLE_R + 10 * SOLO_FACTOR)
    assert run("--restart-s", "-1").returncode == 2
    bad = run("--restart-s", "inf")  # a clear error, not the engine's traceback
    assert bad.returncode == 2 and "finite" in bad.stderr and "Traceback" not in bad.stderr
