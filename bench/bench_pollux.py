"""``--compat pollux`` against the Pollux OSDI'21 artifact: results and speed, side by side.

For each (policy, workload, seed) runs ``hpcsched simulate --compat pollux`` as a process and records its avg
JCT, per-job agreement with the authors' shipped JCTs (tests/data/pollux/shipped-jcts-1.0.csv) and its CPU
seconds (user + sys of the child: the fair figure on a loaded, shared machine) and wall seconds. With
``--reference DIR`` (the artifact's simulator/ folder) and ``--reference-python PY`` (its environment, see
docs/simulator.md) it also runs the artifact's ``simulator.py`` on the same workload and records the same.
Each row is appended to ``--out`` (JSON lines) as soon as it finishes, so a long batch can be watched/resumed.

Run:
  OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/bench_pollux.py --policies tiresias,optimus --workloads 1-8
  .venv/bin/python bench/bench_pollux.py --policies pollux --workloads 6 --seeds 0,1,2
  .venv/bin/python bench/bench_pollux.py --policies tiresias --workloads 6 \
      --reference /work/ref/pollux-osdi21/simulator --reference-python /work/ref/venv/bin/python
  .venv/bin/python bench/bench_pollux.py --summarise OUT.jsonl
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "pollux"
CLUSTER = ROOT / "cluster_spec" / "n16g4.csv"
AUTHORS_MEAN = {"pollux": 2751.13359375, "optimus": 5681.933593749999, "tiresias": 4038.18203125}
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def shipped() -> dict[tuple[str, str], dict[str, float]]:
    out: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    with open(DATA / "shipped-jcts-1.0.csv") as f:
        for r in csv.DictReader(f):
            out[(r["policy"], r["workload"])][r["job"]] = float(r["jct"])
    return out


def _timed(cmd: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=ENV)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return r, cpu, wall


def run_ours(policy: str, trace: Path, seed: int, optimiser: str = "ga") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "hpcsched.cli", "simulate", "--trace", str(trace),
               "--cluster", str(CLUSTER), "--policy", policy, "--compat", "pollux", "--out", tmp, "--json"]
        if policy == "pollux":
            cmd += ["--seed", str(seed), "--pollux-optimiser", optimiser]
        r, cpu, wall = _timed(cmd, ROOT)
        if r.returncode != 0:
            return {"error": r.stderr[-2000:]}
        with open(Path(tmp) / "jobs.csv") as f:
            jcts = {row["job_id"]: float(row["end"]) - float(row["submit"]) for row in csv.DictReader(f)}
    return {"avg_jct": sum(jcts.values()) / len(jcts), "cpu_s": cpu, "wall_s": wall, "jcts": jcts}


def run_reference(policy: str, trace: Path, ref_dir: Path, python: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "out.log"
        r, cpu, wall = _timed([python, "simulator.py", "--policy", policy, "--output", str(log),
                               str(trace.resolve())], ref_dir)
        if r.returncode != 0:
            return {"error": r.stderr[-2000:]}
        last = json.loads(log.read_text().splitlines()[-1])
    jcts = {j["name"]: j["completion_time"] - j["submission_time"] for j in last["submitted_jobs"]
            if j["completion_time"] is not None}
    return {"avg_jct": sum(jcts.values()) / len(jcts), "cpu_s": cpu, "wall_s": wall, "jcts": jcts}


def _range(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def _workloads(text: str) -> list[tuple[str, Path]]:
    """``1-8`` -> the artifact's workloads; a token ending in ``.csv`` -> that trace (a cut), named by its stem."""
    out: list[tuple[str, Path]] = []
    for part in text.split(","):
        if part.endswith(".csv"):
            out.append((Path(part).stem, Path(part)))
        else:
            out += [(f"workload-{w}", DATA / "workloads" / f"workload-{w}.csv") for w in _range(part)]
    return out


def summarise(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        by[(r["side"], r["policy"] + (f" {r['optimiser']}" if r.get("optimiser") else ""))].append(r)
    for (side, label), rs in sorted(by.items()):
        policy = label.split()[0]
        per_wl: dict[str, list[float]] = defaultdict(list)
        for r in rs:
            if "avg_jct" in r:
                per_wl[r["workload"]].append(r["avg_jct"])
        means = {w: sum(v) / len(v) for w, v in per_wl.items()}
        mean = sum(means.values()) / len(means) if means else float("nan")
        cpu = [r["cpu_s"] for r in rs if "cpu_s" in r]
        print(f"{side:9s} {label:12s} workloads={len(means)} runs={len(cpu)} mean_avg_jct={mean:.1f} "
              f"(authors' 8-workload mean {AUTHORS_MEAN[policy]:.1f}) cpu_s mean={sum(cpu) / max(len(cpu), 1):.1f}")
        for w in sorted(means, key=lambda s: int(s.split("-")[1])):
            print(f"    {w}: {means[w]:.1f} over {len(per_wl[w])} run(s)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", default="tiresias,optimus")
    ap.add_argument("--workloads", default="1-8", help="1-8, 6,7 or a trace FILE.csv (e.g. a cut of one)")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--optimiser", default="ga", help="pollux: ga (100 x 100) or ga:POPxGEN")
    ap.add_argument("--reference", type=Path)
    ap.add_argument("--reference-python", default=sys.executable)
    ap.add_argument("--out", type=Path, default=Path("bench_pollux.jsonl"))
    ap.add_argument("--summarise", type=Path)
    args = ap.parse_args()
    if args.summarise:
        summarise(args.summarise)
        return
    ship = shipped()
    for policy in args.policies.split(","):
        for wl, trace in _workloads(args.workloads):
            seeds = _range(args.seeds) if policy == "pollux" else [0]
            sides = [("ours", s) for s in seeds] + ([("reference", None)] if args.reference else [])
            for side, seed in sides:
                load = open("/proc/loadavg").read().split()[0]
                res = run_ours(policy, trace, seed or 0, args.optimiser) if side == "ours" else \
                    run_reference(policy, trace, args.reference, args.reference_python)
                exp = ship.get((policy, wl), {})
                jcts = res.pop("jcts", {})
                row = {"side": side, "policy": policy, "workload": wl, "seed": seed, "load_start": float(load),
                       "optimiser": args.optimiser if policy == "pollux" and side == "ours" else None,
                       **res, "jobs": len(jcts),
                       "mismatches_vs_shipped": sum(1 for k, v in exp.items() if jcts.get(k) != v),
                       "shipped_avg_jct": sum(exp.values()) / len(exp) if exp else None,
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
                print(json.dumps(row), flush=True)
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
