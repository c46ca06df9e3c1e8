"""Testbed (issue 9): a fast-forwarded real run and how close the simulator gets to it, in one command.

    .venv/bin/python bench/bench_testbed.py [--jobs 24] [--skip 0] [--fast-forward 5] [--profiles-from RUN]
        [--no-declare-profiles]

Starts a local controller and 2 workers x 2 slots, replays jobs of the bundled Muri testbed trace under
muri-s with fast-forward (job files declare their profiles, so jobs are interleaved from submission, unless
``--no-declare-profiles``), and prints: wall seconds and CPU seconds (this process and its children: the
controller, workers and every training process), the real-equivalent seconds the run covered and the
speed-up over a real-time replay (covered / wall), the load average, and the avg JCT error of each
simulation against the real run (sim-measured: in sample; sim-predicted: from ``--profiles-from``, out of
sample). The run folder is kept (``--out``) so a later run can be predicted from it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=24)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--fast-forward", type=int, default=5)
    ap.add_argument("--min-steps", type=int, default=500)
    ap.add_argument("--max-steps", type=int, default=10_000)
    ap.add_argument("--profiles-from", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--declare-profiles", action=argparse.BooleanOptionalAction, default=True,
                    help="job files declare their trace profile: muri-s groups jobs from submission (interleaving; "
                         "the default, as hpcsched testbed)")
    args = ap.parse_args()

    from hpcsched.testbed.run import RunOptions, run_testbed

    out = args.out or Path(tempfile.mkdtemp(prefix="bench-testbed-"))
    spec = out.parent / f"{out.name}-l2x2.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text("name: local2x2\nswitches: 1\nnodes_per_switch: 2\ngpus_per_node: 2\n")
    opts = RunOptions(trace=ROOT / "trace-data/muri/cluster_trace.csv", cluster=spec, policy="muri-s", out=out,
                      jobs=args.jobs, skip=args.skip, min_steps=args.min_steps, max_steps=args.max_steps,
                      fast_forward=args.fast_forward, profiles_from=args.profiles_from, timeout_s=3600,
                      declare_profiles=args.declare_profiles)
    load0, wall0, cpu0 = os.getloadavg()[0], time.perf_counter(), _cpu()
    results = run_testbed(opts, say=lambda m: print(m, flush=True))
    wall, cpu, load1 = time.perf_counter() - wall0, _cpu() - cpu0, os.getloadavg()[0]
    from hpcsched.testbed.compare import render_markdown

    (out / "comparison.md").write_text(render_markdown(list(results.values()), list(results)))
    run = json.loads((out / "testbed.json").read_text())
    covered = run["wall_s"] + run["skipped_s"]
    print(f"run folder: {out}")
    print(f"wall {wall:.1f} s, CPU {cpu:.1f} s (with children), load average {load0:.1f} -> {load1:.1f}")
    print(f"replay: {run['wall_s']:.1f} s wall covered {covered:.1f} real-equivalent s "
          f"({len(run['jumps'])} jumps): speed-up x{covered / max(run['wall_s'], 1e-9):.2f} over real time")
    for name, r in results.items():
        s = r["summary"]
        err = {k: v["error"] * 100 for k, v in s.items()}
        print(f"{name:>24}: avg JCT error {err['avg JCT']:+.1f}%, p99 {err['p99 JCT']:+.1f}%, "
              f"makespan {err['makespan']:+.1f}%, mean |per-job| {r['mean_abs_job_error'] * 100:.1f}%")


if __name__ == "__main__":
    main()
