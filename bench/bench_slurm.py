"""Slurm integration timings on the real loopback cluster (scripts/slurm_cluster.sh up first).

Prints: the live source's poll time; and, for a 4-node scavenger run of hpcsched.slurm.dp_train
preempted by a 1-node batch job, the seconds from the batch submit to (i) the training's SIGTERM
checkpoint and (ii) the batch job running, against the scavenger partition's GraceTime (the issue
asks the batch job to start within it). Exits 0 with a note when no Slurm answers.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hpcsched.slurm import commands
from hpcsched.slurm.executors import RUNNING, ScavengerExecutor
from hpcsched.slurm.source import SlurmIdleSource
from hpcsched.slurm.spec import elastic_spec

REPS = 3
GRACE_S = 5


def until(pred, timeout: float, step: float = 0.05) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError
        time.sleep(step)
    return time.monotonic()


def preempt_once(tmp: Path, i: int) -> tuple[float, float]:
    spec = elastic_spec({"id": f"b{i}", "jmax": 4, "steps": 100000,
                         "command": ["{python}", "-m", "hpcsched.slurm.dp_train", "--ckpt-dir", "{ckpt_dir}",
                                     "--steps", "{steps}", "--step-time", "0.05"]}, tmp)
    ex = ScavengerExecutor("scavenger", tmp / "logs")
    run = ex.start(spec, ("n1", "n2", "n3", "n4"), i, 0.0)
    until(lambda: ex.state(run)[0] == RUNNING and spec.progress_step() > 5, 60)
    t0 = time.monotonic()
    batch = commands.run(["sbatch", "--parsable", "-p", "batch", "-N1", "--wrap", "sleep 1"]).strip()

    def stopped() -> bool:
        log = spec.ckpt_dir / "log.jsonl"
        return log.exists() and any(json.loads(x)["event"] == "stop" for x in log.read_text().splitlines())

    t_ckpt = until(stopped, 60) - t0
    t_start = until(lambda: commands.run(["squeue", "-h", "-t", "all", "-j", batch, "-o", "%T"]).strip()
                    in ("RUNNING", "COMPLETING", "COMPLETED"), 60) - t0
    until(lambda: ex.state(run)[0] != RUNNING, 30)
    until(lambda: not commands.run(["squeue", "-h", "-o", "%i"]).strip(), 30)
    return t_ckpt, t_start


def main() -> int:
    why = commands.available()
    if why:
        print(f"skipped: {why}")
        return 0
    src = SlurmIdleSource()
    polls = []
    for _ in range(20):
        t0 = time.perf_counter()
        src.poll()
        polls.append(time.perf_counter() - t0)
    print(f"source poll (sinfo + squeue): median {statistics.median(polls) * 1e3:.0f} ms over 20")
    with tempfile.TemporaryDirectory() as d:
        res = [preempt_once(Path(d), i) for i in range(REPS)]
    ck = [r[0] for r in res]
    st = [r[1] for r in res]
    print(f"batch submit -> harvested job checkpointed on SIGTERM: median {statistics.median(ck):.2f} s "
          f"(max {max(ck):.2f}) over {REPS}")
    print(f"batch submit -> batch job running: median {statistics.median(st):.2f} s (max {max(st):.2f}); "
          f"GraceTime {GRACE_S} s: ratio {max(st) / GRACE_S:.2f} of the grace time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
