"""Slurm integration timings on the real loopback cluster (scripts/slurm_cluster.sh up first).

``python bench/bench_slurm.py poll-cost``: the pilot manager's Slurm calls and CPU per poll at 100 / 1,000 /
10,000 nodes, against the fake Slurm command layer (tests/fake_slurm.py, as programs on PATH).
``python bench/bench_slurm.py site-cost [N]``: the delay a batch job suffers because pilots hold its nodes, on the
real Slurm: submit -> start of a 4-node batch job N times on idle nodes, then N times onto 4 nodes held by the
pilots of a controller running a checkpointing job (each time a preemption), with the steps lost (hpcsched calc).

Without an argument it prints: the live source's poll time; and, for a 4-node scavenger run of hpcsched.slurm.dp_train
preempted by a 1-node batch job, the seconds from the batch submit to (i) the training's SIGTERM
checkpoint and (ii) the batch job running, against the scavenger partition's GraceTime (the issue
asks the batch job to start within it). Exits 0 with a note when no Slurm answers.
"""

from __future__ import annotations

import json
import math
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


def poll_cost(sizes: tuple[int, ...] = (100, 1000, 10000), polls: int = 5) -> int:
    """Calls and CPU per poll of a manager holding a pilot on every node but a few, over the fake Slurm programs."""
    import dataclasses
    import os
    import resource

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from fake_slurm import FakeSlurm, View, install, save  # View: every pilot's worker alive and busy

    from hpcsched.slurm.pilot_config import PilotConfig
    from hpcsched.slurm.pilots import PilotManager

    print(f"load before: {open('/proc/loadavg').read().split()[:3]}")
    for n in sizes:
        with tempfile.TemporaryDirectory() as d:
            dp = Path(d)
            state = dp / "slurm.json"
            save(FakeSlurm(n, prefix="nid", auto_start=True), state)
            install(dp / "bin", state)
            os.environ["PATH"] = f"{dp / 'bin'}:{os.environ['PATH']}"
            calls: list[str] = []

            def run(argv: list[str], calls: list[str] = calls) -> str:
                calls.append(argv[0])
                return commands.run(argv, timeout=120)

            view = View()
            view.demand = n - 5
            cfg = dataclasses.replace(PilotConfig(), partition="scavenger", max_pilots=n, work_dir=dp / "pilots",
                                      settle_s=1.0)
            m = PilotManager(cfg, view, "127.0.0.1:1", None, dp / "state.db", run=run)
            m.step()  # claims n - 5 nodes: one sbatch (a job array), which the fake starts at once
            first = dict(__import__("collections").Counter(calls))
            m.step()
            view.w = {p.worker: (True, 1, 1) for p in m.pilots.values()}
            m.step()
            cpu, wall, per = [], [], []
            for _ in range(polls):
                calls.clear()
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                c0, t0 = time.process_time(), time.perf_counter()
                m.step()
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - t0)
                per.append((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime))
                calls_poll = dict(__import__("collections").Counter(calls))
            # a poll with a change: Slurm ended one pilot (its worker gone): decided in full, one new pilot
            ccpu, ccalls = [], {}
            for _ in range(polls):
                import json as _json

                fake = FakeSlurm.from_json(_json.loads(state.read_text()))
                gone = next(j for j, x in fake.jobs.items() if x["state"] == "RUNNING")
                fake.end(gone)
                save(fake, state)
                view.w.pop(f"pilot-{gone}", None)
                calls.clear()
                c0 = time.process_time()
                m.step()
                ccpu.append(time.process_time() - c0)
                ccalls = dict(__import__("collections").Counter(calls))
                view.w = {p.worker: (True, 1, 1) for p in m.pilots.values()}
                m.step()  # the new pilot's worker registered: settled again
            # the queue empties: every pilot idle past idle_release_s would go; here: half of them cancelled at once
            victims = list(m.pilots.values())[: len(m.pilots) // 2]
            calls.clear()
            for p in victims:
                m._cancel(p, "bench", failed=False)
            m._flush_cancels()
            cancel_calls = dict(__import__("collections").Counter(calls))
            os.environ["PATH"] = os.environ["PATH"].split(":", 1)[1]
            print(f"{n:>6} nodes, {len(m.pilots)} pilots: first poll {first}; steady poll {calls_poll} "
                  f"(settled, skipped {m.quiet_polls}): manager CPU median {statistics.median(cpu) * 1e3:.1f} ms "
                  f"(max {max(cpu) * 1e3:.1f}), wall {statistics.median(wall) * 1e3:.0f} ms, fake tools' CPU "
                  f"{statistics.median(per) * 1e3:.0f} ms; poll after a pilot ended {ccalls}: manager CPU median "
                  f"{statistics.median(ccpu) * 1e3:.1f} ms (max {max(ccpu) * 1e3:.1f}); cancelling {len(victims)}: "
                  f"{cancel_calls}", flush=True)
    print(f"load after: {open('/proc/loadavg').read().split()[:3]}")
    return 0


def site_cost(n: int = 20) -> int:
    """Submit -> start of a 4-node batch job, n times on idle nodes and n times onto pilots' nodes."""
    why = commands.available()
    if why:
        print(f"skipped: {why}")
        return 0
    import signal
    import subprocess

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from runtime_procs import ROOT, client, controller_config, jobs_by_id, start_controller, stop, submit, wait_for

    spans: list[tuple[float, float]] = []  # each batch job's (submit, start), unix times

    def batch(out: Path) -> float:
        t0 = time.time()
        commands.run(["sbatch", "-p", "batch", "-N4", "-J", "bench-batch", "-o", "/dev/null", "--wrap",
                      f"date +%s.%N > {out}; sleep 1"])
        until(lambda: out.exists() and out.read_text().strip() != "", 120)
        start = float(out.read_text())
        spans.append((t0, start))
        until(lambda: "bench-batch" not in commands.run(["squeue", "-h", "-o", "%j"]), 60)
        return start - t0

    def where_it_went(t0: float, start: float) -> str:
        """The pilots Slurm signalled for this batch job: when each was signalled and when each had left (its
        script's ``preempted`` and ``released``), from the submit; a slow start is placed by them."""
        sig, rel = [], []
        for d in (dp / "pilots").glob("*_*"):
            try:
                p = float((d / "preempted").read_text())
            except (OSError, ValueError):
                continue
            if t0 - 1 <= p <= start:
                sig.append(p - t0)
                try:
                    rel.append(float((d / "released").read_text()) - t0)
                except (OSError, ValueError):
                    rel.append(math.nan)
        return (f"{len(sig)} pilots signalled at +{min(sig, default=math.nan):.2f}..+{max(sig, default=math.nan):.2f}"
                f" s, all left by +{max(rel, default=math.nan):.2f} s, start +{start - t0:.2f} s")

    def q(xs: list[float], p: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, max(0, math.ceil(p * len(xs)) - 1))]

    print(f"load before: {open('/proc/loadavg').read().split()[:3]}", flush=True)
    dp = Path(tempfile.mkdtemp(prefix="bench-site-cost-"))  # kept: the controller's and pilots' logs
    print(f"run directory {dp}", flush=True)
    if True:
        base = [batch(dp / f"base-{i}") for i in range(n)]
        print("without pilots: " + " ".join(f"{x:.2f}" for x in base), flush=True)
        cfg = controller_config(dp, min_runtime_s=2, stop_grace_s=4)
        with cfg.open("a") as f:
            f.write("node_source: slurm\nslurm:\n  partition: scavenger\n  max_pilots: 4\n  slots: 1\n"
                    "  stop_grace_s: 3\n  poll_s: 1\n  time_limit_s: 600\n  leave_before_s: 30\n"
                    "  idle_release_s: 60\n  settle_s: 5\n  start_timeout_s: 120\n  register_timeout_s: 60\n"
                    "  work_dir: pilots\n")
        ctl, addr = start_controller(dp, cfg)
        c = client(addr)
        held: list[float] = []
        try:
            job = dp / "train.yaml"
            job.write_text(f"name: train\nlauncher: direct\nprocs: 4\nsteps: 1000000\nworkdir: {ROOT}\n"
                           "command: [tests/netns_job.py, --comm, tcp, --checkpoint-every, '20', --step-ms, '50']\n")
            jid = submit(c, job)
            for i in range(n):
                j0 = wait_for("the job running on four pilots", lambda: (j := jobs_by_id(c)[jid]).state == "running"
                              and len(j.workers) == 4 and j, 180, poll=0.3)
                s0 = j0.steps_done
                wait_for("training progress", lambda s0=s0: jobs_by_id(c)[jid].steps_done >= s0 + 5, 120, poll=0.3)
                held.append(batch(dp / f"pilots-{i}"))
                print(f"preemption {i + 1}: {held[-1]:.2f} s", flush=True)
            c.cancel(jid)
        finally:
            c.close()
            ctl.send_signal(signal.SIGTERM)
            try:
                ctl.wait(timeout=90)
            except subprocess.TimeoutExpired:
                stop(ctl)
        from hpcsched.calc_cli import controller_run

        _, _, figures = controller_run(dp / "run" / "state.db")
    extra = [h - statistics.median(base) for h in held]
    for i, (t0, start) in enumerate(spans[n:]):
        print(f"preemption {i + 1}: {where_it_went(t0, start)}")
    print(f"load after: {open('/proc/loadavg').read().split()[:3]}")
    print(f"submit -> start, without pilots ({n}): p50 {q(base, .5):.2f} s, p99 {q(base, .99):.2f} s, "
          f"max {max(base):.2f} s")
    print(f"submit -> start, onto pilots' nodes ({n} preemptions): p50 {q(held, .5):.2f} s, p99 {q(held, .99):.2f} s, "
          f"max {max(held):.2f} s; p99 more than without pilots: {q(held, .99) - q(base, .99):.2f} s "
          f"(p99 of each less the median without: {q(extra, .99):.2f} s)")
    keys = ("pilots", "pilots_preempted", "preemptions", "lost_steps", "max_lost_steps", "pilot_release_s_p50",
            "pilot_release_s_p99", "pilot_release_s_max")
    print("calc: " + ", ".join(f"{k} {figures.get(k)}" for k in keys))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["poll-cost"]:
        sys.exit(poll_cost(tuple(int(x) for x in sys.argv[2:]) or (100, 1000, 10000)))
    if sys.argv[1:2] == ["site-cost"]:
        sys.exit(site_cost(int(sys.argv[2]) if sys.argv[2:] else 20))
    sys.exit(main())
