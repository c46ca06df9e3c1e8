"""The worker's agent service and hpcsched's rsh agent on loopback: real gRPC, real processes.

What mpirun relies on (stdout, stderr and exit code relayed, stdin passed on) and what the service refuses
(a wrong token; a job that holds no task on that worker), tested without MPI; the multi-host run through mpirun
is in tests/test_runtime_netns.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcsched.runtime import rsh_agent, worker_agent

TOKEN = "agent-test-token"


class Holders:
    """Stands in for the worker's tasks: job -> Holder for one attempt."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int], worker_agent.Holder] = {}

    def find(self, job: str, generation: int) -> worker_agent.Holder | None:
        return self.held.get((job, generation))


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[Holders, str, Path]]:
    holders = Holders()
    service = worker_agent.AgentService("w-test", TOKEN, holders.find, [], hold_wait_s=1.0)
    server, port = worker_agent.serve("127.0.0.1", service)
    try:
        yield holders, f"127.0.0.1:{port}", TOKEN
    finally:
        server.stop(grace=1)


def agent_env(address: str, token: str, job: str = "j0001", generation: int = 1, key_job: str | None = None
              ) -> dict[str, str]:
    """What the node-0 worker gives its launcher (``key_job``: sign another job's key, as a forger would try)."""
    return os.environ | {rsh_agent.AGENTS_ENV: json.dumps({"nodeB": address}), "HPCSCHED_JOB_ID": job,
                         "HPCSCHED_GENERATION": str(generation),
                         rsh_agent.KEY_ENV: worker_agent.job_key(token, key_job or job, generation)}


def run_agent(address: str, token: str, argv: list[str], job: str = "j0001", generation: int = 1,
              stdin: bytes = b"", key_job: str | None = None) -> subprocess.CompletedProcess:
    env = agent_env(address, token, job, generation, key_job)
    return subprocess.run([sys.executable, "-m", "hpcsched.runtime.rsh_agent", *argv], input=stdin,
                          capture_output=True, env=env, timeout=60)


def test_relays_stdout_stderr_stdin_and_exit_code(agent, tmp_path: Path) -> None:
    holders, address, token = agent
    holders.held["j0001", 1] = worker_agent.Holder(os.environ | {"HELD_VAR": "from-the-task"}, str(tmp_path))
    # ssh-style options before the host are ignored; the words are joined for the remote shell, as ssh does
    r = run_agent(address, token, ["-x", "-o", "StrictHostKeyChecking=no", "nodeB", "echo", '"$HELD_VAR";',
                                        "pwd;", "cat;", "echo", "oops", ">&2;", "exit", "3"], stdin=b"piped in\n")
    assert r.returncode == 3, r.stderr
    assert r.stdout.decode().splitlines() == ["from-the-task", str(tmp_path), "piped in"]
    assert r.stderr.decode().strip() == "oops"
    assert holders.held["j0001", 1].procs == []  # done: no longer tracked


def test_a_signal_is_reported_as_128_plus_n(agent, tmp_path: Path) -> None:
    holders, address, token = agent
    holders.held["j0001", 1] = worker_agent.Holder(dict(os.environ), None)
    r = run_agent(address, token, ["nodeB", "kill", "-9", "$$"])
    assert r.returncode == 128 + 9, r.stderr


def test_refuses_a_wrong_key(agent, tmp_path: Path) -> None:
    """A key made with another token, or another job's key (a job's programs see their own key only): refused."""
    holders, address, token = agent
    holders.held["j0001", 1] = worker_agent.Holder(dict(os.environ), None)
    for r in (run_agent(address, "not-the-token", ["nodeB", "touch", str(tmp_path / "ran")]),
              run_agent(address, token, ["nodeB", "touch", str(tmp_path / "ran")], key_job="j0002")):
        assert r.returncode == 255
        assert "UNAUTHENTICATED" in r.stderr.decode() and "wrong key for job 'j0001'" in r.stderr.decode()
    assert not (tmp_path / "ran").exists()


def test_refuses_a_job_without_a_task_on_that_worker(agent, tmp_path: Path) -> None:
    holders, address, token = agent
    holders.held["j0001", 1] = worker_agent.Holder(dict(os.environ), None)
    t0 = time.monotonic()
    r = run_agent(address, token, ["nodeB", "touch", str(tmp_path / "ran")], generation=2)  # an older task
    assert r.returncode == 255
    err = r.stderr.decode()
    assert "FAILED_PRECONDITION" in err and "holds no live task of job 'j0001' attempt 2" in err, err
    assert time.monotonic() - t0 >= 1.0  # it waited for the task (hold_wait_s) before refusing
    assert not (tmp_path / "ran").exists()


def test_waits_for_a_task_that_arrives_late(agent, tmp_path: Path) -> None:
    """The controller sends an attempt's tasks on each worker's own heartbeat: node 0's mpirun may call first."""
    holders, address, token = agent
    env = agent_env(address, token, "j0007")
    p = subprocess.Popen([sys.executable, "-m", "hpcsched.runtime.rsh_agent", "nodeB", "echo", "late"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.5)
    holders.held["j0007", 1] = worker_agent.Holder(dict(os.environ), None)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert out == b"late\n"


def test_unknown_host_and_missing_environment_say_why() -> None:
    r = subprocess.run([sys.executable, "-m", "hpcsched.runtime.rsh_agent", "nodeZ", "true"], capture_output=True,
                       env=os.environ | {rsh_agent.AGENTS_ENV: json.dumps({"nodeB": "127.0.0.1:1"}),
                                         "HPCSCHED_JOB_ID": "j1", "HPCSCHED_GENERATION": "1"}, timeout=60)
    assert r.returncode == 255
    assert "no hpcsched worker agent known for host 'nodeZ' (known: nodeB" in r.stderr.decode()
    env = {k: v for k, v in os.environ.items() if k != "HPCSCHED_JOB_ID"} | {
        rsh_agent.AGENTS_ENV: json.dumps({"nodeB": "127.0.0.1:1"})}
    r = subprocess.run([sys.executable, "-m", "hpcsched.runtime.rsh_agent", "nodeB", "true"], capture_output=True,
                       env=env, timeout=60)
    assert r.returncode == 255 and "$HPCSCHED_JOB_ID is not set" in r.stderr.decode()


def test_a_cancelled_call_kills_the_command(agent, tmp_path: Path) -> None:
    """mpirun stops its agents with SIGTERM at an abort: the command on the other node must not outlive it."""
    holders, address, token = agent
    holder = worker_agent.Holder(dict(os.environ), None)
    holders.held["j0001", 1] = holder
    env = agent_env(address, token)
    p = subprocess.Popen([sys.executable, "-m", "hpcsched.runtime.rsh_agent", "nodeB", "sleep", "300"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not holder.procs and time.monotonic() < deadline:
        time.sleep(0.05)
    assert holder.procs, "the command did not start"
    started = holder.procs[0]
    p.terminate()
    p.communicate(timeout=30)
    started.wait(timeout=30)  # killed by the service when the call went away
    assert started.returncode == -9


def test_split_argv() -> None:
    got = rsh_agent.split_argv(["-p", "22", "-x", "user@n2", "orted", "-mca", "x", '"1"'])
    assert got == ("n2", 'orted -mca x "1"')
    with pytest.raises(ValueError, match="usage"):
        rsh_agent.split_argv(["n2"])
