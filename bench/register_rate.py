"""Registration throughput of a real controller: N Registers, C in flight, over K connections made beforehand.

A real ``hpcsched controller`` process (the fleet harness's config, ``fleet.controller_config``) and one asyncio
client process: the K channels are connected first, so what is measured is the controller's side of a registration
storm (its gRPC server, its Register path), not N new connections (``bench_fleet.py`` measures those too). A shed
Register is sent again after the retry-after it was told (``liveness.told_retry_after``), as a worker does. Printed
(one JSON line): the time until all N registered, registrations a second, the controller's CPU seconds over that
phase (``/proc/PID/stat``) and per registration, Register latency p50 / p99, errors by code, the load before and
after. Run it against two checkouts, interleaved, and say the load::

    PYTHONPATH=$PWD .venv/bin/python bench/register_rate.py 4000 200 50
    PYTHONPATH=$PWD .venv/bin/python bench/register_rate.py 3000 3000 3000 fresh   # connections made by the storm
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import grpc
from fleet import TOKEN, FleetOptions, controller_config, loadavg, stop_controller

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the suite's process helpers
from runtime_procs import start_controller  # noqa: E402

from hpcsched.runtime.auth import metadata
from hpcsched.runtime.liveness import told_retry_after
from hpcsched.runtime.rpc import pb, pb_grpc


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


async def measure(address: str, pid: int, n: int, inflight: int, channels: int, fresh: bool = False) -> dict:
    """``fresh``: the channels connect with their first Register, inside the timed phase (as a storm of pilots)."""
    chans = [grpc.aio.insecure_channel(address, options=(("grpc.use_local_subchannel_pool", 1), ("k", k)))
             for k in range(channels)]
    if not fresh:
        for c in chans:
            await c.channel_ready()
    stubs = [pb_grpc.ControllerStub(c) for c in chans]
    md = metadata(TOKEN)
    gate = asyncio.Semaphore(inflight)
    lat: list[float] = []
    errors: dict[str, int] = {}
    c0, t0 = cpu_s(pid), time.perf_counter()

    async def register(i: int) -> None:
        async with gate:
            while True:
                sent = time.perf_counter()
                try:
                    await stubs[i % channels].Register(pb.RegisterRequest(
                        worker_id=f"w{i}", host="127.0.0.1", slots=4, cpus=4, launchers=["direct"], instance=f"i{i}"),
                        metadata=md, timeout=30)
                    lat.append(time.perf_counter() - sent)
                    return
                except grpc.RpcError as e:
                    errors[e.code().name] = errors.get(e.code().name, 0) + 1
                    await asyncio.sleep(told_retry_after(e.trailing_metadata()) or 0.2)

    await asyncio.gather(*(register(i) for i in range(n)))
    took, used = time.perf_counter() - t0, cpu_s(pid) - c0
    for c in chans:
        await c.close()
    lat.sort()
    return {"n": n, "inflight": inflight, "channels": channels, "fresh_connections": fresh,
            "registered_s": round(took, 2), "per_s": round(n / took), "controller_cpu_s": round(used, 2),
            "controller_cpu_ms_per_registration": round(used / n * 1e3, 3),
            "p50_ms": round(lat[len(lat) // 2] * 1e3, 1), "p99_ms": round(lat[int(0.99 * len(lat))] * 1e3, 1),
            "errors": errors}


def main() -> None:
    n, inflight, channels = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    fresh = sys.argv[4:5] == ["fresh"]
    d = Path(tempfile.mkdtemp(prefix="hpcsched-register-rate-"))
    load = loadavg()
    ctl, address = start_controller(d, controller_config(d, FleetOptions(workers=n, worker_timeout_s=60)),
                                    timeout_s=120)
    try:
        out = asyncio.run(measure(address, ctl.pid, n, inflight, channels, fresh))
    finally:
        stop_controller(ctl)
    print(json.dumps(out | {"load_start": load, "load_end": loadavg()}))


if __name__ == "__main__":
    main()
