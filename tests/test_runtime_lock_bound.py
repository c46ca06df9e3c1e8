"""Leave / Submit calls waiting for the controller's lock are bounded (``liveness.LOCK_WAITING_CALLS``), and so are
Registers waiting for their group's commit (``register_queue.REGISTER_WAITING``): one more is refused
RESOURCE_EXHAUSTED at once, counted (``/metrics``: hpcsched_refused_requests), and ``hpcsched submit``'s client (a
worker: after the retry-after it was told) retries it; against a real gRPC controller, its lock held here as by a
long step."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from runtime_procs import TOKEN, controller_config, kill_tree, start_worker, stop

from hpcsched.runtime.auth import metadata, open_channel
from hpcsched.runtime.client import Client
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.credentials import credential_metadata
from hpcsched.runtime.liveness import (
    BUSY_BACKOFF_S,
    LOCK_WAITING_BEATS,
    LOCK_WAITING_CALLS,
    SHED_PREFIX,
    told_retry_after,
)
from hpcsched.runtime.pacing import FORGET_S, MIN_RETRY_S, PRIOR_RATE, WINDOW_S, RegisterPacer
from hpcsched.runtime.register_queue import REGISTER_WAITING
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.server import ControllerServer

JOB = "name: queued\ncommand: [train.py]\nlauncher: direct\nprocs: 1\nsteps: 10\n"
WAIT_S = 60.0  # for calls to reach their handlers at load 8; polled, never slept whole


@pytest.fixture
def controller(tmp_path: Path):
    srv = ControllerServer(read_controller_config(controller_config(tmp_path)))
    addr = srv.start()
    channel = open_channel(addr)
    try:
        yield srv, pb_grpc.ControllerStub(channel), addr
    finally:
        channel.close()
        srv.stop()


def _until(what: str, cond) -> None:  # noqa: ANN001 (a predicate)
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _alive(srv: ControllerServer, worker: str) -> bool:
    with srv.ctl.lock:
        return any(w.id == worker and w.alive for w in srv.ctl.store.workers())


def _register(stub: pb_grpc.ControllerStub, i: int) -> grpc.Future:
    return stub.Register.future(pb.RegisterRequest(worker_id=f"w{i}", host="127.0.0.1", slots=1, instance=f"i{i}"),
                                metadata=metadata(TOKEN), timeout=WAIT_S)


def _submit(stub: pb_grpc.ControllerStub, i: int) -> grpc.Future:
    return stub.Submit.future(pb.SubmitRequest(spec_yaml=JOB, source=f"j{i}.yaml"), metadata=metadata(TOKEN),
                              timeout=WAIT_S)


def _fill(srv: ControllerServer, stub: pb_grpc.ControllerStub, submits: bool = True,
          registers: bool = True) -> list[grpc.Future]:
    """Calls waiting for the held lock up to both bounds: Submits (``LOCK_WAITING_CALLS``), Registers
    (``REGISTER_WAITING``)."""
    waiting = [_submit(stub, i) for i in range(LOCK_WAITING_CALLS)] if submits else []
    if submits:
        _until("the submits never reached the lock", lambda: srv.ctl.call_waiters.inside == LOCK_WAITING_CALLS)
    if registers:
        waiting += [_register(stub, i) for i in range(REGISTER_WAITING)]
        _until("the registrations never queued", lambda: srv.ctl.registrations.waiting() == REGISTER_WAITING)
    return waiting


def test_calls_past_the_bound_are_shed_at_once_and_counted(controller) -> None:
    srv, stub, _ = controller
    leaver = _register(stub, 50).result()  # registered before: its Leave carries its own credential
    leaver_md = metadata(TOKEN) + credential_metadata(leaver.credential)
    told: list[float | None] = []
    with srv.ctl.lock:
        waiting = _fill(srv, stub)
        for call in (lambda: stub.Submit(pb.SubmitRequest(spec_yaml=JOB, source="j.yaml"), metadata=metadata(TOKEN),
                                         timeout=WAIT_S),
                     lambda: stub.Leave(pb.LeaveRequest(worker_id="w50", instance="i50"), metadata=leaver_md,
                                        timeout=WAIT_S),
                     lambda: _register(stub, 99).result()):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and e.value.details().startswith(SHED_PREFIX)
            told.append(told_retry_after(e.value.trailing_metadata()))
        assert not any(f.done() for f in waiting)  # the admitted ones still wait for the lock
        # only the Register is told when to come back (the worker's storm is paced): the backlog of one drains at once
        assert told[:2] == [None, None] and told[2] is not None and MIN_RETRY_S <= told[2] < MIN_RETRY_S + 0.1
    for f in waiting[LOCK_WAITING_CALLS:]:
        assert f.result(timeout=WAIT_S).heartbeat_interval_s > 0  # and are served once it is free
    assert all(f.result(timeout=WAIT_S).job_id for f in waiting[:LOCK_WAITING_CALLS])
    assert srv.service.refusals() == {("Submit", "shed"): 1, ("Leave", "shed"): 1, ("Register", "shed"): 1}
    assert srv.ctl.counters()["shed_calls"] == 3 and srv.ctl.call_waiters.inside == 0
    assert srv.ctl.registrations.waiting() == 0


def test_the_submit_client_retries_a_shed_submit(controller) -> None:
    srv, stub, addr = controller
    got: list[object] = []
    with srv.ctl.lock:
        waiting = _fill(srv, stub, registers=False)
        client = Client(addr, TOKEN, timeout=WAIT_S)
        t = threading.Thread(target=lambda: got.append(client.submit_many([(JOB, "j.yaml", 1)])))
        t.start()
        _until("the submit was never shed", lambda: srv.service.refusals().get(("SubmitMany", "shed"), 0) >= 1)
    t.join(WAIT_S)
    assert not t.is_alive() and len(got) == 1
    (result,) = got[0]
    assert not result.error and len(result.job_ids) == 1  # retried after the lock was free, stored once
    waited = [f.result(timeout=WAIT_S).job_id for f in waiting]
    assert sorted(j.job_id for j in srv.ctl.list_jobs()) == sorted(waited + list(result.job_ids))


def test_a_worker_shed_by_a_busy_controller_is_not_an_orphan(controller, tmp_path: Path) -> None:
    """A shed Register is an answer from a live controller: a pilot's worker (``--orphan-timeout``) refused that way
    for longer than its orphan timeout stays, says the controller is busy, and registers once the lock is free."""
    srv, stub, addr = controller
    orphan_s = 1.0
    log = tmp_path / "w.log"
    with srv.ctl.lock:
        waiting = _fill(srv, stub, submits=False)
        with log.open("ab") as out:
            w = subprocess.Popen([sys.executable, "-m", "hpcsched.runtime", "worker", "--controller", addr, "--name",
                                  "p1", "--gpus", "0", "--orphan-timeout", str(orphan_s), "--stop-grace", "3",
                                  "--work-dir", str(tmp_path / "p1")],
                                 env=os.environ | {"HPCSCHED_TOKEN": TOKEN}, stdout=out, stderr=subprocess.STDOUT)
        try:
            _until("the worker was never shed", lambda: srv.service.refusals().get(("Register", "shed"), 0) >= 1)
            first = time.monotonic()
            _until("the worker stopped retrying", lambda: srv.service.refusals()[("Register", "shed")] >= 3
                   and time.monotonic() - first > 2 * orphan_s)
            assert w.poll() is None, log.read_text()  # still there, past twice its orphan timeout
        except BaseException:
            kill_tree(w)
            raise
    try:
        _until("the worker never registered", lambda: _alive(srv, "p1"))
        text = log.read_text()
        assert "controller busy (RESOURCE_EXHAUSTED)" in text
        assert "unreachable for" not in text
        # it waited what the controller told it (at least MIN_RETRY_S), not its own first back-offs (0.1-0.2 s)
        waits = [float(w) for w in re.findall(r"controller busy \(RESOURCE_EXHAUSTED\); retry in ([0-9.]+) s", text)]
        assert len(waits) >= 3 and all(w >= MIN_RETRY_S for w in waits), waits
    finally:
        kill_tree(w)
    for f in waiting:
        f.result(timeout=WAIT_S)


def test_shed_registrations_come_back_spread_over_the_backlogs_drain_time() -> None:
    """``pacing.RegisterPacer``: a shed worker is told a moment within the backlog's drain time (backlog / the rate
    of registrations), at least MIN_RETRY_S and at most BUSY_BACKOFF_S; a worker that registered leaves the backlog,
    and one not heard of for FORGET_S is forgotten."""
    now = [0.0]
    pacer = RegisterPacer(random.Random(1), clock=lambda: now[0])
    told = [pacer.retry_after(f"w{i}") for i in range(600)]  # no rate seen yet: the prior
    assert pacer.backlog() == 600 and all(MIN_RETRY_S <= t <= MIN_RETRY_S + 600 / PRIOR_RATE for t in told)
    assert max(told) > MIN_RETRY_S + 0.8 * 600 / PRIOR_RATE  # spread over the drain, not bunched
    for i in range(500):  # 500 registrations within the window: 250 a second
        now[0] += WINDOW_S / 1000
        pacer.registered(f"w{i}")
    assert pacer.backlog() == 100
    later = [pacer.retry_after(f"w{i}") for i in range(500, 600)]
    assert all(MIN_RETRY_S <= t <= MIN_RETRY_S + 100 / 250 for t in later)
    for i in range(5000):  # a backlog far past what drains in BUSY_BACKOFF_S: capped
        pacer.retry_after(f"x{i}")
    assert pacer.retry_after("x0") <= BUSY_BACKOFF_S
    now[0] += FORGET_S + 1
    assert pacer.backlog() == 0 and pacer.told == 600 + 100 + 5000 + 1


INTERVAL_S = 30.0  # the worker's heartbeat interval: an order that waited for the next beat would take this long
PROGRAM = 'echo "{\\"step\\": 0, \\"first\\": true}" >> "$HPCSCHED_PROGRESS_FILE"; while true; do sleep 0.1; done'


def test_a_shed_heartbeat_woken_by_an_order_is_retried_after_its_back_off(tmp_path: Path) -> None:
    """A worker woken by a pushed launch order whose heartbeat is shed (every ``beat_waiters`` slot taken here, as
    by LOCK_WAITING_BEATS heartbeats waiting out a step) sends it again after its back-off (0.1-0.2 s, doubling),
    not at its next interval (30 s): once the slots are free the launch reaches it within a third of the interval."""
    srv = ControllerServer(read_controller_config(controller_config(
        tmp_path, heartbeat_interval_s=INTERVAL_S, worker_timeout_s=4 * INTERVAL_S)))
    addr = srv.start()
    w = start_worker(tmp_path, addr, "a", slots=1)
    held = 0
    try:
        _until("the worker never registered", lambda: _alive(srv, "a"))
        # orders are pushed on its lease connection (no Watch stream with a lease server: lease_link)
        _until("the worker never subscribed", lambda: srv.leases.counters()["lease_subscribed"] == 1)
        srv.ctl.nudge(["a"], "port")  # a beat now: its port is known, so the launch is one order, not two
        _until("the worker's port never came", lambda: "a" in srv.ctl.spare_port)
        for _ in range(LOCK_WAITING_BEATS):  # no heartbeat with news gets in: each is shed, its lease renewed
            srv.ctl.beat_waiters.acquire()
            held += 1
        spec = f"name: idle\nlauncher: direct\nprocs: 1\nsteps: 10\ncommand: {json.dumps(['sh', '-c', PROGRAM])}\n"
        Client(addr, TOKEN, timeout=WAIT_S).submit(spec, "idle.yaml")
        _until("the worker's heartbeat was never shed", lambda: srv.ctl.shed_beats >= 1)
        for _ in range(held):
            srv.ctl.beat_waiters.release()
        held, freed = 0, time.monotonic()
        deadline = freed + INTERVAL_S / 3
        while not any(a.state == "running" for a in srv.ctl.store.allocations(worker_id="a")):
            assert time.monotonic() < deadline, (tmp_path / "a.log").read_text()[-3000:]
            time.sleep(0.05)
        print(f"launched {time.monotonic() - freed:.2f} s after the slots were freed (interval {INTERVAL_S:g} s)")
    finally:
        for _ in range(held):
            srv.ctl.beat_waiters.release()
        stop(w)
        srv.stop()
