"""The runtime end to end: a controller and workers as real processes on loopback, real gRPC, real torchrun.

The helpers start them exactly as a user would (``python -m hpcsched.cli controller|worker``).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_procs import (
    client,
    controller_config,
    job_file,
    jobs_by_id,
    kill_tree,
    start_controller,
    start_worker,
    stop,
    submit,
    wait_for,
)

from hpcsched.runtime import launchers
from hpcsched.runtime.client import Client

# ------------------------------------------------------------------------------------------ the tests
torch_missing = importlib.util.find_spec("torch") is None


@pytest.mark.slow
@pytest.mark.skipif(torch_missing, reason="torch is not installed (pip install -e '.[torch]')")
def test_e2e_worker_killed_and_controller_restarted(tmp_path: Path) -> None:
    """3 workers, 3 jobs; a worker dies mid-training and the controller is kill -9'd and restarted once:
    every job completes with the exact step count, a falling loss, and resumes from its last checkpoint."""
    from hpcsched.runtime.store import Store

    cfg = controller_config(tmp_path)
    ctl, addr = start_controller(tmp_path, cfg)
    workers = {n: start_worker(tmp_path, addr, n) for n in ("w1", "w2", "w3")}
    c = client(addr)
    try:
        wait_for("3 workers", lambda: sum(w.alive for w in c.workers()) == 3, 60)
        a = submit(c, job_file(tmp_path, "a", 2, 100))
        b = submit(c, job_file(tmp_path, "b", 1, 80, model="transformer"))
        cj = submit(c, job_file(tmp_path, "c", 1, 60))
        steps = {a: 100, b: 80, cj: 60}
        # A spans two workers; kill one of them (the whole process tree, like a node failure) after A's
        # first checkpoints.
        job_a = wait_for("job a checkpointed at step >= 20",
                         lambda: (j := jobs_by_id(c)[a]).last_checkpoint_step >= 20 and j, 90)
        victim = job_a.workers[1]
        kill_tree(workers.pop(victim))
        # A fails over: it is first in FIFO order and needs both remaining workers, so B is preempted (it
        # checkpoints on SIGTERM) and A restarts from its checkpoint on w1 + w3; C waits.
        wait_for("job a restarted", lambda: jobs_by_id(c)[a].restarts >= 1, 30)
        running = wait_for("a job running on the new layout",
                           lambda: [j for j in c.jobs() if j.state == "running" and j.steps_done > 0], 90)
        gen_before = {j.job_id: j.generation for j in running}
        # Kill -9 the controller mid-training and restart it on the same port.
        kill_tree(ctl)
        ctl, addr2 = start_controller(tmp_path, controller_config(tmp_path, listen=addr))
        assert addr2 == addr
        c.close()
        c = client(addr)
        jobs = wait_for("every job finished", lambda: (js := jobs_by_id(c)) and all(
            j.state in ("completed", "failed", "cancelled") for j in js.values()) and js, 240, poll=0.5)
        for jid, total in steps.items():
            j = jobs[jid]
            assert j.state == "completed", (jid, j.state, j.message)
            assert j.steps_done == total
            result = json.loads((tmp_path / "run" / "ckpt" / jid / "result.json").read_text())
            assert result["steps"] == total  # exact: no step lost or done twice past the end
            assert result["final_loss"] < result["first_loss"], result
        # A job that was running when the controller died went on without a restart.
        for jid, gen in gen_before.items():
            assert jobs[jid].generation == gen, f"{jid} was relaunched by the controller restart"
        store = Store(tmp_path / "run" / "state.db")
        resumes = store.events(kind="resume")
        assert any(e["job_id"] == a and e["resumed_from"] > 0 for e in resumes), resumes
        for e in resumes:  # every resume starts from the last checkpoint the controller had recorded
            assert e["resumed_from"] == e["last_checkpoint"], e
        assert any(e["worker"] == victim for e in store.events(kind="worker_lost"))
        store.close()
        _check_profile(tmp_path, {a: 2, b: 1, cj: 1})
    finally:
        c.close()
        for w in workers.values():
            stop(w)
        stop(ctl)


@pytest.mark.slow
@pytest.mark.skipif(torch_missing, reason="torch is not installed (pip install -e '.[torch]')")
def test_direct_launcher_resizes_an_elastic_job_2_1_2(tmp_path: Path) -> None:
    """The ``direct`` launcher (the worker starts the ranks itself, no torchrun agent): an elastic job shrinks
    2 -> 1 for a newcomer and grows back 1 -> 2 when it ends; each resize checkpoints, relaunches at the new
    size and restores from that checkpoint, and the job ends at its exact step count with a falling loss."""
    from hpcsched.runtime.store import Store

    ctl, addr = start_controller(tmp_path, controller_config(tmp_path, min_runtime_s=2))
    w = start_worker(tmp_path, addr, "w1", slots=2)
    c = client(addr)
    try:
        wait_for("the worker", lambda: any(x.alive for x in c.workers()), 60)
        # 50 ms of emulated IO per step: at 1 proc the job is still running when the newcomer ends, however
        # fast its relaunch and however slow the newcomer's cold start.
        e = submit(c, job_file(tmp_path, "elastic", 2, 400, launcher="direct", min_procs=1,
                            extra=", --report-every, '2', --io-latency-ms, '50'"))
        wait_for("elastic at 2 procs, training", lambda: (j := jobs_by_id(c)[e]).procs == 2 and j.steps_done > 0, 120)
        s = submit(c, job_file(tmp_path, "small", 1, 20, launcher="direct"))
        jobs = wait_for("both jobs finished", lambda: (js := jobs_by_id(c)) and all(
            j.state in ("completed", "failed", "cancelled") for j in js.values()) and js, 300, poll=0.5)
        assert jobs[e].state == jobs[s].state == "completed", (jobs[e].message, jobs[s].message)
        result = json.loads((tmp_path / "run" / "ckpt" / e / "result.json").read_text())
        assert result["steps"] == 400 and result["final_loss"] < result["first_loss"], result
        assert [h["world_size"] for h in result["history"]] == [2, 1, 2], result["history"]
        store = Store(tmp_path / "run" / "state.db")
        resized = [x["procs"] for x in store.events(e, "resized")]
        resumes = store.events(e, "resume")
        store.close()
        assert resized == [1, 2] and jobs[e].last_resize_s > 0
        assert len(resumes) == 2 and all(r["resumed_from"] == r["last_checkpoint"] > 0 for r in resumes), resumes
        # After the first (cold) launch the worker kept a torch-preloaded supervisor ready: the shrink's
        # relaunch forked its rank from it.
        assert f"launched {e}.g2.n0 (direct, 1 procs, warm start)" in (tmp_path / "w1.log").read_text()
    finally:
        c.close()
        stop(w)
        stop(ctl)


def _check_profile(d: Path, sizes: dict[str, int]) -> None:
    """``hpcsched profile`` on the run's state: the simulator's own readers load what it wrote."""
    from hpcsched.traces import read_jobs
    from hpcsched.traces.bftrainer import read_elastic_jobs

    out = d / "profile"
    done = subprocess.run([sys.executable, "-m", "hpcsched.runtime", "profile", "--state", str(d / "run/state.db"),
                           "--out", str(out), "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    jobs = {j.id: j for j in read_jobs(out / "profiles.csv", "muri")}
    assert {k: j.gpus for k, j in jobs.items()} == sizes
    for j in jobs.values():
        assert j.profile is not None and j.profile.compute_s > 0 and j.profile.data_s > 0.02  # 25 ms emulated IO
    curves = {e.id: e for e in read_elastic_jobs(out / "scaling-Jbnd.csv", out / "scaling-JNPs.csv")}
    assert set(curves) == set(sizes)
    for jid, n in sizes.items():
        assert curves[jid].curve.rate(n) > 0


def test_unauthenticated_client_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No token or a wrong token -> UNAUTHENTICATED, logged; the right token works."""
    import grpc

    from hpcsched.runtime.client import ClientError
    from hpcsched.runtime.config import read_controller_config
    from hpcsched.runtime.server import ControllerServer

    srv = ControllerServer(read_controller_config(controller_config(tmp_path)))
    addr = srv.start()
    try:
        with caplog.at_level("WARNING", logger="hpcsched.runtime.auth"):
            for token in (None, "wrong"):
                bad = Client(addr, token)
                with pytest.raises(ClientError, match="UNAUTHENTICATED"):
                    bad.jobs()
                bad.close()
            raw = grpc.insecure_channel(addr)
            from hpcsched.runtime.rpc import pb, pb_grpc

            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.ControllerStub(raw).Heartbeat(pb.HeartbeatRequest(worker_id="intruder"), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            raw.close()
        assert sum("refused" in r.getMessage() for r in caplog.records) >= 3
        good = client(addr)
        assert good.jobs() == []
        good.close()
    finally:
        srv.stop()


mpi_missing = shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None


@pytest.mark.mpi
@pytest.mark.skipif(mpi_missing, reason="needs Open MPI (apt-get install openmpi-bin libopenmpi-dev) and mpi4py")
def test_mpirun_job_across_two_workers_and_cancel(tmp_path: Path) -> None:
    """An mpi4py job placed on two workers runs under one mpirun and finishes exactly; a cancelled job
    checkpoints (SIGTERM through mpirun) and ends cancelled."""
    cfg = controller_config(tmp_path)
    ctl, addr = start_controller(tmp_path, cfg)
    workers = [start_worker(tmp_path, addr, n) for n in ("m1", "m2", "m3")]
    c = client(addr)
    try:
        wait_for("3 workers", lambda: sum(w.alive for w in c.workers()) == 3, 60)
        done = submit(c, job_file(tmp_path, "mpi", 2, 60, launcher="mpirun", program="workloads/mpi_allreduce.py",
                                model=None))
        slow = submit(c, job_file(tmp_path, "slow", 1, 100000, launcher="mpirun", program="workloads/mpi_allreduce.py",
                                model=None))
        wait_for("the slow job checkpointed", lambda: jobs_by_id(c)[slow].last_checkpoint_step >= 10, 60)
        assert c.cancel(slow).cancelled
        jobs = wait_for("both jobs ended", lambda: (js := jobs_by_id(c)) and all(
            j.state in ("completed", "cancelled", "failed") for j in js.values()) and js, 90)
        assert jobs[done].state == "completed" and jobs[done].steps_done == 60
        assert len(json.loads((tmp_path / "run/ckpt" / done / "result.json").read_text())) and \
            jobs[done].last_loss < jobs[done].first_loss
        assert jobs[slow].state == "cancelled"
        assert (tmp_path / "run/ckpt" / slow / "ckpt.npz").exists()
    finally:
        c.close()
        for w in workers:
            stop(w)
        stop(ctl)


horovod_missing = importlib.util.find_spec("horovod") is None or "horovodrun" not in launchers.available()


@pytest.mark.horovod
@pytest.mark.skipif(horovod_missing or torch_missing, reason="needs Horovod with PyTorch (make horovod)")
def test_horovodrun_job(tmp_path: Path) -> None:
    """A Horovod (gloo) job launched by a worker through horovodrun trains to its exact step count."""
    ctl, addr = start_controller(tmp_path, controller_config(tmp_path))
    w = start_worker(tmp_path, addr, "h1", slots=2)
    c = client(addr)
    try:
        jid = submit(c, job_file(tmp_path, "hvd", 2, 40, launcher="horovodrun", program="workloads/horovod_train.py"))
        j = wait_for("the horovod job ended", lambda: (j := jobs_by_id(c)[jid]).state in ("completed", "failed") and j,
                     180, poll=0.5)
        assert j.state == "completed", j.message
        result = json.loads((tmp_path / "run/ckpt" / jid / "result.json").read_text())
        assert result["steps"] == 40 and result["world_size"] == 2
        assert result["final_loss"] < result["first_loss"]
    finally:
        c.close()
        stop(w)
        stop(ctl)
