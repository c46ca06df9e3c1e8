"""Per-worker credentials (issue 26): the worker token only joins; a worker's own credential speaks for it.

Seen: with the worker token (which a job could read beside its worker), a forged heartbeat reported another user's
task ``done`` at step 1000 and the controller marked that job completed at 67 of its 1000 steps; a forged Leave
made a worker leave. Real controller and worker processes (``runtime_procs``), real gRPC on port 0: the forger holds
the join token, even registers a worker of its own, and is refused for the real worker; then a ``kill -9`` of the
controller, and the worker, whose credential the new controller does not know, registers again keeping its task.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import grpc
import pytest
from runtime_procs import client, controller_config, kill_tree, start_controller, start_worker, stop, wait_for

from hpcsched.runtime.auth import metadata, open_channel
from hpcsched.runtime.credentials import credential_metadata
from hpcsched.runtime.rpc import pb, pb_grpc

FINAL = ("completed", "failed", "cancelled")


def _job(d: Path) -> str:
    """A job that reports step 1, says its task id, waits for ``go`` and then reports its last step (40)."""
    report = 'echo "{\\"step\\": $1, \\"loss\\": 1.0}" >> "$HPCSCHED_PROGRESS_FILE"'
    script = (f'r() {{ {report}; }}; r 1; echo "$HPCSCHED_TASK_ID" > {d}/task; env > {d}/task-env; '
              f'while [ ! -e {d}/go ]; do sleep 0.2; done; r 40')
    return (f"name: victim\nlauncher: direct\nprocs: 1\nsteps: 40\nworkdir: {d}\n"
            f"command: {json.dumps(['sh', '-c', script])}\n")


def _code(call) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


@pytest.mark.slow
def test_the_join_token_alone_cannot_act_for_a_worker_and_a_restart_keeps_its_task(tmp_path: Path) -> None:
    d = tmp_path
    # heartbeats every 0.3 s, a worker lost after 3 s of silence (runtime_procs' config)
    config = controller_config(d, worker_token_file="worker-token")
    (d / "worker-token").write_text("worker-join-9c1\n")
    (d / "worker-token").chmod(0o600)
    ctl, address = start_controller(d, config)
    worker = start_worker(d, None, "w0", token="worker-join-9c1",
                          extra=("--address-file", str(d / "run" / "controller.addr")))
    ch = None
    try:
        c = client(address)
        wait_for("the worker", lambda: any(w.alive for w in c.workers()), 90)
        jid = c.submit(_job(d), "victim.yaml")
        task = wait_for("the task to start", lambda: (d / "task").exists() and (d / "task").read_text().strip(), 90)
        job = wait_for("its first report", lambda: next(j for j in c.jobs() if j.job_id == jid).steps_done >= 1 and
                       next(j for j in c.jobs() if j.job_id == jid), 60)
        ch = open_channel(address)
        stub, join = pb_grpc.ControllerStub(ch), metadata("worker-join-9c1")
        done = pb.TaskStatus(task_id=task, job_id=jid, generation=job.generation, running=False, exit_code=0,
                             progress=[pb.Progress(step=40, loss=0.1, time=time.time())])
        forged = pb.HeartbeatRequest(worker_id="w0", tasks=[done])
        # the join token alone: refused for w0, whatever the report says
        assert _code(lambda: stub.Heartbeat(forged, metadata=join, timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        assert _code(lambda: stub.Leave(pb.LeaveRequest(worker_id="w0", final=True), metadata=join,
                                        timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        # a worker of the forger's own: its credential speaks for it, and for no other worker
        own = stub.Register(pb.RegisterRequest(worker_id="evil", host="127.0.0.1", slots=1, instance="e"),
                            metadata=join, timeout=10).credential
        assert own
        evil = join + credential_metadata(own)
        assert not stub.Heartbeat(pb.HeartbeatRequest(worker_id="evil", instance="e"), metadata=evil,
                                  timeout=10).reregister
        assert _code(lambda: stub.Heartbeat(forged, metadata=evil, timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        assert _code(lambda: stub.Leave(pb.LeaveRequest(worker_id="w0", final=True), metadata=evil,
                                        timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        stub.Leave(pb.LeaveRequest(worker_id="evil", final=True, instance="e"), metadata=evil, timeout=10)
        ch.close()
        ch = None
        now = {j.job_id: j for j in c.jobs()}[jid]
        assert (now.state, now.steps_done) == ("running", 1), "the forged report changed nothing"
        assert {w.worker_id for w in c.workers() if w.alive} == {"w0"}
        # No credential in what the task inherited (the worker keeps its credential in memory only).
        env = (d / "task-env").read_text()
        assert "worker-join-9c1" not in env and "HPCSCHED_TOKEN=" not in env
        c.close()

        kill_tree(ctl)  # kill -9: the new controller knows no credential
        ctl, address = start_controller(d, config)
        c = client(address)
        # the worker is told to register again (and does, with its task): its heartbeats are accepted again
        wait_for("the worker to register again", lambda: "registered with" in _second(d / "w0.log"), 60)
        (d / "go").touch()
        end = wait_for("the job to end", lambda: next((j for j in c.jobs() if j.job_id == jid and j.state in FINAL),
                                                       None), 60)
        c.close()
    finally:
        if ch is not None:
            ch.close()
        stop(worker)
        stop(ctl)
    assert (end.state, end.steps_done, end.restarts) == ("completed", 40, 0), end.message
    log = (d / "controller.log").read_text()
    assert "refused Heartbeat for worker w0" in log and "Traceback" not in log
    # an issued credential is written nowhere: not in the state (the controller keeps a hash, in memory), not in a log
    written = b"".join(p.read_bytes() for p in d.rglob("*") if p.is_file())
    assert own.encode() not in written


def _second(log: Path) -> str:
    """The worker's log after its first registration line."""
    text = log.read_text() if log.exists() else ""
    first = text.find("registered with")
    return text[first + 1:] if first >= 0 else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_worker_leaving_across_a_controller_restart_registers_again_to_say_so(tmp_path: Path) -> None:
    """The restarted controller knows no credential: the leaving worker's notice is refused, it registers again with
    the join token and repeats it, so its job stops as preempted (no attempt counted) instead of being lost."""
    d = tmp_path
    # one port for both controllers: a leaving worker does not look for a moved controller
    config = controller_config(d, listen=f"127.0.0.1:{_free_port()}")
    ctl, address = start_controller(d, config)
    worker = start_worker(d, address, "w0", extra=("--stop-grace", "40"))
    try:
        c = client(address)
        wait_for("the worker", lambda: any(w.alive for w in c.workers()), 90)
        report = 'echo "{\\"step\\": 1, \\"loss\\": 1.0}" >> "$HPCSCHED_PROGRESS_FILE"'
        script = f"trap 'sleep 12; exit 0' TERM; {report}; while :; do sleep 0.2; done"
        jid = c.submit(f"name: slow-stop\nlauncher: direct\nprocs: 1\nsteps: 100\nworkdir: {d}\n"
                       f"command: {json.dumps(['sh', '-c', script])}\n", "slow-stop.yaml")
        wait_for("its first report", lambda: next(j for j in c.jobs() if j.job_id == jid).steps_done >= 1, 60)
        c.close()
        kill_tree(ctl)
        worker.send_signal(signal.SIGTERM)  # its task takes 12 s to stop: the notice is retried meanwhile
        ctl, address = start_controller(d, config)
        worker.wait(timeout=90)
        c = client(address)
        job = next(j for j in c.jobs() if j.job_id == jid)
        c.close()
    finally:
        stop(worker)
        stop(ctl)
    assert "told the controller this worker is leaving" in (d / "w0.log").read_text()
    assert "worker w0 is leaving" in (d / "controller.log").read_text()
    assert (job.state, job.restarts) == ("pending", 0), job.message
