"""The fleet harness's simulated worker (bench/fleet_worker.py) hears of its orders on its lease connection.

As the real worker (tests/test_lease_push.py): right after registering it subscribes its lease connection and opens
no ``Orders.Watch`` stream; after a new registration it subscribes again, and a launch order then reaches it pushed,
well before its next heartbeat (the interval here, 60 s, is far past the deadline, which comes from the scheduling
tick). A real controller process; deadlines from the configured intervals, with room for a loaded 2-core machine."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc

from hpcsched.runtime.auth import metadata
from hpcsched.runtime.rpc import pb, pb_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from fleet import TOKEN, FleetOptions, controller_config, start_controller, stop_controller  # noqa: E402
from fleet_worker import ProcStats, SimOptions, SimWorker, WatchChannels, channel_options  # noqa: E402

SCHEDULE_S = 0.2
STARTUP_S = 0.3
LOAD_FACTOR = 4  # a loaded machine (load 8 on 2 cores) stretches every step this much


def test_sim_worker_subscribes_again_after_it_registers_again_and_gets_its_launch_pushed(tmp_path: Path) -> None:
    long_beat = 60.0
    o = FleetOptions(heartbeat_interval_s=long_beat, schedule_interval_s=SCHEDULE_S, worker_timeout_s=3 * long_beat)
    ctl, address = start_controller(tmp_path, controller_config(tmp_path, o))
    deadline = LOAD_FACTOR * (4 * SCHEDULE_S + STARTUP_S) + 5  # a step, a port nudge, a step, a launch nudge

    async def scenario() -> tuple[ProcStats, float]:
        ch = grpc.aio.insecure_channel(address, options=channel_options(0))
        stub, md = pb_grpc.ControllerStub(ch), metadata(TOKEN)
        opts = SimOptions(address, TOKEN, str(tmp_path), slots=1, iteration_s=0.05, startup_s=STARTUP_S)
        stats = ProcStats()
        w = SimWorker("wa", 0, stub, opts, stats, md)
        w.watch_channels = WatchChannels(opts, 1)
        runs = [asyncio.create_task(w.run(0)), asyncio.create_task(w.watch()), asyncio.create_task(w.lease_link())]
        loop = asyncio.get_running_loop()

        async def until(what: str, pred) -> None:
            end = loop.time() + deadline
            while not pred():
                assert loop.time() < end, f"timed out after {deadline:.0f} s waiting for {what}"
                await asyncio.sleep(0.05)

        # The lease server starts beside the controller: a registration before it listens names none (and the worker
        # watches instead); registering again until one names it is what a restarted worker would do.
        await until("a registration", lambda: stats.registrations >= 1)
        while not w.push_sub:
            w.registered = False
            w.nudge.set()
            await until("the registration again", lambda seen=stats.registrations: stats.registrations > seen)
        await until("the first subscription", lambda: stats.lease_subscriptions == 1)
        w.registered = False  # as after a failed heartbeat: it registers again, and subscribes again
        w.nudge.set()
        await until("the second subscription", lambda: stats.lease_subscriptions == 2)
        sent = loop.time()
        await stub.Submit(pb.SubmitRequest(spec_yaml="name: one\nlauncher: direct\nsteps: 10\n"
                                           "command: [fleet-sim-task]\n", source="one.yaml"), metadata=md)
        await until("the launch order", lambda: stats.launches == 1)
        took = loop.time() - sent
        for r in runs:
            r.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        w.close_lease()
        await w.watch_channels.close()
        await ch.close()
        return stats, took

    try:
        stats, took = asyncio.run(scenario())
    finally:
        stop_controller(ctl)
    assert took < long_beat / 2 and stats.lease_pushes >= 1, (took, stats.lease_pushes)
    assert stats.watch_opened == 0 or stats.registrations > 2  # watched only while no lease server was named
    assert stats.errors == {}, stats.error_examples
