"""Runtime benchmarks (issue 6): heartbeat RPC latency at 256 workers, and the time of a 2-process resize.

1. Heartbeats: a real controller process on loopback; 256 simulated workers (grpc.aio, one process)
   register, receive launches for 128 one-process jobs, report their tasks running with one progress
   report per heartbeat (so the controller writes SQLite on every call), at one heartbeat per worker
   per second. Client-side latency of every Heartbeat RPC; target p99 < 50 ms.
2. Resize: a real controller and one 2-slot worker running torchrun; an elastic job (1..2 procs) runs at
   2, a second job arrives and the first shrinks to 1 (checkpoint, stop, relaunch, restore), then grows
   back to 2 when the second ends. The controller records stop -> first progress at the new size;
   target < 10 s.

    .venv/bin/python bench/bench_runtime.py [--workers 256] [--seconds 15] [--skip-resize]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_runtime_e2e import (  # noqa: E402  (the tests' process helpers: start exactly as a user does)
    TOKEN,
    client,
    controller_config,
    start_controller,
    start_worker,
    stop,
    wait_for,
)

from hpcsched.runtime.auth import metadata  # noqa: E402
from hpcsched.runtime.rpc import pb, pb_grpc  # noqa: E402


async def _sim_worker(stub, wid: str, md, until: float, lat: list[float], interval: float) -> None:
    await stub.Register(pb.RegisterRequest(worker_id=wid, host="127.0.0.1", slots=1, cpus=1,
                                           launchers=["torchrun"]), metadata=md)
    tasks: dict[str, pb.LaunchTask] = {}
    step = 0
    await asyncio.sleep(interval * (hash(wid) % 1000) / 1000)  # spread the phases, as real daemons are
    while time.time() < until:
        step += 1
        req = pb.HeartbeatRequest(worker_id=wid, spare_port=20000 + hash(wid) % 20000)
        for tid, t in tasks.items():
            p = pb.Progress(step=step, loss=1.0 / step, samples_per_s=100.0, data_s=0.01, compute_s=0.02,
                            comm_s=0.01, world_size=1, time=time.time(), first=step == 1)
            req.tasks.append(pb.TaskStatus(task_id=tid, job_id=t.job_id, generation=t.generation, running=True,
                                           progress=[p]))
        t0 = time.perf_counter()
        reply = await stub.Heartbeat(req, metadata=md)
        lat.append(time.perf_counter() - t0)
        for t in reply.launch:
            tasks[t.task_id] = t
        await asyncio.sleep(interval)


async def _heartbeats(addr: str, n: int, seconds: float, interval: float) -> list[float]:
    lat: list[float] = []
    md = metadata(TOKEN)
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = pb_grpc.ControllerStub(ch)
        until = time.time() + seconds
        await asyncio.gather(*(_sim_worker(stub, f"sim{i:03d}", md, until, lat, interval) for i in range(n)))
    return lat


def bench_heartbeats(n: int, seconds: float) -> dict:
    d = Path(tempfile.mkdtemp(prefix="hpcsched-bench-hb-"))
    ctl, addr = start_controller(d, controller_config(d, heartbeat_interval_s=1.0, worker_timeout_s=30))
    try:
        c = client(addr)
        job = d / "job.yaml"
        job.write_text("command: [train.py]\nprocs: 1\nsteps: 1000\n")
        for _ in range(n // 2):
            c.submit(job.read_text(), str(job))
        cpu0 = _cpu_s(ctl.pid)
        lat = sorted(asyncio.run(_heartbeats(addr, n, seconds, 1.0)))
        cpu = _cpu_s(ctl.pid) - cpu0
        running = sum(j.state == "running" for j in c.jobs())
        c.close()
    finally:
        stop(ctl)
        shutil.rmtree(d, ignore_errors=True)
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3  # noqa: E731
    return {"workers": n, "rpcs": len(lat), "rpc_per_s": len(lat) / seconds, "jobs_running": running,
            "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": lat[-1] * 1e3, "target_p99_ms": 50.0,
            "controller_cpu_ms_per_rpc": cpu / len(lat) * 1e3, "controller_cpu_share": cpu / seconds}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (load-independent, unlike latency on a shared machine)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def bench_resize() -> dict:
    d = Path(tempfile.mkdtemp(prefix="hpcsched-bench-rs-"))
    ctl, addr = start_controller(d, controller_config(d))
    w = start_worker(d, addr, "r1", slots=2)
    c = client(addr)
    try:
        wait_for("the worker", lambda: any(x.alive for x in c.workers()), 60)
        common = "command: [workloads/ddp_train.py, --checkpoint-every, '10', --io-latency-ms, '20']\n"
        e = d / "elastic.yaml"
        e.write_text(f"name: elastic\nprocs: 2\nmin_procs: 1\nmax_procs: 2\nsteps: 400\nworkdir: {ROOT}\n{common}")
        s = d / "small.yaml"
        s.write_text(f"name: small\nprocs: 1\nsteps: 30\nworkdir: {ROOT}\n{common}")
        ej = c.submit(e.read_text(), str(e))
        wait_for("elastic job training at 2", lambda: (j := {x.job_id: x for x in c.jobs()}[ej]).procs == 2
                 and j.steps_done > 0, 120)
        c.submit(s.read_text(), str(s))
        wait_for("all jobs done", lambda: all(x.state == "completed" for x in c.jobs()), 300, poll=0.5)
    finally:
        c.close()
        stop(w)
        stop(ctl)
    from hpcsched.runtime.store import Store

    st = Store(d / "run" / "state.db")
    ev = [e for e in st.events(ej) if e["kind"] in ("stop", "stopped", "start", "resized")]
    st.close()
    shutil.rmtree(d, ignore_errors=True)
    resizes = []
    for i, e in enumerate(ev):  # stop -> stopped (checkpoint, exit) -> start (placed) -> resized (training again)
        if e["kind"] == "stop" and e["reason"] == "resize":
            nxt = {x["kind"]: x for x in reversed(ev[i + 1:i + 4])}
            if {"stopped", "start", "resized"} <= set(nxt):
                resizes.append({"to_procs": nxt["resized"]["procs"], "total_s": round(nxt["resized"]["seconds"], 2),
                                "checkpoint_and_exit_s": round(nxt["stopped"]["time"] - e["time"], 2),
                                "reschedule_s": round(nxt["start"]["time"] - nxt["stopped"]["time"], 2),
                                "relaunch_to_first_report_s": round(nxt["resized"]["time"] - nxt["start"]["time"], 2)})
    return {"resizes": resizes, "max_s": max((r["total_s"] for r in resizes), default=None), "target_s": 10.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--skip-resize", action="store_true")
    args = ap.parse_args()
    hb = bench_heartbeats(args.workers, args.seconds)
    print(json.dumps({"heartbeats": hb}, indent=1), flush=True)
    print(f"heartbeat p99 {hb['p99_ms']:.1f} ms vs target 50 ms: ratio {hb['p99_ms'] / 50:.2f}")
    if not args.skip_resize:
        rs = bench_resize()
        print(json.dumps({"resize": rs}, indent=1))
        if rs["max_s"] is not None:
            print(f"slowest 2-process resize {rs['max_s']:.1f} s vs target 10 s: ratio {rs['max_s'] / 10:.2f}")


if __name__ == "__main__":
    main()
