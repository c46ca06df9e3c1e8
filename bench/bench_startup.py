"""CLI start-up (issue 14): whole-process times of `hpcsched --help` and of a small simulation, beside the
reference Muri simulator on the same trace and policy, in the same run.

What a user waits for is the process, not the simulation inside it (0.1-0.2 s for SRSF on trace3):
interpreter start, imports, argument parsing, writing the result files. Targets: `hpcsched --help`
<= 0.4 s; `hpcsched simulate --trace trace-data/muri/trace3.csv --cluster cluster_spec/n8g8.csv
--policy srsf --compat muri --out DIR` <= 0.8 s and >= 5x faster than the reference's
`run_sim.py --schedule=shortest-gpu` (its SRSF) on the same trace and cluster.

The three commands run interleaved, one of each per repetition after one unmeasured warm-up each, so
that a change of load touches them alike; each figure is the median and the minimum over the
repetitions, of wall time and of the child's CPU time (user + system, the fairer figure on a shared
machine). The load average is printed before and after. The average JCT of both simulators is
printed too, to show they simulated the same thing.

Bytecode: by default the children run as Python does out of the box, caching compiled modules, in a
cache of this run's own (``PYTHONPYCACHEPREFIX`` in the temporary folder, filled by the warm-up, so neither
this checkout nor the reference's folder gets ``__pycache__`` files); an environment that sets
``PYTHONDONTWRITEBYTECODE`` (this project's machines do) would otherwise make every run compile the
project's ~45 modules (and the reference's) from source again, ~0.07 s that no user with a normal
Python pays after the first run. ``--no-bytecode-cache`` measures that way instead (both simulators alike),
as the bench did before it chose (its first figures in bench/RESULTS.md were, this environment setting it).

The reference is not part of this repository. Get it once (Muri's SIGCOMM'22 artifact, Rivendile/Muri on
GitHub; its ``simulator/`` folder) and give it a Python with numpy and cvxpy, e.g.::

    python3 -m venv /tmp/muriref-venv && /tmp/muriref-venv/bin/pip install numpy cvxpy
    bench/bench_startup.py --ref /tmp/muriref/simulator --ref-python /tmp/muriref-venv/bin/python

(``--ref`` defaults to $MURI_REF, else /tmp/muriref/simulator; ``--ref-python`` to $MURI_PYTHON, else
/tmp/muriref-venv/bin/python.) Without a runnable reference the bench says why and prints our figures.

Run: .venv/bin/python bench/bench_startup.py [--reps 7] [--no-bytecode-cache]
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "trace-data/muri/trace3.csv"
CLUSTER = ROOT / "cluster_spec/n8g8.csv"
TARGET_HELP_S = 0.4
TARGET_SIMULATE_S = 0.8
TARGET_RATIO = 5.0


def hpcsched_exe() -> list[str]:
    """The installed console script beside this interpreter (what a user types), else ``python -m``."""
    script = Path(sys.executable).parent / "hpcsched"
    return [str(script)] if script.exists() else [sys.executable, "-m", "hpcsched.cli"]


def child_env(work: Path, bytecode_cache: bool) -> dict[str, str]:
    """The children's environment: Python's default bytecode caching (into ``work``) unless told otherwise."""
    env = os.environ | {"COLUMNS": "120"}
    if not bytecode_cache:
        return env | {"PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env | {"PYTHONPYCACHEPREFIX": str(work / "pycache")}


def timed(cmd: Sequence[str], cwd: Path, stdout: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one run of ``cmd``; a failed run stops the bench."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(stdout, "w") as out:
        p = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {' '.join(cmd)} (output in {stdout})")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def avg_jct(jobs_csv: Path, submit: str, end: str) -> float:
    """Mean of end - submit over the rows of a jobs file (ours: submit,end; the reference's: JCT's parts)."""
    rows = list(csv.DictReader(open(jobs_csv)))
    return sum(float(r[end]) - float(r[submit]) for r in rows) / len(rows)


def reference_problem(ref: Path, python: str) -> str | None:
    """Why the reference cannot be run here, or None when it can."""
    if not (ref / "run_sim.py").exists():
        return f"no reference simulator at {ref} (run_sim.py missing; see this file's docstring)"
    if not Path(python).exists():
        return f"no Python for the reference at {python} (it needs numpy and cvxpy; see this file's docstring)"
    p = subprocess.run([python, "-c", "import numpy, cvxpy"], capture_output=True, text=True)
    if p.returncode != 0:
        return f"{python} cannot import numpy and cvxpy: {p.stderr.strip().splitlines()[-1:]}"
    return None


def summary(label: str, walls: list[float], cpus: list[float]) -> str:
    return (f"{label:<37} wall median {statistics.median(walls):6.3f} s  min {min(walls):6.3f} s   "
            f"cpu median {statistics.median(cpus):6.3f} s  min {min(cpus):6.3f} s")


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7, help="measured repetitions of each command (after 1 warm-up)")
    ap.add_argument("--ref", type=Path, default=Path(os.environ.get("MURI_REF", "/tmp/muriref/simulator")),
                    help="the reference's simulator/ folder")
    ap.add_argument("--ref-python", default=os.environ.get("MURI_PYTHON", "/tmp/muriref-venv/bin/python"),
                    help="a Python with numpy and cvxpy for the reference")
    ap.add_argument("--no-bytecode-cache", dest="bytecode_cache", action="store_false",
                    help="run every child with PYTHONDONTWRITEBYTECODE=1 (modules compiled from source each run)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_startup-"))
    exe = hpcsched_exe()
    commands: dict[str, tuple[list[str], Path]] = {
        "hpcsched --help": ([*exe, "--help"], ROOT),
        "hpcsched simulate srsf --compat muri": (
            [*exe, "simulate", "--trace", str(TRACE), "--cluster", str(CLUSTER), "--policy", "srsf",
             "--compat", "muri", "--out", str(work / "ours")], ROOT),
    }
    why_not = reference_problem(args.ref, args.ref_python)
    if why_not is None:
        # As the reference's sim_fig9.sh runs it (--print, yarn placement, 4 resources); shortest-gpu is SRSF.
        commands["reference run_sim.py srsf"] = (
            [args.ref_python, "run_sim.py", f"--cluster_spec={CLUSTER}", "--print", "--scheme=yarn",
             f"--trace_file={TRACE}", "--schedule=shortest-gpu", f"--log_path={work / 'ref'}",
             "--multi_resource", "4"], args.ref)
        (work / "ref").mkdir()

    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} "
          f"({os.cpu_count()} cores); {args.reps} repetitions after 1 warm-up; hpcsched = {' '.join(exe)}; "
          f"bytecode {'cached (Python default)' if args.bytecode_cache else 'not cached (PYTHONDONTWRITEBYTECODE=1)'}",
          flush=True)
    env = child_env(work, args.bytecode_cache)
    for label, (cmd, cwd) in commands.items():
        print(f"  {label}: {' '.join(cmd)}  (in {cwd})", flush=True)
    walls: dict[str, list[float]] = {k: [] for k in commands}
    cpus: dict[str, list[float]] = {k: [] for k in commands}
    for rep in range(args.reps + 1):
        for label, (cmd, cwd) in commands.items():
            wall, cpu = timed(cmd, cwd, work / f"{label.split()[0]}-{label.split()[1]}.out", env)
            if rep > 0:
                walls[label].append(wall)
                cpus[label].append(cpu)
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    for label in commands:
        print(summary(label, walls[label], cpus[label]))

    help_s = statistics.median(walls["hpcsched --help"])
    sim_label = "hpcsched simulate srsf --compat muri"
    sim_s = statistics.median(walls[sim_label])
    print(f"target `hpcsched --help` <= {TARGET_HELP_S} s (median wall): {verdict(help_s <= TARGET_HELP_S)}")
    print(f"target `hpcsched simulate` <= {TARGET_SIMULATE_S} s (median wall): {verdict(sim_s <= TARGET_SIMULATE_S)}")
    ours_jct = avg_jct(work / "ours" / "jobs.csv", "submit", "end")
    if why_not is not None:
        print(f"reference not run: {why_not}")
        print(f"ours: avg JCT {ours_jct:,.2f} s")
        return
    ref_label = "reference run_sim.py srsf"
    ratio = statistics.median(walls[ref_label]) / sim_s
    print(f"reference / hpcsched simulate: {ratio:.2f}x (median wall), "
          f"{min(walls[ref_label]) / min(walls[sim_label]):.2f}x (min wall), "
          f"{statistics.median(cpus[ref_label]) / statistics.median(cpus[sim_label]):.2f}x (median CPU)")
    print(f"target >= {TARGET_RATIO:g}x faster than the reference (median wall): {verdict(ratio >= TARGET_RATIO)}")
    ref_jct = avg_jct(work / "ref" / "job.csv", "submit_time", "end_time")
    print(f"same simulation: avg JCT ours {ours_jct:,.2f} s, reference {ref_jct:,.2f} s")


if __name__ == "__main__":
    main()
