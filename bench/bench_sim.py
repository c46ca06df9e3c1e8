"""Simulator speed (issue 3): SRSF on trace3, every baseline on trace2 in both modes, Philly, scaling.

Targets: SRSF on trace3 < 0.5 s; each baseline (fifo srtf srsf las tiresias themis) on trace2 (5,755
jobs, n8g8) < 5 s, in the default mode and in ``--compat muri``; Philly (82,247 jobs) < 60 s.
The reference simulator needs ~2.6 s for SRSF on trace3 and 54-80 s for Muri-S on trace3.
Prints wall and CPU seconds (``time.process_time``: the fairer figure on a shared, loaded machine; the
simulator starts no child processes), events per CPU-second, and how time grows when the number of
jobs doubles (the first 1/4, 1/2 and all of trace2; with Philly, its first 10k, 20k, 40k, 82k jobs).

Run: .venv/bin/python bench/bench_sim.py [--quick]   (--quick skips Philly: the trace3/trace2 targets
and the trace2 scaling rows, ~1 minute of CPU)
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


def line(label: str, r, wall: float, cpu: float, target: float | None = None) -> bool:
    ok = cpu < target if target is not None else True
    verdict = "" if target is None else ("  OK" if ok else f"  OVER target {target} s")
    print(f"{label:<36} wall {wall:7.2f} s  cpu {cpu:7.2f} s  events {r.events:>7}  "
          f"{r.events / max(cpu, 1e-9):>9,.0f} events/cpu-s{verdict}", flush=True)
    return ok


def scaling(label: str, jobs, cluster, policy: str, sizes: list[int], target: float | None = None) -> None:
    """Run the first n jobs for each n in sizes; print the time ratio for each step of jobs."""
    prev: tuple[float, int] | None = None
    for n in sizes:
        r, w, c = timed(jobs[:n], cluster, policy)
        line(f"{label} {policy} first {n} jobs", r, w, c, target if n == len(jobs) else None)
        if prev:
            print(f"  x{c / prev[0]:.2f} time for x{n / prev[1]:.2f} jobs "
                  f"(events x{r.events / prev[2]:.2f})", flush=True)
        prev = (c, n, r.events)


def main() -> None:
    quick = "--quick" in sys.argv
    n8g8 = read_cluster_spec(ROOT / "cluster_spec/n8g8.csv")
    t3 = read_jobs(ROOT / "trace-data/muri/trace3.csv")
    missed = 0
    for compat in ("muri", None):
        r, w, c = timed(t3, n8g8, "srsf", compat)
        missed += not line(f"trace3 srsf compat={compat}", r, w, c, 0.5)
    t2 = read_jobs(ROOT / "trace-data/muri/trace2.csv")
    total = 0.0
    for compat in (None, "muri"):
        for p in BASELINES:
            r, w, c = timed(t2, n8g8, p, compat)
            total += c
            missed += not line(f"trace2 {p} compat={compat}", r, w, c, 5.0)
    print(f"trace2, all 12 runs: {total:.2f} CPU-s; targets missed: {missed}")
    t2s = sorted(t2, key=lambda j: j.submit)
    scaling("trace2", t2s, n8g8, "srsf", [len(t2s) // 4, len(t2s) // 2, len(t2s)])
    if quick:
        return
    w = time.perf_counter()
    philly = sorted(read_jobs(PHILLY), key=lambda j: j.submit)
    print(f"philly read: {len(philly)} jobs in {time.perf_counter() - w:.1f} s (reader, not simulator)")
    spec = read_cluster_spec(PHILLY_CLUSTER)
    scaling("philly", philly, spec, "srsf", [10_000, 20_000, 40_000, len(philly)], 60.0)
    r, w, c = timed(philly, spec, "fifo")
    line("philly fifo", r, w, c, 60.0)


if __name__ == "__main__":
    main()
