"""The fleet harness (bench/fleet.py) at a small size: a real controller process, 50 simulated workers on the real
gRPC protocol, 40 jobs of mixed sizes (some elastic). Every job must complete, no worker may re-register or see an
RPC error, and every figure the benchmark reports must be there. Deadlines come from the configured intervals
(heartbeat, scheduling tick, the jobs' own length), with room for a loaded 2-core machine."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from fleet import FleetOptions, run_fleet  # noqa: E402

HEARTBEAT_S = 0.5
SCHEDULE_S = 0.2
JOB_S = 2.0  # mean; the longest is 1.5x
STARTUP_S = 0.3
LOAD_FACTOR = 4  # a loaded machine (load 8 on 2 cores) stretches every step this much


def test_fleet_small_every_job_completes(tmp_path: Path) -> None:
    # One job's path: submit, a tick places it, the next heartbeat carries its launch, start-up, its steps, the
    # exit heartbeat. 40 jobs of at most 4 processes fit 50 x 4 slots at once, so no job waits for another.
    one_job = SCHEDULE_S + HEARTBEAT_S + STARTUP_S + 1.5 * JOB_S + HEARTBEAT_S
    o = FleetOptions(workers=50, jobs=40, duration=LOAD_FACTOR * one_job + 10, slots=4, job_seconds=JOB_S,
                     iteration_s=0.05, startup_s=STARTUP_S, heartbeat_interval_s=HEARTBEAT_S, worker_timeout_s=10,
                     schedule_interval_s=SCHEDULE_S, elastic_frac=0.3, until_done=True, quiet=True,
                     register_timeout=30)
    r = run_fleet(o, keep_dir=tmp_path / "controller")

    reg = r["registration"]
    assert reg["registered"] == 50 and reg["all_registered_s"] is not None
    assert reg["reregistrations"] == 0 and reg["reregister_replies"] == 0
    assert r["rpc_errors"] == {}, r["rpc_errors"]
    assert r["heartbeat"]["lease_lapses"] == 0
    # every worker heartbeats at the interval the controller gave it, not the harness's default
    assert r["heartbeat"]["intervals_s"] == {str(HEARTBEAT_S): 50}

    assert r["submit"]["jobs"] == 40 and not r["submit"]["failed"]
    ja = r["jobs_after"]
    assert ja["states"] == {"completed": 40}, ja
    assert ja["harness_saw_done"] == 40
    s2l = r["submit_to_launch"]
    assert s2l["n"] == 40 and s2l["never_launched"] == 0
    assert 0 < s2l["p50_ms"] <= s2l["p99_ms"] <= s2l["max_ms"]
    hb = r["heartbeat"]
    assert hb["n"] > 50 and 0 < hb["p50_ms"] <= hb["p90_ms"] <= hb["p99_ms"] <= hb["max_ms"]
    assert r["tasks"]["tasks_done"] >= 40  # a job across two workers ends with a task on each

    assert r["controller"]["cpu_s"] > 0 and r["controller"]["peak_rss_mb"] > 10
    assert "Heartbeat" in r["controller"]["rpc_handler"] and r["submit_rpc"] in r["controller"]["rpc_handler"]
    assert r["harness"]["processes_reported"] == r["harness_processes"] == 1
    assert r["harness"]["leaves_said"] == 50  # every worker drained and said goodbye
    # the controller heard every goodbye: its log has a Leave per worker, and no refusal of any call
    log = (tmp_path / "controller" / "controller.log").read_text()
    assert log.count(" left (") == 50, log[-2000:]
    assert "refused" not in log
