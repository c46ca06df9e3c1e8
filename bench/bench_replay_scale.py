"""The harvesting replayer at machine size (issue 17): seeded synthetic logs, 1,000 elastic jobs, old code beside new.

    .venv/bin/python bench/bench_replay_scale.py                 # every part, the old code beside the new
    .venv/bin/python bench/bench_replay_scale.py --parts cobalt  # one or more of PARTS, comma-separated
    .venv/bin/python bench/bench_replay_scale.py --old none      # the new code only

Parts (elastic jobs: trace-data/bftrainer/hps-shufflenet-*-1000J.csv unless said; HiGHS, Tfwd 10 s, maxJ 10,
time limit 10 s per decision, from the log's first job start):

- ``kth``: the real 100-node KTH SP2 log (bundled): a small pool, so thousands of decisions
- ``cobalt``: ``hpcsched trace generate cobalt --seed 0`` (22,500 jobs, 49,152 nodes), ``replay --log --nodes 49152``
- ``cobalt10``: the same log with 10 elastic jobs (the issue's report: killed after 300 s at 11.6 GB)
- ``swf``: ``hpcsched trace generate swf --seed 0`` (one year, 160,000 nodes; MaxNodes in the header)
- ``decision``: ``trace generate cobalt --nodes 10000``: per-decision time over the replay's decisions
- ``stress``: that 10,000-node replay with ``--max-jobs 1000`` (every submitted job in one decision)
- ``stress-busy``, ``stress-busy-dp``: the same with ``--skip-warmup`` (the pool is scarce, hundreds of jobs wait
  in each decision), HiGHS and the exact DP; new code only (the old one decides with the same solvers)

Logs go to /tmp/hpcsched-bench-replay (fixed seed: the same bytes every time). Each replay runs in a fresh
process through ``hpcsched.harvest.run.run_replay`` (the code path of ``hpcsched replay``); the parent samples
its resident memory from /proc every 0.1 s and stops it past ``--old-timeout`` seconds or ``--old-rss-gb``.
"Old" is the package at ``--old REF`` (default e7b3392, before issue 17), extracted with ``git archive``.
Prints markdown rows for bench/RESULTS.md: wall and CPU seconds, peak RSS, events, decisions, decision
p50/p99 (the ``solve_s`` column of events.csv; the old code's leaves out building its Problem, O(pool)),
utilisation, and whether old and new agree on every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = Path("/tmp/hpcsched-bench-replay")
BF = ROOT / "trace-data" / "bftrainer"
OLD_REF = "e7b3392"

LOGS = {  # file name -> `hpcsched trace generate` arguments
    "mira-synth-22500.csv": ["cobalt", "--seed", "0"],
    "synth-160k-1y.swf": ["swf", "--seed", "0"],
    "cobalt-10k.csv": ["cobalt", "--seed", "0", "--nodes", "10000"],
}
PARTS: dict[str, dict[str, object]] = {
    "kth": {"log": str(ROOT / "trace-data" / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz"), "nodes": None, "jobs": "1000J"},
    "cobalt": {"log": "mira-synth-22500.csv", "nodes": 49152, "jobs": "1000J"},
    "cobalt10": {"log": "mira-synth-22500.csv", "nodes": 49152, "jobs": "10J"},
    "swf": {"log": "synth-160k-1y.swf", "nodes": None, "jobs": "1000J"},
    "decision": {"log": "cobalt-10k.csv", "nodes": 10000, "jobs": "1000J"},
    "stress": {"log": "cobalt-10k.csv", "nodes": 10000, "jobs": "1000J", "max_jobs": 1000},
    "stress-busy": {"log": "cobalt-10k.csv", "nodes": 10000, "jobs": "1000J", "max_jobs": 1000, "skip_warmup": 1,
                    "old": False},
    "stress-busy-dp": {"log": "cobalt-10k.csv", "nodes": 10000, "jobs": "1000J", "max_jobs": 1000, "skip_warmup": 1,
                       "solver": "dp", "old": False},
}

# Runs in the child: the package under test first on sys.path, one replay, a JSON line on stdout.
CHILD = r"""
import json, resource, sys, time
root, log, nodes, jobs_tag, max_jobs, out, bf, skip_warmup, solver = sys.argv[1:10]
sys.path.insert(0, root)
import hpcsched.harvest, hpcsched.milp
assert hpcsched.harvest.__file__.startswith(root), hpcsched.harvest.__file__
from pathlib import Path
import numpy as np
from hpcsched.harvest.replay import ReplayConfig
from hpcsched.harvest.run import ReplayRequest, run_replay
bf = Path(bf)
t0, c0 = time.perf_counter(), time.process_time()
req = ReplayRequest(bf / f"hps-shufflenet-Jbnd-{jobs_tag}.csv", bf / f"hps-shufflenet-JNPs-{jobs_tag}.csv",
                    log=Path(log), nodes=int(nodes) if nodes != "-" else None, skip_warmup=skip_warmup == "1",
                    config=ReplayConfig(max_jobs=int(max_jobs), solver=solver))
run = run_replay(req, Path(out))
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
s = run.summary
secs = np.array([e[14] for e in run.result.events if e[15] not in ("finished", "empty")], dtype=float)
keys = ("events", "decisions", "jobs_done", "utilization", "useful_utilization", "idle_node_hours",
        "used_node_hours", "rescales", "preemptions", "samples", "nonoptimal_decisions", "end")
print(json.dumps({"wall": wall, "cpu": cpu, "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "p50_ms": float(np.percentile(secs, 50)) * 1e3 if len(secs) else None,
                  "p99_ms": float(np.percentile(secs, 99)) * 1e3 if len(secs) else None,
                  "max_ms": float(secs.max()) * 1e3 if len(secs) else None,
                  "machine": len(run.timeline.nodes), "summary": {k: s[k] for k in keys}}))
"""


def generate() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    for name, args in LOGS.items():
        path = WORK / name
        if not path.is_file():
            subprocess.run([str(ROOT / ".venv/bin/hpcsched"), "trace", "generate", *args, "--out", str(path),
                            "--quiet"], check=True)


def old_tree(ref: str) -> Path:
    """The package as it was at ``ref`` (git archive), for the side-by-side runs."""
    dest = Path(tempfile.gettempdir()) / f"hpcsched-old-{ref}"
    if not (dest / "hpcsched" / "harvest").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "hpcsched"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_child(root: Path, part: dict[str, object], timeout: float, rss_cap_kb: int) -> dict[str, object]:
    """One replay in a fresh process; stopped (and said so) past the timeout or the memory cap."""
    out = Path(tempfile.mkdtemp(prefix="replay-", dir=WORK))
    nodes = part.get("nodes")
    cmd = [sys.executable, "-c", CHILD, str(root), str(WORK / str(part["log"])), str(nodes) if nodes else "-",
           str(part["jobs"]), str(part.get("max_jobs", 10)), str(out), str(BF),
           str(part.get("skip_warmup", 0)), str(part.get("solver", "highs"))]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak, why = 0, None
    while proc.poll() is None:
        peak = max(peak, _rss_kb(proc.pid))
        if time.perf_counter() - t0 > timeout:
            why = f"stopped after {timeout:.0f} s"
        elif peak > rss_cap_kb:
            why = f"stopped at {peak / 2**20:.1f} GB resident (cap {rss_cap_kb / 2**20:.0f} GB)"
        if why:
            proc.kill()
            proc.wait()
            return {"stopped": why, "wall": time.perf_counter() - t0, "rss_kb": peak}
        time.sleep(0.1)
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        return {"stopped": f"failed (exit {proc.returncode}): {stderr.strip().splitlines()[-1:]}",
                "wall": time.perf_counter() - t0, "rss_kb": peak}
    return json.loads(stdout.strip().splitlines()[-1])


def _fmt(r: dict[str, object]) -> str:
    if "stopped" in r:
        return (f"{r['wall']:.1f} | - | >= {int(r['rss_kb']) / 1024:,.0f} MiB | - | - | - | - | "  # type: ignore[call-overload]
                f"**{r['stopped']}**")
    s = r["summary"]
    assert isinstance(s, dict)
    return (f"{r['wall']:.1f} | {r['cpu']:.1f} | {int(r['rss_kb']) / 1024:,.0f} MiB | {s['events']:,} | "  # type: ignore[call-overload]
            f"{s['decisions']:,} | {r['p50_ms']:.1f} / {r['p99_ms']:.1f} (max {r['max_ms']:.1f}) | "
            f"{s['utilization']:.4f} | {s['jobs_done']} jobs done, {s['nonoptimal_decisions']} non-optimal")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--old", default=OLD_REF, help="git ref of the code to compare with, or 'none'")
    ap.add_argument("--old-timeout", type=float, default=300.0, help="seconds before an old run is stopped")
    ap.add_argument("--old-rss-gb", type=float, default=6.0, help="resident GB at which an old run is stopped")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds before a new run is stopped")
    a = ap.parse_args()
    generate()
    old = None if a.old == "none" else old_tree(a.old)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    print("| part | code | wall s | CPU s | peak RSS | events | decisions | decision p50 / p99 ms | utilisation | "
          "result |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in a.parts.split(","):
        part = PARTS[name]
        new = run_child(ROOT, part, a.timeout, 64 * 2**20)
        print(f"| {name} | new | {_fmt(new)} |", flush=True)
        if old is not None and part.get("old", True):
            was = run_child(old, part, a.old_timeout, int(a.old_rss_gb * 2**20))
            same = ""
            if "stopped" not in was and "stopped" not in new:
                same = "; same figures as new" if was["summary"] == new["summary"] else "; FIGURES DIFFER from new"
            print(f"| {name} | old {a.old} | {_fmt(was)}{same} |", flush=True)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
