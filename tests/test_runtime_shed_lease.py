"""A worker whose heartbeats the controller sheds keeps its lease: the controller renewed it as of each shed beat
(``liveness.RENEWED_PREFIX``), so the worker counts it renewed too, and retries at least three times within the
lease. Before, a worker shed a few times in a row let its own lease run out (its back-off doubling to 10 s) and
stopped its tasks while the controller still held it alive. Real controller (in this process, so the test can hold
its heartbeat bound), a real worker daemon and its task, real gRPC on port 0."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from runtime_procs import client, controller_config, start_worker, stop, wait_for

from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.liveness import LOCK_WAITING_BEATS
from hpcsched.runtime.server import ControllerServer

LEASE_S = 3.0  # runtime_procs' worker_timeout_s
FINAL = ("completed", "failed", "cancelled")


def _steps_job(d: Path, steps: int, pause_s: float) -> str:
    """One step reported every ``pause_s``, done at ``steps``: every heartbeat carries news (progress)."""
    script = (f'i=0; while [ $i -lt {steps} ]; do i=$((i+1)); echo "{{\\"step\\": $i, \\"loss\\": 1.0}}" '
              f'>> "$HPCSCHED_PROGRESS_FILE"; sleep {pause_s}; done')
    return (f"name: shed\nlauncher: direct\nprocs: 1\nsteps: {steps}\nworkdir: {d}\n"
            f"command: {json.dumps(['sh', '-c', script])}\n")


def test_a_worker_shed_past_its_lease_keeps_its_task(tmp_path: Path) -> None:
    d = tmp_path
    srv = ControllerServer(read_controller_config(controller_config(d, worker_timeout_s=LEASE_S)))
    address = srv.start()
    worker = start_worker(d, address, "n1")
    held: list[threading.BoundedSemaphore] = []
    try:
        c = client(address)
        wait_for("the worker", lambda: any(w.alive for w in c.workers()), 90)
        jid = c.submit(_steps_job(d, 400, 0.05), "shed.yaml")
        job = lambda: next(j for j in c.jobs() if j.job_id == jid)  # noqa: E731
        wait_for("the job to run", lambda: job().steps_done > 0, 60)
        # Every heartbeat with news is shed from now on: the bound of those waiting for the lock is taken
        for _ in range(LOCK_WAITING_BEATS):
            assert srv.ctl.beat_waiters.acquire(timeout=30), "a heartbeat held the bound for 30 s"
            held.append(srv.ctl.beat_waiters)
        shed0 = srv.ctl.shed_beats
        wait_for("three leases of shed heartbeats", lambda: srv.ctl.shed_beats - shed0 >= 3, 60)
        threading.Event().wait(3 * LEASE_S)  # what is tested is that nothing happens for this long
        assert srv.ctl.shed_beats - shed0 >= 6, "the worker stopped beating"
        assert "n1" in srv.ctl.last_seen, "the controller holds the worker alive throughout"
        while held:
            held.pop().release()
        done = wait_for("the job to end", lambda: (j := job()).state in FINAL and j, 120)
        log = (d / "n1.log").read_text()
        assert "past this worker's lease" not in log, log[-3000:]
        # one attempt, every step: the task was never fenced
        assert (done.state, done.steps_done, done.generation, done.restarts) == ("completed", 400, 1, 0), done.message
        c.close()
    finally:
        while held:
            held.pop().release()
        stop(worker)
        srv.stop()
