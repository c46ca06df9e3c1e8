"""A worker stopped with SIGTERM (as Slurm stops it): its task checkpoints, the controller hears of it at once
and resumes the job on another worker, well before the worker timeout could have noticed."""

from __future__ import annotations

import importlib.util
import json
import signal
import time
from pathlib import Path

import pytest
from test_runtime_e2e import client, controller_config, start_controller, start_worker, stop, wait_for

# Reports step 1, then idles; on SIGTERM writes a checkpoint at step 3 and exits 0 (what a workload does).
PROGRAM = (
    'F="$HPCSCHED_PROGRESS_FILE"; '
    'trap \'echo "{\\"step\\": 3, \\"checkpoint\\": \\"ck-3\\"}" >> "$F"; exit 0\' TERM; '
    'echo "{\\"step\\": 1, \\"loss\\": 2.0}" >> "$F"; '
    "while true; do sleep 0.1; done"
)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (torchrun launches)")
def test_sigterm_worker_checkpoints_and_leaves(tmp_path: Path) -> None:
    timeout_s = 120  # worker_timeout_s: far longer than the test waits, so only the Leave RPC can explain it
    ctl, address = start_controller(tmp_path, controller_config(tmp_path, worker_timeout_s=timeout_s))
    procs = [ctl]
    try:
        a = start_worker(tmp_path, address, "a")
        procs.append(a)
        c = client(address)
        spec = f"name: idle\nprocs: 1\nsteps: 10\ncommand: {json.dumps(['sh', '-c', PROGRAM])}\n"
        jid = c.submit(spec, "j.yaml")
        wait_for("the job to report on worker a", lambda: [j for j in c.jobs() if j.job_id == jid and
                                                           j.steps_done == 1 and list(j.workers) == ["a"]], 90)
        b = start_worker(tmp_path, address, "b")
        procs.append(b)
        wait_for("worker b", lambda: any(w.worker_id == "b" and w.alive for w in c.workers()), 60)

        t0 = time.time()
        a.send_signal(signal.SIGTERM)
        assert a.wait(timeout=60) == 0
        left_s = time.time() - t0
        (w_a,) = [w for w in c.workers() if w.worker_id == "a"]
        assert not w_a.alive
        job = wait_for("the job on worker b", lambda: [j for j in c.jobs() if j.job_id == jid and
                                                       j.state == "running" and list(j.workers) == ["b"]], 60)[0]
        moved_s = time.time() - t0
        assert moved_s < timeout_s / 2, moved_s
        assert (job.generation, job.restarts, job.last_checkpoint_step) == (2, 0, 3)  # preempted, not failed
        log = (tmp_path / "controller.log").read_text()
        assert "worker a is leaving" in log and "worker a left" in log
        print(f"worker exited {left_s:.1f} s after SIGTERM; job running on b {moved_s:.1f} s after it")
    finally:
        for p in reversed(procs):
            stop(p)
