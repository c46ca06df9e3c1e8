"""Scheduling steps whose cost follows what changed, not the queue's length (issue 25).

Seen: with 20,000 pending jobs the controller re-read and re-parsed every active job under its lock at every
tick (0.5-2.1 s a read) and planned over all of them. Now the state is in memory, a step that finds nothing
changed does not plan, and a step that plans sees the running jobs plus a bounded head of the queue in the
policy's order, passing over jobs no live worker can hold. A real controller on a real state file; the workers
are its own RPC handlers called directly (the gRPC layer only translates messages).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from runtime_procs import controller_config

from hpcsched.runtime import controller as controller_mod
from hpcsched.runtime import controller_step, plan_set
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.jobfile import parse_job_spec
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.store import Store

N = 2000


def _queue(state: Path, blocked: int, runnable: int) -> list[str]:
    """``blocked`` jobs of a GPU type no worker has, then ``runnable`` one-process jobs, all pending."""
    st = Store(state)
    try:
        st.db.execute("PRAGMA synchronous=OFF")  # a test's own filling: thousands of commits
        ids = []
        for i in range(blocked):
            spec = parse_job_spec(f"name: b{i}\ncommand: [t.py]\nlauncher: direct\nprocs: 1\ngpu_type: h100\n",
                                  "b.yaml")
            ids.append(st.add_job(spec, float(i)))
        for i in range(runnable):
            spec = parse_job_spec(f"name: r{i}\ncommand: [t.py]\nlauncher: direct\nprocs: 1\n", "r.yaml")
            ids.append(st.add_job(spec, float(blocked + i)))
        return ids
    finally:
        st.close()


def test_a_step_plans_over_a_bounded_head_and_only_when_something_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = _queue(tmp_path / "run" / "state.db", blocked=N, runnable=N)
    seen: list[int] = []
    real_plan = controller_mod.scheduler.plan

    def counting_plan(state, *a, **k):  # noqa: ANN001, ANN002, ANN003
        seen.append(len(state.jobs))
        return real_plan(state, *a, **k)

    monkeypatch.setattr(controller_mod.scheduler, "plan", counting_plan)
    monkeypatch.setattr(controller_step, "_REPLAN_S", 3600.0)  # the safety-net re-plan is not what this checks
    cfg = read_controller_config(controller_config(tmp_path, worker_timeout_s=600))  # its workers beat once
    ctl = controller_mod.Controller(cfg)
    try:
        ctl.started()
        for w in ("w1", "w2"):
            ctl.register(pb.RegisterRequest(worker_id=w, host="127.0.0.1", slots=2, cpus=2, launchers=["direct"],
                                            instance=w, gpu_type="v100"))
            ctl.heartbeat(pb.HeartbeatRequest(worker_id=w, instance=w, spare_port=41000))
        t0 = time.perf_counter()
        ctl.tick()
        first = time.perf_counter() - t0
        running = [j.id for j in ctl.store.jobs(("running",))]
        # FIFO over the runnable jobs: the first two (one per worker's free port) start, none of the blocked ones
        assert running and set(running) <= set(ids[N:N + 4]), running
        assert seen and seen[-1] <= plan_set.HEAD_MIN + 4, seen  # not 4,000 jobs
        for _ in range(N):  # the notes are written over steps of a bounded time each
            if not ctl.counters()["notes_due"]:
                break
            ctl.tick()
        blocked = ctl.store.job(ids[0])
        assert "waiting: no live worker with direct has GPU type h100" in blocked.message
        plans = ctl.plans
        for _ in range(5):  # nothing changed: no plan
            ctl.tick()
        assert ctl.plans == plans and ctl.quiet_steps >= 5
        writes = ctl.store.sql_writes
        t0 = time.perf_counter()
        ctl.tick()
        quiet = time.perf_counter() - t0
        assert ctl.store.sql_writes == writes
        assert quiet < max(0.05, first / 4), (quiet, first)  # a quiet step costs far less than a planning one
        # something changes (a job is cancelled): the next step plans
        ctl.cancel(ids[N + 10])
        ctl.tick()
        assert ctl.plans == plans + 1
    finally:
        ctl.store.close()


def test_waiting_notes_are_written_a_bounded_time_a_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A change that touches the waiting note of more queued jobs than a step writes (the first worker of a fleet,
    100,000 queued jobs) is written over the next steps, for a bounded time each (here none: one chunk a step),
    counted, and every note arrives."""
    monkeypatch.setattr(controller_step, "_NOTES_S", 0.0)
    chunk = controller_step._NOTES_CHUNK
    ids = _queue(tmp_path / "run" / "state.db", blocked=3 * chunk + 5, runnable=0)
    cfg = read_controller_config(controller_config(tmp_path, worker_timeout_s=600))
    ctl = controller_mod.Controller(cfg)
    try:
        ctl.started()
        ctl.tick()  # no worker: every job is noted "no live worker", one chunk of them now
        noted = [j for j in ctl.store.jobs(("pending",)) if "waiting: " in j.message]
        assert len(noted) == chunk and ctl.wakeup.is_set()
        assert ctl.counters()["notes_due"] == len(ids) - chunk and ctl.counters()["notes_deferred_steps"] == 1
        for _ in range(3):
            ctl.tick()
        assert all("waiting: no live worker" in ctl.store.job(j).message for j in ids)
        assert ctl.counters()["notes_due"] == 0 and ctl.counters()["notes_deferred_steps"] == 3
    finally:
        ctl.store.close()
