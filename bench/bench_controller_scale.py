"""The controller's own cost at fleet scale (issue 25), in one process, without gRPC or a harness.

A real ``Controller`` on a real state file (SQLite, WAL), its RPC handlers called directly: --workers workers of
--slots slots register, --jobs jobs (1..4 processes, every fifth elastic 1..4) are queued, and then --rounds rounds
run: in each, every worker heartbeats once (reporting the tasks it was given as running, each with one progress
report, and exiting 0 those that have run --job-beats beats), then one scheduling step runs. So the job churn per
round is the same at every fleet size for the same --jobs and --job-beats, and every figure is the controller's
own work: scheduling step (decision) wall and CPU time, heartbeat handler wall time, peak RSS. Nothing else
competes with it inside the process, but the machine is shared: the load average is printed, and CPU seconds
(``thread_time``) are the steadier figure.

The same script runs against any controller with the same handlers (main before and after this work), so the
before/after figures come from one command:

    PYTHONPATH=. .venv/bin/python bench/bench_controller_scale.py --workers 1000 --jobs 100000 --rounds 8
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.controller import Controller
from hpcsched.runtime.jobfile import parse_job_spec
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.store import Store


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def fill(state: Path, jobs: int) -> None:
    """Queue ``jobs`` jobs straight into the state before the controller opens it (a controller with a backlog)."""
    specs = []
    for k in range(4):
        procs = k + 1
        specs.append(parse_job_spec(f"name: s{procs}\ncommand: [t.py]\nlauncher: direct\nprocs: {procs}\nsteps: 100\n",
                                    "s.yaml"))
        specs.append(parse_job_spec(f"name: e{procs}\ncommand: [t.py]\nlauncher: direct\nmin_procs: 1\n"
                                    f"max_procs: {procs}\nsteps: 100\n", "e.yaml"))
    st = Store(state)
    st.db.execute("PRAGMA synchronous=OFF")
    try:
        for i in range(jobs):
            st.add_job(specs[(i % 4) * 2 + (1 if i % 5 == 0 else 0)], time.time())
    finally:
        st.close()


def run(workers: int, slots: int, jobs: int, rounds: int, job_beats: int, d: Path) -> dict:
    cfg_path = d / "controller.yaml"
    cfg_path.write_text("listen: 127.0.0.1:0\nstate: run/state.db\ncheckpoint_root: run/ckpt\n"
                        "worker_timeout_s: 600\nmin_runtime_s: 0\n")
    t0 = time.perf_counter()
    fill(d / "run" / "state.db", jobs)
    fill_s = time.perf_counter() - t0
    ctl = Controller(read_controller_config(cfg_path))
    ctl.started()
    names = [f"w{i:05d}" for i in range(workers)]
    reg = []
    for w in names:
        t = time.perf_counter()
        ctl.register(pb.RegisterRequest(worker_id=w, host="127.0.0.1", slots=slots, cpus=slots, launchers=["direct"],
                                        instance=w))
        reg.append(time.perf_counter() - t)
    have: dict[str, dict[str, list]] = {w: {} for w in names}  # worker -> task -> [LaunchTask, beats, running]
    hb, hb_cpu, step, step_cpu = [], [], [], []
    for r in range(rounds):
        for w in names:
            tasks = []
            for tid, (launch, beats, _) in list(have[w].items()):
                beats += 1
                done = beats >= job_beats
                prog = [pb.Progress(step=min(100, beats * 10), loss=1.0, time=time.time(), world_size=launch.world_size,
                                    resumed_from=-1, done=done)]
                tasks.append(pb.TaskStatus(task_id=tid, job_id=launch.job_id, generation=launch.generation,
                                           running=not done, exit_code=0, progress=prog))
                have[w][tid] = [launch, beats, not done]
            req = pb.HeartbeatRequest(worker_id=w, instance=w, spare_port=20000 + r, tasks=tasks)
            t, c = time.perf_counter(), time.thread_time()
            reply = ctl.heartbeat(req)
            hb.append(time.perf_counter() - t)
            hb_cpu.append(time.thread_time() - c)
            for tid in reply.forget:
                have[w].pop(tid, None)
            for k in reply.kill:
                if k.task_id in have[w]:
                    have[w][k.task_id][1] = job_beats  # exits at its next report
            for launch in reply.launch:
                have[w].setdefault(launch.task_id, [launch, 0, True])
        t, c = time.perf_counter(), time.thread_time()
        ctl.tick()
        step.append(time.perf_counter() - t)
        step_cpu.append(time.thread_time() - c)
    states: dict[str, int] = {}
    for s in ("pending", "running", "stopping", "completed"):
        states[s] = len(ctl.store.jobs((s,)))
    ctl.store.close()
    ms = 1e3
    return {
        "workers": workers, "slots": slots, "jobs": jobs, "rounds": rounds, "job_beats": job_beats,
        "fill_s": round(fill_s, 1),
        "register_ms_p50_p99": [round(_q(reg, 0.5) * ms, 2), round(_q(reg, 0.99) * ms, 2)],
        "heartbeat_ms_p50_p99_max": [round(_q(hb, 0.5) * ms, 2), round(_q(hb, 0.99) * ms, 2), round(max(hb) * ms, 1)],
        "heartbeat_cpu_ms_mean": round(statistics.fmean(hb_cpu) * ms, 3),
        "step_s_p50_p99_max": [round(_q(step, 0.5), 3), round(_q(step, 0.99), 3), round(max(step), 3)],
        "step_cpu_s_p50_max": [round(_q(step_cpu, 0.5), 3), round(max(step_cpu), 3)],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "jobs_after": states, "load": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--job-beats", type=int, default=4, help="heartbeats a task runs before it exits 0")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ctl-scale-") as tmp:
        out = run(a.workers, a.slots, a.jobs, a.rounds, a.job_beats, Path(tmp))
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
