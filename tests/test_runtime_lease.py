"""Lease renewals at the lease server (hpcsched/runtime/lease.py, lease_server.py) with a real controller process.

What they prove: renewals alone keep a worker alive (the controller never hears a heartbeat from it), a worker that
stops renewing is lost within ``worker_timeout_s`` plus the controller's check interval, a renewal needs the
renewing daemon's own credential, a kill -9 of the controller takes the lease server with it, and a real worker
whose lease server died keeps its lease by heartbeating the controller (and the controller says so).
Deadlines follow the configured interval and timeout, with margins for a loaded 2-core machine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from runtime_procs import TOKEN, client, controller_config, descendants, start_controller, start_worker, stop, wait_for

from hpcsched.runtime.auth import metadata
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.lease_wire import LeaseClient, LeaseError
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.server import ControllerServer

INTERVAL_S = 0.3  # heartbeat_interval_s
TIMEOUT_S = 3.0  # worker_timeout_s
SCHEDULE_S = 0.2  # schedule_interval_s: silent workers are looked for at each step, at most every 0.5 s
CHECK_S = min(0.5, TIMEOUT_S / 10) + SCHEDULE_S  # the controller's check interval, at worst
SLACK_S = 3.0  # a loaded machine: the step thread and the listing may each be late


def _register(address: str, name: str, instance: str) -> pb.RegisterReply:
    """Register through the real RPC until the reply names a lease server (it starts beside the controller)."""
    with grpc.insecure_channel(address) as ch:
        stub = pb_grpc.ControllerStub(ch)
        req = pb.RegisterRequest(worker_id=name, host="127.0.0.1", slots=1, cpus=1, launchers=["direct"],
                                 instance=instance)
        return wait_for("a registration naming the lease server",
                        lambda: (r := stub.Register(req, metadata=metadata(TOKEN), timeout=10)).lease_port and r, 30)


def _renew(lease: LeaseClient, name: str, instance: str, reply: pb.RegisterReply) -> pb.RenewReply:
    return lease.renew(pb.RenewRequest(worker_id=name, instance=instance, slot=reply.lease_slot,
                                       credential=reply.credential))


def _alive(c, name: str) -> bool:
    return any(w.worker_id == name and w.alive for w in c.workers())


def _stats(d: Path) -> dict:
    return json.loads((d / "run" / "rpc_stats.json").read_text())


def test_renewals_alone_keep_a_worker_alive_and_it_is_lost_once_they_stop(tmp_path: Path) -> None:
    ctl, address = start_controller(tmp_path, controller_config(
        tmp_path, heartbeat_interval_s=INTERVAL_S, worker_timeout_s=TIMEOUT_S, schedule_interval_s=SCHEDULE_S,
        rpc_stats_file="run/rpc_stats.json"))
    try:
        a = _register(address, "a", "ia")
        b = _register(address, "b", "ib")
        assert a.lease_slot != b.lease_slot
        lease = LeaseClient(address.rpartition(":")[0], a.lease_port)
        try:
            c = client(address)
            # Another daemon cannot renew a's lease: b's credential on a's slot, a's credential with another instance
            for forged in (pb.RegisterReply(lease_slot=a.lease_slot, credential=b.credential),
                           pb.RegisterReply(lease_slot=a.lease_slot, credential="x" * 43)):
                with pytest.raises(LeaseError) as e:
                    _renew(lease, "a", "ia", forged)
                assert e.value.code == "REFUSED"
            with pytest.raises(LeaseError) as e:
                _renew(lease, "a", "another-daemon", a)
            assert e.value.code == "REFUSED"

            # Not the protocol (a frame past MAX_FRAME, a message that does not parse): that connection is closed,
            # the lease server serves on
            for junk in (b"\xff\xff\xff\xff", b"\x00\x00\x00\x03\xff\xff\xff"):
                with socket.create_connection((address.rpartition(":")[0], a.lease_port), timeout=10) as raw:
                    raw.sendall(junk)
                    assert raw.recv(16) == b""

            # a renews for three timeouts and is never heard at the controller; b says nothing and is lost
            t0 = time.monotonic()
            renewals = 0
            while time.monotonic() - t0 < 3 * TIMEOUT_S:
                sent = time.monotonic()
                r = _renew(lease, "a", "ia", a)
                last = sent  # a's last renewal: the lease server wrote it after this
                assert r.heartbeat_interval_s == pytest.approx(INTERVAL_S)
                renewals += 1
                time.sleep(INTERVAL_S)
            assert _alive(c, "a"), "a worker renewing at the lease server was declared lost"
            assert not _alive(c, "b"), "a silent worker outlived three timeouts"

            # a has stopped renewing: lost within the timeout and the check interval, not before the timeout
            wait_for("a declared lost", lambda: not _alive(c, "a"), TIMEOUT_S + CHECK_S + SLACK_S, poll=0.1)
            lost_after = time.monotonic() - last
            assert lost_after >= TIMEOUT_S, f"lost {lost_after:.1f} s after its last renewal"
            # Lost: its slot holds nothing any more; the controller tells it to register again
            with pytest.raises(LeaseError) as e:
                _renew(lease, "a", "ia", a)
            assert e.value.code == "REFUSED"
            c.close()
        finally:
            lease.close()
        print(f"{renewals} renewals over {3 * TIMEOUT_S:g} s kept a alive; lost {lost_after:.2f} s after the last "
              f"(worker_timeout_s {TIMEOUT_S:g})")
    finally:
        stop(ctl)
    s = _stats(tmp_path)
    assert "Heartbeat" not in s, "the renewals reached the controller's server"
    assert s["controller"]["lease_renewals"] == renewals
    assert s["controller"]["lease_refused"] == 4  # three forged, one after it was lost


def test_kill_9_of_the_controller_takes_the_lease_server_with_it(tmp_path: Path) -> None:
    ctl, address = start_controller(tmp_path, controller_config(tmp_path))
    try:
        a = _register(address, "a", "ia")  # the lease server listens: it is up
        children = descendants(ctl.pid)
        assert len(children) == 1, children
        lease_pid = children[0]
        os.kill(ctl.pid, signal.SIGKILL)
        ctl.wait(timeout=10)

        def gone() -> bool:
            try:
                return Path(f"/proc/{lease_pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
            except OSError:
                return True
        wait_for("the lease server gone with its controller", gone, 10, poll=0.05)
        with pytest.raises(LeaseError) as e:
            _renew(LeaseClient(address.rpartition(":")[0], a.lease_port), "a", "ia", a)
        assert e.value.code == "UNAVAILABLE"
    finally:
        stop(ctl)


def test_a_worker_whose_lease_server_died_keeps_its_lease_at_the_controller(tmp_path: Path) -> None:
    ctl, address = start_controller(tmp_path, controller_config(
        tmp_path, heartbeat_interval_s=INTERVAL_S, worker_timeout_s=TIMEOUT_S, schedule_interval_s=SCHEDULE_S,
        rpc_stats_file="run/rpc_stats.json"))
    procs = [ctl]
    try:
        lease_pid = wait_for("the lease server", lambda: descendants(ctl.pid), 30)[0]
        wait_for("the lease server listening", lambda: _register(address, "probe", "p"), 30)
        procs.append(start_worker(tmp_path, address, "a"))
        c = client(address)
        wait_for("worker a", lambda: _alive(c, "a"), 60)
        time.sleep(2 * TIMEOUT_S)  # idle: renewals at the lease server
        assert _alive(c, "a")
        os.kill(lease_pid, signal.SIGKILL)
        time.sleep(3 * TIMEOUT_S)  # its renewals fail: it beats the controller
        assert _alive(c, "a"), "a worker whose lease server died was lost"
        c.close()
    finally:
        for p in reversed(procs):
            stop(p)
    s = _stats(tmp_path)["controller"]
    assert s["lease_renewals"] >= TIMEOUT_S / INTERVAL_S, s  # it renewed there while it lived
    assert s["lease_server_exits"] == 1, s  # and its exit was said
    log = (tmp_path / "a.log").read_text()
    assert "lease renewal failed (UNAVAILABLE" in log, log[-2000:]
    assert "the lease server (pid" in (tmp_path / "controller.log").read_text()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test certificate")
def test_with_tls_renewals_are_tls_too(tmp_path: Path) -> None:
    """A controller with tls_cert/tls_key: its lease server speaks TLS with the same certificate; a worker trusting
    it renews, a plaintext one is refused (it would then heartbeat the controller, which also needs TLS)."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(tmp_path / "c.pem")], check=True, capture_output=True)
    (tmp_path / "c.yaml").write_text(f"listen: 127.0.0.1:0\nstate: s.db\ntoken: {TOKEN}\ntls_cert: c.pem\n"
                                     "tls_key: k.pem\n")
    (tmp_path / "c.yaml").chmod(0o600)  # it holds a token inline
    srv = ControllerServer(read_controller_config(tmp_path / "c.yaml"))
    addr = srv.start()
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=(tmp_path / "c.pem").read_bytes())
        with grpc.secure_channel(addr, creds) as ch:
            stub = pb_grpc.ControllerStub(ch)
            req = pb.RegisterRequest(worker_id="a", host="127.0.0.1", slots=1, cpus=1, instance="ia")
            a = wait_for("a registration naming the lease server",
                         lambda: (r := stub.Register(req, metadata=metadata(TOKEN), timeout=10)).lease_port and r, 30)
        host = addr.rpartition(":")[0]
        tls = LeaseClient(host, a.lease_port, tmp_path / "c.pem")
        try:
            assert not _renew(tls, "a", "ia", a).refused
        finally:
            tls.close()
        with pytest.raises(LeaseError) as e:
            _renew(LeaseClient(host, a.lease_port, timeout_s=3), "a", "ia", a)
        assert e.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
        assert srv.leases is not None and srv.leases.counters()["lease_renewals"] == 1
    finally:
        srv.stop()
