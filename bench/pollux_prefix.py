"""The Pollux search on the first MAX_TIME simulated seconds of an artifact workload: CPU s and a digest of every
round's allocation, to hold a speed change to "same allocation at every round" and to compare with the artifact's
simulator on the same prefix (its CPU sampled against the simulated time it prints).

Run:  .venv/bin/python bench/pollux_prefix.py WORKLOAD SEED MAX_TIME [OPTIMISER]     e.g. 6 0 14000 ga-stall:10
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from hpcsched.compat.pollux import SimJob, simulate_pollux
from hpcsched.compat.pollux_ga import PolluxGAPolicy, ga_search
from hpcsched.goodput import APPLICATIONS
from hpcsched.traces.pollux import read_pollux_workload

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    wl, seed, max_time = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    workload = read_pollux_workload(ROOT / "tests" / "data" / "pollux" / "workloads" / f"workload-{wl}.csv",
                                    tuple(APPLICATIONS))
    optimiser = sys.argv[4] if len(sys.argv) > 4 else "ga"
    pop, generations, stall = ga_search(optimiser)
    policy = PolluxGAPolicy(16, 4, seed, pop, generations, stall=stall)
    digest = hashlib.sha256()
    search = policy.optimize

    def optimize(jobs: dict[str, SimJob], prev: dict[str, list[int]], now: float) -> dict[str, list[int]]:
        out = search(jobs, prev, now)
        digest.update(json.dumps(sorted(out.items())).encode())
        return out

    policy.optimize = optimize  # type: ignore[method-assign]
    t0 = time.process_time()
    run = simulate_pollux(workload, policy, 16, 4, max_time=max_time)
    cpu = time.process_time() - t0
    jcts = run.jcts()
    print(json.dumps({"wl": wl, "seed": seed, "tmax": max_time, "cpu_s": round(cpu, 2), "rounds": len(run.rounds),
                      "done": len(jcts), "avg_jct": sum(jcts.values()) / max(len(jcts), 1),
                      "digest": digest.hexdigest()[:16], "unfilled": policy.duplicates_left,
                      "optimiser": optimiser, "generations": policy.generations_run,
                      "stopped_early": policy.stopped_early,
                      "load": open("/proc/loadavg").read().split()[0]}))


if __name__ == "__main__":
    main()
