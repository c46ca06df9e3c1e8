"""The worker daemon with real processes: fork-safe task start, parent-death kill, relative work dirs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.worker import Worker, spawn
from hpcsched.runtime.worker_config import WorkerConfig

REPO = Path(__file__).resolve().parents[1]


def _gone(pid: int, within_s: float) -> bool:
    end = time.time() + within_s
    while time.time() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_tasks_start_while_grpc_threads_run(tmp_path: Path) -> None:
    """Many task starts under live gRPC traffic (server and client threads polling epoll): every child
    execs and exits 0. A Python preexec_fn here could abort the child inside gRPC's fork handlers."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_ControllerServicer_to_server(pb_grpc.ControllerServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()

    def chatter() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.ControllerStub(ch)
            while not stop.is_set():
                try:
                    stub.ListJobs(pb.ListJobsRequest(), timeout=1)
                except grpc.RpcError:
                    pass  # UNIMPLEMENTED: the traffic is the point

    threads = [threading.Thread(target=chatter) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        with open(tmp_path / "out.log", "ab") as out:
            procs = [spawn(["sh", "-c", "exit 0"], dict(os.environ), str(tmp_path), out) for _ in range(40)]
            codes = [p.wait(timeout=60) for p in procs]
    finally:
        stop.set()
        for t in threads:
            t.join()
        server.stop(0)
    assert codes == [0] * 40, (tmp_path / "out.log").read_text()[-2000:]


def test_task_dies_with_its_worker(tmp_path: Path) -> None:
    """The parent-death signal now comes from setpriv (no preexec_fn): kill -9 the worker, its task goes."""
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from hpcsched.runtime.worker import spawn
        p = spawn(["sleep", "60"], dict(os.environ), None, open(os.devnull, "wb"))
        print(p.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert not _gone(child, 0.3), "the task should run while its worker lives"
        os.kill(parent.pid, signal.SIGKILL)
        assert _gone(child, 5.0), "task outlived its killed worker"
    finally:
        parent.kill()
        parent.wait()


def test_relative_work_dir_is_resolved_and_progress_reaches_worker(tmp_path: Path, monkeypatch) -> None:
    """A worker started with ``--work-dir rel`` runs a task whose cwd is elsewhere: the task's progress
    file must still be the worker's file (an absolute path), so its reports arrive."""
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "job-cwd"
    elsewhere.mkdir()
    w = Worker(WorkerConfig(controller="127.0.0.1:9", name="w0", work_dir=Path("rel")))
    try:
        assert w.cfg.work_dir == tmp_path / "rel"
        report = 'echo "{\\"step\\": 7, \\"loss\\": 1.5}" >> "$HPCSCHED_PROGRESS_FILE"'
        t = pb.LaunchTask(task_id="j1.g1.n0", job_id="j1", generation=1, launcher="torchrun",
                          command=["sh", "-c", report], env={"HPCSCHED_WORKDIR": str(elsewhere)}, node_rank=0,
                          nnodes=1, nprocs=1, world_size=1, master_addr="127.0.0.1", master_port=0,
                          checkpoint_dir=str(tmp_path / "ck"))
        w.launch(t)
        task = w.tasks[t.task_id]
        assert task.progress_path.is_absolute()
        task.proc.wait(timeout=120)
        w._poll()
        assert task.exit_code == 0, (w.cfg.work_dir / t.task_id / "output.log").read_text()[-2000:]
        assert [(p.step, p.loss) for p in task.pending] == [(7, 1.5)]
        assert not (elsewhere / "rel").exists()
    finally:
        w.shutdown()


_RANK_PROGRAM = textwrap.dedent("""
    import os, signal, sys, time
    out = sys.argv[1]
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    forked = b"--warm" in open("/proc/self/cmdline", "rb").read()  # no exec: still the supervisor's command line
    with open(f"{out}.{os.environ['RANK']}", "w") as f:
        f.write(" ".join(f"{k}={os.environ.get(k)}" for k in keys) + f" FORKED={forked} ARGV1={sys.argv[1]}")
    fail = os.environ.get("FAIL_RANK") == os.environ["RANK"]
    end = time.time() + 30
    while not stop and time.time() < end:
        if fail and os.path.exists(f"{out}.0"):  # rank 0 is up, its SIGTERM handler installed
            sys.exit(3)
        time.sleep(0.02)
    with open(f"{out}.{os.environ['RANK']}.stopped", "w") as f:
        f.write("checkpointed")
""")


def _ranks(tmp_path: Path, nprocs: int, offset: int, warm: bool = False, **env: str) -> subprocess.Popen:
    """A node's ``direct`` task exactly as the worker starts it (launchers.build, then spawn, or handed to a
    warm supervisor, preloading ``json`` here instead of torch)."""
    from hpcsched.runtime import launchers
    from hpcsched.runtime.worker import WarmRanks

    prog = tmp_path / "rank.py"
    prog.write_text(_RANK_PROGRAM)
    t = pb.LaunchTask(task_id="j1.g1.n1", job_id="j1", generation=1, launcher="direct",
                      command=[str(prog), str(tmp_path / "out")], node_rank=1, nnodes=2, nprocs=nprocs,
                      world_size=offset + nprocs, master_addr="127.0.0.1", master_port=29411, rank_offset=offset)
    argv, extra = launchers.build(t, sys.executable, "")
    if warm:
        w = WarmRanks(sys.executable, tmp_path / "warm.log", delay_s=0, preload="json")
        w.ensure()
        assert w.proc is None  # not before the node's first direct launch
        w.wanted = True
        w.ensure()
        p = w.take(argv, dict(os.environ) | extra | env, str(tmp_path), tmp_path / "log")
        assert p is not None
        return p
    with open(tmp_path / "log", "ab") as log:
        return spawn(argv, dict(os.environ) | extra | env, None, log)


@pytest.mark.parametrize("warm", [False, True], ids=["exec", "warm-fork"])
def test_direct_launcher_gives_each_rank_its_environment_and_forwards_sigterm(tmp_path: Path, warm: bool) -> None:
    """Node 1 of a 3-rank job runs ranks 1 and 2 itself (no torchrun agent): each sees the variables
    torch.distributed's env:// rendezvous reads; SIGTERM to the task reaches every rank, which
    checkpoints and exits 0, and so does the task. From a warm supervisor the ranks are forked, not exec'd."""
    p = _ranks(tmp_path, nprocs=2, offset=1, warm=warm)
    out = tmp_path / "out"
    deadline = time.time() + 20
    while not all(Path(f"{out}.{r}").exists() for r in (1, 2)) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    envs = {r: dict(kv.split("=") for kv in Path(f"{out}.{r}").read_text().split()) for r in (1, 2)}
    assert envs[1] | {"RANK": "", "LOCAL_RANK": ""} == envs[2] | {"RANK": "", "LOCAL_RANK": ""}
    assert (envs[1]["RANK"], envs[1]["LOCAL_RANK"], envs[2]["RANK"], envs[2]["LOCAL_RANK"]) == ("1", "0", "2", "1")
    assert envs[1]["WORLD_SIZE"] == "3" and envs[1]["LOCAL_WORLD_SIZE"] == "2" and envs[1]["GROUP_RANK"] == "1"
    assert (envs[1]["MASTER_ADDR"], envs[1]["MASTER_PORT"]) == ("127.0.0.1", "29411")
    assert envs[1]["FORKED"] == envs[2]["FORKED"] == str(warm) and envs[1]["ARGV1"] == str(tmp_path / "out")
    p.send_signal(signal.SIGTERM)  # what Worker.kill(checkpoint=True) sends
    assert p.wait(timeout=20) == 0
    assert all(Path(f"{out}.{r}.stopped").read_text() == "checkpointed" for r in (1, 2))


@pytest.mark.parametrize("warm", [False, True], ids=["exec", "warm-fork"])
def test_direct_launcher_stops_the_other_ranks_when_one_fails(tmp_path: Path, warm: bool) -> None:
    """As torchrun's agent does: a failed rank's peers are stopped (they could only hang in a collective)
    and the node's task exits with the failed rank's code (sys.exit(3) in a forked rank too)."""
    p = _ranks(tmp_path, nprocs=2, offset=0, warm=warm, FAIL_RANK="1")
    assert p.wait(timeout=30) == 3
    assert Path(f"{tmp_path / 'out'}.0.stopped").exists()  # rank 0 got SIGTERM and left cleanly
