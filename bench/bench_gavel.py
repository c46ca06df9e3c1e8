"""``--compat gavel`` vs Gavel's own simulator: figures and wall time side by side (issue 19).

Ours runs in this process (the simulation alone, as ``simulate --json`` reports ``wall_s``) and as the full
``hpcsched simulate`` command; Gavel's runs as its trace driver in its own venv, timed as a process (its
import of cvxpy included, as a user pays it), when a checkout is given:

    python bench/bench_gavel.py                          # ours only, against the README's figures
    python bench/bench_gavel.py --gavel /tmp/gavel/scheduler --gavel-python /tmp/gavel-venv/bin/python
    python bench/bench_gavel.py --solvers highs,ecos     # the HiGHS default and --solver ecos, row by row

(or GAVEL_DIR / GAVEL_PYTHON in the environment). Gavel needs its gRPC stubs (``make rpc_stubs``), a
``matrix_completion`` module (only its throughput estimator uses it: an empty stub on PYTHONPATH will do,
``--gavel-pythonpath``), and for the packed policy the revert in ../shared/reference/gavel/README.md, in a
second checkout (``--gavel-packed``). Traces: A and A4 (the README's), B, C and D4 (made by our generator;
their Gavel figures are in tests/test_gavel_compat.py).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACES = {"A": (ROOT / "trace-data/gavel/A_120jobs_0.5jph_seed0.trace", "v100=8,p100=8,k80=8", "8:8:8"),
          "A4": (ROOT / "trace-data/gavel/A4_120jobs_0.5jph_seed0_sfmax4.trace", "v100=4,p100=4,k80=4", "4:4:4"),
          "B": (ROOT / "trace-data/gavel/B_80jobs_1jph_seed1_sfmax4.trace", "v100=4,p100=4,k80=4", "4:4:4"),
          "C": (ROOT / "trace-data/gavel/C_100jobs_1jph_seed2.trace", "v100=8,p100=8,k80=8", "8:8:8"),
          "D4": (ROOT / "trace-data/gavel/D4_120jobs_1jph_seed3_sfmax4.trace", "v100=4,p100=4,k80=4", "4:4:4")}
POLICIES = ("fifo", "max-min-fairness", "max-min-fairness-perf", "finish-time-fairness-perf",
            "min-total-duration-perf", "max-sum-throughput-perf")


def _timed(cmd: list[str], **kw: object) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``cmd``; (the process, its wall s, its CPU s: user + system of the child and its children).

    CPU time is reported beside wall time because this machine is shared: other sessions' load stretches
    wall time (both programs' alike, but not evenly), while a process's own CPU time barely moves.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p, wall, cpu


def gavel_run(gavel: Path, python: str, pythonpath: str | None, trace: Path, policy: str,
              spec: str) -> tuple[float, float, float, float]:
    """Gavel's (avg JCT, makespan, wall s, CPU s) for one run of its trace driver (the README's command)."""
    cmd = [python, "scripts/drivers/simulate_scheduler_with_trace.py", "-t", str(trace), "-p",
           policy.replace("-", "_"), "-c", spec, "--seed", "0", "--solver", "ECOS", "--time_per_iteration", "360",
           "--throughputs_file", "simulation_throughputs.json", "--num_gpus_per_server", "1:1:1"]
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    p, wall, cpu = _timed(cmd, cwd=gavel, env=env)
    jct = re.search(r"Average job completion time: ([\d.]+) seconds", p.stdout)
    total = re.search(r"Total duration: ([\d.]+) seconds", p.stdout)
    if p.returncode or not jct or not total:
        raise RuntimeError(f"Gavel failed ({p.returncode}): {p.stderr[-2000:]}")
    return float(jct.group(1)), float(total.group(1)), wall, cpu


def ours_cli(trace: Path, cluster: str, policy: str, repeat: int, solver: str = "highs") -> tuple[float, float]:
    """(wall s, CPU s) of the whole ``hpcsched simulate ... --compat gavel --json [--solver ecos]`` process, the
    best of ``repeat`` runs of each."""
    exe = str(Path(sys.executable).parent / "hpcsched")
    walls, cpus = [], []
    extra = ["--solver", solver]  # named always: the command's default (auto) is ecos where it is installed
    for _ in range(repeat):
        p, wall, cpu = _timed([exe, "simulate", "--trace", str(trace), "--cluster", cluster, "--policy", policy,
                               "--compat", "gavel", "--json", *extra], cwd=ROOT)
        if p.returncode:
            raise RuntimeError(f"hpcsched failed ({p.returncode}): {p.stderr[-2000:]}")
        walls.append(wall)
        cpus.append(cpu)
    return min(walls), min(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gavel", default=os.environ.get("GAVEL_DIR"), help="Gavel's scheduler/ directory")
    ap.add_argument("--gavel-python", default=os.environ.get("GAVEL_PYTHON", "python3"))
    ap.add_argument("--gavel-pythonpath", default=os.environ.get("GAVEL_PYTHONPATH"))
    ap.add_argument("--gavel-packed", default=os.environ.get("GAVEL_PACKED_DIR"),
                    help="scheduler/ of a checkout with the README's revert, for max-min-fairness-packed")
    ap.add_argument("--solvers", default="highs", help="ours with each of these --solver values (highs, ecos)")
    ap.add_argument("--traces", default="A,A4")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--repeat", type=int, default=3, help="runs of ours per case (the best is kept; Gavel: 1)")
    args = ap.parse_args()

    from hpcsched.hetero.simulate import run_gavel

    sys.path.insert(0, str(ROOT / "tests"))
    from test_gavel_compat import GAVEL, MORE  # Gavel's figures: the README's, and on our generated traces

    print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print("| trace | policy | solver | avg JCT ours / Gavel's (diff) | makespan ours / Gavel's (diff) | ours sim s | "
          "ours CLI wall / CPU s | Gavel wall / CPU s | ratio wall / CPU (Gavel / ours CLI) |")
    print("|---|---|---|---|---|---|---|---|---|")
    walls, cpus = [], []
    for name in args.traces.split(","):
        trace, cluster, spec = TRACES[name]
        for policy in args.policies.split(","):
            gavel_dir = args.gavel_packed if policy == "max-min-fairness-packed" else args.gavel
            gavel = None
            if gavel_dir:  # Gavel once per case, beside each of our solvers
                gavel = gavel_run(Path(gavel_dir), args.gavel_python, args.gavel_pythonpath, trace, policy, spec)
            for solver in args.solvers.split(","):
                s = run_gavel(trace, cluster, policy, solver=solver)
                cli_wall, cli_cpu = ours_cli(trace, cluster, policy, args.repeat, solver)
                if gavel is not None:
                    g_jct, g_mk, g_wall, g_cpu = gavel
                    walls.append(g_wall / cli_wall)
                    cpus.append(g_cpu / cli_cpu)
                    g = f"{g_wall:.2f} / {g_cpu:.2f} | {g_wall / cli_wall:.1f}x / {g_cpu / cli_cpu:.1f}x"
                else:
                    (g_jct, g_mk), g = (GAVEL | MORE)[(name, policy)], "- | -"
                d_jct = 100 * (s["avg_jct"] / g_jct - 1)
                print(f"| {name} | {policy} | {solver} | {s['avg_jct']:,.3f} / {g_jct:,.3f} ({d_jct:+.2f}%) "
                      f"| {s['makespan']:,.3f} / {g_mk:,.3f} ({100 * (s['makespan'] / g_mk - 1):+.2f}%) "
                      f"| {s['wall_s']:.2f} | {cli_wall:.2f} / {cli_cpu:.2f} | {g} |", flush=True)
    print(f"\nload average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if walls:
        print(f"\nspeed-up, Gavel's process / ours: wall min {min(walls):.1f}x, max {max(walls):.1f}x; "
              f"CPU min {min(cpus):.1f}x, max {max(cpus):.1f}x")


if __name__ == "__main__":
    main()
