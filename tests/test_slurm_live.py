"""Harvesting against a REAL Slurm: the 4-node loopback cluster of scripts/slurm_cluster.sh.

Skipped with the reason when no Slurm controller answers (run `scripts/slurm_cluster.sh up` as root;
`.ci/run` does). Each test starts from a clean cluster: no jobs, every node idle and its slurmd up.
The training job is ``hpcsched.slurm.dp_train`` (real numpy data-parallel logistic regression with
checkpoint/resume), paced to 50 ms a step so that resizes happen mid-run.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from hpcsched.metrics import summarize
from hpcsched.results import read_results
from hpcsched.slurm import commands
from hpcsched.slurm.dp_train import main as train_main
from hpcsched.slurm.executors import LocalExecutor, ScavengerExecutor
from hpcsched.slurm.harvester import HarvestConfig, Harvester
from hpcsched.slurm.record import Recorder
from hpcsched.slurm.source import SlurmIdleSource
from hpcsched.slurm.spec import ElasticSpec, elastic_spec

WHY_NOT = commands.available()
pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no real Slurm: {WHY_NOT}")]

NODES = ("n1", "n2", "n3", "n4")
GRACE_S = 5  # scavenger partition's GraceTime in deploy/slurm/slurm.conf
CKPT_EVERY = 25


def sh(*argv: str) -> str:
    return commands.run(argv)


def wait_for(pred: Callable[[], object], timeout: float, what: str, step: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; sinfo:\n{sh('sinfo', '-N')}")
        time.sleep(step)


def slurmd_alive(node: str) -> bool:
    try:
        os.kill(int(Path(f"/run/slurmd-{node}.pid").read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def states() -> dict[str, str]:
    return dict(line.split() for line in sh("sinfo", "-N", "-h", "-p", "batch", "-o", "%N %T").splitlines())


@pytest.fixture(autouse=True)
def clean_cluster() -> Iterator[None]:
    def reset() -> None:
        ids = sh("squeue", "-h", "-o", "%i").split()
        if ids:
            sh("scancel", *ids)
        for n in NODES:
            if not slurmd_alive(n):
                subprocess.run(["/usr/sbin/slurmd", "-N", n], check=True)
            if states().get(n, "").startswith("drain"):
                sh("scontrol", "update", f"NodeName={n}", "State=RESUME")
        wait_for(lambda: set(states().values()) == {"idle"}, 60, "all nodes idle")

    reset()
    yield
    reset()


@pytest.fixture
def harvesters() -> Iterator[list[Harvester]]:
    """Harvesters a test made; on teardown (a failed test too) their runs are stopped, none orphaned."""
    made: list[Harvester] = []
    yield made
    for h in made:
        if h.runs:
            h.shutdown(wait_s=10)


def harvester(made: list[Harvester], spec: ElasticSpec, out: Path, mode: str = "scavenger", **cfg: float
              ) -> Harvester:
    """A harvester over the live Slurm for one job, stopped at teardown (``harvesters`` fixture)."""
    ex = ScavengerExecutor("scavenger", out / "logs") if mode == "scavenger" else LocalExecutor(out / "logs")
    h = Harvester(SlurmIdleSource(), ex, [spec], Recorder(out), HarvestConfig(**cfg))
    made.append(h)
    return h


def dp_spec(out: Path, steps: int) -> ElasticSpec:
    return elastic_spec({"id": "lr", "jmax": 4, "steps": steps, "scale_up_s": 1, "scale_down_s": 1,
                         "command": ["{python}", "-m", "hpcsched.slurm.dp_train", "--ckpt-dir", "{ckpt_dir}",
                                     "--steps", "{steps}", "--ckpt-every", str(CKPT_EVERY), "--step-time", "0.05"]},
                        out)


def reference_weights(tmp: Path, steps: int) -> np.ndarray:
    """The same training run start to end on one process: what every resized run must end with."""
    assert train_main(["--ckpt-dir", str(tmp), "--steps", str(steps), "--ckpt-every", str(CKPT_EVERY)]) == 0
    return np.load(tmp / "ckpt.npz")["w"]


def sizes(h: Harvester, job: str = "lr") -> int:
    run = h.runs.get(job)
    return len(run.nodes) if run is not None and run.running_since is not None and not run.stop_requested else 0


def drive(h: Harvester, until: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        assert not h.done or until(), f"job finished before {what}"
        t0 = time.monotonic()
        h.step()
        time.sleep(max(0.0, h.cfg.poll_s - (time.monotonic() - t0)))


def events(out: Path) -> list[dict[str, str]]:
    with (out / "events.csv").open() as f:
        return list(csv.DictReader(f))


def test_pool_follows_drain_batch_jobs_and_a_killed_slurmd() -> None:
    src = SlurmIdleSource()
    ev = src.poll()
    assert ev is not None and ev.joined == NODES and ev.left == ()

    def next_event(timeout: float) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]:
        got: list = []
        wait_for(lambda: got.append(src.poll()) or got[-1] is not None, timeout, "a pool change")
        return got[-1].joined, got[-1].left, src.reasons

    sh("scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=hpcsched-test")
    joined, left, why = next_event(10)
    assert (joined, left) == ((), ("n2",)) and "drain" in why["n2"]
    sh("scontrol", "update", "NodeName=n2", "State=RESUME")
    assert next_event(10)[:2] == (("n2",), ())

    job = sh("sbatch", "--parsable", "-p", "batch", "-N1", "-w", "n3", "--wrap", "sleep 30").strip()
    joined, left, why = next_event(10)
    # squeue may list the job before sinfo stops saying idle: the reason names the job either way
    assert left == ("n3",) and why["n3"].startswith(f"held by job {job} (batch), "), why
    sh("scancel", job)
    assert next_event(15)[:2] == (("n3",), ())

    os.kill(int(Path("/run/slurmd-n4.pid").read_text()), 9)  # a node dies without a word
    t0 = time.monotonic()
    joined, left, why = next_event(60)
    assert left == ("n4",) and why["n4"].endswith("(not responding)"), why
    print(f"killed slurmd: n4 left the pool after {time.monotonic() - t0:.1f}s ({why['n4']})")
    subprocess.run(["/usr/sbin/slurmd", "-N", "n4"], check=True)
    assert next_event(60)[:2] == (("n4",), ())


def test_elastic_job_yields_to_batch_and_grows_back(tmp_path: Path, harvesters: list[Harvester]) -> None:
    """The issue's done-when: grow onto idle nodes; a batch job preempts; shrink keeping the checkpoint;
    the batch job starts within the grace time; grow back when it ends; a drained node is vacated;
    finish with the exact step count and the weights of an unresized run."""
    steps = 400
    out = tmp_path / "run"
    spec = dp_spec(out, steps)
    h = harvester(harvesters, spec, out, poll_s=0.3, settle_s=3.0)
    drive(h, lambda: sizes(h) == 4 and spec.progress_step() >= 60, 60, "the job running on 4 nodes")

    batch = sh("sbatch", "--parsable", "-p", "batch", "-N1", "--wrap", "sleep 6").strip()
    drive(h, lambda: sh("squeue", "-h", "-j", batch, "-o", "%T").strip() == "RUNNING", 30, "the batch job to start")
    submit, start = sh("squeue", "-h", "-j", batch, "-o", "%V %S").split()
    waited = np.datetime64(start) - np.datetime64(submit)
    assert waited <= np.timedelta64(GRACE_S, "s"), f"batch job waited {waited} for its nodes"
    drive(h, lambda: sizes(h) == 3, 30, "the job to shrink to 3 nodes")
    drive(h, lambda: sizes(h) == 4, 60, "the job to grow back to 4 nodes after the batch job")

    victim = h.runs["lr"].nodes[-1]
    sh("scontrol", "update", f"NodeName={victim}", "State=DRAIN", "Reason=hpcsched-test")
    drive(h, lambda: sizes(h) == 3 and victim not in h.runs["lr"].nodes, 30, f"the job to vacate drained {victim}")
    sh("scontrol", "update", f"NodeName={victim}", "State=RESUME")
    drive(h, lambda: h.done, 120, "the job to finish")
    h.write()

    ev = events(out)
    starts = [e for e in ev if e["event"] == "start"]
    assert [len(e["nodes"].split()) for e in starts][:4] == [4, 3, 4, 3], starts
    preempted = [e for e in ev if e["event"] == "preempted"]
    assert len(preempted) == 2  # the batch job, the drain
    for p in preempted:  # SIGTERM reached the job: it checkpointed where it stopped, nothing lost
        assert int(p["lost_steps"]) == 0 and int(p["ckpt_step"]) > 0
    assert int(starts[1]["ckpt_step"]) == int(preempted[0]["ckpt_step"])  # the restart resumed the checkpoint
    assert spec.checkpoint_step() == spec.progress_step() == steps
    np.testing.assert_allclose(np.load(spec.ckpt_dir / "ckpt.npz")["w"], reference_weights(tmp_path / "ref", steps),
                               rtol=1e-10, atol=1e-12)

    df, meta = read_results(out)
    assert meta["preemptions"] == 2 and meta["max_lost_steps"] == 0
    s = summarize(df, meta)
    assert df.loc[0, "status"] == "completed" and df.loc[0, "nodes"] == 4
    assert 0.5 < s["utilization"] <= 1.0, s  # harvested node-seconds over the pool's node-seconds


def test_requeue_preemption_is_a_preemption_too(tmp_path: Path, harvesters: list[Harvester]) -> None:
    """PreemptMode=REQUEUE: no run of ours is left requeued (it would start ~2 min later, after
    BeginTime); the job restarts on the free nodes at once from its SIGTERM checkpoint and ends exactly.

    Seen on 22.05: a run whose step exits within the grace time completes and is not requeued at all;
    a run Slurm does requeue is cancelled by the harvester (event ``requeued``)."""
    sh("scontrol", "update", "PartitionName=scavenger", "PreemptMode=REQUEUE")
    try:
        steps = 200
        out = tmp_path / "run"
        spec = dp_spec(out, steps)
        h = harvester(harvesters, spec, out, poll_s=0.3, settle_s=2.0)
        drive(h, lambda: sizes(h) == 4 and spec.progress_step() >= 30, 60, "the job running on 4 nodes")
        sh("sbatch", "--parsable", "-p", "batch", "-N2", "--wrap", "sleep 3")
        drive(h, lambda: h.done, 120, "the job to finish")
    finally:
        sh("scontrol", "update", "PartitionName=scavenger", "PreemptMode=CANCEL")
    ev = events(out)
    preempted = [e for e in ev if e["event"] == "preempted"]
    assert preempted and all(int(e["lost_steps"]) == 0 for e in preempted)
    assert not sh("squeue", "-h", "-n", ",".join(f"hpcsched-lr-{i}" for i in range(1, 20)), "-o", "%i").strip()
    assert 2 in [len(e["nodes"].split()) for e in ev if e["event"] == "start"]
    assert spec.checkpoint_step() == spec.progress_step() == steps


def test_local_mode_vacates_nodes_slurm_allocates_or_loses(tmp_path: Path, harvesters: list[Harvester]) -> None:
    """Mode (b): own processes on idle nodes, invisible to Slurm; vacated when Slurm allocates a node
    to a batch job and when a node's slurmd dies, regrown after; the job still ends exactly."""
    steps = 400
    out = tmp_path / "run"
    spec = dp_spec(out, steps)
    h = harvester(harvesters, spec, out, mode="local", poll_s=0.3, settle_s=1.0)
    drive(h, lambda: sizes(h) == 4 and spec.progress_step() >= 40, 60, "the job running on 4 nodes")
    sh("sbatch", "--parsable", "-p", "batch", "-N2", "-w", "n1,n2", "--wrap", "sleep 4")
    os.kill(int(Path("/run/slurmd-n4.pid").read_text()), 9)  # and n4 dies without a word
    drive(h, lambda: sizes(h) == 2, 30, "the job to vacate the 2 nodes Slurm gave the batch job")
    assert set(h.runs["lr"].nodes) == {"n3", "n4"}  # n4 looks fine to Slurm for a while yet
    drive(h, lambda: any(e["event"] == "vacate" and e["nodes"] == "n4" for e in events(out)), 60,
          "n4's dead slurmd noticed")
    drive(h, lambda: sizes(h) == 3, 30, "the job on the 3 live nodes")
    subprocess.run(["/usr/sbin/slurmd", "-N", "n4"], check=True)
    drive(h, lambda: h.done, 150, "the job to finish")
    h.write()

    vacate = {e["nodes"]: e["detail"] for e in events(out) if e["event"] == "vacate"}
    # n1/n2: held by the batch job (squeue may list it before sinfo stops saying idle); n4: idle*
    assert "(batch)" in vacate["n1 n2"] and vacate["n4"].endswith("(not responding)"), vacate
    assert spec.checkpoint_step() == steps
    np.testing.assert_allclose(np.load(spec.ckpt_dir / "ckpt.npz")["w"], reference_weights(tmp_path / "ref", steps),
                               rtol=1e-10, atol=1e-12)
    df, meta = read_results(out)
    assert meta["mode"] == "local" and df.loc[0, "status"] == "completed" and df.loc[0, "start"] >= 0


def test_cli_nodes_json_lists_the_pool() -> None:
    from typer.testing import CliRunner

    from hpcsched.cli import app

    r = CliRunner().invoke(app, ["slurm", "nodes", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["pool"] == list(NODES) and d["nodes"] == dict.fromkeys(NODES, "idle")


RUNTIME_WORKLOAD = Path(__file__).resolve().parents[1] / "workloads" / "ddp_train.py"


@pytest.mark.skipif(os.environ.get("HPCSCHED_SLURM_TORCH") != "1",
                    reason="opt-in (HPCSCHED_SLURM_TORCH=1): torch start-up per restart makes this ~90 s")
@pytest.mark.skipif(not RUNTIME_WORKLOAD.exists(), reason="the runtime's workloads/ddp_train.py is not here")
def test_runtime_ddp_workload_is_preempted_and_finishes(tmp_path: Path, harvesters: list[Harvester]) -> None:
    """The runtime's torch DDP program, unchanged, harvested in mode (a): preempted by a batch job,
    resumed from its checkpoint on fewer nodes, grown back, finished at its exact step count."""
    pytest.importorskip("torch")
    steps = 300
    out = tmp_path / "run"
    spec = elastic_spec({"id": "cnn", "jmax": 2, "steps": steps, "scale_up_s": 5, "scale_down_s": 5,
                         "command": ["{python}", str(RUNTIME_WORKLOAD), "--model", "cnn", "--checkpoint-every", "50",
                                     "--io-latency-ms", "40"]},
                        out)
    h = harvester(harvesters, spec, out, poll_s=0.5)
    drive(h, lambda: sizes(h, "cnn") == 2 and spec.progress_step() >= 20, 120, "the DDP job running on 2 nodes")
    sh("sbatch", "--parsable", "-p", "batch", "-N3", "--wrap", "sleep 8")
    drive(h, lambda: sizes(h, "cnn") == 1, 60, "the job to shrink to 1 node")
    drive(h, lambda: h.done, 240, "the job to finish")
    h.write()
    preempted = [e for e in events(out) if e["event"] == "preempted"]
    assert preempted and all(int(e["lost_steps"]) <= 50 for e in preempted)
    assert json.loads((spec.ckpt_dir / "result.json").read_text())["steps"] == steps


def store_job(state: Path, name: str) -> object | None:
    """The controller's row of harvest job ``name``, read from its state while it runs (read-only, as calc does)."""
    from hpcsched.runtime.statefile import StateNotReady
    from hpcsched.runtime.store import Store

    if not state.exists():
        return None
    try:
        store = Store(state, query_only=True)
    except StateNotReady:  # the controller made the file and has not written its tables yet
        return None
    try:
        return next((j for j in store.jobs() if j.spec.name == name), None)
    finally:
        store.close()


def test_harvest_mode_controller_runs_the_job_on_pilot_workers(tmp_path: Path) -> None:
    """One launch path: `hpcsched slurm harvest` (mode controller, the default) runs the job through the runtime's
    controller on pilot workers: it grows onto the four idle nodes' pilots; a batch job preempts a pilot; the job
    shrinks to 3 with its checkpoint; it grows back to 4 when the batch job ends; it finishes at exactly its step
    count with the weights of an unresized run; events.csv / jobs.csv / meta.json say so, `hpcsched calc` reads
    them, and no pilot is left in Slurm's queue."""
    import sys

    steps = 900  # 45 s at 50 ms a step: outlives Slurm's preemption of a pilot (up to ~30 s) and the regrow
    cfg = tmp_path / "harvest.yaml"
    cfg.write_text(
        "partition: scavenger\npoll_s: 0.5\nmin_runtime_s: 2\npilot: {stop_grace_s: 3}\njobs:\n"
        f"  - {{id: lr, jmax: 4, steps: {steps}, scale_up_s: 1, scale_down_s: 1, command: ['{{python}}', -m, "
        f"hpcsched.slurm.dp_train, --ckpt-dir, '{{ckpt_dir}}', --steps, '{{steps}}', --ckpt-every, '{CKPT_EVERY}', "
        "--step-time, '0.05']}\n")
    out = tmp_path / "out"
    state = out / "run" / "state.db"
    proc = subprocess.Popen([sys.executable, "-m", "hpcsched.cli", "slurm", "harvest", str(cfg), "--out", str(out),
                             "--timeout", "150", "--json"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        def at(procs: int, min_step: int = 0) -> bool:
            j = store_job(state, "lr")
            assert proc.poll() is None, f"harvest ended early: {proc.communicate()}"
            return j is not None and j.state == "running" and j.procs == procs and j.steps_done >= min_step

        wait_for(lambda: at(4, 20), 60, "the job running on 4 pilots")
        batch = sh("sbatch", "--parsable", "-p", "batch", "-N1", "--wrap", "sleep 5").strip()
        # A pilot is a batch script (no job step): Slurm signals it on its periodic timer, not at once (15-30 s,
        # docs/slurm.md "Limits"); the job shrinks as soon as the pilot's worker has the SIGTERM.
        wait_for(lambda: at(3), 45, "the job to shrink to 3 pilots")
        submit, start = sh("squeue", "-h", "-j", batch, "-o", "%V %S").split()
        # informative only: at load the pilot's node may not be free yet when the job has shrunk (start "N/A")
        print(f"batch job started {np.datetime64(start) - np.datetime64(submit)} after its submit" if start != "N/A"
              else "batch job not started yet when the job shrank (its node is still being released)")
        wait_for(lambda: at(4), 60, "the job to grow back to 4 pilots after the batch job")
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.terminate()  # SIGTERM: the controller stops and cancels its pilots
            proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout)
    assert summary["finished"] == 1 and summary["preemptions"] >= 1 and summary["max_lost_steps"] <= CKPT_EVERY
    assert not [n for n, _ in _squeue_names() if n.startswith("hpcsched-pilot-")], "a pilot outlived the harvest"

    ev = events(out)
    starts = [len(e["nodes"].split()) for e in ev if e["event"] == "start"]
    sizes_seen = iter(starts)  # 4, then 3, then 4 again, in that order (a pilot slow to register may add a start)
    assert all(any(n == want for n in sizes_seen) for want in (4, 3, 4)), ev
    preempted = [e for e in ev if e["event"] == "preempted"]
    assert preempted and all(int(e["lost_steps"]) <= CKPT_EVERY for e in preempted), preempted
    assert any(e["event"] == "vacate" for e in ev) and ev[-1]["event"] == "pilot-gone"
    finish = [e for e in ev if e["event"] == "finish"]
    assert len(finish) == 1 and int(finish[0]["step"]) == steps
    df, meta = read_results(out)
    assert meta["mode"] == "controller" and meta["failed_attempts"] == 0 and meta["pilots"] >= 5
    assert meta["preemptions"] == len(preempted) and meta["max_lost_steps"] == max(meta["lost_steps"])
    assert df.loc[0, "status"] == "completed" and df.loc[0, "nodes"] == 4
    ckpt = Path(meta["checkpoint_dirs"]["lr"])
    assert json.loads((ckpt / "checkpoint.json").read_text())["step"] == steps
    np.testing.assert_allclose(np.load(ckpt / "ckpt.npz")["w"], reference_weights(tmp_path / "ref", steps),
                               rtol=1e-10, atol=1e-12)
    from typer.testing import CliRunner

    from hpcsched.cli import app

    r = CliRunner().invoke(app, ["calc", str(out), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert 0.5 < s["utilization"] <= 1.0 and s["preemptions"] == meta["preemptions"], s
    # The same config on the same --out again: the job is the earlier run's (request id harvest:lr), not a new one
    again = subprocess.run([sys.executable, "-m", "hpcsched.cli", "slurm", "harvest", str(cfg), "--out", str(out),
                            "--timeout", "30", "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert again.returncode == 0 and "resumed:" in again.stderr, again.stderr
    assert json.loads(again.stdout)["finished"] == 1 and read_results(out)[1]["resumed_jobs"] == ["lr"]
    assert [e["event"] for e in events(out)].count("start") == len(starts)  # nothing started again


def _squeue_names() -> list[tuple[str, str]]:
    return [tuple(line.split("|", 1)) for line in sh("squeue", "-h", "-o", "%j|%i").splitlines()]
