"""Runtime benchmarks (issue 6): heartbeat RPC latency at 256 workers, and the time of a 2-process resize.

1. Heartbeats: a real controller process on loopback; 256 simulated workers register, receive launches
   for 128 one-process jobs, report their tasks running with one progress report per heartbeat (so the
   controller writes SQLite on every call), at one heartbeat per worker per second, phases spread evenly
   (worker i starts at i/n of the interval: deterministic). The workers are split over ``--clients``
   processes (grpc.aio each): one Python process driving 256 of them adds its own event-loop lag to
   every latency, which is measured and printed (``loop_lag``). Reported: client-side latency of every
   Heartbeat RPC (all calls, and after the ``--warmup`` seconds of registration and first placements),
   and the controller's own handler time (its ``rpc_stats_file``). Target: client p99 < 50 ms.
2. Resize: a real controller and one 2-slot worker; an elastic job (1..2 procs) of
   ``workloads/ddp_train.py`` runs at 2, a second job arrives and the first shrinks to 1 (checkpoint,
   stop, relaunch, restore), then grows back to 2 when the second ends. The controller records stop ->
   first progress at the new size; target < 10 s. Run once per ``--launchers`` entry (``direct``: the
   worker starts the ranks itself, a relaunch forks them from a torch-preloaded supervisor; ``torchrun``:
   through torchrun's agent). ``events`` is the job's timeline: a relaunch stopped again before its first
   report (a slow start outlived ``min_runtime_s``) has no ``resized`` and is no measured resize.

CPU seconds are printed beside wall seconds: on a shared 2-core machine they are the steadier figure.

    .venv/bin/python bench/bench_runtime.py [--workers 256] [--seconds 15] [--clients 2] [--skip-resize]
        [--launchers direct,torchrun]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
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
from hpcsched.runtime.credentials import credential_metadata  # noqa: E402
from hpcsched.runtime.rpc import pb, pb_grpc  # noqa: E402


async def _sim_worker(stub, i: int, n: int, md, t0: float, until: float, lat: list, interval: float) -> None:
    wid = f"sim{i:03d}"
    reg = await stub.Register(pb.RegisterRequest(worker_id=wid, host="127.0.0.1", slots=1, cpus=1,
                                                 launchers=["torchrun"]), metadata=md)
    md = tuple(md) + credential_metadata(reg.credential)  # Heartbeat speaks for this worker with its own credential
    tasks: dict[str, pb.LaunchTask] = {}
    step = 0
    await asyncio.sleep(interval * i / n)  # spread the phases, as independent daemons are
    while time.time() < until:
        step += 1
        req = pb.HeartbeatRequest(worker_id=wid, spare_port=20000 + i)
        for tid, t in tasks.items():
            p = pb.Progress(step=step, loss=1.0 / step, samples_per_s=100.0, data_s=0.01, compute_s=0.02,
                            comm_s=0.01, world_size=1, time=time.time(), first=step == 1)
            req.tasks.append(pb.TaskStatus(task_id=tid, job_id=t.job_id, generation=t.generation, running=True,
                                           progress=[p]))
        sent = time.perf_counter()
        reply = await stub.Heartbeat(req, metadata=md)
        lat.append((time.time() - t0, time.perf_counter() - sent))
        for t in reply.launch:
            tasks[t.task_id] = t
        await asyncio.sleep(interval)


async def _loop_lag(until: float, lags: list[float], period: float = 0.01) -> None:
    """How late this process's event loop wakes a 10 ms timer: the client's own share of every latency."""
    while time.time() < until:
        t = time.perf_counter()
        await asyncio.sleep(period)
        lags.append(time.perf_counter() - t - period)


async def _client(addr: str, ids: list[int], n: int, t0: float, until: float, interval: float) -> dict:
    lat: list = []
    lags: list[float] = []
    md = metadata(TOKEN)
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = pb_grpc.ControllerStub(ch)
        await asyncio.gather(_loop_lag(until, lags),
                             *(_sim_worker(stub, i, n, md, t0, until, lat, interval) for i in ids))
    return {"lat": lat, "lags": lags}


def _client_process(addr: str, ids: list[int], n: int, seconds: float, interval: float, out, go, t0) -> None:
    out.put("ready")
    go.wait()  # every client process is up (spawn + imports take seconds) before the clock starts
    got = asyncio.run(_client(addr, ids, n, t0.value, t0.value + seconds, interval))
    out.put(got | {"cpu_s": time.process_time()})


def _q(v: list[float], p: float) -> float:
    return sorted(v)[min(len(v) - 1, int(p * len(v)))] * 1e3 if v else float("nan")


def bench_heartbeats(n: int, seconds: float, clients: int, warmup: float) -> dict:
    d = Path(tempfile.mkdtemp(prefix="hpcsched-bench-hb-"))
    stats_file = d / "rpc_stats.json"
    ctl, addr = start_controller(d, controller_config(d, heartbeat_interval_s=1.0, worker_timeout_s=30,
                                                      rpc_stats_file=stats_file))
    try:
        c = client(addr)
        job = d / "job.yaml"
        job.write_text("command: [train.py]\nprocs: 1\nsteps: 1000\n")
        for _ in range(n // 2):
            c.submit(job.read_text(), str(job))
        cpu0 = _cpu_s(ctl.pid)
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that has gRPC threads
        q, go, t0 = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
        procs = [ctx.Process(target=_client_process,
                             args=(addr, list(range(k, n, clients)), n, seconds, 1.0, q, go, t0))
                 for k in range(clients)]
        for p in procs:
            p.start()
        for _ in procs:
            assert q.get(timeout=120) == "ready"
        t0.value = time.time()
        go.set()
        parts = [q.get(timeout=seconds + 120) for _ in procs]
        for p in procs:
            p.join()
        cpu = _cpu_s(ctl.pid) - cpu0
        running = sum(j.state == "running" for j in c.jobs())
        c.close()
    finally:
        stop(ctl)
    server = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    shutil.rmtree(d, ignore_errors=True)
    lat = [x for part in parts for x in part["lat"]]
    lags = [x for part in parts for x in part["lags"]]
    all_s = [x for _, x in lat]
    steady = [x for t, x in lat if t >= warmup]
    hb = server.get("Heartbeat", {})
    return {
        "workers": n, "client_processes": clients, "rpcs": len(lat), "rpc_per_s": len(lat) / seconds,
        "jobs_running": running, "target_p99_ms": 50.0,
        "client_all": {"p50_ms": _q(all_s, 0.5), "p99_ms": _q(all_s, 0.99), "max_ms": max(all_s) * 1e3},
        f"client_after_{warmup:g}s": {"rpcs": len(steady), "p50_ms": _q(steady, 0.5), "p99_ms": _q(steady, 0.99),
                                      "max_ms": max(steady, default=0) * 1e3},
        "server_handler": {k: hb.get(k) for k in ("calls", "p50_ms", "p99_ms", "max_ms")},
        "server_register": server.get("Register"),
        "client_loop_lag": {"p50_ms": _q(lags, 0.5), "p99_ms": _q(lags, 0.99), "max_ms": max(lags, default=0) * 1e3},
        "controller_cpu_ms_per_rpc": cpu / max(1, len(lat)) * 1e3, "controller_cpu_s": cpu,
        "client_cpu_s": sum(part["cpu_s"] for part in parts),
    }


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (load-independent, unlike latency on a shared machine)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def bench_resize(launcher: str) -> dict:
    d = Path(tempfile.mkdtemp(prefix="hpcsched-bench-rs-"))
    cpu0 = os.times()
    wall0 = time.perf_counter()
    ctl, addr = start_controller(d, controller_config(d))
    w = start_worker(d, addr, "r1", slots=2)
    c = client(addr)
    try:
        wait_for("the worker", lambda: any(x.alive for x in c.workers()), 60)
        common = f"launcher: {launcher}\nworkdir: {ROOT}\n"
        cmd = "command: [workloads/ddp_train.py, --checkpoint-every, '10', --io-latency-ms, '{}']\n"
        e = d / "elastic.yaml"  # 40 ms of IO a step: still running at 1 proc when the newcomer ends (cold start)
        e.write_text(f"name: elastic\nprocs: 2\nmin_procs: 1\nmax_procs: 2\nsteps: 800\n{common}{cmd.format(40)}")
        s = d / "small.yaml"
        s.write_text(f"name: small\nprocs: 1\nsteps: 30\n{common}{cmd.format(20)}")
        ej = c.submit(e.read_text(), str(e))
        wait_for("elastic job training at 2", lambda: (j := {x.job_id: x for x in c.jobs()}[ej]).procs == 2
                 and j.steps_done > 0, 120)
        c.submit(s.read_text(), str(s))
        wait_for("all jobs done", lambda: all(x.state == "completed" for x in c.jobs()), 300, poll=0.5)
        steps = {x.name: x.steps_done for x in c.jobs()}
    finally:
        c.close()
        stop(w)
        stop(ctl)
    cpu1 = os.times()
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
    # Children's CPU: controller, worker and (reaped below the worker) every launcher and training process.
    cpu = (cpu1.children_user + cpu1.children_system) - (cpu0.children_user + cpu0.children_system)
    t_first = ev[0]["time"] if ev else 0.0
    timeline = [f"{e['time'] - t_first:.2f} {e['kind']} {e.get('reason') or e.get('procs') or ''}".strip() for e in ev]
    return {"launcher": launcher, "events": timeline, "resizes": resizes,
            "max_s": max((r["total_s"] for r in resizes), default=None), "target_s": 10.0, "steps": steps,
            "run_wall_s": round(time.perf_counter() - wall0, 1), "run_cpu_s_all_processes": round(cpu, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--clients", type=int, default=2, help="client processes the simulated workers are split over")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of registration burst left out of 'after'")
    ap.add_argument("--skip-resize", action="store_true")
    ap.add_argument("--skip-heartbeats", action="store_true")
    ap.add_argument("--launchers", default="direct,torchrun", help="launchers to measure the resize with")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    if not args.skip_heartbeats:
        t, c = time.perf_counter(), time.process_time()
        hb = bench_heartbeats(args.workers, args.seconds, args.clients, args.warmup)
        hb["bench_wall_s"], hb["bench_process_cpu_s"] = time.perf_counter() - t, time.process_time() - c
        print(json.dumps({"heartbeats": hb}, indent=1), flush=True)
        p99 = hb["client_all"]["p99_ms"]
        print(f"heartbeat p99 (client, all calls) {p99:.1f} ms vs target 50 ms: ratio {p99 / 50:.2f}; "
              f"server handler p99 {hb['server_handler']['p99_ms']:.1f} ms; "
              f"client loop lag p99 {hb['client_loop_lag']['p99_ms']:.1f} ms")
    if not args.skip_resize:
        for launcher in args.launchers.split(","):
            rs = bench_resize(launcher)
            print(json.dumps({"resize": rs}, indent=1), flush=True)
            if rs["max_s"] is not None:
                print(f"slowest 2-process resize ({launcher}) {rs['max_s']:.1f} s vs target 10 s: "
                      f"ratio {rs['max_s'] / 10:.2f}")
    print(f"load average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
