"""``--compat gavel`` vs Gavel's own simulator: figures and wall time side by side (issue 19).

Ours runs in this process (the simulation alone, as ``simulate --json`` reports ``wall_s``) and as the full
``hpcsched simulate`` command; Gavel's runs as its trace driver in its own venv, timed as a process (its
import of cvxpy included, as a user pays it), when a checkout is given:

    python bench/bench_gavel.py                          # ours only, against the README's figures
    python bench/bench_gavel.py --gavel /tmp/gavel/scheduler --gavel-python /tmp/gavel-venv/bin/python

(or GAVEL_DIR / GAVEL_PYTHON in the environment). Gavel needs its gRPC stubs (``make rpc_stubs``), a
``matrix_completion`` module (only its throughput estimator uses it: an empty stub on PYTHONPATH will do,
``--gavel-pythonpath``), and for the packed policy the revert in ../shared/reference/gavel/README.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACES = {"A": (ROOT / "trace-data/gavel/A_120jobs_0.5jph_seed0.trace", "v100=8,p100=8,k80=8", "8:8:8"),
          "A4": (ROOT / "trace-data/gavel/A4_120jobs_0.5jph_seed0_sfmax4.trace", "v100=4,p100=4,k80=4", "4:4:4")}
POLICIES = ("fifo", "max-min-fairness", "max-min-fairness-perf", "finish-time-fairness-perf",
            "min-total-duration-perf", "max-sum-throughput-perf")


def gavel_run(gavel: Path, python: str, pythonpath: str | None, trace: Path, policy: str,
              spec: str) -> tuple[float, float, float]:
    """Gavel's (avg JCT, makespan, wall s) for one run of its trace driver (the README's command)."""
    cmd = [python, "scripts/drivers/simulate_scheduler_with_trace.py", "-t", str(trace), "-p",
           policy.replace("-", "_"), "-c", spec, "--seed", "0", "--solver", "ECOS", "--time_per_iteration", "360",
           "--throughputs_file", "simulation_throughputs.json", "--num_gpus_per_server", "1:1:1"]
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=gavel, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    jct = re.search(r"Average job completion time: ([\d.]+) seconds", p.stdout)
    total = re.search(r"Total duration: ([\d.]+) seconds", p.stdout)
    if p.returncode or not jct or not total:
        raise RuntimeError(f"Gavel failed ({p.returncode}): {p.stderr[-2000:]}")
    return float(jct.group(1)), float(total.group(1)), wall


def ours_cli(trace: Path, cluster: str, policy: str) -> float:
    """Wall s of the whole ``hpcsched simulate ... --compat gavel --json`` process."""
    t0 = time.perf_counter()
    exe = str(Path(sys.executable).parent / "hpcsched")
    subprocess.run([exe, "simulate", "--trace", str(trace), "--cluster", cluster, "--policy", policy,
                    "--compat", "gavel", "--json"], check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gavel", default=os.environ.get("GAVEL_DIR"), help="Gavel's scheduler/ directory")
    ap.add_argument("--gavel-python", default=os.environ.get("GAVEL_PYTHON", "python3"))
    ap.add_argument("--gavel-pythonpath", default=os.environ.get("GAVEL_PYTHONPATH"))
    ap.add_argument("--traces", default="A,A4")
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args()

    from hpcsched.hetero.simulate import run_gavel

    sys.path.insert(0, str(ROOT / "tests"))
    from test_gavel_compat import GAVEL  # the README's figures

    print("| trace | policy | avg JCT ours / Gavel's (diff) | makespan ours / Gavel's (diff) | ours sim s | "
          "ours CLI s | Gavel s | ratio (Gavel / ours CLI) |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for name in args.traces.split(","):
        trace, cluster, spec = TRACES[name]
        for policy in args.policies.split(","):
            s = run_gavel(trace, cluster, policy)
            cli_s = ours_cli(trace, cluster, policy)
            if args.gavel:
                g_jct, g_mk, g_s = gavel_run(Path(args.gavel), args.gavel_python, args.gavel_pythonpath, trace,
                                             policy, spec)
                ratios.append(g_s / cli_s)
                g = f"{g_s:.2f} | {g_s / cli_s:.1f}x"
            else:
                (g_jct, g_mk), g = GAVEL[(name, policy)], "- | -"
            d_jct = 100 * (s["avg_jct"] / g_jct - 1)
            print(f"| {name} | {policy} | {s['avg_jct']:,.3f} / {g_jct:,.3f} ({d_jct:+.2f}%) "
                  f"| {s['makespan']:,.3f} / {g_mk:,.3f} ({100 * (s['makespan'] / g_mk - 1):+.2f}%) "
                  f"| {s['wall_s']:.2f} | {cli_s:.2f} | {g} |", flush=True)
    if ratios:
        print(f"\nspeed-up, Gavel's process / ours: min {min(ratios):.1f}x, max {max(ratios):.1f}x")


if __name__ == "__main__":
    main()
