"""A scheduling step's own CPU at fleet size, in one process (issue 25): the figure the step's work is judged on.

A real ``Controller`` on a real state file: --workers workers of 4 slots register, --backlog jobs of the fleet
harness's ``mix`` of a GPU type no worker has are queued, the waiting notes settle, then --jobs runnable jobs are
submitted and --rounds rounds run: every worker heartbeats (reporting its tasks, which exit after 3 beats), a tenth
of --jobs more are submitted every other round, and one scheduling step runs. The step's CPU (``thread_time``: the
machine is shared, wall time is not the step's own) and wall time are printed with the load. The same script runs on
any controller with these handlers, so before/after figures come from one command:

    PYTHONPATH=. .venv/bin/python bench/bench_step_cost.py --workers 10000 --backlog 100000 --jobs 500 --rounds 30
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleet  # noqa: E402

from hpcsched.runtime.config import read_controller_config  # noqa: E402
from hpcsched.runtime.controller import Controller  # noqa: E402
from hpcsched.runtime.jobfile import parse_job_spec  # noqa: E402
from hpcsched.runtime.rpc import pb  # noqa: E402
from hpcsched.runtime.store import Store  # noqa: E402


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 4) if xs else 0.0


def run(workers: int, backlog: int, jobs: int, rounds: int, d: Path) -> dict:
    (d / "run").mkdir()
    cfg = d / "controller.yaml"
    cfg.write_text("listen: 127.0.0.1:0\nstate: run/state.db\ncheckpoint_root: run/ckpt\nworker_timeout_s: 600\n"
                   "min_runtime_s: 0\n")
    o = fleet.FleetOptions(workers=workers, jobs=jobs)
    rng = random.Random(1)
    st = Store(d / "run" / "state.db")
    st.db.execute("PRAGMA synchronous=OFF")  # a benchmark's own filling
    specs: dict[str, object] = {}
    for i in range(backlog):
        y = fleet.pending_yaml(i, "mix", rng, o).replace(f"fleet-backlog-{i}", "backlog").replace(f"'{i}'", "b")
        spec = specs.get(y) or specs.setdefault(y, parse_job_spec(y, "backlog.yaml"))
        st.add_job(spec, time.time())
    st.close()
    ctl = Controller(read_controller_config(cfg))
    ctl.started()
    names = [f"w{i:05d}" for i in range(workers)]
    for w in names:
        ctl.register(pb.RegisterRequest(worker_id=w, host="127.0.0.1", slots=4, cpus=4, launchers=["direct"],
                                        instance=w))
    t0, settle = time.perf_counter(), 0
    while ctl.counters().get("notes_due", 0) or not ctl.plans:  # the backlog's notes written
        ctl.tick()
        settle += 1
    settle_s = time.perf_counter() - t0
    have: dict[str, dict[str, list]] = {w: {} for w in names}
    wall, cpu = [], []
    for i in range(jobs):
        ctl.submit(fleet.job_yaml(i, rng, o), "r.yaml")
    for r in range(rounds):
        for w in names:
            tasks = []
            for tid, (launch, beats) in list(have[w].items()):
                beats += 1
                tasks.append(pb.TaskStatus(task_id=tid, job_id=launch.job_id, generation=launch.generation,
                                           running=beats < 3, exit_code=0,
                                           progress=[pb.Progress(step=beats, time=time.time(), resumed_from=-1,
                                                                 world_size=launch.world_size, done=beats >= 3)]))
                have[w][tid] = [launch, beats]
            reply = ctl.heartbeat(pb.HeartbeatRequest(worker_id=w, instance=w, spare_port=20000 + r, tasks=tasks))
            for tid in reply.forget:
                have[w].pop(tid, None)
            for launch in reply.launch:
                have[w].setdefault(launch.task_id, [launch, 0])
        if r % 2 == 0:
            for i in range(jobs // 10):
                ctl.submit(fleet.job_yaml(10_000 + r * 1000 + i, rng, o), "r.yaml")
        t, c = time.perf_counter(), time.thread_time()
        ctl.tick()
        wall.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
    counters = ctl.counters()
    ctl.store.close()
    return {"workers": workers, "backlog": backlog, "jobs": jobs, "rounds": rounds,
            "settle_steps": settle, "settle_s": round(settle_s, 1),
            "step_cpu_s_p50_p99_max": [_q(cpu, 0.5), _q(cpu, 0.99), round(max(cpu), 4)],
            "step_wall_s_p50_p99_max": [_q(wall, 0.5), _q(wall, 0.99), round(max(wall), 4)],
            "planned_steps": counters["planned_steps"], "load": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--backlog", type=int, default=10000)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        print(json.dumps(run(a.workers, a.backlog, a.jobs, a.rounds, Path(tmp))))


if __name__ == "__main__":
    main()
