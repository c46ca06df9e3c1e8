"""Failures are failures (issue 15, items 1-2): a job's state is the truth of its processes.

Each test reproduces a failure seen in the field and checks the fix with the real parts a user meets: the
``ranks.py`` supervisor as the worker runs it (``python -P ranks.py``), and a real controller and worker daemon
over real gRPC (``runtime_procs``; port 0, no fixed ports) for the end-to-end ones.

- ``ranks.py --nprocs 1 -- sh -c 'sleep 0.3; exit 3'`` exited 0: its loop read the rank's exit code in a
  second poll, after deciding all ranks were gone, so a lone rank's code was never read. A ``direct`` job
  running ``/bin/false`` ended ``completed``, and so did one whose rank hit EADDRINUSE on its MASTER_PORT.
- A job that declares ``steps`` and exits 0 short of them was ``completed`` (at step 0).
- A job file with an env name ``A=B`` or ``""``, or a NUL byte, crashed the worker daemon at every resend of
  its launch (Popen's ValueError); under a restart-always supervisor the node crash-looped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime_procs import TOKEN, client, controller_config, start_controller, start_worker, stop, wait_for

from hpcsched.runtime import launchers
from hpcsched.runtime.jobfile import JobSpec
from hpcsched.runtime.launchers import direct
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.store import Store
from hpcsched.runtime.worker import WarmRanks, Worker
from hpcsched.runtime.worker_config import WorkerConfig

RANKS = Path(direct.RANKS_SCRIPT)
MAX_RESTARTS = 1  # so a failing job is failed after 2 attempts


# ----------------------------------------------------------------------------------------- ranks.py
def _ranks(nprocs: int, *program: str, cwd: Path | None = None) -> int:
    """Run the ``direct`` supervisor exactly as a worker does (``python -P ranks.py``) and return its exit code."""
    done = subprocess.run([sys.executable, "-P", str(RANKS), f"--nprocs={nprocs}", "--grace=5", "--", *program],
                          capture_output=True, text=True, timeout=120, cwd=cwd)
    return done.returncode


@pytest.mark.parametrize(("nprocs", "program", "code"), [
    (1, ["sh", "-c", "sleep 0.3; exit 3"], 3),  # the reproduction: exited 0
    (1, ["sh", "-c", "exit 3"], 3),
    (1, ["/bin/false"], 1),
    (2, ["sh", "-c", 'if [ "$RANK" = 1 ]; then exit 5; fi; exec sleep 60'], 5),  # a peer stopped, the failure kept
    (1, ["sh", "-c", "kill -9 $$"], 137),  # a signal: 128 + 9, as a shell reports it
    (2, ["/nonexistent/program"], 127),  # cannot start
    (2, ["sh", "-c", "exit 0"], 0),
], ids=["sleep-exit-3", "exit-3", "false", "one-of-two-fails", "sigkill", "cannot-start", "success"])
def test_ranks_supervisor_exits_with_the_failing_rank_s_code(nprocs: int, program: list[str], code: int) -> None:
    assert _ranks(nprocs, *program) == code


def test_ranks_supervisor_cannot_start_without_setpriv(tmp_path: Path) -> None:
    """Without setpriv on PATH the rank is exec'd by Popen itself, whose 'no such file' is a Python exception:
    the supervisor reports it and exits 127 instead of a traceback and 1 (or 0)."""
    env = os.environ | {"PATH": str(tmp_path)}  # nothing there: no setpriv, no sh
    done = subprocess.run([sys.executable, "-P", str(RANKS), "--nprocs=2", "--", "/nonexistent/program"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 127, done.stderr
    assert "cannot start rank 0" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("body", "code"), [("time.sleep(0.3); sys.exit(3)", 3),
                                            ("os.kill(os.getpid(), signal.SIGKILL)", 137),
                                            ("raise OSError(98, 'Address already in use')", 1),
                                            ("time.sleep(0.3)", 0)], ids=["exit-3", "sigkill", "raises", "success"])
def test_warm_forked_rank_s_code_is_the_task_s(tmp_path: Path, body: str, code: int) -> None:
    """The same through a warm supervisor, whose Python ranks are forked rather than exec'd."""
    prog = tmp_path / "rank.py"
    prog.write_text(f"import os, signal, sys, time\n{body}\n")
    t = pb.LaunchTask(task_id="j1.g1.n0", job_id="j1", generation=1, launcher="direct", command=[str(prog)],
                      node_rank=0, nnodes=1, nprocs=1, world_size=1, master_addr="127.0.0.1", master_port=1)
    argv, extra = launchers.build(t, sys.executable, "")
    warm = WarmRanks(sys.executable, tmp_path / "warm.log", delay_s=0, preload="json")
    warm.wanted = True
    warm.ensure()
    try:
        p = warm.take(argv, dict(os.environ) | extra, str(tmp_path), tmp_path / "log")
        assert p is not None
        assert p.wait(timeout=120) == code, (tmp_path / "log").read_text()[-2000:]
    finally:
        warm.close()


# ------------------------------------------------------------------------------- a worker, no daemon
def _task(tmp_path: Path, task_id: str, command: list[str], env: dict[str, str] | None = None) -> pb.LaunchTask:
    return pb.LaunchTask(task_id=task_id, job_id=task_id.split(".")[0], generation=1, launcher="direct",
                         command=command, env={"HPCSCHED_WORKDIR": str(tmp_path)} | (env or {}), node_rank=0,
                         nnodes=1, nprocs=1, world_size=1, master_addr="127.0.0.1", master_port=1,
                         checkpoint_dir=str(tmp_path / "ck" / task_id))


BAD_TASKS = {  # what each crashed the daemon with
    "env-name-with-equals": (["sh", "-c", "exit 0"], {"A=B": "1"}, "'A=B' is not a valid name"),  # illegal env name
    "env-name-empty": (["sh", "-c", "exit 0"], {"": "1"}, "'' is not a valid name"),
    "nul-in-argument": (["sh", "-c", "echo a\0b"], {}, "contains a NUL byte"),  # embedded null byte
    "nul-in-env-value": (["sh", "-c", "exit 0"], {"X": "a\0b"}, "X contains a NUL byte"),
    "no-such-workdir": (["sh", "-c", "exit 0"], {"HPCSCHED_WORKDIR": "/nonexistent/dir"}, "/nonexistent/dir"),
}


@pytest.mark.parametrize("case", list(BAD_TASKS))
def test_a_task_that_cannot_start_fails_the_task_not_the_worker(tmp_path: Path, case: str) -> None:
    """``Worker.launch`` raised out of the daemon's loop; now the task is recorded as exited 127 with the
    reason, reported as such, and the next task starts as usual."""
    command, env, why = BAD_TASKS[case]
    w = Worker(WorkerConfig(controller="127.0.0.1:9", name="w0", work_dir=tmp_path / "w"))
    try:
        w._apply(pb.HeartbeatReply(launch=[_task(tmp_path, "j1.g1.n0", command, env)]))  # as the daemon gets it
        bad = w.tasks["j1.g1.n0"]
        assert bad.exit_code == 127 and bad.proc is None
        assert bad.reason.startswith("cannot start: ") and why in bad.reason, bad.reason
        (status,) = w._heartbeat().tasks
        assert (status.running, status.exit_code, status.reason) == (False, 127, bad.reason)
        w._apply(pb.HeartbeatReply(launch=[_task(tmp_path, "j2.g1.n0", ["sh", "-c", "exit 0"])]))
        good = w.tasks["j2.g1.n0"]
        assert good.proc is not None and good.proc.wait(timeout=60) == 0
    finally:
        w.shutdown()


def test_a_failed_task_reports_how_it_ended_and_its_last_words(tmp_path: Path) -> None:
    """The reason sent with a non-zero exit: the code (a signal by name) and the traceback's last line."""
    w = Worker(WorkerConfig(controller="127.0.0.1:9", name="w0", work_dir=tmp_path / "w"))
    prog = tmp_path / "fail.py"
    prog.write_text("import sys\nprint('loading', flush=True)\nraise OSError(98, 'Address already in use')\n")
    try:
        w.launch(_task(tmp_path, "j1.g1.n0", [str(prog)]))
        w.launch(_task(tmp_path, "j2.g1.n0", ["sh", "-c", "kill -9 $$"]))
        wait_for("both tasks to exit", lambda: (w._poll(), all(t.exit_code is not None for t in w.tasks.values()))[1],
                 120, 0.1)
        t1, t2 = w.tasks["j1.g1.n0"], w.tasks["j2.g1.n0"]
        assert t1.exit_code == 1 and t1.reason == "exited with 1: OSError: [Errno 98] Address already in use"
        assert t2.exit_code == 137 and t2.reason.startswith("exited with 137 (a process killed by SIGKILL)")
    finally:
        w.shutdown()


def test_garbage_in_a_progress_file_is_dropped_not_fatal(tmp_path: Path) -> None:
    """A program's progress lines are the program's: a JSON list (no ``.items()``) raised out of the worker's
    loop; numbers past the proto's range and wrong types are dropped with a warning, good lines still count."""
    lines = ["[1]", '"text"', '{"step": 1e30}', '{"step": 99999999999999999999}', '{"checkpoint": 5}',
             '{"step": 3, "loss": 0.5}']
    script = "; ".join(f"echo '{ln}' >> \"$HPCSCHED_PROGRESS_FILE\"" for ln in lines)
    w = Worker(WorkerConfig(controller="127.0.0.1:9", name="w0", work_dir=tmp_path / "w"))
    try:
        w.launch(_task(tmp_path, "j1.g1.n0", ["sh", "-c", script]))
        wait_for("the task to exit", lambda: (w._poll(), w.tasks["j1.g1.n0"].exit_code is not None)[1], 120, 0.1)
        task = w.tasks["j1.g1.n0"]
        assert task.exit_code == 0 and [(p.step, p.loss) for p in task.pending] == [(3, 0.5)]
    finally:
        w.shutdown()


# ------------------------------------------------------------------ real controller, worker and gRPC
class Cluster:
    def __init__(self, d: Path, address: str, procs: list[subprocess.Popen]) -> None:
        self.d, self.address, self.procs, self.c = d, address, procs, client(address)

    def submit(self, name: str, command: list[str], launcher: str = "direct", steps: int | None = None,
               procs: int = 1) -> str:
        text = (f"name: {name}\nlauncher: {launcher}\nprocs: {procs}\nworkdir: {self.d}\n"
                f"command: {json.dumps(command)}\n" + (f"steps: {steps}\n" if steps else ""))
        return self.c.submit(text, f"{name}.yaml")

    def job(self, jid: str) -> pb.JobInfo:
        return next(j for j in self.c.jobs() if j.job_id == jid)

    def wait_final(self, jid: str, timeout: float = 180) -> pb.JobInfo:
        return wait_for(f"job {jid} to end", lambda: (j := self.job(jid)).state in ("completed", "failed",
                                                                                      "cancelled") and j, timeout)

    def events(self, jid: str) -> list[dict]:
        st = Store(self.d / "run" / "state.db")
        try:
            return st.events(jid)
        finally:
            st.close()


def _start(d: Path, slots: int = 2) -> Cluster:
    ctl, address = start_controller(d, controller_config(d, max_restarts=MAX_RESTARTS))
    procs = [ctl]
    try:
        procs.append(start_worker(d, address, "w0", slots=slots))
        cl = Cluster(d, address, procs)
        wait_for("the worker", lambda: any(w.alive for w in cl.c.workers()), 90)
    except BaseException:
        for p in reversed(procs):
            stop(p)
        raise
    return cl


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    cl = _start(tmp_path)
    try:
        yield cl
    finally:
        cl.c.close()
        for p in reversed(cl.procs):
            stop(p)


def _assert_failed(cl: Cluster, jid: str, *reason: str) -> pb.JobInfo:
    """Failed after every attempt, with the reason in its message and no 'completed' anywhere in its history."""
    job = cl.wait_final(jid)
    assert job.state == "failed", (job.state, job.message)
    assert job.restarts == MAX_RESTARTS + 1
    for r in reason:
        assert r in job.message, job.message
    assert f"failed {MAX_RESTARTS + 1} attempts" in job.message
    kinds = [e["kind"] for e in cl.events(jid)]
    assert "completed" not in kinds and kinds.count("task_failed") == MAX_RESTARTS + 1, kinds
    return job


def _launcher(name: str, missing: bool, what: str) -> object:
    return pytest.param(name, marks=pytest.mark.skipif(missing, reason=f"{what} is not installed here"))


LAUNCHERS_HERE = [
    _launcher("direct", False, ""),
    _launcher("torchrun", importlib.util.find_spec("torch") is None, "torch"),
    _launcher("mpirun", shutil.which("mpirun") is None, "mpirun"),
    _launcher("horovodrun", shutil.which("horovodrun") is None and not
              (Path(sys.executable).parent / "horovodrun").exists(), "horovodrun"),
]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS_HERE)
def test_failing_job_is_failed_for_every_launcher(cluster: Cluster, launcher: str) -> None:
    """``command: [/bin/false]`` ended ``completed`` under ``direct``; under every launcher it is retried by the
    job's policy (max_restarts) and then failed, with the exit in its message and in ``hpcsched jobs -o wide`` (the
    default table keeps to what reads at 80 columns: the state, not the message)."""
    jid = cluster.submit("false", ["/bin/false"], launcher=launcher)
    job = _assert_failed(cluster, jid, f"task {jid}.g{MAX_RESTARTS + 1}.n0 exited with 1")
    env = os.environ | {"HPCSCHED_TOKEN": TOKEN, "COLUMNS": "400"}
    cli = [sys.executable, "-m", "hpcsched.runtime", "jobs", "--controller", cluster.address]
    table = subprocess.run([*cli, "-o", "wide"], capture_output=True, text=True, env=env, timeout=120)
    assert table.returncode == 0, table.stderr
    (row,) = [ln for ln in table.stdout.splitlines() if jid in ln]
    assert "failed" in row and "exited with 1" in row and f"failed {MAX_RESTARTS + 1} attempts" in row, row
    listed = json.loads(subprocess.run([*cli, "--json"], capture_output=True, text=True, env=env,
                                       timeout=120).stdout)
    assert [j["message"] for j in listed if j["job_id"] == jid] == [job.message]


# A rank whose rendezvous port is taken, as rank 0 of a torch job meets it (torch's TCPStore binds
# MASTER_ADDR:MASTER_PORT): another process holds the port, the rank's bind fails with EADDRINUSE and it dies
# with a traceback. Seen in a testbed run: "exited with 0", job completed at step 0.
EADDRINUSE_RANK = textwrap.dedent("""
    import os, socket
    addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    holder = socket.socket()
    holder.bind(addr)
    holder.listen()
    store = socket.socket()
    store.bind(addr)  # OSError: [Errno 98] Address already in use
""")


@pytest.mark.slow
def test_rank_that_hits_eaddrinuse_fails_the_job(cluster: Cluster) -> None:
    (cluster.d / "rank.py").write_text(EADDRINUSE_RANK)
    jid = cluster.submit("eaddrinuse", [sys.executable, str(cluster.d / "rank.py")], steps=400)
    _assert_failed(cluster, jid, "exited with 1: OSError: [Errno 98] Address already in use")


# Reports a step, then exits 0 on its own.
REPORTS_AND_EXITS = 'echo "{\\"step\\": %d, \\"loss\\": 1.0}" >> "$HPCSCHED_PROGRESS_FILE"; exit 0'


@pytest.mark.slow
def test_exit_0_short_of_the_declared_steps_is_not_completed(cluster: Cluster) -> None:
    """A job that declares ``steps`` and exits 0 before reaching them (or reporting itself done) failed to do
    its work: failed, 'exited 0 at step N of M'. Reaching them, or declaring none, is completed."""
    silent = cluster.submit("silent", ["sh", "-c", "exit 0"], steps=400)
    short = cluster.submit("short", ["sh", "-c", REPORTS_AND_EXITS % 7], steps=400)
    full = cluster.submit("full", ["sh", "-c", REPORTS_AND_EXITS % 400], steps=400)
    undeclared = cluster.submit("undeclared", ["sh", "-c", "exit 0"])
    _assert_failed(cluster, silent, "exited 0 at step 0 of 400")
    _assert_failed(cluster, short, "exited 0 at step 7 of 400")
    assert cluster.wait_final(full).state == "completed"
    assert cluster.wait_final(undeclared).state == "completed"


@pytest.mark.slow
def test_killed_rank_and_missing_program_fail_the_job(cluster: Cluster) -> None:
    """A rank killed by a signal and a program that does not exist: failures, each saying which."""
    killed = cluster.submit("killed", ["sh", "-c", "kill -9 $$"])
    missing = cluster.submit("missing", ["/nonexistent/program"])
    _assert_failed(cluster, killed, "exited with 137 (a process killed by SIGKILL)")
    _assert_failed(cluster, missing, "exited with 127", "/nonexistent/program")


@pytest.mark.slow
def test_job_files_that_crashed_workers_fail_their_job_and_the_worker_lives(tmp_path: Path) -> None:
    """Jobs the controller now refuses at submit (test_job_validation) but a state file from before holds: the
    worker daemon gets their launches, fails each task with the reason, and lives on (one registration, no
    crash); each job fails after its retries, and a good job then runs on the same worker."""
    st = Store(tmp_path / "run" / "state.db")
    bad = {}
    for case, (command, env, why) in BAD_TASKS.items():
        if case == "no-such-workdir":
            spec = JobSpec(name=case, command=tuple(command), launcher="direct", workdir="/nonexistent/dir")
        else:
            spec = JobSpec(name=case, command=tuple(command), launcher="direct", workdir=str(tmp_path), env=env)
        bad[st.add_job(spec, time.time())] = why
    st.close()
    cl = _start(tmp_path)
    try:
        worker = cl.procs[1]
        for jid, why in bad.items():
            _assert_failed(cl, jid, "cannot start: ", why)
        assert worker.poll() is None, "the worker daemon died"
        good = cl.submit("good", ["sh", "-c", "exit 0"])
        assert cl.wait_final(good).state == "completed"
        assert worker.poll() is None
        log = (tmp_path / "w0.log").read_text()
        assert log.count("registered with") == 1, log[-3000:]
        assert "cannot start" in log  # it said why, and went on
    finally:
        cl.c.close()
        for p in reversed(cl.procs):
            stop(p)
