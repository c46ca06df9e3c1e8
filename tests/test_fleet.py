"""The fleet harness (bench/fleet.py) at a small size: a real controller process, 50 simulated workers on the real
gRPC protocol, 40 jobs of mixed sizes (some elastic). Every job must complete, no worker may re-register or see an
RPC error, and every figure the benchmark reports must be there. Deadlines come from the configured intervals
(heartbeat, scheduling tick, the jobs' own length), with room for a loaded 2-core machine."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path

import grpc

from hpcsched.runtime.auth import metadata
from hpcsched.runtime.rpc import pb, pb_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from fleet import TOKEN, FleetOptions, controller_config, run_fleet, start_controller, stop_controller  # noqa: E402
from fleet_worker import ProcStats, SimOptions, SimWorker, WatchChannels, channel_options  # noqa: E402

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
    # A Register may fail to connect on a loaded machine (a worker's connect floor, 200 ms until the fleet runs showed
    # it: bench/RESULTS.md); it is retried at once and is no re-registration. Any other failed call is a defect.
    # A heartbeat with news may be shed while liveness.LOCK_WAITING_BEATS others wait for the lock (a slow step on a
    # loaded machine): its lease is renewed and the worker, still registered, reports again after its back-off.
    assert set(r["rpc_errors"]) <= {"Register UNAVAILABLE", "Heartbeat RESOURCE_EXHAUSTED"}, r["rpc_error_examples"]
    assert r["heartbeat"]["lease_lapses"] == 0
    # every worker heartbeats at the interval the controller gave it, not the harness's default
    assert r["heartbeat"]["intervals_s"] == {str(HEARTBEAT_S): 50}

    assert r["submit"]["jobs"] == 40 and not r["submit"]["failed"], r["submit"]
    ja = r["jobs_after"]
    assert ja["states"] == {"completed": 40}, ja
    assert ja["harness_saw_done"] == ja["done_at_end"] == 40
    s2l = r["submit_to_launch"]
    assert s2l["n"] == 40 and s2l["never_launched"] == 0
    assert 0 < s2l["p50_ms"] <= s2l["p99_ms"] <= s2l["max_ms"]
    hb = r["heartbeat"]
    assert hb["n"] > 50 and 0 < hb["p50_ms"] <= hb["p90_ms"] <= hb["p99_ms"] <= hb["max_ms"]
    assert r["tasks"]["tasks_done"] >= 40  # a job across two workers ends with a task on each

    ctl = r["controller"]
    assert ctl["cpu_s"] > 0 and ctl["peak_rss_mb"] > 10
    # the CPU split in its two phases: the storm (50 registrations) and the churn after it, which add up to the whole
    assert ctl["registration_cpu_s"] > 0 and ctl["registration_cpu_ms_each"] > 0 and ctl["churn_cpu_pct"] > 0
    assert abs(ctl["registration_window_s"] + ctl["churn_window_s"] - ctl["window_s"]) < 0.5
    assert abs(ctl["registration_cpu_s"] + ctl["churn_cpu_pct"] * ctl["churn_window_s"] / 100 - ctl["cpu_s"]) < 0.5
    assert "Heartbeat" in r["controller"]["rpc_handler"] and r["submit_rpc"] in r["controller"]["rpc_handler"]
    assert r["harness"]["processes_reported"] == r["harness_processes"] == 1
    assert r["harness"]["leaves_said"] == 50  # every worker drained and said goodbye
    # and the controller heard it: two Leave calls per worker (draining, then gone), none of its workers alive after
    # (a Leave shed while liveness.LOCK_WAITING_CALLS others waited for the lock is sent again: timed as shed too)
    leaves = r["controller"]["rpc_handler"]
    assert leaves["Leave"]["calls"] - leaves.get("Leave (shed)", {}).get("calls", 0) == 100
    assert r["harness"]["workers_alive_after_leave"] == 0


def test_sim_worker_obeys_kill_with_a_checkpoint_and_resumes(tmp_path: Path) -> None:
    """The KillTask path against a real controller: a running job is preempted by a worker's Leave (its task gets a
    checkpointing KillTask), the simulated task writes its step and exits 0, the job goes back to pending with that
    checkpoint, resumes from it on the other worker (``resumed_from``) and completes at exactly its steps."""
    o = FleetOptions(heartbeat_interval_s=HEARTBEAT_S, schedule_interval_s=SCHEDULE_S, worker_timeout_s=10)
    ctl, address = start_controller(tmp_path, controller_config(tmp_path, o))
    iteration_s, steps = 0.05, 200  # 10 s of steps: long enough to be preempted midway
    step_deadline = LOAD_FACTOR * (SCHEDULE_S + 2 * HEARTBEAT_S + STARTUP_S) + 10

    async def scenario() -> dict:
        ch = grpc.aio.insecure_channel(address, options=channel_options(0))
        stub, md = pb_grpc.ControllerStub(ch), metadata(TOKEN)
        opts = SimOptions(address, TOKEN, str(tmp_path), slots=1, iteration_s=iteration_s, startup_s=STARTUP_S)
        stats = ProcStats()
        a = SimWorker("wa", 0, stub, opts, stats, md)
        run_a = asyncio.create_task(a.run(0))

        async def job() -> pb.JobInfo:
            return (await stub.ListJobs(pb.ListJobsRequest(), metadata=md)).jobs[0]

        async def until(what: str, pred, timeout: float) -> pb.JobInfo:
            loop = asyncio.get_running_loop()
            end = loop.time() + timeout
            while loop.time() < end:
                j = await job()
                if pred(j):
                    return j
                await asyncio.sleep(0.2)
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}: {await job()}")

        while "wa" not in stats.first_registered_at:
            await asyncio.sleep(0.05)
        await stub.Submit(pb.SubmitRequest(spec_yaml=f"name: long\nlauncher: direct\nsteps: {steps}\n"
                                           "command: [fleet-sim-task]\n", source="long.yaml"), metadata=md)
        await until("steps on worker wa", lambda j: j.state == "running" and j.steps_done >= 20, step_deadline)
        b = SimWorker("wb", 1, stub, opts, stats, md)
        run_b = asyncio.create_task(b.run(0))
        run_a.cancel()
        await asyncio.gather(run_a, return_exceptions=True)
        await a.leave()  # draining: its job stops with a checkpoint, then goes elsewhere
        j = await until("the job checkpointed and back in the queue or on wb",
                        lambda j: j.last_checkpoint_step > 0 and "wa" not in j.workers, step_deadline)
        ckpt = j.last_checkpoint_step
        done = await until("completion on wb", lambda j: j.state == "completed",
                           step_deadline + LOAD_FACTOR * steps * iteration_s)
        run_b.cancel()
        await asyncio.gather(run_b, return_exceptions=True)
        await b.leave()
        await ch.close()
        return {"ckpt": ckpt, "job": done, "stats": stats}

    try:
        got = asyncio.run(scenario())
    finally:
        stop_controller(ctl)
    j, stats = got["job"], got["stats"]
    assert 0 < got["ckpt"] < steps
    assert j.state == "completed" and j.steps_done == steps and list(j.workers) in ([], ["wb"])
    assert stats.tasks_checkpointed == 1 and stats.tasks_killed == 0 and stats.tasks_done == 1
    assert stats.errors == {}, stats.error_examples
    # the second attempt restored that checkpoint, as a training program reading its checkpoint dir does
    db = sqlite3.connect(f"file:{tmp_path / 'run' / 'state.db'}?mode=ro", uri=True)
    resumes = [json.loads(d) for (d,) in db.execute("SELECT detail FROM events WHERE kind = 'resume'")]
    db.close()
    assert [r["resumed_from"] for r in resumes] == [got["ckpt"]], resumes


def test_sim_worker_watches_again_after_it_registers_again(tmp_path: Path) -> None:
    """A re-registered simulated worker reopens its Orders.Watch stream (grpc.aio answers the cancel of the old call
    with CancelledError, which once ended the watch for good), so a launch order reaches it at once, not at its next
    heartbeat: the interval here (60 s) is far past the deadline, which comes from the scheduling tick. Without a lease
    server (with one, orders come on the lease connection: tests/test_lease_push_fleet.py)."""
    long_beat = 60.0
    o = FleetOptions(heartbeat_interval_s=long_beat, schedule_interval_s=SCHEDULE_S, worker_timeout_s=3 * long_beat,
                     lease=False)
    ctl, address = start_controller(tmp_path, controller_config(tmp_path, o))
    deadline = LOAD_FACTOR * (4 * SCHEDULE_S + STARTUP_S) + 5  # a step, a port nudge, a step, a launch nudge

    async def scenario() -> tuple[ProcStats, float]:
        ch = grpc.aio.insecure_channel(address, options=channel_options(0))
        stub, md = pb_grpc.ControllerStub(ch), metadata(TOKEN)
        opts = SimOptions(address, TOKEN, str(tmp_path), slots=1, iteration_s=0.05, startup_s=STARTUP_S)
        stats = ProcStats()
        w = SimWorker("wa", 0, stub, opts, stats, md)
        w.watch_channels = WatchChannels(opts, 1)
        runs = [asyncio.create_task(w.run(0)), asyncio.create_task(w.watch())]
        loop = asyncio.get_running_loop()

        async def until(what: str, pred) -> None:
            end = loop.time() + deadline
            while not pred():
                assert loop.time() < end, f"timed out after {deadline:.0f} s waiting for {what}"
                await asyncio.sleep(0.05)

        await until("the first Watch stream", lambda: stats.watch_opened == 1 and w.watch_call is not None)
        w.registered = False  # as after a failed heartbeat: it registers again, and its stream is reopened
        w.nudge.set()
        await until("the registration again", lambda: stats.registrations == 2)
        await until("the second Watch stream", lambda: stats.watch_opened == 2 and w.watch_call is not None)
        sent = loop.time()
        await stub.Submit(pb.SubmitRequest(spec_yaml="name: one\nlauncher: direct\nsteps: 10\n"
                                           "command: [fleet-sim-task]\n", source="one.yaml"), metadata=md)
        await until("the launch order", lambda: stats.launches == 1)
        took = loop.time() - sent
        for r in runs:
            r.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        await w.watch_channels.close()
        await ch.close()
        return stats, took

    try:
        stats, took = asyncio.run(scenario())
    finally:
        stop_controller(ctl)
    assert took < long_beat / 2 and stats.watch_events >= 1
    assert stats.errors == {}, stats.error_examples


def test_sim_worker_keeps_its_registration_through_late_heartbeats(tmp_path: Path, monkeypatch) -> None:
    """A heartbeat that times out (a busy controller: DEADLINE_EXCEEDED) leaves the worker registered, as the real
    worker's loop does (``liveness.keeps_registration``): it beats again after its back-off and never calls Register
    a second time. Before, every late heartbeat of a 10,000-worker storm added a Register (808 in one run)."""
    import fleet_worker

    o = FleetOptions(heartbeat_interval_s=HEARTBEAT_S, schedule_interval_s=SCHEDULE_S, worker_timeout_s=30)
    ctl, address = start_controller(tmp_path, controller_config(tmp_path, o))
    # the back-off after a failed call starts at 0.2 s and doubles (at most BUSY_BACKOFF_S, 10 s): three failures
    # and the first beat after them come within ~13 s even at load; LOAD_FACTOR covers a slow machine
    deadline = LOAD_FACTOR * (15 + HEARTBEAT_S)

    async def scenario() -> ProcStats:
        ch = grpc.aio.insecure_channel(address, options=channel_options(0))
        stub, md = pb_grpc.ControllerStub(ch), metadata(TOKEN)
        stats = ProcStats()
        w = SimWorker("wlate", 0, stub, SimOptions(address, TOKEN, str(tmp_path), slots=1), stats, md)
        run = asyncio.create_task(w.run(0))
        loop = asyncio.get_running_loop()

        async def until(what: str, pred) -> None:
            end = loop.time() + deadline
            while not pred():
                assert loop.time() < end, f"timed out waiting for {what}: {stats.errors}"
                await asyncio.sleep(0.05)

        await until("a first heartbeat", lambda: len(stats.hb_lat) >= 1)
        monkeypatch.setattr(fleet_worker, "RPC_TIMEOUT_S", 1e-6)  # every call now misses its deadline
        await until("three late heartbeats", lambda: stats.errors.get("Heartbeat DEADLINE_EXCEEDED", 0) >= 3)
        monkeypatch.setattr(fleet_worker, "RPC_TIMEOUT_S", 10.0)
        beats = len(stats.hb_lat)
        await until("heartbeats answered again", lambda: len(stats.hb_lat) >= beats + 2)
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await ch.close()
        return stats

    try:
        stats = asyncio.run(scenario())
    finally:
        stop_controller(ctl)
    assert stats.registrations == 1, stats.errors  # the late heartbeats registered nobody again
    assert set(stats.errors) == {"Heartbeat DEADLINE_EXCEEDED"}, stats.error_examples
    assert stats.reregister_replies == 0  # and the controller never dropped it meanwhile
