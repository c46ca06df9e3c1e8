"""Adaptive batch size on the real runtime: a controller and workers as real processes on loopback, real gRPC, the
``direct`` launcher and CPU torch (workloads/adaptive_train.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from runtime_procs import (
    ROOT,
    client,
    controller_config,
    jobs_by_id,
    start_controller,
    start_worker,
    stop,
    submit,
    wait_for,
)

torch_missing = importlib.util.find_spec("torch") is None
scipy_missing = importlib.util.find_spec("scipy") is None
FINAL = ("completed", "failed", "cancelled")


def _adaptive_job(d: Path, steps: int) -> Path:
    p = d / "adaptive.yaml"
    # 48-64 samples per process: the three sizes' batch ranges do not overlap, so every resize must change the batch
    p.write_text(
        f"name: adaptive\nlauncher: direct\nprocs: 1\nmin_procs: 1\nmax_procs: 3\nsteps: {steps}\nworkdir: {ROOT}\n"
        "batch: {base: 64, max: 1024, min_per_proc: 48, max_per_proc: 64, lr_scaling: sqrt}\n"
        "command: [workloads/adaptive_train.py, --report-every, '2', --checkpoint-every, '10',"
        " --io-latency-ms, '40']\n")
    return p


@pytest.mark.slow
@pytest.mark.skipif(torch_missing, reason="torch is not installed (pip install -e '.[torch]')")
def test_adaptive_job_resized_1_3_2_changes_its_batch_converges_and_reports_gradient_statistics(tmp_path: Path) -> None:
    """Harvested nodes come and go: one worker of 1 slot, the job starts at 1 process and batch 64 (B0); a worker
    of 2 slots joins: it grows to 3 and is told a batch in 144..192; the first worker leaves (SIGTERM, as Slurm
    takes a node back): it shrinks to 2 and is told a batch in 96..128. Every attempt trains at the batch it was
    told (its own record), reports |G|^2 and the per-sample variance with its progress, the controller keeps
    them per report and fits the noise scale (the later batches are goodput choices), and the job converges."""
    from hpcsched.runtime.store import Store

    ctl, addr = start_controller(tmp_path, controller_config(tmp_path, min_runtime_s=2))
    w1 = start_worker(tmp_path, addr, "w1", slots=1)
    c = client(addr)
    workers = [w1]
    try:
        wait_for("the worker", lambda: any(x.alive for x in c.workers()), 60)
        e = submit(c, _adaptive_job(tmp_path, 600))
        # at 1 process until it has reported statistics at batch 64 (every 2 steps)
        first = wait_for("1 process, 10 steps, statistics", lambda: (j := jobs_by_id(c)[e]).procs == 1
                         and j.steps_done >= 10 and j.noise_scale > 0 and j, 120)
        assert first.batch_size == 64
        workers.append(start_worker(tmp_path, addr, "w2", slots=2))
        grown = wait_for("3 processes", lambda: (j := jobs_by_id(c)[e]).procs == 3 and j, 180)
        # trained at 3: 10 steps past where the attempt started (its resume point: the last step reported at 1)
        wait_for("3 processes, training", lambda: (j := jobs_by_id(c)[e]).generation == grown.generation
                 and j.steps_done >= grown.steps_done + 10, 180)
        stop(w1)  # its task checkpoints; the job is placed again on what is left: 2 slots
        wait_for("2 processes", lambda: jobs_by_id(c)[e].procs == 2, 120)
        job = wait_for("the job finished", lambda: (j := jobs_by_id(c)[e]).state in FINAL and j, 400, poll=0.5)
        assert job.state == "completed", job.message
    finally:
        c.close()
        for w in workers:
            stop(w)
        stop(ctl)
    result = json.loads((tmp_path / "run" / "ckpt" / e / "result.json").read_text())
    attempts = [(h["world_size"], h["batch_size"]) for h in result["history"]]
    assert [n for n, _ in attempts[:3]] == [1, 3, 2], attempts
    ranges = {1: (64, 64), 2: (96, 128), 3: (144, 192)}
    for n, b in attempts:  # every attempt trained at a batch for its size
        assert ranges[n][0] <= b <= ranges[n][1], attempts
    assert attempts[0][1] != attempts[1][1] != attempts[2][1]
    assert result["steps"] == 600 and result["final_loss"] < 0.6 * result["first_loss"], result
    store = Store(tmp_path / "run" / "state.db")
    told = store.events(e, "batch")
    rows = [r for r in store.progress(e) if r["grad_var"] is not None]
    store.close()
    # the controller told each attempt what the attempt says it ran at
    assert [(x["procs"], x["batch_size"]) for x in told] == attempts, (told, attempts)
    assert told[0]["how"] == "no statistics yet"
    if not scipy_missing:  # later attempts: chosen by goodput from the statistics of the earlier ones
        assert all(x["how"] == "goodput" and x["noise_scale"] > 0 for x in told[1:]), told
    # the statistics came with the progress, at every batch the job ran at
    assert {r["batch_size"] for r in rows} == {b for _, b in attempts}
    assert all(r["batch_size"] and r["grad_var"] > 0 for r in rows), rows
    assert sum(r["grad_sqr"] > 0 for r in rows) > len(rows) / 2  # an unbiased estimate: some windows go below 0
