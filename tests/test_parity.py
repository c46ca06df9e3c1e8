"""Parity (issue 16): the simulator and the runtime's controller, given the same policy and trace, take the same
sequence of decisions, because both decide through one core (``hpcsched.core.decide``).

The runtime side is real: a controller and two worker daemons (``n0``, ``n1``, one slot each) as processes,
real gRPC, jobs that are real programs (``direct`` launcher) sleeping through their steps, reporting their
stage times, checkpointing on SIGTERM and resuming from it. The simulator replays the same jobs at the
submit times the controller recorded, with ``as_controller`` (the controller's knowledge and rules). The
trace is built so that every decision is forced by an event seconds away from any other, whatever the
machine's load: SRTF, a short job whose profile is declared preempts the longest running job, an undeclared
one waits behind jobs whose length the controller has measured.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from runtime_procs import client, controller_config, start_controller, start_worker, stop, wait_for

from hpcsched.core.decide import DecideOptions
from hpcsched.model import ClusterSpec, Job, ResourceProfile
from hpcsched.sim.core_decisions import AsController
from hpcsched.sim.engine import simulate

STAGES = (0.02, 0.06, 0.02)  # seconds per step: data, compute, comm (what each program sleeps and reports)
PROFILE = ResourceProfile(*STAGES)
# name, submit (s after the first), steps, profile declared in the job file
TRACE = (("A", 0.0, 60, False), ("B", 0.2, 110, False), ("C", 2.5, 10, True), ("D", 4.5, 20, False))

PROGRAM = """
import json, os, signal, sys, time
from pathlib import Path
steps, stages = int(sys.argv[1]), [float(x) for x in sys.argv[2:5]]
ck = Path(os.environ["HPCSCHED_CHECKPOINT_DIR"]) / "step"
done = int(ck.read_text()) if ck.exists() else 0
out = open(os.environ["HPCSCHED_PROGRESS_FILE"], "a")
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
data_s, compute_s, comm_s = stages
while done < steps and not stopping:
    time.sleep(sum(stages))
    done += 1
    ck.write_text(str(done))
    out.write(json.dumps({"step": done, "loss": 1.0 / done, "checkpoint": str(done), "data_s": data_s,
                          "compute_s": compute_s, "comm_s": comm_s}) + "\\n")
    out.flush()
"""


def _job_file(d: Path, name: str, steps: int, declared: bool) -> str:
    prog = d / "steps.py"
    cmd = [sys.executable, str(prog), str(steps), *map(str, STAGES)]
    text = f"name: {name}\nlauncher: direct\nprocs: 1\nsteps: {steps}\nworkdir: {d}\ncommand: {json.dumps(cmd)}\n"
    if declared:
        text += f"profile: {{data_s: {STAGES[0]}, compute_s: {STAGES[1]}, comm_s: {STAGES[2]}}}\n"
    return text


@pytest.mark.slow
@pytest.mark.alone  # which worker a restart lands on follows real stop times: another test beside it moved them
def test_simulator_and_controller_take_the_same_decisions(tmp_path: Path) -> None:
    from hpcsched.runtime.store import Store

    (tmp_path / "steps.py").write_text(PROGRAM)
    cfg = controller_config(tmp_path, policy="srtf", min_runtime_s=0, worker_timeout_s=30)
    ctl, addr = start_controller(tmp_path, cfg)
    # The simulator charges every start one measured overhead (``restart_s``): starts must cost about the same.
    # A warm ranks supervisor makes them bimodal: a launch handed to one still importing torch waits out the
    # import (C, a 1 s job, took 8.8 s at load 25, so A ended first and B resumed on n0, a valid decision for
    # that order of events). These programs use the standard library only: every start is cold, ~0.1-1 s.
    wfile = tmp_path / "worker.yaml"
    wfile.write_text("warm_ranks: false\n")
    workers = [start_worker(tmp_path, addr, n, extra=("--config", str(wfile))) for n in ("n0", "n1")]
    c = client(addr)
    try:
        wait_for("2 workers", lambda: sum(w.alive for w in c.workers()) == 2, 60)
        t0 = time.time()
        ids: dict[str, str] = {}
        for name, at, steps, declared in TRACE:
            time.sleep(max(0.0, t0 + at - time.time()))
            ids[c.submit(_job_file(tmp_path, name, steps, declared), f"{name}.yaml")] = name
        final = wait_for("every job finished", lambda: (js := [j for j in c.jobs() if j.job_id in ids]) and all(
            j.state in ("completed", "failed", "cancelled") for j in js) and js, 240, poll=0.5)
        assert {ids[j.job_id]: j.state for j in final} == dict.fromkeys("ABCD", "completed")
        store = Store(tmp_path / "run" / "state.db")
        events = [e for e in store.events() if e["job_id"] in ids]
        store.close()
    finally:
        c.close()
        for w in workers:
            stop(w)
        stop(ctl)

    submitted = {ids[e["job_id"]]: e["time"] for e in events if e["kind"] == "submit"}
    first = min(submitted.values())
    real = [(e["kind"], ids[e["job_id"]], tuple(e.get("workers", ())), e.get("reason", ""))
            for e in events if e["kind"] in ("start", "stop")]
    starts = [e["time"] for e in events if e["kind"] == "start"]
    overhead = _launch_overhead(events, ids)

    jobs = [Job(name, submit=submitted[name] - first, gpus=1, iterations=steps, iteration_time=PROFILE.total_s,
                duration=steps * PROFILE.total_s, profile=PROFILE, model="steps") for name, _, steps, _ in TRACE]
    declared = {name: PROFILE for name, _, _, d in TRACE if d}
    sim = simulate(jobs, ClusterSpec(1, 2, 1, name="n0,n1"), "srtf", restart_s=overhead,
                   as_controller=AsController(DecideOptions(min_runtime_s=0.0), declared))
    simulated = [(d.kind, d.job, d.workers, d.reason) for d in sim.decisions]
    assert simulated == real, (
        f"simulated: {simulated}\nreal:      {real}\n(real start times after the first submit: "
        f"{[round(t - first, 2) for t in starts]}; simulated: {[round(d.time, 2) for d in sim.decisions]})")
    # the decisions the scenario forces: C preempts B (the longest left) on n1, B resumes there when C
    # ends, D (length unknown to the controller) waits for A's node
    assert simulated == [("start", "A", ("n0",), ""), ("start", "B", ("n1",), ""), ("stop", "B", (), "preempt"),
                         ("start", "C", ("n1",), ""), ("start", "B", ("n1",), ""), ("start", "D", ("n0",), "")]


def _launch_overhead(events: list[dict], ids: dict[str, str]) -> float:
    """Median seconds an attempt lost beyond its steps (start-up + tear-down), from the controller's own
    log: the simulator charges it per start, as the testbed does (``feedback.measured_restart_s``)."""
    import statistics

    per_job: dict[str, list[dict]] = {}
    for e in events:
        per_job.setdefault(e["job_id"], []).append(e)
    lost = []
    for jid, evs in per_job.items():
        steps = next(s for n, _, s, _ in TRACE if n == ids[jid])
        starts = [e["time"] for e in evs if e["kind"] == "start"]
        ends = [e["time"] for e in evs if e["kind"] in ("stopped", "completed")]
        if len(starts) == 1 and ends:
            lost.append(ends[-1] - starts[0] - steps * PROFILE.total_s)
    return max(0.0, statistics.median(lost)) if lost else 0.5
