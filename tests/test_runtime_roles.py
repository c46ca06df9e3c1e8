"""Roles and credentials (issue 15, item 5, and item 8's unthrottled auth log).

Seen: one token for everyone, so any user could send a worker's heartbeat (a running job became ``completed
1000/1000``), make any worker leave, or register a worker with 2^31-1, -5 or 0 slots or a 100 KB id; the token
reached every job's environment; each unauthenticated call logged 233 bytes with no limit. Now users, workers
and admins hold different tokens, a role's RPCs are the only ones it may call, registrations are bounded, and no
task inherits a credential. Real gRPC on port 0; a real worker process for the environment check.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from runtime_procs import client, controller_config, start_controller, start_worker, stop, wait_for, write_secret

from hpcsched.errors import InputError
from hpcsched.runtime.auth import metadata, open_channel
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.credentials import credential_metadata
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.server import ControllerServer

USER, WORKER, ADMIN = "user-tok-1b", "worker-tok-2c", "admin-tok-3d"


def _roles_config(d: Path, **extra: object) -> Path:
    config = controller_config(d, worker_token_file="worker.token", admin_token_file="admin.token", **extra)
    write_secret(d / "token", USER)
    write_secret(d / "worker.token", WORKER)
    write_secret(d / "admin.token", ADMIN)
    return config


def _code(call, *args: object) -> grpc.StatusCode:
    try:
        call(*args)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


@pytest.fixture
def server(tmp_path: Path):
    srv = ControllerServer(read_controller_config(_roles_config(tmp_path)))
    addr = srv.start()
    ch = open_channel(addr)
    try:
        yield pb_grpc.ControllerStub(ch), tmp_path
    finally:
        ch.close()
        srv.stop()


def _job(d: Path) -> pb.SubmitRequest:
    return pb.SubmitRequest(spec_yaml=f"name: j\nlauncher: direct\nworkdir: {d}\ncommand: [sh, -c, 'exit 0']\n",
                            source="j.yaml")


def test_each_role_calls_only_its_rpcs(server) -> None:
    stub, d = server
    cred = [""]  # the credential of w0's latest registration: Heartbeat and Leave carry it (credentials.py)

    def register(md):
        cred[0] = stub.Register(pb.RegisterRequest(worker_id="w0", host="127.0.0.1", slots=1, instance="i0"),
                                metadata=md, timeout=10).credential

    calls = {
        "Submit": lambda md: stub.Submit(_job(d), metadata=md, timeout=10),
        "ListJobs": lambda md: stub.ListJobs(pb.ListJobsRequest(), metadata=md, timeout=10),
        "Cancel": lambda md: stub.Cancel(pb.CancelRequest(job_id="j9999"), metadata=md, timeout=10),
        "ListWorkers": lambda md: stub.ListWorkers(pb.ListWorkersRequest(), metadata=md, timeout=10),
        "Register": register,
        "Heartbeat": lambda md: stub.Heartbeat(pb.HeartbeatRequest(worker_id="w0", instance="i0"),
                                               metadata=md + credential_metadata(cred[0]), timeout=10),
        "Leave": lambda md: stub.Leave(pb.LeaveRequest(worker_id="w0", instance="i0"),
                                       metadata=md + credential_metadata(cred[0]), timeout=10),
    }
    user_rpcs = {"Submit", "ListJobs", "Cancel", "ListWorkers"}
    ok, denied = grpc.StatusCode.OK, grpc.StatusCode.PERMISSION_DENIED
    for name, call in calls.items():
        assert _code(call, metadata(USER)) == (ok if name in user_rpcs else denied), f"user {name}"
        assert _code(call, metadata(WORKER)) == (denied if name in user_rpcs else ok), f"worker {name}"
        assert _code(call, metadata(ADMIN)) == ok, f"admin {name}"
        assert _code(call, metadata("nope")) == grpc.StatusCode.UNAUTHENTICATED, f"wrong token {name}"
        assert _code(call, ()) == grpc.StatusCode.UNAUTHENTICATED, f"no token {name}"
    try:
        stub.Heartbeat(pb.HeartbeatRequest(worker_id="w0"), metadata=metadata(USER), timeout=10)
    except grpc.RpcError as e:
        assert "role (user) may not call Heartbeat" in e.details() and "workers hold" in e.details()


@pytest.mark.parametrize(("fields", "why"), [
    ({"slots": 0}, "slots: must be 1 to 4096, got 0"),
    ({"slots": -5}, "slots: must be 1 to 4096, got -5"),
    ({"slots": 2**31 - 1}, "slots: must be 1 to 4096"),
    ({"worker_id": "w" * 100_000}, "worker id: 1 to 128 characters"),
    ({"worker_id": "w0\n2026-01-01 forged log line"}, "worker id"),
    ({"worker_id": ""}, "worker id"),
    ({"host": ""}, "host"),
    ({"gpus": -1}, "gpus and cpus must be >= 0"),
], ids=["0-slots", "negative-slots", "int32-max-slots", "100kb-id", "newline-id", "empty-id", "no-host",
        "negative-gpus"])
def test_registration_is_bounded(server, fields: dict, why: str) -> None:
    stub, _ = server
    req = pb.RegisterRequest(**({"worker_id": "w0", "host": "127.0.0.1", "slots": 1} | fields))
    with pytest.raises(grpc.RpcError) as e:
        stub.Register(req, metadata=metadata(WORKER), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and why in e.value.details()
    assert len(e.value.details()) < 400  # the 100 KB id is not echoed back
    assert stub.ListWorkers(pb.ListWorkersRequest(), metadata=metadata(ADMIN), timeout=10).workers == []


def test_a_leave_for_a_name_that_is_no_worker_id_is_refused(server) -> None:
    """Leave names a worker in the log: a name with a line break would forge a line. Refused before the handler
    runs (no worker holds a credential for that name), or by the handler's id check."""
    stub, _ = server
    with pytest.raises(grpc.RpcError) as e:
        stub.Leave(pb.LeaveRequest(worker_id="w0\n2026-01-01 00:00:00 forged"), metadata=metadata(WORKER), timeout=10)
    assert e.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED)


def test_refused_calls_are_logged_at_a_bounded_rate(server, caplog: pytest.LogCaptureFixture) -> None:
    stub, _ = server
    with caplog.at_level(logging.WARNING, logger="hpcsched.runtime.auth"):
        for _ in range(50):
            _code(lambda: stub.ListJobs(pb.ListJobsRequest(), metadata=metadata("nope"), timeout=10))
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert 1 <= len(refused) <= 2, [r.getMessage() for r in refused]


def test_roles_need_different_tokens(tmp_path: Path) -> None:
    config = _roles_config(tmp_path)
    write_secret(tmp_path / "worker.token", USER)
    with pytest.raises(InputError, match="token and worker_token are the same credential"):
        read_controller_config(config)


def test_one_token_for_every_role_is_said_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    srv = ControllerServer(read_controller_config(controller_config(tmp_path)))
    with caplog.at_level(logging.WARNING, logger="hpcsched.runtime.server"):
        srv.start()
        srv.stop()
    assert any("one token for every role" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_no_credential_reaches_a_job_s_environment(tmp_path: Path) -> None:
    d = tmp_path
    ctl, address = start_controller(d, _roles_config(d))
    worker = start_worker(d, address, "w0", token=WORKER)
    try:
        c = client(address)
        c.md = metadata(USER)
        wait_for("the worker", lambda: any(w.alive for w in c.workers()), 90)
        text = (f"name: env\nlauncher: direct\nworkdir: {d}\n"
                f"command: {json.dumps(['sh', '-c', 'env > env.txt; cat /proc/$PPID/environ > parent-env.txt'])}\n")
        jid = c.submit(text, "env.yaml")
        job = wait_for("the job", lambda: next((j for j in c.jobs() if j.job_id == jid and j.state in
                                                ("completed", "failed")), None), 90)
        assert job.state == "completed", job.message
        c.close()
    finally:
        stop(worker)
        stop(ctl)
    env = (d / "env.txt").read_text()
    supervisor = (d / "parent-env.txt").read_text(errors="replace")  # the rank's parent: ranks.py
    assert "HPCSCHED_JOB_ID=j0001" in env and "HPCSCHED_JOB_ID=j0001" in supervisor  # the task's environment
    for secret in (USER, WORKER, ADMIN):
        assert secret not in env and secret not in supervisor
    assert "HPCSCHED_TOKEN" not in env and "HPCSCHED_TOKEN" not in supervisor


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test certificate")
def test_a_worker_without_the_ca_is_told_the_controller_may_talk_tls(tmp_path: Path) -> None:
    """A worker without --tls-ca against a TLS controller retried forever with no hint."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(tmp_path / "c.pem")], check=True, capture_output=True)
    srv = ControllerServer(read_controller_config(controller_config(tmp_path, tls_cert="c.pem", tls_key="k.pem")))
    addr = srv.start()
    worker = start_worker(tmp_path, addr, "w0")
    try:
        log = tmp_path / "w0.log"
        wait_for("the hint", lambda: "if it talks TLS, start the worker with --tls-ca" in log.read_text(), 90)
        time.sleep(2.0)
        assert log.read_text().count("if it talks TLS") == 1, "said once"
    finally:
        stop(worker)
        srv.stop()


def test_users_list_and_cancel_only_their_own_jobs_where_the_site_wants_it(tmp_path: Path) -> None:
    """``user_tokens`` name each user; with ``own_jobs_only`` a user sees and cancels only the jobs they submitted,
    an admin all of them. Real gRPC, each user with their own token."""
    alice, bob = write_secret(tmp_path / "alice.token", "alice-tok-4e"), write_secret(tmp_path / "bob.token", "bob-5f")
    config = _roles_config(tmp_path, own_jobs_only="true")
    config.write_text(config.read_text() + f"user_tokens:\n  alice: {alice}\n  bob: {bob}\n")
    srv = ControllerServer(read_controller_config(config))
    addr = srv.start()
    try:
        as_alice, as_bob, as_admin = client(addr), client(addr), client(addr)
        as_alice.md, as_bob.md, as_admin.md = metadata("alice-tok-4e"), metadata("bob-5f"), metadata(ADMIN)
        text = f"name: mine\nlauncher: direct\nworkdir: {tmp_path}\ncommand: [sh, -c, 'exit 0']\n"
        a = as_alice.submit(text, "a.yaml")
        b = as_bob.submit(text, "b.yaml")
        assert [(j.job_id, j.owner) for j in as_alice.jobs()] == [(a, "alice")]
        assert [(j.job_id, j.owner) for j in as_bob.jobs()] == [(b, "bob")]
        assert [(j.job_id, j.owner) for j in as_admin.jobs()] == [(a, "alice"), (b, "bob")]
        refused = as_bob.cancel(a)
        assert not refused.cancelled and refused.message == f"no job {a!r} of yours"
        assert as_alice.cancel(a).cancelled
        assert as_admin.cancel(b).cancelled  # an admin cancels anyone's
        for c in (as_alice, as_bob, as_admin):
            c.close()
    finally:
        srv.stop()


def test_user_tokens_are_private_named_and_distinct(tmp_path: Path) -> None:
    config = _roles_config(tmp_path)
    (tmp_path / "carol.token").write_text("carol-6a\n")
    (tmp_path / "carol.token").chmod(0o640)
    config.write_text(config.read_text() + "user_tokens:\n  carol: carol.token\n")
    with pytest.raises(InputError, match="carol.token: token file is accessible by others"):
        read_controller_config(config)
    (tmp_path / "carol.token").chmod(0o600)
    assert read_controller_config(config).user_tokens == {"carol": "carol-6a"}
    write_secret(tmp_path / "carol.token", WORKER)
    with pytest.raises(InputError, match="worker_token and user_tokens: carol are the same credential"):
        read_controller_config(config)
    config.write_text(config.read_text().replace("carol:", "admin:"))
    with pytest.raises(InputError, match="not a role"):
        read_controller_config(config)
