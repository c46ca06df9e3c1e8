"""Orders pushed over the lease connection (hpcsched/runtime/lease_server.py, lease_link.py) with a real controller.

What they prove: a real worker daemon subscribed on its lease connection gets a launch and a stop within a round trip
although its heartbeats are ``INTERVAL_S`` (30 s) apart, with no ``Orders.Watch`` stream open; a subscription with a
forged credential or another worker's slot is refused and pushed nothing, and a renewal without ``push`` (an older
worker) gets its answers and never an unsolicited frame; with the lease server killed the worker still gets its
orders with its heartbeats (the lost wake-ups counted), and after a controller restart it registers and subscribes
again. Deadlines follow the configured intervals, with margins for a loaded 2-core machine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest
from runtime_procs import TOKEN, client, controller_config, descendants, start_controller, start_worker, stop, wait_for

from hpcsched.runtime.auth import metadata
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.lease_link import LeaseLink
from hpcsched.runtime.lease_wire import frame, frame_length
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.server import ControllerServer

INTERVAL_S = 30.0
TIMEOUT_S = 120.0  # worker_timeout_s: at least three intervals (liveness caps the interval at a third of it)
# Reports its start (``first``: the worker delivers that at once, as a training program's) and step 1, then idles.
PROGRAM = ('F="$HPCSCHED_PROGRESS_FILE"; echo "{\\"step\\": 0, \\"first\\": true}" >> "$F"; '
           'echo "{\\"step\\": 1, \\"loss\\": 2.0}" >> "$F"; while true; do sleep 0.1; done')


def _spec(name: str) -> str:
    return f"name: {name}\nlauncher: direct\nprocs: 1\nsteps: 10\ncommand: {json.dumps(['sh', '-c', PROGRAM])}\n"


def _counters(d: Path) -> dict:
    return json.loads((d / "run" / "rpc_stats.json").read_text())["controller"]


def _reported(c, jid: str) -> bool:
    return any(j.job_id == jid and j.steps_done == 1 for j in c.jobs())


def _state(c, jid: str) -> str:
    return next((j.state for j in c.jobs() if j.job_id == jid), "")


def _subscribed(d: Path, name: str, times: int = 1) -> bool:
    log = d / f"{name}.log"
    return log.exists() and log.read_text().count("subscribed: orders are pushed on it") >= times


def test_orders_reach_a_worker_through_its_lease_connection_before_its_next_heartbeat(tmp_path: Path) -> None:
    ctl, address = start_controller(tmp_path, controller_config(
        tmp_path, heartbeat_interval_s=INTERVAL_S, worker_timeout_s=TIMEOUT_S, rpc_stats_file="run/rpc_stats.json"))
    procs = [ctl]
    try:
        wfile = tmp_path / "worker.yaml"
        wfile.write_text("warm_ranks: false\n")  # shell jobs: no torch-preloaded supervisor (seconds of imports)
        procs.append(start_worker(tmp_path, address, "a", slots=2, extra=("--config", str(wfile))))
        c = client(address)
        wait_for("worker a subscribed on its lease connection", lambda: _subscribed(tmp_path, "a"), 60)
        # The first launch may ride the worker's first (jittered) beat; once its first report is delivered the worker's
        # next regular beat is an interval away, so the launch and the stop after it can only come by push.
        first = c.submit(_spec("first"), "first.yaml")
        wait_for("the first job's report", lambda: _reported(c, first), INTERVAL_S)
        t0 = time.monotonic()
        jid = c.submit(_spec("pushed"), "pushed.yaml")
        wait_for("the second job's report", lambda: _reported(c, jid), INTERVAL_S / 3)
        launched_s = time.monotonic() - t0
        t1 = time.monotonic()
        assert c.cancel(jid).cancelled
        wait_for("the job cancelled", lambda: _state(c, jid) == "cancelled", INTERVAL_S / 3)
        stopped_s = time.monotonic() - t1
        c.close()
        print(f"submit to first report {launched_s:.2f} s, cancel to cancelled {stopped_s:.2f} s "
              f"(heartbeat interval {INTERVAL_S:g} s)")
    finally:
        for p in reversed(procs):
            stop(p)
    counters = _counters(tmp_path)
    assert counters["lease_pushes"] >= 2, counters  # the launch, the stop (and the port it asked for)
    assert counters["lease_subscriptions"] >= 1, counters
    assert counters["watch_streams_opened"] == 0 and counters["watch_events_sent"] == 0, counters  # no Watch stream
    assert counters["lease_wakeups_dropped"] == 0, counters


def _register(stub: pb_grpc.ControllerStub, name: str, launchers: tuple[str, ...] = ("direct",)) -> pb.RegisterReply:
    req = pb.RegisterRequest(worker_id=name, host="127.0.0.1", slots=1, cpus=1, launchers=launchers,
                             instance=f"i-{name}")
    return wait_for("a registration naming the lease server",
                    lambda: (r := stub.Register(req, metadata=metadata(TOKEN), timeout=10)).lease_port and r, 30)


class _Raw:
    """A raw lease connection: frames written and read by hand, as an older or a forged client would."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)

    def renew(self, name: str, reg: pb.RegisterReply, push: bool, slot: int | None = None,
              credential: str | None = None) -> pb.RenewReply:
        self.sock.sendall(frame(pb.RenewRequest(
            worker_id=name, instance=f"i-{name}", slot=reg.lease_slot if slot is None else slot,
            credential=reg.credential if credential is None else credential, push=push)))
        return self.read()

    def read(self, timeout: float = 10.0) -> pb.RenewReply:
        self.sock.settimeout(timeout)
        head = self._exactly(4)
        return pb.RenewReply.FromString(self._exactly(frame_length(head)))

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "the lease server closed the connection"
            buf += chunk
        return buf

    def nothing_pending(self) -> bool:
        self.sock.setblocking(False)
        try:
            return self.sock.recv(1) == b""  # closed: nothing was sent either
        except BlockingIOError:
            return True
        finally:
            self.sock.setblocking(True)


def test_only_a_checked_subscription_is_pushed_to_and_a_renewal_without_push_never_is(tmp_path: Path) -> None:
    ctl, address = start_controller(tmp_path, controller_config(
        tmp_path, heartbeat_interval_s=INTERVAL_S, worker_timeout_s=TIMEOUT_S, rpc_stats_file="run/rpc_stats.json"))
    host = address.rpartition(":")[0]
    conns: list[_Raw] = []
    try:
        with grpc.insecure_channel(address) as ch:
            stub = pb_grpc.ControllerStub(ch)
            a, b = _register(stub, "a"), _register(stub, "b", launchers=())  # b cannot run the job: a gets it
        conns = [_Raw(host, a.lease_port) for _ in range(5)]
        good, old, forged_b, forged_x, forged_id = conns
        # b's credential on a's slot, a made-up credential, and b's own registration presented for a's slot
        assert good.renew("a", a, push=True).refused == ""
        assert old.renew("a", a, push=False).refused == ""
        assert forged_b.renew("a", a, push=True, credential=b.credential).refused
        assert forged_x.renew("a", a, push=True, credential="x" * 43).refused
        assert forged_id.renew("b", b, push=True, slot=a.lease_slot).refused
        # Orders for a: a job placed on it
        c = client(address)
        c.submit(_spec("job"), "job.yaml")
        c.close()
        pushed = good.read(INTERVAL_S / 3)
        assert pushed.pushed and pushed.heartbeat_now, pushed
        time.sleep(0.5)  # anything else written in the same wake-up has arrived by now
        for conn in (old, forged_b, forged_x, forged_id):
            assert conn.nothing_pending(), "a connection that did not subscribe was pushed to"
        r = old.renew("a", a, push=False)  # the older worker still hears of its orders in its renewal's answer
        assert not r.pushed and r.heartbeat_now, r
    finally:
        for conn in conns:
            conn.sock.close()
        stop(ctl)
    counters = _counters(tmp_path)
    assert counters["lease_refused"] == 3, counters
    assert counters["lease_subscriptions"] == 1, counters
    assert counters["lease_pushes"] >= 1 and counters["lease_push_unsubscribed"] == 0, counters


def test_with_its_lease_server_killed_a_worker_gets_orders_by_heartbeat_and_resubscribes_after_a_restart(
        tmp_path: Path) -> None:
    interval_s, timeout_s = 1.0, 10.0
    cfg = controller_config(tmp_path, heartbeat_interval_s=interval_s, worker_timeout_s=timeout_s,
                            rpc_stats_file="run/rpc_stats.json")
    ctl, address = start_controller(tmp_path, cfg)
    procs = [ctl]
    try:
        wfile = tmp_path / "worker.yaml"
        wfile.write_text("warm_ranks: false\n")  # shell jobs: no torch-preloaded supervisor (seconds of imports)
        procs.append(start_worker(tmp_path, None, "a", extra=("--config", str(wfile), "--address-file",
                                                              str(tmp_path / "run" / "controller.addr"))))
        wait_for("worker a subscribed", lambda: _subscribed(tmp_path, "a"), 60)
        os.kill(descendants(ctl.pid)[0], signal.SIGKILL)
        c = client(address)
        jid = c.submit(_spec("by-heartbeat"), "hb.yaml")
        # not pushed: the next heartbeat (at most an interval away, and its renewal's failure) carries it
        wait_for("the job's report", lambda: _reported(c, jid), 2 * interval_s + 15)
        assert c.cancel(jid).cancelled
        wait_for("the job cancelled", lambda: _state(c, jid) == "cancelled", 2 * interval_s + 15)
        c.close()
        stop(ctl)
        first = _counters(tmp_path)
        assert first["lease_server_exits"] == 1 and first["lease_wakeups_dropped"] >= 1, first
        assert "lease renewal failed (UNAVAILABLE" in (tmp_path / "a.log").read_text()

        ctl, address = start_controller(tmp_path, cfg)  # the same state: the worker follows the address file
        procs[0] = ctl
        wait_for("worker a subscribed again", lambda: _subscribed(tmp_path, "a", 2), timeout_s + 30)
        c = client(address)
        jid = c.submit(_spec("pushed-again"), "again.yaml")
        wait_for("the job's report", lambda: _reported(c, jid), 2 * interval_s + 15)
        c.close()
    finally:
        for p in reversed(procs):
            stop(p)
    second = _counters(tmp_path)
    assert second["lease_subscriptions"] >= 1 and second["lease_pushes"] >= 1, second


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test certificate")
def test_the_worker_link_subscribes_renews_and_is_pushed_to_over_tls(tmp_path: Path) -> None:
    """The worker's ``LeaseLink`` against a TLS controller's lease server: one thread reads and writes the TLS
    connection; renewals are answered on it and a push (orders for that worker) wakes ``on_push``."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(tmp_path / "c.pem")], check=True, capture_output=True)
    (tmp_path / "c.yaml").write_text(f"listen: 127.0.0.1:0\nstate: s.db\ntoken: {TOKEN}\ntls_cert: c.pem\n"
                                     "tls_key: k.pem\n")
    (tmp_path / "c.yaml").chmod(0o600)  # it holds a token inline
    srv = ControllerServer(read_controller_config(tmp_path / "c.yaml"))
    addr = srv.start()
    pushed = threading.Event()
    link = LeaseLink(pushed.set, tmp_path / "c.pem", timeout_s=10)
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=(tmp_path / "c.pem").read_bytes())
        with grpc.secure_channel(addr, creds) as ch:
            a = _register(pb_grpc.ControllerStub(ch), "a")
        req = pb.RenewRequest(worker_id="a", instance="i-a", slot=a.lease_slot, credential=a.credential)
        link.update(addr.rpartition(":")[0], a.lease_port, req)
        wait_for("the link subscribed", lambda: link.connected, 30, poll=0.05)
        for _ in range(3):
            assert not link.renew(req).heartbeat_now
        assert not pushed.is_set()
        assert srv.leases is not None
        srv.leases.want(["a"], push=True)  # what the controller does when it has orders for a
        assert pushed.wait(10), "no push reached the link"
        assert link.renew(req).heartbeat_now  # and the renewal says so too, until a heartbeat takes the orders
        assert link.pushes == 1 and link.subscriptions == 1
        counters = srv.leases.counters()
        assert counters["lease_pushes"] == 1 and counters["lease_subscribed"] == 1, counters
    finally:
        link.stop()
        srv.stop()


def test_the_worker_link_against_a_lease_server_from_before_pushes_renews_and_says_to_watch(tmp_path: Path) -> None:
    """A lease server from before pushes ignores ``push`` (proto3) and answers without ``subscribed``: the link keeps
    the connection for renewals and calls ``on_no_push`` once (the worker then opens its Watch stream)."""
    srv = socket.create_server(("127.0.0.1", 0))
    answered: list[pb.RenewRequest] = []

    def old_lease_server() -> None:  # today's frames, a reply without the fields it does not know
        conn, _ = srv.accept()
        with conn:
            while True:
                head = conn.recv(4)
                if len(head) < 4:
                    return
                n = frame_length(head)
                body = b""
                while len(body) < n:
                    body += conn.recv(n - len(body))
                answered.append(pb.RenewRequest.FromString(body))
                conn.sendall(frame(pb.RenewReply(heartbeat_interval_s=2.0)))

    threading.Thread(target=old_lease_server, daemon=True).start()
    told = threading.Event()
    link = LeaseLink(lambda: None, timeout_s=10, on_no_push=told.set)
    try:
        req = pb.RenewRequest(worker_id="a", instance="i-a", slot=0, credential="c")
        link.update("127.0.0.1", srv.getsockname()[1], req)
        assert told.wait(30), "on_no_push was not called"
        wait_for("the link up", lambda: link.connected, 10, poll=0.05)
        assert link.renew(req).heartbeat_interval_s == 2.0
        assert link.subscriptions == 0 and len(answered) == 2
    finally:
        link.stop()
        srv.close()
