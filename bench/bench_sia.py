"""``--compat sia`` vs the Sia artifact's simulator: avg JCT and wall time side by side on saturn cuts.

A cut keeps the rows of a saturn workload submitted before T seconds (the artifact's cluster unchanged). Ours
runs as the full ``hpcsched simulate --compat sia`` command (a process, timed); the artifact's as its
``multi_simulator.py`` with ``run_experiment.sh``'s flags in its own venv (timed as a process), or its earlier
logs are read (``--reference-logs DIR`` with ``{policy}_w{N}_{T}.log``, as /work/ref/sia-runs keeps them):

    python bench/bench_sia.py --artifact /work/ref/sia/sia-simulator --reference-logs /work/ref/sia-runs
    python bench/bench_sia.py --artifact ... --reference-python /work/ref/venv-sia/bin/python --run-reference
    python bench/bench_sia.py --artifact ... --tie-breaks prev-high,high,low   # Sia's tie sensitivity (in-process)
    python bench/bench_sia.py --policies sia,pollux,gavel --seeds 0 --cuts 1:1e9,2:1e9 --optimiser ga:20x10  # Table 3

``pollux`` is Pollux as the Sia paper ran it (heterogeneity-unaware, ``hpcsched.sia.pollux_unaware``; the
artifact's ``multi_simulator_unaware.py --policy=pollux --policy_p_val=-1 --interval=60``); ours is seeded, so
its row is the mean over ``--seeds`` (each seed's avg JCT listed), the artifact's GA is not.

Prints one Markdown row per (cut, policy): jobs, the artifact's avg JCT, ours, the difference, both walls
and the load average at the start and end of the row.
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
sys.path.insert(0, str(ROOT))

SIA_FLAGS = ["--policy=sia", "--policy_p_val=-0.5", "--mip_lambda_a=0.01", "--mip_lambda_n=1.1", "--interval=60",
             "--project_throughput", "--share_max_replicas"]
GAVEL_FLAGS = ["--policy=gavel", "--interval=360"]
POLLUX_FLAGS = ["--policy=pollux", "--interval=60", "--policy_p_val=-1"]  # run_experiment.sh's, unaware simulator
DEFAULT_CUTS = "1:1800,2:1800,3:1800,1:3600,2:3600,3:3600"


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def write_cut(artifact: Path, workload: int, until: float, into: Path) -> Path:
    lines = (artifact / "workloads" / "saturn" / f"workload-{workload}.csv").read_text().splitlines()
    out = into / f"saturn_w{workload}_first{int(until)}s.csv"
    out.write_text("\n".join([lines[0]] + [x for x in lines[1:] if float(x.split(",")[1]) < until]) + "\n")
    return out


def reference_avg(log: Path) -> float:
    """avg JCT from the artifact's JSON-lines log (its last record), as its print_run_stats does."""
    last = log.read_text().strip().splitlines()[-1]
    jobs = json.loads(last)["submitted_jobs"]
    jct = [j["completion_time"] - j["submission_time"] for j in jobs if j["completion_time"] is not None]
    if len(jct) != len(jobs):
        raise SystemExit(f"{log}: {len(jobs) - len(jct)} jobs unfinished (an interrupted run?)")
    return sum(jct) / len(jct)


def run_ours(cut: Path, policy: str, artifact: Path, seed: int = 0, optimiser: str = "ga") -> tuple[dict, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "hpcsched.cli", "simulate", "--compat", "sia", "--policy", policy,
                        "--trace", str(cut), "--cluster", str(ROOT / "cluster_spec" / "saturn.csv"),
                        "--profiles", str(artifact / "traces"), "--json",
                        *(["--seed", str(seed), "--pollux-optimiser", optimiser] if policy == "pollux" else [])],
                       capture_output=True, text=True,
                       env=env)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"ours failed on {cut}: {r.stderr.strip()}")
    return json.loads(r.stdout), wall


def run_reference(cut: Path, policy: str, artifact: Path, python: str, out: Path) -> tuple[float, float]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    log = out / f"{policy}_{cut.stem}.log"
    t0 = time.perf_counter()
    flags = {"sia": SIA_FLAGS, "gavel": GAVEL_FLAGS, "pollux": POLLUX_FLAGS}[policy]
    script = "multi_simulator_unaware.py" if policy == "pollux" else "multi_simulator.py"
    r = subprocess.run([python, script, str(cut), *flags, f"--output={log}"], cwd=artifact, capture_output=True,
                       text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"the artifact failed on {cut}: {r.stderr.strip()[-500:]}")
    return reference_avg(log), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", type=Path, default=Path(os.environ.get("HPCSCHED_SIA_ARTIFACT",
                                                                         "/work/ref/sia/sia-simulator")))
    ap.add_argument("--cuts", default=DEFAULT_CUTS, help="workload:seconds, comma-separated")
    ap.add_argument("--policies", default="gavel,sia", help="of gavel, sia, pollux")
    ap.add_argument("--seeds", default="0", help="pollux: its search's seeds (the row is their mean)")
    ap.add_argument("--optimiser", default="ga", help="pollux: --pollux-optimiser (ga = the artifact's 100 x 100)")
    ap.add_argument("--reference-logs", type=Path, help="the artifact's logs of earlier runs ({policy}_wN_T.log)")
    ap.add_argument("--run-reference", action="store_true", help="run the artifact now (minutes per cut)")
    ap.add_argument("--reference-python", default=os.environ.get("SIA_PYTHON", "/work/ref/venv-sia/bin/python"))
    ap.add_argument("--tie-breaks", help="instead: Sia's avg JCT per tie-break rule (in-process), e.g. prev-high,high")
    args = ap.parse_args()
    cuts = [(int(w), float(t)) for w, t in (c.split(":") for c in args.cuts.split(","))]
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        if args.tie_breaks:
            from hpcsched.sia.simulate import read_cluster, read_workload, run

            nodes, gpus = read_cluster(ROOT / "cluster_spec" / "saturn.csv")
            print("| cut | tie-break | avg JCT (s) | wall (s) | load |\n|---|---|---|---|---|")
            for w, t in cuts:
                cut = write_cut(args.artifact, w, t, tmpd)
                for tb in args.tie_breaks.split(","):
                    s = run(read_workload(cut), nodes, gpus, "sia", str(args.artifact / "traces"), tie_break=tb)
                    print(f"| w{w} < {t:.0f} s | {tb} | {s['avg_jct']:.2f} | {s['wall_s']:.1f} | {load()} |",
                          flush=True)
            return
        print("| cut | policy | jobs | artifact avg JCT (s) | ours (s) | diff | artifact wall (s) | ours wall (s) "
              "| load start / end |\n|---|---|---|---|---|---|---|---|---|")
        means: dict[str, list[float]] = {}
        for w, t in cuts:
            cut = write_cut(args.artifact, w, t, tmpd)
            for policy in args.policies.split(","):
                start = load()
                ref_wall = None
                if args.run_reference:
                    ref, ref_wall = run_reference(cut, policy, args.artifact, args.reference_python, tmpd)
                elif args.reference_logs:
                    log = args.reference_logs / f"{policy}_w{w}_{int(t)}.log"
                    ref = reference_avg(log) if log.exists() else None
                else:
                    ref = None
                seeds = [int(x) for x in args.seeds.split(",")] if policy == "pollux" else [0]
                runs = [run_ours(cut, policy, args.artifact, seed, args.optimiser) for seed in seeds]
                avg = sum(r["avg_jct"] for r, _ in runs) / len(runs)
                means.setdefault(policy, []).append(avg)
                wall = sum(x for _, x in runs) / len(runs)
                each = ", ".join(f"{r['avg_jct']:.1f}" for r, _ in runs)
                label = policy if len(runs) == 1 else f"{policy} (seeds {args.seeds}: {each})"
                diff = f"{(avg / ref - 1) * 100:+.2f}%" if ref else "-"
                print(f"| w{w} < {t:.0f} s | {label} | {runs[0][0]['jobs']} | {f'{ref:.2f}' if ref else '-'} | "
                      f"{avg:.2f} | {diff} | {f'{ref_wall:.1f}' if ref_wall else '-'} | {wall:.1f} | "
                      f"{start} / {load()} |", flush=True)
        if len(cuts) > 1:  # Table 3's form: mean +- std over the workloads (cuts), and the policies' order
            print()
            for policy, v in means.items():
                m = sum(v) / len(v)
                sd = (sum((x - m) ** 2 for x in v) / (len(v) - 1)) ** 0.5
                print(f"{policy}: avg JCT {m / 3600:.3f} +- {sd / 3600:.3f} h over {len(v)}")
            print("order (lowest mean first):", " < ".join(sorted(means, key=lambda k: sum(means[k]))))


if __name__ == "__main__":
    main()
