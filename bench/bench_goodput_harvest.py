"""Goodput-valued vs throughput-valued harvesting on a BFTrainer replay of a real idle log (bundled Summit log).

The jobs are the first N of BFTrainer's 1,000-job trace (its submit times and node bounds), each given a Pollux
application round-robin (``hpcsched.harvest.goodput``): every job trains with Pollux's adaptive batch, so at every
size it runs at its goodput-best batch and progresses in useful (base-batch-equivalent) samples towards the
samples that complete its epochs. The two runs differ only in what the MILP values a size by: goodput, or the
throughput of that same configuration (what a BFTrainer scaling curve measures). Both use ``exact_events``, so a
job completes the moment it reaches its target and its nodes go back to the pool at once.

    .venv/bin/python bench/bench_goodput_harvest.py --jobs 60 --nodes 100 --json out.json

Prints, per valuation: jobs done, average and median JCT, makespan, useful samples, node-hours held, and the
average JCT per application; and the ratio of the two.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcsched.harvest.goodput import GoodputProfile, GoodputValuation  # noqa: E402
from hpcsched.harvest.replay import ReplayConfig, replay  # noqa: E402
from hpcsched.harvest.run import idle_timeline  # noqa: E402
from hpcsched.traces.bftrainer import read_elastic_jobs  # noqa: E402

DATA = ROOT / "trace-data" / "bftrainer"
# (application, epochs to the target): imagenet and deepspeech2 shortened so a job is hours, not days, of the pool
MIX = (("cifar10", None), ("imagenet", 10), ("bert", None), ("ncf", None), ("deepspeech2", 20), ("yolov3", 20))


def run(value: str, n_jobs: int, nodes: int, max_jobs: int, tfwd: float) -> dict[str, object]:
    jobs = read_elastic_jobs(DATA / "hps-shufflenet-Jbnd-1000J.csv", DATA / "hps-shufflenet-JNPs-1000J.csv")[:n_jobs]
    profiles = {j.id: GoodputProfile(app, 4, epochs) for j, (app, epochs) in
                zip(jobs, (MIX[k % len(MIX)] for k in range(len(jobs))), strict=True)}
    valuation = GoodputValuation(profiles, value)
    jobs = valuation.prepare(jobs)
    tl = idle_timeline(DATA / "idle-intervals.csv.gz", nodes, None, min(j.submit for j in jobs))
    cfg = ReplayConfig(tfwd=tfwd, max_jobs=max_jobs, exact_events=True)
    t0 = time.perf_counter()
    res = replay(tl, jobs, cfg, valuation=valuation)
    wall = time.perf_counter() - t0
    s = res.summary
    jct = {r.job_id: r.end - r.submit for r in res.jobs if r.end is not None}
    by_app: dict[str, list[float]] = {}
    for jid, t in jct.items():
        by_app.setdefault(profiles[jid].application, []).append(t)
    return {
        "value": value, "jobs": len(jobs), "jobs_done": s["jobs_done"],
        "avg_jct_h": statistics.fmean(jct.values()) / 3600 if jct else None,
        "median_jct_h": statistics.median(jct.values()) / 3600 if jct else None,
        "makespan_h": (float(s["end"]) - float(s["start"])) / 3600,  # type: ignore[arg-type]
        "useful_samples": s["samples"], "held_node_hours": s["used_node_hours"],
        "useful_samples_per_held_node_hour": float(s["samples"]) / float(s["used_node_hours"]),  # type: ignore[arg-type]
        "rescales": s["rescales"], "decisions": s["decisions"], "nonoptimal_decisions": s["nonoptimal_decisions"],
        "avg_jct_h_by_app": {a: statistics.fmean(v) / 3600 for a, v in sorted(by_app.items())},
        "wall_s": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--max-jobs", type=int, default=10)
    ap.add_argument("--tfwd", type=float, default=10.0)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = ap.parse_args()
    out = {v: run(v, a.jobs, a.nodes, a.max_jobs, a.tfwd) for v in ("throughput", "goodput")}
    g, t = out["goodput"], out["throughput"]
    for v, r in out.items():
        print(f"{v:10s} done {r['jobs_done']}/{r['jobs']}  avg JCT {r['avg_jct_h']:.2f} h  median "
              f"{r['median_jct_h']:.2f} h  makespan {r['makespan_h']:.2f} h  held {r['held_node_hours']:.1f} node-h"
              f"  useful samples/held node-h {r['useful_samples_per_held_node_hour']:.4g}  rescales {r['rescales']}  "
              f"({r['wall_s']:.1f} s)")
        print("           avg JCT by app (h): " + ", ".join(f"{k} {x:.2f}" for k, x in r["avg_jct_h_by_app"].items()))
    print(f"goodput / throughput: avg JCT x{g['avg_jct_h'] / t['avg_jct_h']:.3f}, makespan "
          f"x{g['makespan_h'] / t['makespan_h']:.3f}, useful samples per held node-hour "
          f"x{g['useful_samples_per_held_node_hour'] / t['useful_samples_per_held_node_hour']:.3f}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
