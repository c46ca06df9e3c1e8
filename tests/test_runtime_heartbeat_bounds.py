"""Heartbeats that cannot harm other workers' jobs or the controller, and that scale with the fleet (issue 26
items 2-3, issue 25 liveness).

Seen: one forged heartbeat reporting another worker's task ``done`` at step 1000 marked that job completed at
67 of its steps and killed its real process as stale; 150,000 bogus task entries held the controller lock 17 s
and a live worker was declared lost. Real controller, real gRPC on port 0; the workers are gRPC clients that
speak the protocol as a worker daemon does.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest
from runtime_procs import TOKEN, controller_config

from hpcsched.runtime.auth import metadata, open_channel
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.credentials import credential_metadata
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.server import ControllerServer

JOB = "name: victim\ncommand: [train.py]\nlauncher: direct\nprocs: 1\nsteps: 1000\n"


class FakeWorker:
    """A worker as the controller sees it: registers, heartbeats with what it says it runs."""

    def __init__(self, stub: pb_grpc.ControllerStub, name: str, slots: int = 2,
                 launchers: tuple[str, ...] = ("direct",)) -> None:
        self.stub, self.name, self.md = stub, name, metadata(TOKEN)
        reply = stub.Register(pb.RegisterRequest(worker_id=name, host="127.0.0.1", slots=slots, cpus=2,
                                                 launchers=list(launchers), instance=f"i-{name}"),
                              metadata=self.md, timeout=10)
        self.interval = reply.heartbeat_interval_s
        self.md = self.md + credential_metadata(reply.credential)  # its own credential, as a worker daemon's

    def beat(self, tasks: list[pb.TaskStatus] = (), partial: bool = False, timeout: float = 10) -> pb.HeartbeatReply:
        req = pb.HeartbeatRequest(worker_id=self.name, instance=f"i-{self.name}", spare_port=40000, tasks=tasks,
                                  partial=partial)
        return self.stub.Heartbeat(req, metadata=self.md, timeout=timeout)


@pytest.fixture
def controller(tmp_path: Path, request: pytest.FixtureRequest):
    extra = getattr(request, "param", {})
    srv = ControllerServer(read_controller_config(controller_config(tmp_path, **extra)))
    addr = srv.start()
    channel = open_channel(addr)
    try:
        yield srv, pb_grpc.ControllerStub(channel)
    finally:
        channel.close()
        srv.stop()


def _place(srv: ControllerServer, stub: pb_grpc.ControllerStub, w: FakeWorker) -> pb.LaunchTask:
    """Submit the victim job and heartbeat ``w`` until it is told to launch it; confirm it running at step 67."""
    stub.Submit(pb.SubmitRequest(spec_yaml=JOB, source="victim.yaml"), metadata=metadata(TOKEN), timeout=10)
    deadline = time.time() + 30
    while time.time() < deadline:
        reply = w.beat()
        if reply.launch:
            launch = reply.launch[0]
            progress = [pb.Progress(step=67, loss=1.0, time=time.time(), world_size=1, resumed_from=-1)]
            w.beat([pb.TaskStatus(task_id=launch.task_id, job_id=launch.job_id, generation=launch.generation,
                                  running=True, progress=progress)])
            assert srv.ctl.store.job(launch.job_id).steps_done == 67
            return launch
        time.sleep(0.1)
    raise AssertionError("the job was never placed")


def test_a_forged_report_of_another_workers_task_changes_nothing(controller) -> None:
    srv, stub = controller
    victim = FakeWorker(stub, "w-victim")
    forger = FakeWorker(stub, "w-forger", launchers=("mpirun",))  # nothing of the victim's job can go there
    launch = _place(srv, stub, victim)
    done = [pb.Progress(step=1000, loss=0.1, time=time.time(), world_size=1, done=True, resumed_from=-1)]
    forged = pb.TaskStatus(task_id=launch.task_id, job_id=launch.job_id, generation=launch.generation,
                           running=False, exit_code=0, progress=done)
    reply = forger.beat([forged])
    assert not reply.kill and not reply.launch
    # the right worker, but another job's id or another attempt: refused too
    victim.beat([pb.TaskStatus(task_id=launch.task_id, job_id="j9999", generation=launch.generation, running=False,
                               progress=done)])
    victim.beat([pb.TaskStatus(task_id=launch.task_id, job_id=launch.job_id, generation=launch.generation + 1,
                               running=False, progress=done)])
    job = srv.ctl.store.job(launch.job_id)
    assert (job.state, job.steps_done, job.done, job.generation) == ("running", 67, 0, launch.generation)
    assert srv.ctl.refused_reports == 3
    assert srv.ctl.store.alloc(launch.task_id).state == "running"
    # the real process is not killed as stale: its own worker's next report is answered with nothing to do
    reply = victim.beat([pb.TaskStatus(task_id=launch.task_id, job_id=launch.job_id, generation=launch.generation,
                                       running=True)])
    assert not reply.kill and not reply.forget


def test_a_huge_heartbeat_is_refused_before_the_lock_and_a_live_worker_stays(controller) -> None:
    srv, stub = controller
    live = FakeWorker(stub, "w-live")
    bully = FakeWorker(stub, "w-bully")
    launch = _place(srv, stub, live)
    mine = pb.TaskStatus(task_id=launch.task_id, job_id=launch.job_id, generation=launch.generation, running=True)
    stop = threading.Event()
    answered: list[float] = []
    problems: list[str] = []

    def keep_beating() -> None:  # the live worker, at its interval
        while not stop.wait(live.interval):
            t0 = time.perf_counter()
            try:
                reply = live.beat([mine], timeout=30)
            except grpc.RpcError as e:
                problems.append(f"{e.code().name}: {e.details()}")
                continue
            answered.append(time.perf_counter() - t0)
            if reply.reregister or reply.kill:
                problems.append(f"told to reregister or kill: {reply}")

    bogus = [pb.TaskStatus(task_id=f"{i:05x}", job_id=f"j{i:06d}", running=False) for i in range(150_000)]
    big = pb.HeartbeatRequest(worker_id="w-bully", instance="i-w-bully", tasks=bogus)
    assert 2_500_000 < big.ByteSize() < 4 * 1024 * 1024  # under gRPC's default limit: the controller must refuse it
    # Refused before the lock: it is refused even while the lock is held here
    with srv.ctl.lock:
        t0 = time.perf_counter()
        with pytest.raises(grpc.RpcError) as e:
            stub.Heartbeat(big, metadata=bully.md, timeout=20)
        held = time.perf_counter() - t0
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "150000 task entries" in e.value.details()
    assert held < 10, held
    beater = threading.Thread(target=keep_beating, daemon=True)
    beater.start()
    timeout = srv.cfg.worker_timeout_s
    t_end = time.time() + timeout * 1.5  # past one worker_timeout_s of being flooded
    sent = 1
    while time.time() < t_end:
        with pytest.raises(grpc.RpcError):
            stub.Heartbeat(big, metadata=bully.md, timeout=20)
        sent += 1
    stop.set()
    beater.join(timeout=60)
    assert not problems, problems
    assert answered and max(answered) < timeout, answered
    assert srv.ctl.refused_heartbeats == sent
    assert "w-live" in srv.ctl.last_seen
    job = srv.ctl.store.job(launch.job_id)
    assert (job.state, job.generation, job.restarts) == ("running", launch.generation, 0)
    assert not bully.beat().kill  # a heartbeat of a normal size is served (it may be told to register again)


@pytest.mark.parametrize("controller", [{"heartbeat_rate": 2, "worker_timeout_s": 30}], indirect=True)
def test_the_interval_grows_with_the_fleet_and_partial_reports_keep_tasks(controller) -> None:
    srv, stub = controller
    w = FakeWorker(stub, "w0")
    launch = _place(srv, stub, w)
    others = [FakeWorker(stub, f"w{i}") for i in range(1, 6)]
    assert w.interval == pytest.approx(0.5) and others[-1].interval == pytest.approx(3.0)  # 1, then 6 workers at 2/s
    writes = srv.ctl.store.sql_writes
    reply = w.beat([], partial=True)  # nothing new: the running task is left out
    assert reply.heartbeat_interval_s == pytest.approx(3.0)
    assert not reply.launch and not reply.kill
    assert srv.ctl.store.sql_writes == writes  # a heartbeat that changes nothing writes nothing
    job = srv.ctl.store.job(launch.job_id)
    assert job.state == "running" and srv.ctl.store.alloc(launch.task_id).state == "running"
    # a full report without the task: the worker lost it (restarted without it): the attempt is lost
    w.beat([], partial=False)
    assert srv.ctl.store.alloc(launch.task_id).state == "exited"
    assert srv.ctl.store.job(launch.job_id).state in ("stopping", "pending")


@pytest.mark.parametrize("controller", [{"heartbeat_rate": 1, "worker_timeout_s": 3}], indirect=True)
def test_the_timeout_caps_the_interval_and_says_so_once(controller, caplog: pytest.LogCaptureFixture) -> None:
    srv, stub = controller
    with caplog.at_level("WARNING", logger="hpcsched.runtime.controller"):
        workers = [FakeWorker(stub, f"w{i}") for i in range(6)]
    assert workers[-1].interval == pytest.approx(1.0)  # 6 s wanted, a third of worker_timeout_s 3 s allowed
    said = [r for r in caplog.records if "raise worker_timeout_s" in r.getMessage()]
    assert len(said) == 1


def test_a_heartbeat_with_nothing_to_reconcile_does_not_wait_for_the_lock(controller) -> None:
    """Lease-only heartbeats (controller_members' docstring): while the controller's lock is held (here; a long
    scheduling step at 10,000 workers), an idle worker's heartbeat and a partial one with no news from a worker
    whose task runs as placed are answered at once, renew the lease in memory and write nothing; a heartbeat that
    reports a task waits for the lock and is reconciled, as before."""
    srv, stub = controller
    busy, idle = FakeWorker(stub, "w-busy"), FakeWorker(stub, "w-idle")
    launch = _place(srv, stub, busy)
    seen = dict(srv.ctl.last_seen)
    quick, writes = srv.ctl.lease_only_beats, srv.ctl.store.sql_writes
    running = pb.TaskStatus(task_id=launch.task_id, job_id=launch.job_id, generation=launch.generation, running=True,
                            progress=[pb.Progress(step=80, loss=1.0, time=time.time(), world_size=1, resumed_from=-1)])
    with srv.ctl.lock:  # held by this thread; the handlers run on the server's
        for w, partial in ((idle, False), (idle, True), (busy, True)):
            reply = w.beat([], partial=partial, timeout=10)  # the lock is never released here: waiting would time out
            assert not reply.launch and not reply.kill and not reply.reregister
            assert reply.heartbeat_interval_s == busy.interval
        assert srv.ctl.last_seen["w-idle"] > seen["w-idle"] and srv.ctl.last_seen["w-busy"] > seen["w-busy"]
        assert srv.ctl.lease_only_beats == quick + 3 and srv.ctl.store.sql_writes == writes
        with pytest.raises(grpc.RpcError) as e:  # news to write: it waits for the lock
            busy.beat([running], partial=True, timeout=1.0)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    reply = busy.beat([running], partial=True)
    assert not reply.kill and srv.ctl.store.job(launch.job_id).steps_done == 80
    assert srv.ctl.lease_only_beats == quick + 3
    # every call's wait for a server thread is timed beside its handler's time (method_pools)
    stats = srv.timings.summary()
    assert stats["Heartbeat (queued)"]["calls"] >= stats["Heartbeat"]["calls"] > 3  # queued: timed first


@pytest.fixture
def pooled(tmp_path: Path):
    from hpcsched.runtime.method_pools import POOLS

    srv = ControllerServer(read_controller_config(controller_config(tmp_path)), method_pools=POOLS)
    channel = open_channel(srv.start())
    try:
        yield srv, pb_grpc.ControllerStub(channel)
    finally:
        channel.close()
        srv.stop()


def test_heartbeats_can_have_threads_of_their_own(pooled) -> None:
    """method_pools (an experiment, not the default): with every thread of the default pool and of the Register pool
    waiting for the controller's lock or refused at once (held here, as by a long scheduling step: at most
    liveness.LOCK_WAITING_CALLS wait, the others are shed), an idle worker's heartbeat is still
    answered at once: it runs in the Heartbeat pool, not behind them in one queue; its wait for a thread is timed
    as "Heartbeat (queued)"."""
    from hpcsched.runtime.liveness import LOCK_WAITING_CALLS, SHED_PREFIX
    from hpcsched.runtime.method_pools import POOLS

    srv, stub = pooled
    idle = FakeWorker(stub, "w-idle")
    md = metadata(TOKEN)
    with srv.ctl.lock:
        blocked = [stub.Submit.future(pb.SubmitRequest(spec_yaml=JOB, source=f"j{i}.yaml"), metadata=md, timeout=60)
                   for i in range(48 + 8)]  # more than the default pool's threads
        blocked += [stub.Register.future(pb.RegisterRequest(worker_id=f"w-new{i}", host="127.0.0.1", slots=1,
                                                            instance=f"i{i}"), metadata=md, timeout=60)
                    for i in range(POOLS["Register"] + 4)]
        deadline = time.time() + 30
        while srv.timings.summary().get("Register (queued)", {}).get("calls", 0) < POOLS["Register"] + 1:
            assert time.time() < deadline, "the blocked calls never reached their handlers"
            time.sleep(0.05)
        reply = idle.beat([], partial=True, timeout=10)  # in one queue with them it would wait for the lock's release
        assert not reply.reregister
    served = 0
    for f in blocked:  # those admitted to wait for the lock are served once it is free; the rest were shed at once
        try:
            f.result(timeout=60)
            served += 1
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and e.details().startswith(SHED_PREFIX)
    assert served >= LOCK_WAITING_CALLS
    assert sum(n for (_, why), n in srv.service.refusals().items() if why == "shed") == len(blocked) - served
    stats = srv.timings.summary()
    assert stats["Heartbeat (queued)"]["calls"] >= 1 and stats["Submit (queued)"]["calls"] == 48 + 8


def test_heartbeats_with_news_past_the_waiting_bound_are_shed_with_the_lease_renewed(controller) -> None:
    """At most liveness.LOCK_WAITING_BEATS heartbeats wait for the controller's lock at once (so a long step cannot
    take every server thread); one more with news is refused RESOURCE_EXHAUSTED at once, counted, and its worker's
    lease renewed (it is alive; a worker keeps its registration and sends the news after its back-off)."""
    from hpcsched.runtime.liveness import LOCK_WAITING_BEATS, RENEWED_PREFIX

    srv, stub = controller
    workers = [FakeWorker(stub, f"w{i:02d}") for i in range(LOCK_WAITING_BEATS + 1)]
    news = [pb.TaskStatus(task_id="t-unknown", job_id="j-unknown", running=False)]  # reconciled under the lock
    with srv.ctl.lock:
        waiting = [w.stub.Heartbeat.future(pb.HeartbeatRequest(worker_id=w.name, instance=f"i-{w.name}", tasks=news),
                                           metadata=w.md, timeout=60) for w in workers[:-1]]
        deadline = time.time() + 30
        while srv.timings.summary().get("Heartbeat (queued)", {}).get("calls", 0) < LOCK_WAITING_BEATS:
            assert time.time() < deadline, "the heartbeats never reached their handlers"
            time.sleep(0.05)
        before = srv.ctl.last_seen[workers[-1].name]
        with pytest.raises(grpc.RpcError) as e:
            workers[-1].beat(news, timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and e.value.details().startswith(RENEWED_PREFIX)
        assert srv.ctl.last_seen[workers[-1].name] > before and srv.ctl.shed_beats == 1
        assert not any(f.done() for f in waiting)
    for f in waiting:
        assert list(f.result(timeout=60).forget) == ["t-unknown"]  # served once the lock was free
    assert srv.service.refusals() == {("Heartbeat", "shed"): 1}
    assert not workers[-1].beat(news).reregister  # and the shed worker's next report is reconciled
