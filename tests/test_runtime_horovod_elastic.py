"""Elastic Horovod resizes in place: a real ``horovodrun`` (gloo, loopback) launched by the worker grows and
shrinks when the worker rewrites its host list, without restarting the surviving rank or reloading a checkpoint."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from runtime_procs import no_horovod

from hpcsched.runtime import horovod_elastic, launchers
from hpcsched.runtime.hostaddr import spare_port
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.worker import Worker
from hpcsched.runtime.worker_config import WorkerConfig

REPO = Path(__file__).resolve().parents[1]
STEPS = 160  # enough that the grow lands before the end; few enough to finish soon after it

horovod_missing = no_horovod()


def elastic_task(tmp: Path, lo: int = 1, hi: int = 2, world: int = 2, generation: int = 1,
                 steps: int = STEPS) -> pb.LaunchTask:
    """The LaunchTask a controller would send for a Horovod job of [lo, hi] processes placed at ``world`` here."""
    ckpt = tmp / "ckpt"
    env = {"HPCSCHED_WORKDIR": str(REPO), "HPCSCHED_STEPS": str(steps), "HPCSCHED_GENERATION": str(generation),
           "HPCSCHED_CHECKPOINT_DIR": str(ckpt), horovod_elastic.MIN_ENV: str(lo), horovod_elastic.MAX_ENV: str(hi)}
    # 50 ms of emulated I/O per step paces the run (~10 steps/s at 2 ranks) so the resizes land mid-training.
    return pb.LaunchTask(task_id=f"hvd.g{generation}.n0", job_id="hvd", generation=generation, launcher="horovodrun",
                         command=["workloads/horovod_train.py", "--io-latency-ms", "50", "--checkpoint-every", "50",
                                  "--commit-every", "5"],
                         env=env, node_rank=0, nnodes=1, nprocs=world, world_size=world, master_addr="127.0.0.1",
                         master_port=spare_port("127.0.0.1"), checkpoint_dir=str(ckpt), hosts=[f"127.0.0.1:{world}"])


def reports(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # being written
    return out


def wait_until(what: str, cond, timeout_s: float):  # noqa: ANN001, ANN202
    end = time.time() + timeout_s
    while time.time() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def reference_weights(steps: int) -> dict:
    """The same training (the workload's defaults: CNN, seed 0, SGD lr 0.05 momentum 0.9, global batch 32) on one
    process with plain torch. The global batch is fixed, so every world size computes the same averaged gradient:
    an unresized 2-rank run ends within 3e-7 of it at 160 steps, one lost or repeated step moves it by ~0.09."""
    import sys

    import torch

    sys.path.insert(0, str(REPO / "workloads"))
    from models import batch, build

    torch.manual_seed(0)
    model = build("cnn")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        x, y = batch("cnn", 0, step, 32, 0, 1)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.state_dict()


def test_elastic_command_and_host_list(tmp_path: Path) -> None:
    """The rigid command's ``-H`` list becomes the discovery script; the script prints the merged host list,
    and a rewrite changes what it prints. Rigid jobs (or other launchers) keep their command."""
    t = elastic_task(tmp_path)
    argv, _ = launchers.build(t, "python", "")
    cmd = horovod_elastic.elastic_command(argv, t, tmp_path / "task")
    assert "-H" not in cmd and cmd[cmd.index("--min-np") + 1] == "1" and cmd[cmd.index("--max-np") + 1] == "2"
    script = Path(cmd[cmd.index("--host-discovery-script") + 1])
    assert subprocess.run([script], capture_output=True, text=True, check=True).stdout == "127.0.0.1:2\n"
    assert horovod_elastic.resize(tmp_path / "task", ["127.0.0.1:1", "10.0.0.2:1"]) == 2
    assert subprocess.run([script], capture_output=True, text=True, check=True).stdout == "127.0.0.1:1\n10.0.0.2:1\n"
    rigid = elastic_task(tmp_path, lo=2, hi=2)
    assert horovod_elastic.size_range(rigid) is None
    assert horovod_elastic.elastic_command(argv, rigid, tmp_path / "rigid") == argv
    with pytest.raises(ValueError, match="no elastic Horovod task"):
        horovod_elastic.resize(tmp_path / "rigid", ["127.0.0.1:1"])
    with pytest.raises(ValueError, match="outside the job's range 1..2"):
        horovod_elastic.resize(tmp_path / "task", ["127.0.0.1:3"])
    with pytest.raises(ValueError, match="host:slots"):
        horovod_elastic.host_lines(["127.0.0.1"])
    # a failed host may be used again after a cooldown (a pilot back on a preempted node)
    i = cmd.index("--blacklist-cooldown-range")
    assert tuple(int(x) for x in cmd[i + 1:i + 3]) == horovod_elastic.BLACKLIST_COOLDOWN_S
    # node 0 at a loopback address no interface holds (a pilot at 127.0.0.13): Horovod would reach it through ssh,
    # and its own worker refuses that, so its entry is localhost in the -H list and in every discovery list
    pilot = pb.LaunchTask()
    pilot.CopyFrom(t)
    del pilot.hosts[:]
    pilot.hosts.extend(["127.0.0.13:1", "127.0.0.12:1"])
    argv, _ = launchers.build(pilot, "python", "")
    assert argv[argv.index("-H") + 1] == "localhost:1,127.0.0.12:1"
    cmd = horovod_elastic.elastic_command(argv, pilot, tmp_path / "pilot")
    script = Path(cmd[cmd.index("--host-discovery-script") + 1])
    assert subprocess.run([script], capture_output=True, text=True, check=True).stdout == "localhost:1\n127.0.0.12:1\n"
    horovod_elastic.resize(tmp_path / "pilot", ["127.0.0.13:1", "127.0.0.12:0", "127.0.0.14:1"])
    assert subprocess.run([script], capture_output=True, text=True, check=True).stdout == "localhost:1\n127.0.0.14:1\n"


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.skipif(horovod_missing, reason="needs Horovod with PyTorch (make horovod)")
def test_horovod_job_shrinks_and_grows_in_place(tmp_path: Path) -> None:
    """2 -> 1 -> 2 ranks through the worker's host list: rank 0 is the same process throughout, the step count
    never goes back (no checkpoint is reloaded, no process restarts training), and the job ends at exactly
    STEPS with both in-place resizes recorded, the loss down and the weights of an unresized run."""
    w = Worker(WorkerConfig(controller=f"127.0.0.1:{spare_port('127.0.0.1')}", name="h1", slots=2,
                            work_dir=tmp_path / "w"))  # never dials its controller: the test gives the orders
    t = elastic_task(tmp_path)
    task_dir = tmp_path / "w" / t.task_id
    progress = task_dir / "progress.jsonl"
    pool = ThreadPoolExecutor(1)
    try:
        w.launch(t)
        # The reference (torch import + 160 steps, ~20 s at load 11) is computed while the job runs.
        reference = pool.submit(reference_weights, STEPS)
        proc = w.tasks[t.task_id].proc
        wait_until("training at 2 ranks",
                   lambda: any(r["step"] >= 5 and r["world_size"] == 2 for r in reports(progress)), 120)
        assert w.resize_in_place(t.task_id, ["127.0.0.1:1"])
        wait_until("training at 1 rank", lambda: any(r["world_size"] == 1 for r in reports(progress)), 60)
        assert w.resize_in_place(t.task_id, ["127.0.0.1:2"])
        wait_until("the job ended", lambda: proc.poll() is not None, 150)
        assert proc.returncode == 0, (task_dir / "output.log").read_text()[-3000:]
    finally:
        w.shutdown()
        pool.shutdown(wait=False, cancel_futures=True)
    seen = reports(progress)
    sizes = [r["world_size"] for r in seen]
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2, sizes
    assert len({r["pid"] for r in seen}) == 1, "rank 0 was restarted"
    assert sum(r["first"] for r in seen) == 1 and all(r["resumed_from"] == -1 for r in seen)
    steps = [r["step"] for r in seen]
    assert steps == sorted(steps) and steps[-1] == STEPS and seen[-1]["done"]
    in_place = [r for r in seen if r.get("resized_in_place")]
    assert [(r["from_world_size"], r["world_size"]) for r in in_place] == [(2, 1), (1, 2)]
    result = json.loads((tmp_path / "ckpt" / "result.json").read_text())
    assert result["steps"] == STEPS and result["world_size"] == 2
    assert [h["world_size"] for h in result["history"] if "in_place_at" in h] == [1, 2]
    assert result["final_loss"] < result["first_loss"]
    # No step lost or repeated, and the newcomer trained from the survivors' state: the weights are those of an
    # unresized run.
    import torch

    final = torch.load(tmp_path / "ckpt" / "ckpt.pt", weights_only=False)
    assert final["step"] == STEPS
    for name, want in reference.result().items():
        torch.testing.assert_close(final["model"][name], want, rtol=0, atol=1e-4, msg=name)
    times = horovod_elastic.resize_times(task_dir)
    assert [(r.from_size, r.to_size) for r in times] == [(2, 1), (1, 2)]
    assert all(r.seconds is not None and r.seconds > 0 for r in times)
    print("in-place resize 2->1 / 1->2:", " / ".join(f"{r.seconds:.2f} s" for r in times))
