"""Adaptive batch size through in-place resizes: an elastic Horovod job is told its new global batch with each
resize, without a restart. The file the worker writes (no Horovod needed), then the whole path: a real controller
and worker as processes on loopback, real gRPC, a real elastic ``horovodrun`` (Gloo, CPU torch) running
workloads/adaptive_train.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runtime_procs import (
    ROOT,
    client,
    controller_config,
    jobs_by_id,
    no_horovod,
    start_controller,
    start_worker,
    stop,
    submit,
    wait_for,
)

from hpcsched.runtime import horovod_elastic
from hpcsched.runtime.launch import InPlaceChange
from hpcsched.runtime.rpc import pb

horovod_missing = no_horovod()
FINAL = ("completed", "failed", "cancelled")
STEPS = 200


def _task(tmp: Path, batch: int) -> pb.LaunchTask:
    env = {horovod_elastic.MIN_ENV: "1", horovod_elastic.MAX_ENV: "3"}
    return pb.LaunchTask(task_id="a.g1.n0", job_id="a", generation=1, launcher="horovodrun", command=["x.py"],
                         env=env, node_rank=0, nnodes=1, nprocs=1, world_size=1, master_addr="127.0.0.1",
                         master_port=1, checkpoint_dir=str(tmp / "ckpt"), hosts=["127.0.0.1:1"],
                         batch_size=batch, base_batch=64, lr_scaling="sqrt")


def test_resize_writes_the_batch_before_the_host_list(tmp_path: Path) -> None:
    """The launch writes the attempt's batch (version 0) and the ranks' path to it; each in-place resize writes the
    batch for the new size as a newer version, before the host list Horovod's driver acts on (so the file is never
    older than the hosts), and logs it; a batch told for another size than the placement is refused."""
    d = tmp_path / "task"
    t = _task(tmp_path, 64)
    argv = horovod_elastic.elastic_command(["horovodrun", "-np", "1", "-H", "127.0.0.1:1", "python", "x.py"], t, d)
    assert "--host-discovery-script" in argv
    assert horovod_elastic.batch_env(t, d) == {horovod_elastic.BATCH_ENV: str(d / horovod_elastic.BATCH)}
    assert json.loads((d / horovod_elastic.BATCH).read_text()) == {
        "version": 0, "batch_size": 64, "world_size": 1, "base_batch": 64, "lr_scaling": "sqrt"}
    told = horovod_elastic.BatchTold(180, 3, 64, "sqrt")
    assert horovod_elastic.resize(d, ["127.0.0.1:3"], batch=told) == 3
    assert (d / horovod_elastic.BATCH).stat().st_mtime_ns <= (d / horovod_elastic.HOSTS).stat().st_mtime_ns
    got = json.loads((d / horovod_elastic.BATCH).read_text())
    assert (got["version"], got["batch_size"], got["world_size"]) == (1, 180, 3)
    with pytest.raises(ValueError, match="told for 2 processes"):
        horovod_elastic.resize(d, ["127.0.0.1:3"], batch=horovod_elastic.BatchTold(120, 2, 64, "sqrt"))
    assert json.loads((d / horovod_elastic.BATCH).read_text())["version"] == 1  # nothing written when refused
    log = [json.loads(x) for x in (d / horovod_elastic.LOG).read_text().splitlines()]
    assert [(x["world_size"], x.get("batch_size"), x.get("batch_version")) for x in log] == [(3, 180, 1)]
    # a job without ``batch:`` gets no file and no path
    plain = tmp_path / "plain"
    horovod_elastic.elastic_command(["horovodrun", "-np", "1", "-H", "127.0.0.1:1", "x"], _task(tmp_path, 0), plain)
    assert not (plain / horovod_elastic.BATCH).exists() and horovod_elastic.batch_env(_task(tmp_path, 0), plain) == {}


def test_in_place_change_tells_the_batch_in_every_launch_task(tmp_path: Path) -> None:
    t = _task(tmp_path, 64)
    change = InPlaceChange([("a.g1.n0", 2, t.SerializeToString())], [("w2", pb.LaunchTask.FromString(
        t.SerializeToString()))], 3).with_batch(180)
    for msg in [pb.LaunchTask.FromString(b) for _, _, b in change.resized] + [m for _, m in change.added]:
        assert msg.batch_size == 180 and msg.env["HPCSCHED_BATCH_SIZE"] == "180"
        assert msg.env["HPCSCHED_BASE_BATCH"] == "64" and msg.env["HPCSCHED_LR_SCALING"] == "sqrt"
        assert horovod_elastic.BatchTold.of(msg) == horovod_elastic.BatchTold(180, 1, 64, "sqrt")


def _reports(path: Path) -> list[dict]:
    out = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # being written
    return out


def _spec(d: Path, name: str, text: str) -> Path:
    p = d / f"{name}.yaml"
    p.write_text(text)
    return p


def resize_scenario(d: Path, batch_key: str, steps: int = STEPS, lr: float = 0.1) -> tuple[pb.JobInfo, str, Path]:
    """An elastic Horovod job (1..3 processes, ``workloads/adaptive_train.py``, ``batch_key``: its ``batch:`` line or
    '' for a fixed batch of 64) resized 1 -> 3 -> 2 in place on one 3-slot worker: a 2-process job holds 2 slots
    when it starts and ends by itself, then a 1-process job arrives once it has trained at 3. Real controller and
    worker processes. Returns the job as listed at its end, its id and its rank 0's progress file (also run by
    ``bench/bench_adaptive_inplace.py``)."""
    ctl, addr = start_controller(d, controller_config(d, min_runtime_s=2))
    w = start_worker(d, addr, "w1", slots=3)
    c = client(addr)
    # A horovodrun start, and a grow's new ranks (torch and Horovod imports), took 10-30 s each at load 13-33 here;
    # Gloo's timeout is raised to 60 s for the same reason (rank 0 waits in it for the grow's new ranks).
    wait_s = 120
    try:
        wait_for("the worker", lambda: any(x.alive for x in c.workers()), 60)
        # The blocker ends by itself (6 s of steps; the grow then waits for the job's first report if need be). A
        # cancelled one would do too: the grow waits for the slots it holds while it stops, then is made in place
        # (hpcsched.core.in_place, tests/test_runtime_grow_in_place.py).
        blocker = submit(c, _spec(d, "blocker", f"name: blocker\nlauncher: direct\nprocs: 2\nworkdir: {ROOT}\n"
                                  "steps: 60\ncommand: [tests/netns_job.py, --step-ms, '100']\n"))
        wait_for("the blocker running", lambda: jobs_by_id(c)[blocker].state == "running", wait_s)
        # 30 ms of emulated I/O per step paces the run so that each size trains for a while
        e = submit(c, _spec(d, "adaptive", (
            f"name: adaptive\nlauncher: horovodrun\nprocs: 1\nmin_procs: 1\nmax_procs: 3\nsteps: {steps}\n"
            f"workdir: {ROOT}\nenv: {{HOROVOD_GLOO_TIMEOUT_SECONDS: '60'}}\n{batch_key}"
            "command: [workloads/adaptive_train.py, --report-every, '2', --checkpoint-every, '100',"
            f" --commit-every, '2', --io-latency-ms, '30', --lr, '{lr}', --batch, '64']\n")))
        # the listing says 3 as soon as the resize is ordered; the program's own reports say when it trains at 3
        progress = d / "run" / "w1" / f"{e}.g1.n0" / "progress.jsonl"
        at3 = wait_for("training at 3", lambda: next((r["step"] for r in _reports(progress) if r["world_size"] == 3),
                                                     None), wait_s)
        wait_for("trained at 3", lambda: any(r["world_size"] == 3 and r["step"] >= at3 + 4
                                             for r in _reports(progress)), wait_s)
        small = submit(c, _spec(d, "small", f"name: small\nlauncher: direct\nprocs: 1\nworkdir: {ROOT}\n"
                                "steps: 100000\ncommand: [tests/netns_job.py, --step-ms, '100']\n"))
        wait_for("2 processes", lambda: jobs_by_id(c)[e].procs == 2, wait_s)
        job = wait_for("the job finished", lambda: (j := jobs_by_id(c)[e]).state in FINAL and j, 2 * wait_s, poll=0.5)
        c.cancel(small)
    finally:
        c.close()
        stop(w)
        stop(ctl)
    return job, e, progress


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.skipif(horovod_missing, reason="needs Horovod with PyTorch (make horovod)")
def test_horovod_job_resized_1_3_2_in_place_changes_its_batch_and_converges(tmp_path: Path) -> None:
    """One 3-slot worker. A 2-process job holds 2 slots, so the elastic Horovod job (1..3, ``batch:``) starts at
    1 process and batch 64 (B0). When that job ends the Horovod job grows in place to 3 and is told a batch in
    144..192; a 1-process job arrives: it shrinks in place to 2 and is told a batch in 96..128. One attempt
    throughout (no restart, one rank-0 process): each world Horovod formed trained at the batch told for it, the
    reports carry it with the gradient statistics, and the job converges."""
    from hpcsched.runtime.store import Store

    # 48-64 samples per process: the three sizes' batch ranges do not overlap, so every resize must change it. At
    # lr 0.1 a single process run with the same batch schedules is under 0.6x its first loss by step 110-140 and at
    # 0.2-0.3 by 200 (at lr 0.2 one such schedule was still at 0.7x at 150, in place and in one process alike)
    job, e, progress = resize_scenario(
        tmp_path, "batch: {base: 64, max: 1024, min_per_proc: 48, max_per_proc: 64, lr_scaling: sqrt}\n")
    assert job.state == "completed" and job.generation == 1 and job.restarts == 0, job
    store = Store(tmp_path / "run" / "state.db")
    told = [(x["procs"], x["batch_size"]) for x in store.events(e, "batch")]
    resizes = store.events(e, "resize")
    rows = [r for r in store.progress(e) if r["grad_var"] is not None]
    store.close()
    ranges = {1: (64, 64), 2: (96, 128), 3: (144, 192)}
    assert [n for n, _ in told] == [1, 3, 2], told
    assert all(ranges[n][0] <= b <= ranges[n][1] for n, b in told), told
    assert [(x["resize_kind"], x["from_procs"], x["procs"], x["batch_size"]) for x in resizes] == [
        ("in-place", 1, 3, told[1][1]), ("in-place", 3, 2, told[2][1])], resizes
    progress = _reports(progress)
    assert len({r["pid"] for r in progress}) == 1, "rank 0 was restarted"
    assert all(r["resumed_from"] == -1 for r in progress)  # no checkpoint reloaded
    # every report ran at the batch told for its size, and the batch changed at each resize, in place
    assert all(r["batch_size"] == dict(told)[r["world_size"]] for r in progress), progress
    in_place = [(r["from_world_size"], r["world_size"], r["from_batch_size"], r["batch_size"])
                for r in progress if r.get("resized_in_place")]
    assert in_place == [(1, 3, told[0][1], told[1][1]), (3, 2, told[1][1], told[2][1])], in_place
    result = json.loads((tmp_path / "run" / "ckpt" / e / "result.json").read_text())
    assert [(h["world_size"], h["batch_size"]) for h in result["history"]] == told, result["history"]
    assert result["steps"] == STEPS and result["final_loss"] < 0.6 * result["first_loss"], result
    # the statistics came with the progress at every batch the job ran at (the controller fits them)
    assert {r["batch_size"] for r in rows} == {b for _, b in told}
    assert all(r["grad_var"] > 0 for r in rows), rows
