"""Orders pushed to workers (``Orders.Watch``, hpcsched/runtime/watch.py) with a real controller and real workers.

The controller runs without its lease server (``lease_server: false``): a worker with a lease connection hears its
orders there instead (tests/test_lease_push.py). The workers beat every ``INTERVAL_S`` (30 s), so an order that
waited for the next heartbeat would take up to that long; pushed, it takes a round trip. A launch and a cancel must
each reach the worker within a third of the interval: the cancel comes right after the worker's last beat (it
delivered the task's first report), so only the push explains a stop that fast. And a worker that never opens the
stream (an older one: the fleet harness's simulated workers with the watch off) still gets every order in its
heartbeat replies."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from runtime_procs import client, controller_config, start_controller, start_worker, stop, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from fleet import FleetOptions, run_fleet  # noqa: E402

INTERVAL_S = 30.0
TIMEOUT_S = 120.0  # worker_timeout_s: at least three intervals (liveness caps the interval at a third of it)
# Reports its start (``first``: the worker delivers that at once, as a training program's) and step 1, then idles.
PROGRAM = ('F="$HPCSCHED_PROGRESS_FILE"; echo "{\\"step\\": 0, \\"first\\": true}" >> "$F"; '
           'echo "{\\"step\\": 1, \\"loss\\": 2.0}" >> "$F"; while true; do sleep 0.1; done')


def test_launch_and_stop_reach_a_watching_worker_before_its_next_heartbeat(tmp_path: Path) -> None:
    ctl, address = start_controller(tmp_path, controller_config(
        tmp_path, heartbeat_interval_s=INTERVAL_S, worker_timeout_s=TIMEOUT_S, rpc_stats_file="run/rpc_stats.json",
        lease_server="false"))
    procs = [ctl]
    try:
        procs.append(start_worker(tmp_path, address, "a", slots=2))
        c = client(address)
        wait_for("worker a", lambda: any(w.worker_id == "a" and w.alive for w in c.workers()), 60)
        spec = f"name: idle\nlauncher: direct\nprocs: 1\nsteps: 10\ncommand: {json.dumps(['sh', '-c', PROGRAM])}\n"

        t0 = time.time()
        jid = c.submit(spec, "idle.yaml")
        wait_for("the job's first report", lambda: [j for j in c.jobs() if j.job_id == jid and j.steps_done == 1],
                 INTERVAL_S / 3)
        launched_s = time.time() - t0

        t1 = time.time()
        assert c.cancel(jid).cancelled
        wait_for("the job cancelled", lambda: [j for j in c.jobs() if j.job_id == jid and j.state == "cancelled"],
                 INTERVAL_S / 3)
        stopped_s = time.time() - t1
        c.close()
        print(f"launch to first report {launched_s:.2f} s, cancel to cancelled {stopped_s:.2f} s "
              f"(heartbeat interval {INTERVAL_S:g} s)")
    finally:
        for p in reversed(procs):
            stop(p)
    counters = json.loads((tmp_path / "run" / "rpc_stats.json").read_text())["controller"]
    assert counters["watch_events_sent"] >= 2, counters  # the launch (and the port it asked for), the stop
    assert counters["watch_refused"] == 0, counters


def test_a_worker_that_does_not_watch_gets_its_orders_with_heartbeats(tmp_path: Path) -> None:
    heartbeat_s, job_s = 0.5, 1.0
    o = FleetOptions(workers=8, jobs=6, duration=60, slots=2, job_seconds=job_s, iteration_s=0.05, startup_s=0.2,
                     heartbeat_interval_s=heartbeat_s, worker_timeout_s=10, schedule_interval_s=0.2,
                     elastic_frac=0.0, until_done=True, quiet=True, register_timeout=30, watch=False)
    r = run_fleet(o, keep_dir=tmp_path / "controller")
    assert (r["watch"]["streams_opened"], r["watch"]["events"]) == (0, 0)
    assert r["jobs_after"]["states"] == {"completed": 6}, r["jobs_after"]
    assert set(r["rpc_errors"]) <= {"Register UNAVAILABLE"}, r["rpc_error_examples"]
    counters = r["controller"]["rpc_handler"]["controller"]
    assert counters["watching"] == 0 and counters["watch_events_sent"] == 0
    # every launch was nudged (a wake-up for the worker's lease slot) and pushed at nobody: heartbeats carried it
    assert counters["lease_wakeups"] >= 6 and counters["lease_subscriptions"] == 0, counters
    assert counters["lease_pushes"] == 0, counters
