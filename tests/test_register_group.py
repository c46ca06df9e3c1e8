"""Registrations committed in groups (``register_queue``): a burst of Registers over real gRPC is stored in far
fewer transactions than Registers, a name is still held by one daemon when two of its daemons are in one group,
and a ``kill -9`` of the controller in the middle of a storm loses no registration it acknowledged."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from pathlib import Path

import grpc
import pytest
from runtime_procs import TOKEN, controller_config, kill_tree, start_controller

from hpcsched.runtime.auth import metadata, open_channel
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.liveness import told_retry_after
from hpcsched.runtime.register_queue import REGISTER_WAITING, GroupCommit
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.server import ControllerServer

WAIT_S = 60.0  # for calls to reach their handlers at load 8; polled, never slept whole


def _until(what: str, cond) -> None:  # noqa: ANN001 (a predicate)
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _req(name: str, instance: str | None = None) -> pb.RegisterRequest:
    return pb.RegisterRequest(worker_id=name, host="127.0.0.1", slots=2, instance=instance or f"i-{name}")


class _Commits:
    """Counts the store's committed transactions that wrote a worker row (SQLite's own statement trace)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.registering = 0  # committed transactions with a worker row in them
        self.rows = 0  # worker rows written in all
        self._open = 0  # worker rows written in the open transaction
        db.set_trace_callback(self._saw)

    def _saw(self, sql: str) -> None:
        if sql.startswith("INSERT OR REPLACE INTO workers"):
            self._open += 1
        elif sql == "COMMIT":
            if self._open:
                self.registering += 1
                self.rows += self._open
            self._open = 0
        elif sql == "ROLLBACK":
            self._open = 0


@pytest.fixture
def controller(tmp_path: Path):
    srv = ControllerServer(read_controller_config(controller_config(tmp_path, worker_timeout_s=600)))
    addr = srv.start()
    channel = open_channel(addr)
    try:
        yield srv, pb_grpc.ControllerStub(channel)
    finally:
        channel.close()
        srv.stop()


def test_a_burst_of_registers_is_committed_in_far_fewer_transactions(controller) -> None:
    """Ten bursts of REGISTER_WAITING Registers, each queued while the lock is held (as by a scheduling step): each
    burst is stored in at most two transactions (the first Register leads alone, the rest follow in one group), and
    every worker is registered with its event."""
    srv, stub = controller
    commits = _Commits(srv.ctl.store.db)
    md = metadata(TOKEN)
    rounds, n = 10, REGISTER_WAITING
    for r in range(rounds):
        with srv.ctl.lock:
            calls = [stub.Register.future(_req(f"w{r}-{i}"), metadata=md, timeout=WAIT_S) for i in range(n)]
            _until("the registrations never queued", lambda: srv.ctl.registrations.waiting() == n)
            assert commits.rows == r * n  # nothing is written (nor answered) while the lock is held
        for c in calls:
            assert c.result(timeout=WAIT_S).heartbeat_interval_s > 0
    total = rounds * n
    assert commits.rows == total and len(srv.ctl.store.events(kind="register")) == total
    assert commits.registering <= 2 * rounds < total / 10, commits.registering
    assert srv.ctl.counters()["register_groups"] == commits.registering
    alive = {w.id for w in srv.ctl.store.workers() if w.alive}
    assert alive == {f"w{r}-{i}" for r in range(rounds) for i in range(n)}


def test_two_daemons_of_one_name_in_one_group_one_holds_it(controller) -> None:
    """Two daemons of one name committed in the same group: the first holds the name, the second is refused
    FAILED_PRECONDITION, as if they had come one after the other; the other Registers of the group go through."""
    srv, stub = controller
    md = metadata(TOKEN)
    with srv.ctl.lock:
        lead = stub.Register.future(_req("lead"), metadata=md, timeout=WAIT_S)  # leads alone, waits for the lock
        _until("the first registration never queued", lambda: srv.ctl.registrations.waiting() == 1)
        twins = [stub.Register.future(_req("twin", f"daemon-{k}"), metadata=md, timeout=WAIT_S) for k in "ab"]
        others = [stub.Register.future(_req(f"o{i}"), metadata=md, timeout=WAIT_S) for i in range(4)]
        _until("the group never queued", lambda: srv.ctl.registrations.waiting() == 7)
    lead.result(timeout=WAIT_S)
    for c in others:
        c.result(timeout=WAIT_S)
    won, refused = [], []
    for k, c in zip("ab", twins, strict=True):
        try:
            c.result(timeout=WAIT_S)
            won.append(f"daemon-{k}")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "held by another live daemon" in e.details()
            refused.append(k)
    assert len(won) == 1 and len(refused) == 1
    assert srv.ctl.instance["twin"] == won[0]
    assert srv.ctl.registrations.largest >= 6  # the twins were in one group (the lead was alone in its own)
    assert len(srv.ctl.store.events(kind="register")) == 1 + 1 + 4


def test_registrations_acknowledged_before_a_kill_minus_9_are_all_in_the_state(tmp_path: Path) -> None:
    """Eight clients register 600 workers as fast as they are answered (a shed one comes back when told, as a worker
    does); the controller is killed with SIGKILL in the middle. Every registration it answered is in the state
    file, with its event: a Register is answered only after its group's transaction committed."""
    proc, addr = start_controller(tmp_path, controller_config(tmp_path, worker_timeout_s=600))
    acked: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    names = [f"w{i:03d}" for i in range(600)]

    def client(part: list[str]) -> None:
        channel = open_channel(addr)
        stub = pb_grpc.ControllerStub(channel)
        try:
            for name in part:
                while not stop.is_set():
                    try:
                        stub.Register(_req(name), metadata=metadata(TOKEN), timeout=WAIT_S)
                    except grpc.RpcError as e:
                        if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                            return  # the controller is gone
                        time.sleep(told_retry_after(e.trailing_metadata()) or 0.05)
                        continue
                    with lock:
                        acked.append(name)
                    break
        finally:
            channel.close()

    threads = [threading.Thread(target=client, args=(names[k::8],)) for k in range(8)]
    for t in threads:
        t.start()
    try:
        _until("no registration was answered", lambda: len(acked) >= 150)
        proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT_S)
    finally:
        stop.set()
        for t in threads:
            t.join(WAIT_S)
        kill_tree(proc)
    with lock:
        answered = set(acked)
    assert 150 <= len(answered) < len(names)  # killed in the middle of the storm
    db = sqlite3.connect(tmp_path / "run" / "state.db")
    try:
        stored = {r[0] for r in db.execute("SELECT id FROM workers")}
        events = {r[0] for r in db.execute("SELECT json_extract(detail, '$.worker') FROM events "
                                           "WHERE kind = 'register'")}
    finally:
        db.close()
    assert answered <= stored and answered <= events, sorted(answered - stored)[:5]


def test_group_commit_gives_each_its_own_outcome_and_bounds_the_waiters() -> None:
    """Without gRPC: outcomes reach their own callers (a refusal only its own, an exception of the commit every one
    of that group), and past ``bound`` waiting a request is refused at once (None)."""
    gate = threading.Event()
    groups: list[list[int]] = []

    def commit(reqs):  # noqa: ANN001, ANN202
        gate.wait(WAIT_S)
        groups.append(list(reqs))
        if 99 in reqs:
            raise OSError("disk full")
        return [ValueError(f"odd {r}") if r % 2 else r * 10 for r in reqs]

    q: GroupCommit[int, int] = GroupCommit(commit, bound=5, max_batch=3)
    got: dict[int, object] = {}

    def call(r: int) -> None:
        try:
            got[r] = q.submit(r)
        except Exception as e:  # noqa: BLE001 (recorded to be checked)
            got[r] = e

    threads = [threading.Thread(target=call, args=(r,)) for r in (0, 1, 2, 3, 4)]
    for k, t in enumerate(threads):  # one at a time: 0 leads (its group waits at the gate), 1-4 queue behind it
        t.start()
        _until("not queued", lambda k=k: q.waiting() == k + 1)
    assert q.submit(7) is None and q.refused == 1  # five wait: refused at once
    gate.set()
    for t in threads:
        t.join(WAIT_S)
    assert got[0] == 0 and got[2] == 20 and got[4] == 40
    assert isinstance(got[1], ValueError) and isinstance(got[3], ValueError)
    assert groups == [[0], [1, 2, 3], [4]] and q.groups == 3 and q.largest == 3 and q.waiting() == 0
    with pytest.raises(OSError):
        q.submit(99)
    assert q.submit(6) == 60  # the queue goes on after a failed group


def test_a_register_from_a_thread_holding_the_lock_does_not_wait_for_the_queue(tmp_path: Path) -> None:
    """In-process callers may register while holding the controller's lock: queued behind a leader that waits for
    that lock, the call would never return; it is committed at once instead, and the queued one after the lock."""
    from hpcsched.runtime.config import ControllerConfig
    from hpcsched.runtime.controller import Controller

    ctl = Controller(ControllerConfig(state=tmp_path / "s.db", checkpoint_root=tmp_path / "ck", worker_timeout_s=600))
    ctl.started()
    got: list[str] = []
    holding = threading.Event()

    def queued() -> None:
        holding.wait(WAIT_S)
        got.append(ctl.register(_req("queued")) and "queued")

    def inline() -> None:  # holds the lock while the other registration queues, then registers itself
        with ctl.lock:
            holding.set()
            _until("the other registration never queued", lambda: ctl.registrations.waiting() == 1)
            got.append(ctl.register(_req("inline")) and "inline")

    threads = [threading.Thread(target=f, daemon=True) for f in (queued, inline)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads), "a registration under the lock waited for the queue: deadlock"
    assert got == ["inline", "queued"] and {w.id for w in ctl.store.workers()} == {"inline", "queued"}
    ctl.store.close()
