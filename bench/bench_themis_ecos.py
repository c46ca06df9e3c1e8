"""Compat Themis: the reference's solver (``themis-ecos``) against the closed form (``themis``).

No speed target: ``themis-ecos`` exists for fidelity (docs/simulator.md). This prints, per trace, CPU
and wall seconds of each and the ratio, with the averages against the reference's published figure,
so the cost of that fidelity is one command away:

    .venv/bin/python bench/bench_themis_ecos.py [--traces trace3,trace3_pr]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hpcsched.cluster_spec import read_cluster_spec
from hpcsched.sim import simulate
from hpcsched.traces import read_jobs

ROOT = Path(__file__).resolve().parents[1]
# the reference's own Themis averages (Rivendile/Muri simulator/draw_fig9-10.py)
PUBLISHED_AVG = {"trace1": 1823179.078, "trace1_pr": 3314303.178, "trace2": 4628171.542, "trace2_pr": 12529490.82,
                 "trace3": 397058.802, "trace3_pr": 1502768.219, "trace4": 994970.736, "trace4_pr": 2271053.053}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="trace3,trace3_pr", help="comma-separated Muri trace names")
    args = ap.parse_args()
    cluster = read_cluster_spec(ROOT / "cluster_spec/n8g8.csv")
    print(f"{'trace':<10} {'policy':<12} {'cpu_s':>8} {'wall_s':>8} {'avg JCT':>14} {'vs published':>12}")
    for trace in args.traces.split(","):
        jobs = read_jobs(ROOT / f"trace-data/muri/{trace}.csv")
        cpu: dict[str, float] = {}
        for policy in ("themis", "themis-ecos"):
            c0, w0 = time.process_time(), time.perf_counter()
            avg = simulate(jobs, cluster, policy, compat="muri").summary()["avg_jct"]
            cpu[policy] = time.process_time() - c0
            wall, off = time.perf_counter() - w0, avg / PUBLISHED_AVG[trace] - 1
            print(f"{trace:<10} {policy:<12} {cpu[policy]:>8.2f} {wall:>8.2f} {avg:>14,.2f} {off:>+11.1%}")
        print(f"{trace:<10} themis-ecos / themis CPU: {cpu['themis-ecos'] / cpu['themis']:.1f}x")


if __name__ == "__main__":
    main()
