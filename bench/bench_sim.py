"""Simulator speed (issue 3): SRSF on trace3, every baseline on trace2, Philly (82,247 jobs), scaling.

Targets: SRSF on trace3 < 0.5 s; each baseline on trace2 (5,755 jobs) < 5 s; Philly < 60 s.
The reference simulator needs ~2.6 s for SRSF on trace3 and 54-80 s for Muri-S on trace3.
Prints wall and CPU seconds (CPU is the fairer figure on a shared, loaded machine), events/s, and how
time grows when the number of jobs doubles (the first N jobs of Philly, N = 10k, 20k, 40k, 80k).

Run: .venv/bin/python bench/bench_sim.py [--quick]   (--quick skips Philly)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcsched.cluster_spec import read_cluster_spec  # noqa: E402
from hpcsched.sim.engine import simulate  # noqa: E402
from hpcsched.traces import read_jobs  # noqa: E402

BASELINES = ("fifo", "srtf", "srsf", "las", "tiresias", "themis")
PHILLY = ROOT / "trace-data/philly/philly-sia.csv.gz"
PHILLY_CLUSTER = ROOT / "cluster_spec/n128g8.csv"  # 1024 GPUs; Philly's mean demand is 374 GPUs (37% load)


def timed(jobs, cluster, policy, compat=None):
    w, c = time.perf_counter(), time.process_time()
    r = simulate(jobs, cluster, policy, compat)
    return r, time.perf_counter() - w, time.process_time() - c


def line(label: str, r, wall: float, cpu: float, target: float | None = None) -> None:
    ok = "" if target is None else ("  OK" if cpu < target else f"  OVER target {target} s")
    print(f"{label:<34} wall {wall:7.2f} s  cpu {cpu:7.2f} s  events {r.events:>7}  "
          f"{r.events / max(cpu, 1e-9):>9,.0f} events/cpu-s{ok}")


def main() -> None:
    quick = "--quick" in sys.argv
    n8g8 = read_cluster_spec(ROOT / "cluster_spec/n8g8.csv")
    t3 = read_jobs(ROOT / "trace-data/muri/trace3.csv")
    for compat in ("muri", None):
        r, w, c = timed(t3, n8g8, "srsf", compat)
        line(f"trace3 srsf compat={compat}", r, w, c, 0.5)
    t2 = read_jobs(ROOT / "trace-data/muri/trace2.csv")
    for p in BASELINES:
        r, w, c = timed(t2, n8g8, p)
        line(f"trace2 {p}", r, w, c, 5.0)
    if quick:
        return
    w = time.perf_counter()
    philly = sorted(read_jobs(PHILLY), key=lambda j: j.submit)
    print(f"philly read: {len(philly)} jobs in {time.perf_counter() - w:.1f} s (reader, not simulator)")
    spec = read_cluster_spec(PHILLY_CLUSTER)
    prev: tuple[float, int] | None = None
    for n in (10_000, 20_000, 40_000, len(philly)):
        r, w, c = timed(philly[:n], spec, "srsf")
        line(f"philly srsf first {n} jobs", r, w, c, 60.0 if n == len(philly) else None)
        if prev:
            print(f"  x{c / prev[0]:.2f} time for x{n / prev[1]:.2f} jobs")
        prev = (c, n)
    r, w, c = timed(philly, spec, "fifo")
    line("philly fifo", r, w, c, 60.0)


if __name__ == "__main__":
    main()
