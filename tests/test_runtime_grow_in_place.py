"""An elastic Horovod job grows in place into slots another job gives up (cancelled, or ended), instead of being
stopped and relaunched at the new size while those slots are still held: the decision (pure, hand-checked), the
controller in process (heartbeats by hand, no Horovod), and the whole path with real processes and ``horovodrun``.
Also the controller's count of ``shrink_to_fit`` starts (an elastic job started below the size it was given)."""

from __future__ import annotations

import json
import logging
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

from hpcsched.runtime import scheduler
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.scheduler import ClusterState, JobState, WorkerState

horovod_missing = no_horovod()


def _hvd(procs: int, where: tuple[tuple[str, int], ...], max_procs: int = 2) -> JobState:
    return JobState("a", submit=0.0, running=True, procs=procs, min_procs=1, max_procs=max_procs, launcher="horovodrun",
                    placement=where, attempt_start=0.0, in_place=True)


def test_plan_waits_for_departing_slots_instead_of_relaunching() -> None:
    """Slots held by a job that is not planned any more (stopping: cancelled, preempted) are counted by admission
    but are not free yet: an elastic Horovod job sized into them keeps its size (no stop, no resize) and says the
    size it waits for; once they are free it grows in place, on its own node or onto another worker."""
    w = (WorkerState("w1", 2, ("horovodrun", "direct")),)
    held = scheduler.plan(ClusterState(10.0, (_hvd(1, (("w1", 1),)),), w, {"w1": 2}))
    assert held.stops == {} and held.resizes == {} and held.sizes == {"a": 1}, held
    assert held.grow_waits == {"a": 2}, held
    freed = scheduler.plan(ClusterState(11.0, (_hvd(1, (("w1", 1),)),), w, {"w1": 1}))
    assert freed.resizes == {"a": [("w1", 2)]} and freed.stops == {} and freed.grow_waits == {}
    two = (WorkerState("w1", 1, ("horovodrun",)), WorkerState("w2", 1, ("horovodrun",)))
    held = scheduler.plan(ClusterState(10.0, (_hvd(1, (("w1", 1),)),), two, {"w1": 1, "w2": 1}))
    assert held.stops == {} and held.resizes == {} and held.grow_waits == {"a": 2}, held
    freed = scheduler.plan(ClusterState(11.0, (_hvd(1, (("w1", 1),)),), two, {"w1": 1}))
    assert freed.resizes == {"a": [("w1", 1), ("w2", 1)]} and freed.stops == {}
    # a pending job admitted at its minimum still starts on the free slot (the departing ones are what the grow waits
    # for); the grow is sized again from what runs at the next step
    other = (WorkerState("w1", 3, ("horovodrun", "direct")), WorkerState("w2", 1, ("horovodrun", "direct")))
    late = JobState("b", submit=5.0, running=False, procs=0, min_procs=1, max_procs=1, launcher="direct")
    both = scheduler.plan(ClusterState(10.0, (_hvd(1, (("w1", 1),), 4), late), other, {"w1": 3}))
    assert both.grow_waits == {"a": 3} and both.stops == {} and both.starts == {"b": [("w2", 1)]}, both


def test_plan_still_relaunches_where_departing_slots_do_not_help() -> None:
    """The fallback stays where waiting cannot make the grow fit in place: slots free only on a worker without the
    horovodrun launcher (and none departing), or a job whose first node is gone."""
    other = (WorkerState("w1", 2, ("horovodrun",)), WorkerState("w2", 2, ("torchrun",)))
    j = JobState("a", submit=0.0, running=True, procs=2, min_procs=1, max_procs=4, launcher="horovodrun",
                 placement=(("w1", 2),), attempt_start=0.0, in_place=True)
    nowhere = scheduler.plan(ClusterState(10.0, (j,), other, {"w1": 2, "w2": 1}))
    assert nowhere.stops == {"a": "resize"} and nowhere.resizes == {} and nowhere.grow_waits == {}


class _InProcess:
    """A real ``Controller`` in this process, its workers' heartbeats written by hand (no Horovod): each order to
    launch becomes a running task, reported on the next heartbeat."""

    def __init__(self, tmp_path: Path) -> None:
        from hpcsched.runtime.config import ControllerConfig
        from hpcsched.runtime.controller import Controller

        self.c = Controller(ControllerConfig(state=tmp_path / "s.db", checkpoint_root=tmp_path / "ck",
                                             min_runtime_s=0))
        self.c.started()
        self.running: dict[str, list[pb.TaskStatus]] = {}

    def join(self, w: str, slots: int, launchers: list[str]) -> None:
        self.c.register(pb.RegisterRequest(worker_id=w, host=f"10.0.0.{w[1]}", slots=slots, launchers=launchers,
                                           instance=w, agent_port=7000 + int(w[1])))
        self.beat(w)

    def beat(self, w: str) -> pb.HeartbeatReply:
        reply = self.c.heartbeat(pb.HeartbeatRequest(worker_id=w, spare_port=40000, agent_port=7000 + int(w[1]),
                                                     tasks=self.running.get(w, []), instance=w))
        self.running[w] = [t for t in self.running.get(w, []) if t.running]
        for order in reply.launch:
            if all(t.task_id != order.task_id for t in self.running[w]):
                self.running[w].append(pb.TaskStatus(task_id=order.task_id, job_id=order.job_id,
                                                     generation=order.generation, running=True))
        return reply

    def exit(self, w: str, job_id: str) -> None:
        """The job's tasks on ``w`` end (as after a stop: they checkpointed and exited 0), reported at once."""
        for t in self.running[w]:
            if t.job_id == job_id:
                t.running, t.exit_code = False, 0
        self.beat(w)


def test_cancelled_blocker_grows_the_elastic_job_in_place(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The defect, in process: an elastic Horovod job (min 1, max 2) runs at 1 beside a 1-process job on a 2-slot
    worker; the other job is cancelled. While its task still holds the slot the elastic job is left as it is (it
    was stopped and relaunched at 2 here: a checkpoint, a restart and the steps since lost); when the task has
    exited it grows 1 -> 2 in place, same generation, no stop."""
    p = _InProcess(tmp_path)
    c = p.c
    p.join("w1", 2, ["horovodrun", "direct"])
    blocker = c.submit("name: blocker\nlauncher: direct\ncommand: [t.py]\nsteps: 1000\nprocs: 1\n", "b")
    c.tick()
    p.beat("w1")
    hvd = c.submit("name: hvd\nlauncher: horovodrun\ncommand: [t.py]\nsteps: 1000\nmin_procs: 1\nmax_procs: 2\n",
                   "h")
    c.tick()
    p.beat("w1")
    assert (c.store.job(hvd).state, c.store.job(hvd).procs, c.store.job(blocker).state) == ("running", 1, "running")
    ok, _ = c.cancel(blocker)
    assert ok and c.store.job(blocker).state == "stopping"
    with caplog.at_level(logging.INFO, logger="hpcsched.runtime.controller"):
        c.tick()
        c.tick()  # said once, not at every step while it waits
    job = c.store.job(hvd)
    assert (job.state, job.procs, job.generation, job.stop_reason) == ("running", 1, 1, None), job
    assert not c.store.events(hvd, "stop") and not c.store.events(hvd, "resize")
    waits = [r.getMessage() for r in caplog.records if "grows in place to 2" in r.getMessage()]
    assert len(waits) == 1 and hvd in waits[0], caplog.text
    (kill,) = p.beat("w1").kill  # the cancel's stop reaches the blocker's task, which exits
    assert kill.task_id.startswith(blocker)
    p.exit("w1", blocker)
    assert c.store.job(blocker).state == "cancelled"
    c.tick()
    job = c.store.job(hvd)
    assert (job.state, job.procs, job.generation, job.stop_reason) == ("running", 2, 1, "in-place"), job
    (resize,) = c.store.events(hvd, "resize")
    assert (resize["resize_kind"], resize["from_procs"], resize["procs"]) == ("in-place", 1, 2), resize
    assert not c.store.events(hvd, "stop")


def test_shrink_to_fit_is_counted_and_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An elastic job sized 2 when no worker has 2 free slots (1 on each of two) starts at 1 (``shrink_to_fit``):
    the controller counts it (``counters()['shrunk_to_fit']``; ``/metrics`` exports it, ``test_ops``) and logs it
    once, with the size it was given and the one it got."""
    p = _InProcess(tmp_path)
    c = p.c
    for w in ("w1", "w2"):
        p.join(w, 2, ["direct"])
    rigid = [c.submit(f"name: r{k}\nlauncher: direct\ncommand: [t.py]\nsteps: 1000\nprocs: 1\n", f"r{k}")
             for k in range(4)]
    for _ in range(8):  # a start takes a port its worker's heartbeat offers: one start per worker and heartbeat
        c.tick()
        for w in ("w1", "w2"):
            p.beat(w)
    assert all(c.store.job(j).state == "running" for j in rigid) and c.counters()["shrunk_to_fit"] == 0
    for w in ("w1", "w2"):  # one job on each worker ends: 1 slot free on each, none with 2
        gone = p.running[w][0].job_id
        assert c.cancel(gone)[0]
        p.beat(w)
        p.exit(w, gone)
        assert c.store.job(gone).state == "cancelled"
    elastic = c.submit("name: el\nlauncher: direct\ncommand: [t.py]\nsteps: 100\nmin_procs: 1\nmax_procs: 2\n",
                       "e")
    with caplog.at_level(logging.INFO, logger="hpcsched.runtime.controller"):
        c.tick()
    job = c.store.job(elastic)
    assert (job.state, job.procs) == ("running", 1), job
    assert c.counters()["shrunk_to_fit"] == 1
    said = [r.getMessage() for r in caplog.records if "shrink_to_fit" in r.getMessage()]
    assert len(said) == 1 and elastic in said[0] and "at 1 procs, below the 2" in said[0], caplog.text


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.skipif(horovod_missing, reason="needs Horovod with PyTorch (make horovod)")
def test_controller_grows_horovod_job_in_place_when_blocker_cancelled(tmp_path: Path) -> None:
    """Real controller and worker processes, real gRPC, real ``horovodrun``: an elastic Horovod job (min 1, max 2)
    starts at 1 beside a long 1-process job on a 2-slot worker; that job is cancelled and the Horovod job grows
    1 -> 2 in place: one attempt (generation 1), no stop, rank 0 one process that never restored a checkpoint,
    the exact step count, ending at 2 ranks."""
    steps = 300
    cfg = controller_config(tmp_path, min_runtime_s=0)
    ctl, addr = start_controller(tmp_path, cfg)
    w = start_worker(tmp_path, addr, "w1", slots=2)
    c = client(addr)
    # the controller's intervals (controller_config): what its reactions are waited for with, generously (load 8)
    beat_s, step_s = 0.3, 0.2
    react_s = 60 * (beat_s + step_s)
    try:
        wait_for("the worker", lambda: any(x.alive for x in c.workers()), 60)
        blocker = tmp_path / "blocker.yaml"
        blocker.write_text(f"name: blocker\nlauncher: direct\nprocs: 1\nsteps: 100000\nworkdir: {ROOT}\n"
                           "command: [tests/netns_job.py, --checkpoint-every, '50', --step-ms, '50']\n")
        b = submit(c, blocker)
        wait_for("the blocker running", lambda: jobs_by_id(c)[b].steps_done > 0, react_s + 30)
        # 50 ms of emulated IO per step: 300 steps last ~15 s at any load, long past the grow (Horovod's start-up of
        # the new rank, 10-20 s under load, is why the job is not shorter). Gloo's timeout as in the other in-place
        # tests: rank 0 waits in Gloo for the new rank, whose start a loaded machine can starve past 10 s.
        spec = tmp_path / "hvd.yaml"
        spec.write_text(f"name: hvd\nlauncher: horovodrun\nprocs: 2\nmin_procs: 1\nmax_procs: 2\nsteps: {steps}\n"
                        f"workdir: {ROOT}\nenv: {{HOROVOD_GLOO_TIMEOUT_SECONDS: '30'}}\n"
                        f"command: [workloads/horovod_train.py, --io-latency-ms, '50', "
                        f"--checkpoint-every, '100', --commit-every, '5']\n")
        e = submit(c, spec)
        wait_for("hvd at 1 proc, training", lambda: (j := jobs_by_id(c)[e]).procs == 1 and j.steps_done > 0, 120)
        c.cancel(b)
        wait_for("the blocker cancelled", lambda: jobs_by_id(c)[b].state == "cancelled", react_s + 10)
        wait_for("hvd resized to 2", lambda: jobs_by_id(c)[e].procs == 2, react_s)
        jobs = wait_for("hvd finished", lambda: (js := jobs_by_id(c)) and js[e].state in (
            "completed", "failed", "cancelled") and js, 240, poll=0.5)
    finally:
        c.close()
        stop(w)
        stop(ctl)
    from hpcsched.runtime.store import Store

    store = Store(tmp_path / "run" / "state.db")
    ev = {k: store.events(e, k) for k in ("resize", "resized", "resume", "stop")}
    store.close()
    assert jobs[e].state == "completed", jobs[e].message
    assert jobs[e].generation == 1 and jobs[e].restarts == 0, jobs[e]
    assert not ev["stop"] and not ev["resume"], ev
    assert [(x["resize_kind"], x["from_procs"], x["procs"]) for x in ev["resize"]] == [("in-place", 1, 2)], ev
    assert [(x["resize_kind"], x["procs"]) for x in ev["resized"]] == [("in-place", 2)], ev
    progress = [json.loads(line) for line in
                (tmp_path / "run" / "w1" / f"{e}.g1.n0" / "progress.jsonl").read_text().splitlines()]
    assert len({r["pid"] for r in progress}) == 1, "rank 0 was restarted"
    assert all(r["resumed_from"] == -1 for r in progress)
    result = json.loads((tmp_path / "run" / "ckpt" / e / "result.json").read_text())
    assert result["steps"] == steps and result["world_size"] == 2, result
