"""How many calls a second the controller's gRPC server takes: registered workers beating lease-only heartbeats.

A real ``hpcsched controller`` process (the fleet harness's config, ``fleet.controller_config``), WORKERS workers
registered through the real Register RPC, then INFLIGHT heartbeats kept in flight for SECONDS from one asyncio
client process over CHANNELS channels; every heartbeat is lease-only (nothing to reconcile), so the controller's own
work per call is ~20 us and what is measured is the server's per-call cost: calls answered a second and their
latency. Used to choose between gRPC's thread-pool and asyncio servers (bench/RESULTS.md, "the gRPC server as the
limit"): run it against two checkouts, interleaved, and say the load::

    PYTHONPATH=$PWD .venv/bin/python bench/fleet_accept.py 2000 400 10 100

A fifth argument ``lease`` sends the same beats as renewals to the controller's lease server instead (one frame each
way, ``hpcsched/runtime/lease_wire.py``; each in-flight renewal loop on a connection of its own): the per-call cost of
the two servers, side by side (``heartbeat``, the default, is the controller's).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import grpc
from fleet import TOKEN, FleetOptions, controller_config, loadavg, stop_controller, tree_cpu_s

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the suite's process helpers
from runtime_procs import start_controller  # noqa: E402

from hpcsched.runtime.auth import metadata
from hpcsched.runtime.credentials import credential_metadata
from hpcsched.runtime.lease_wire import LeaseError, frame, frame_length
from hpcsched.runtime.rpc import pb, pb_grpc


async def measure(address: str, workers: int, inflight: int, seconds: float, channels: int, lease: bool = False,
                  pid: int = 0) -> dict:
    chans = [grpc.aio.insecure_channel(address, options=(("grpc.use_local_subchannel_pool", 1), ("k", k)))
             for k in range(channels)]
    stubs = [pb_grpc.ControllerStub(c) for c in chans]
    md = metadata(TOKEN)
    mds: dict[int, tuple] = {}
    slots: dict[int, int] = {}
    lease_port = 0
    gate = asyncio.Semaphore(200)
    t0 = time.perf_counter()

    async def register(i: int) -> None:
        async with gate:
            while True:
                try:
                    reply = await stubs[i % channels].Register(pb.RegisterRequest(
                        worker_id=f"w{i}", host="127.0.0.1", slots=4, cpus=4, launchers=["direct"], instance=f"i{i}"),
                        metadata=md, timeout=30)
                    if lease and not reply.lease_port:  # the lease server is not listening yet
                        raise grpc.RpcError()
                    mds[i] = md + credential_metadata(reply.credential)
                    slots[i] = reply.lease_slot
                    nonlocal lease_port
                    lease_port = reply.lease_port
                    return
                except grpc.RpcError:  # shed or slow: again shortly (the figure is the heartbeats', not this)
                    await asyncio.sleep(0.2)

    await asyncio.gather(*(register(i) for i in range(workers)))
    registered_s = time.perf_counter() - t0
    creds = {i: m[-1][1] for i, m in mds.items()}
    lat: list[float] = []
    errors: dict[str, int] = {}
    cpu0 = tree_cpu_s(pid) if pid else {}
    end = time.perf_counter() + seconds

    async def beat(k: int) -> None:
        i = k
        conn = await asyncio.open_connection(address.rpartition(":")[0], lease_port) if lease else None
        while time.perf_counter() < end:
            i = (i + inflight) % workers
            sent = time.perf_counter()
            try:
                if conn is not None:
                    conn[1].write(frame(pb.RenewRequest(worker_id=f"w{i}", instance=f"i{i}", slot=slots[i],
                                                        credential=creds[i])))
                    r = pb.RenewReply.FromString(await conn[0].readexactly(frame_length(await conn[0].readexactly(4))))
                    if r.refused:
                        raise LeaseError("REFUSED", r.refused)
                else:
                    await stubs[i % channels].Heartbeat(pb.HeartbeatRequest(worker_id=f"w{i}", instance=f"i{i}",
                                                                            partial=True), metadata=mds[i], timeout=10)
                lat.append(time.perf_counter() - sent)
            except grpc.RpcError as e:
                errors[e.code().name] = errors.get(e.code().name, 0) + 1
            except LeaseError as e:
                errors[e.code] = errors.get(e.code, 0) + 1
        if conn is not None:
            conn[1].close()

    await asyncio.gather(*(beat(k) for k in range(inflight)))
    cpu = {p: c - cpu0.get(p, 0.0) for p, c in tree_cpu_s(pid).items()} if pid else {}
    for c in chans:
        await c.close()
    lat.sort()

    def q(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3, 1) if lat else None

    return {"registered_s": round(registered_s, 2), "heartbeats_per_s": round(len(lat) / seconds),
            "p50_ms": q(0.5), "p99_ms": q(0.99), "errors": errors,
            # the CPU the serving side spent per call: the controller's process, or its lease server
            "server_cpu_us_per_call": round(1e6 * (sum(c for p, c in cpu.items() if (p != pid) == lease))
                                            / max(1, len(lat)), 1) if cpu else None}


def main() -> None:
    workers, inflight, seconds, channels = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    lease = len(sys.argv) > 5 and sys.argv[5] == "lease"
    d = Path(tempfile.mkdtemp(prefix="hpcsched-accept-"))
    load = loadavg()
    ctl, address = start_controller(d, controller_config(d, FleetOptions(workers=workers, worker_timeout_s=60)),
                                    timeout_s=120)
    try:
        out = asyncio.run(measure(address, workers, inflight, seconds, channels, lease, ctl.pid))
    finally:
        stop_controller(ctl)
    print(json.dumps(out | {"server": "lease" if lease else "heartbeat", "load_start": load, "load_end": loadavg()}))


if __name__ == "__main__":
    main()
