"""Heterogeneity-aware vs agnostic Gavel policies on Gavel's continuous-arrival workload (issue 19, "Done when").

For each arrival rate and seed, writes a trace with Gavel's own generator (``hpcsched.hetero.workload``, what
``hpcsched trace generate gavel`` writes), runs every policy through ``--compat gavel`` (in this process through
``hpcsched.hetero.simulate.run_gavel``, or with ``--via cli`` as ``hpcsched simulate ... --compat gavel --json
--out DIR`` processes), and records per run: average / median / p99 JCT, makespan, jobs Gavel's mechanism dropped,
and the fairness figures of ``calc`` (``hpcsched.metrics.fairness_metrics``): finish-time fairness rho (worst,
median, mean), Jain's index of shares, GPU-hours.

rho's baseline: ``calc --isolated fluid`` needs each job's solo time, which a Gavel job does not have (its speed
depends on the GPU type it gets), so calc reports rho as unavailable for these runs. This bench computes Gavel's
isolated policy for a heterogeneous cluster as a fluid instead (``hetero_isolated_jcts``: while m jobs are in the
system each job gets 1/m of every type, at most its own scale factor, i.e. Gavel's ``IsolatedPolicy``
allocation, at the throughput table's speeds) and hands those JCTs to calc's ``fairness_metrics`` as the baseline.

Prints two tables: per rate and policy, the median over seeds [min, max]; and per rate, each aware policy
against an agnostic one: the ratio aware / agnostic per seed (median [min, max]) and in how many seeds the aware
one was better. ``--out`` keeps the traces, every run's jobs.csv/meta.json and ``runs.csv``; ``--plots DIR``
writes the figures (average JCT vs arrival rate; JCT CDF at ``--cdf-rate``; worst rho and makespan vs rate).

    .venv/bin/python bench/bench_hetero.py --seeds 0,1,2,3,4 --rates 0.5,1,1.5,2,2.5,3 --jobs 500 \
        --cluster v100=36,p100=36,k80=36 --out /tmp/bench_hetero --plots docs/hetero --workers 2
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # a fallback: PYTHONPATH (e.g. a snapshot of a commit) or the install wins

POLICIES = ("fifo", "max-min-fairness", "max-min-fairness-perf", "finish-time-fairness-perf",
            "min-total-duration-perf", "max-sum-throughput-perf")
AGNOSTIC = ("fifo", "max-min-fairness")
# (agnostic, aware, metrics compared). Only max-min-fairness / -perf is a true pair (the same program with and
# without throughputs); Gavel's agnostic fifo / finish_time_fairness / min_total_duration counterparts and its
# fifo_perf are not registered here, so the other aware policies are set against the nearest agnostic one.
PAIRS = (
    ("max-min-fairness", "max-min-fairness-perf", ("avg_jct", "rho_max", "makespan")),
    ("max-min-fairness", "finish-time-fairness-perf", ("rho_max", "avg_jct")),
    ("fifo", "max-sum-throughput-perf", ("avg_jct", "makespan")),
    ("fifo", "min-total-duration-perf", ("makespan", "avg_jct")),
)
FIELDS = ("rate", "seed", "policy", "jobs", "dropped", "avg_jct", "p50_jct", "p99_jct", "makespan", "win_avg_jct",
          "win_from", "win_to", "win_jobs", "win_dropped", "rho_max",
          "rho_p50", "rho_mean", "rho_jobs", "jain_share", "gpu_hours", "utilization", "lp_solves", "solver_trouble",
          "wall_s", "dir")


def trace_name(jobs: int, rate: float, seed: int, max_scale: int) -> str:
    return f"gavel_{jobs}jobs_{rate:g}jph_seed{seed}" + (f"_sfmax{max_scale}" if max_scale != 8 else "") + ".trace"


def write_gavel_trace(path: Path, jobs: int, rate: float, seed: int, max_scale: int) -> Path:
    """The trace ``hpcsched trace generate gavel --seed SEED --jobs JOBS --rate RATE --max-scale M`` writes."""
    from hpcsched.hetero.workload import generate, write_trace

    path.parent.mkdir(parents=True, exist_ok=True)
    write_trace(generate(jobs, rate, seed, max_scale=max_scale), path)
    return path


def hetero_isolated_jcts(trace: str | Path, cluster: str, throughputs: str | Path | None = None) -> dict[str, float]:
    """Each job's JCT under Gavel's isolated policy on a heterogeneous cluster, as a fluid.

    While m jobs are in the system, job i (scale factor g) gets ``x_ij = C_j / (m g)`` of type j (C_j GPUs of
    type j, C in all), scaled down to a row sum of 1 when C / (m g) > 1: Gavel's ``IsolatedPolicy``. Its speed is
    then ``min(1, C / (m g)) x sum_j T_ij C_j / C`` steps/s, ``T_ij`` the throughput table's steps/s at its scale
    factor on type j; it ends when its steps are done. No rounds, no restarts (the fluid limit of the
    allocation, as ``calc --isolated fluid`` computes it for one GPU type). Job ids as ``simulate`` writes them.
    """
    import numpy as np

    from hpcsched.hetero.simulate import load_round_jobs
    from hpcsched.hetero.throughputs import load_throughputs
    from hpcsched.metrics.fairness import fluid_share_jcts
    from hpcsched.primitives.hetero_cluster import parse_hetero_cluster

    spec = parse_hetero_cluster(cluster)
    table = load_throughputs(throughputs) if throughputs is not None else load_throughputs()
    counts = spec.gpu_counts()
    total = float(sum(counts.values()))
    jobs = load_round_jobs(trace)
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival, i))
    submit = [jobs[i].arrival for i in order]
    g = np.array([float(jobs[i].scale_factor) for i in order])
    full = np.array([sum(table.isolated(jobs[i].job_type, t, jobs[i].scale_factor) * c / total
                         for t, c in counts.items()) for i in order])  # steps/s with the whole time share
    if np.any(full <= 0):
        raise ValueError("a job has no throughput on any type of the cluster")
    work = [float(jobs[i].total_steps) for i in order]
    jct = fluid_share_jcts(submit, work, g, full, total)
    return {str(jobs[i].id): jct[k] for k, i in enumerate(order)}


def run_one(trace: Path, cluster: str, policy: str, out: Path, isolated: dict[str, float], via: str = "api",
            rate: float = math.nan, seed: int = -1, window: tuple[int, int] | None = None) -> dict[str, Any]:
    """One simulation and its calc figures, as one row of ``runs.csv``. ``window``: also the average JCT of
    the jobs with ids in [from, to) (``win_avg_jct``), as Gavel's paper measures a window of a long trace."""
    import pandas as pd

    from hpcsched.metrics.fairness import fairness_metrics

    t0 = time.perf_counter()
    if via == "cli":
        exe = str(Path(sys.executable).parent / "hpcsched")
        p = subprocess.run([exe, "simulate", "--trace", str(trace), "--cluster", cluster, "--policy", policy,
                            "--compat", "gavel", "--json", "--out", str(out)], capture_output=True, text=True,
                           check=False, cwd=ROOT)
        if p.returncode:
            raise RuntimeError(f"hpcsched simulate {policy} on {trace} failed ({p.returncode}): {p.stderr[-2000:]}")
        s = json.loads(p.stdout)
    else:
        from hpcsched.hetero.simulate import run_gavel

        s = run_gavel(trace, cluster, policy, out=out)
    wall = time.perf_counter() - t0
    df = pd.read_csv(out / "jobs.csv", dtype={"job_id": str})
    meta = json.loads((out / "meta.json").read_text())
    f = fairness_metrics(df, meta, baseline=isolated, baseline_name="heterogeneous fluid isolated (bench_hetero)")
    win: dict[str, Any] = {"win_avg_jct": math.nan, "win_from": -1, "win_to": -1, "win_jobs": 0, "win_dropped": 0}
    if window is not None:
        ids = df["job_id"].astype(int)
        w = df[(ids >= window[0]) & (ids < window[1])]
        done = w[w["end"].notna()]
        win = {"win_avg_jct": float((done["end"] - done["submit"]).mean()) if len(done) else math.nan,
               "win_from": window[0], "win_to": window[1], "win_jobs": len(w), "win_dropped": len(w) - len(done)}
    solver = dict(s.get("solver") or {})
    lp = solver.pop("lp_solves", 0)
    return {"rate": rate, "seed": seed, "policy": policy, "jobs": s["jobs"], "dropped": s["unfinished"],
            "avg_jct": s["avg_jct"], "p50_jct": s["p50_jct"], "p99_jct": s["p99_jct"], "makespan": s["makespan"],
            **win, "rho_max": f.get("ftf_rho_max", math.nan), "rho_p50": f.get("ftf_rho_p50", math.nan),
            "rho_mean": f.get("ftf_rho_mean", math.nan), "rho_jobs": f.get("ftf_jobs", 0),
            "jain_share": f.get("jain_share", math.nan), "gpu_hours": f.get("gpu_hours", math.nan),
            "utilization": s.get("utilization"), "lp_solves": lp,
            "solver_trouble": ";".join(f"{k}={v}" for k, v in sorted(solver.items())), "wall_s": wall,
            "dir": str(out)}


def _task(args: tuple[Path, str, str, Path, Path, str, float, int, tuple[int, int] | None]) -> dict[str, Any]:
    trace, cluster, policy, out, iso_json, via, rate, seed, window = args
    isolated = json.loads(iso_json.read_text())
    return run_one(trace, cluster, policy, out, isolated, via, rate, seed, window)


def run_grid(seeds: Sequence[int], rates: Sequence[float], jobs: int, cluster: str, policies: Sequence[str],
             out: Path, max_scale: int = 8, workers: int = 1, via: str = "api",
             window: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """Every (rate, seed, policy) run; rows sorted by rate, seed, policy order."""
    tasks = []
    for rate in rates:
        for seed in seeds:
            trace = write_gavel_trace(out / "traces" / trace_name(jobs, rate, seed, max_scale), jobs, rate, seed,
                                      max_scale)
            iso = out / "isolated" / (trace.stem + ".json")
            iso.parent.mkdir(parents=True, exist_ok=True)
            iso.write_text(json.dumps(hetero_isolated_jcts(trace, cluster)))
            for policy in policies:
                tasks.append((trace, cluster, policy, out / "runs" / trace.stem / policy, iso, via, rate, seed,
                              window))
    if workers > 1:
        with ProcessPoolExecutor(workers) as ex:
            rows = list(ex.map(_task, tasks))
    else:
        rows = []
        for t in tasks:
            rows.append(_task(t))
            print(f"  {t[2]} rate {t[6]:g} seed {t[7]}: {rows[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
    return rows


def _spread(values: Sequence[float], fmt: str) -> str:
    v = [x for x in values if x == x]
    if not v:
        return "n/a"
    if len(v) == 1:
        return format(v[0], fmt)
    return f"{format(statistics.median(v), fmt)} [{format(min(v), fmt)}, {format(max(v), fmt)}]"


def policy_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown: per rate and policy, median [min, max] over seeds; JCTs and makespan in hours."""
    win = window_of(rows)
    wcol = f" avg JCT, jobs {win[0]}-{win[1] - 1} (h) |" if win else ""
    out = [f"| rate (jobs/h) | policy | avg JCT (h) |{wcol} p99 JCT (h) | makespan (h) | worst rho | median rho | "
           "Jain (shares) | jobs dropped (all seeds) |",
           "|---|---|---|---|---|---|---|---|---|" + ("---|" if win else "")]
    for rate in sorted({r["rate"] for r in rows}):
        for policy in [p for p in POLICIES if any(r["policy"] == p for r in rows)] + \
                sorted({r["policy"] for r in rows} - set(POLICIES)):
            rs = [r for r in rows if r["rate"] == rate and r["policy"] == policy]
            if not rs:
                continue
            wval = f" {_spread([r['win_avg_jct'] / 3600 for r in rs], '.1f')} |" if win else ""
            out.append(f"| {rate:g} | {policy} | {_spread([r['avg_jct'] / 3600 for r in rs], '.1f')} |{wval}"
                       f" {_spread([r['p99_jct'] / 3600 for r in rs], '.0f')} "
                       f"| {_spread([r['makespan'] / 3600 for r in rs], '.0f')} "
                       f"| {_spread([r['rho_max'] for r in rs], '.2f')} | {_spread([r['rho_p50'] for r in rs], '.2f')} "
                       f"| {_spread([r['jain_share'] for r in rs], '.3f')} | {sum(r['dropped'] for r in rs)} |")
    return out


def window_of(rows: Sequence[dict[str, Any]]) -> tuple[int, int] | None:
    """The measurement window [from, to) of job ids the rows were run with, or None."""
    for r in rows:
        if r.get("win_from", -1) >= 0:
            return int(r["win_from"]), int(r["win_to"])
    return None


_JCT_CACHE: dict[str, dict[int, float]] = {}


def run_jcts(run_dir: str) -> dict[int, float]:
    """Job id -> JCT (s) of the finished jobs of one run (its jobs.csv)."""
    if run_dir not in _JCT_CACHE:
        with (Path(run_dir) / "jobs.csv").open() as fh:
            _JCT_CACHE[run_dir] = {int(r["job_id"]): float(r["end"]) - float(r["submit"])
                                   for r in csv.DictReader(fh) if r["end"] not in ("", "nan")}
    return _JCT_CACHE[run_dir]


def pair_ratios(rows: Sequence[dict[str, Any]], agnostic: str, aware: str, metric: str,
                rate: float) -> list[float]:
    """aware / agnostic of ``metric`` per seed at ``rate`` (seeds where both ran). Average JCTs are compared over
    the jobs that finished in both runs (and lie in the window, for ``win_avg_jct``): Gavel's mechanism drops a
    job now and then, and leaving it out of one side only would flatter that side."""
    by = {(r["policy"], r["seed"]): r for r in rows if r["rate"] == rate}
    seeds = sorted({s for p, s in by if p == agnostic} & {s for p, s in by if p == aware})
    out = []
    for s in seeds:
        a, b = by[(agnostic, s)], by[(aware, s)]
        if metric in ("avg_jct", "win_avg_jct"):
            ja, jb = run_jcts(a["dir"]), run_jcts(b["dir"])
            common = set(ja) & set(jb)
            if metric == "win_avg_jct":
                lo, hi = window_of(rows) or (0, 0)
                common = {i for i in common if lo <= i < hi}
            out.append(math.fsum(jb[i] for i in common) / math.fsum(ja[i] for i in common))
        else:
            out.append(b[metric] / a[metric])
    return out


def pair_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown: per pair and metric, per rate: median [min, max] of aware / agnostic over seeds, wins."""
    win = window_of(rows)
    names = {"avg_jct": "avg JCT", "rho_max": "worst rho", "makespan": "makespan"}
    if win:
        names["win_avg_jct"] = f"avg JCT, jobs {win[0]}-{win[1] - 1}"
    out = ["| agnostic -> aware | metric | rate (jobs/h) | aware / agnostic, median [min, max] "
           "| seeds aware better-worse (>1%) |",
           "|---|---|---|---|---|"]
    policies = {r["policy"] for r in rows}
    for agnostic, aware, metrics in PAIRS:
        if agnostic not in policies or aware not in policies:
            continue
        for metric in ((("win_avg_jct",) if win else ()) + metrics):
            for rate in sorted({r["rate"] for r in rows}):
                ratios = pair_ratios(rows, agnostic, aware, metric, rate)
                if not ratios:
                    continue
                better, worse = sum(1 for x in ratios if x < 1 - TIE), sum(1 for x in ratios if x > 1 + TIE)
                out.append(f"| {agnostic} -> {aware} | {names[metric]} | {rate:g} | {_spread(ratios, '.3f')} "
                           f"| {better}-{worse} of {len(ratios)} |")
    return out


TIE = 0.01
"""A ratio within 1% of 1 is a tie in the counts of seeds where aware is better or worse."""


def pair_matrix(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown, one row per rate: aware / agnostic per seed, median [min, max], then k-l: in k seeds aware is
    better, in l worse, by more than ``TIE`` (1%; the rest are ties),
    for the comparisons that matter (each aware policy on its own objective, and on average JCT)."""
    win = window_of(rows)
    jct = "win_avg_jct" if win else "avg_jct"
    jct_name = f"avg JCT (jobs {win[0]}-{win[1] - 1})" if win else "avg JCT"
    cols = [("max-min-fairness", "max-min-fairness-perf", jct),
            ("max-min-fairness", "max-min-fairness-perf", "rho_max"),
            ("max-min-fairness", "finish-time-fairness-perf", "rho_max"),
            ("fifo", "max-sum-throughput-perf", jct), ("fifo", "min-total-duration-perf", "makespan"),
            ("fifo", "min-total-duration-perf", jct)]
    policies = {r["policy"] for r in rows}
    cols = [c for c in cols if c[0] in policies and c[1] in policies]
    short = {"max-min-fairness": "mmf", "max-min-fairness-perf": "mmf-perf", "finish-time-fairness-perf": "ftf-perf",
             "max-sum-throughput-perf": "max-sum-thr-perf", "min-total-duration-perf": "min-total-dur-perf",
             "fifo": "fifo"}
    names = {jct: jct_name, "rho_max": "worst rho", "makespan": "makespan", "avg_jct": "avg JCT"}
    out = ["| rate (jobs/h) | " + " | ".join(f"{short[b]} / {short[a]}: {names[m]}" for a, b, m in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for rate in sorted({r["rate"] for r in rows}):
        cells = []
        for a, b, m in cols:
            ratios = pair_ratios(rows, a, b, m, rate)
            better, worse = sum(1 for x in ratios if x < 1 - TIE), sum(1 for x in ratios if x > 1 + TIE)
            cells.append(f"{_spread(ratios, '.2f')} {better}-{worse}" if ratios else "n/a")
        out.append(f"| {rate:g} | " + " | ".join(cells) + " |")
    return out


def write_runs_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in FIELDS})


def read_runs_csv(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open() as fh:
        for r in csv.DictReader(fh):
            row: dict[str, Any] = dict(r)
            for k in ("rate", "avg_jct", "p50_jct", "p99_jct", "makespan", "win_avg_jct", "rho_max", "rho_p50",
                      "rho_mean", "jain_share", "gpu_hours", "utilization", "wall_s"):
                row[k] = float(r[k]) if r[k] not in ("", "None") else math.nan
            for k in ("seed", "jobs", "dropped", "win_from", "win_to", "win_jobs", "win_dropped", "rho_jobs",
                      "lp_solves"):
                row[k] = int(r[k])
            rows.append(row)
    return rows


STYLE = {"fifo": ("tab:gray", "o", "--"), "max-min-fairness": ("tab:blue", "s", "--"),
         "max-min-fairness-perf": ("tab:blue", "s", "-"), "finish-time-fairness-perf": ("tab:green", "^", "-"),
         "min-total-duration-perf": ("tab:purple", "v", "-"), "max-sum-throughput-perf": ("tab:red", "D", "-")}


def _label(policy: str) -> str:
    return policy + (" (agnostic)" if policy in AGNOSTIC else " (aware)")


def plot_all(rows: Sequence[dict[str, Any]], plots: Path, cluster: str, jobs: int,
             cdf_rate: float | None) -> list[Path]:
    """Average JCT vs rate; JCT CDF at ``cdf_rate`` (every seed's jobs pooled); worst rho and makespan vs rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    plots.mkdir(parents=True, exist_ok=True)
    rates = sorted({r["rate"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    seed_txt = f"seeds {seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 1 \
        else "seeds " + ",".join(map(str, seeds))
    shape = f"Gavel continuous-arrival trace ({jobs} jobs, Poisson arrivals), cluster {cluster}"
    policies = [p for p in POLICIES if any(r["policy"] == p for r in rows)]
    written = []

    def vs_rate(ax: Any, metric: str, scale: float) -> None:
        for p in policies:
            med, lo, hi = [], [], []
            for rate in rates:
                v = [r[metric] / scale for r in rows
                     if r["policy"] == p and r["rate"] == rate and r[metric] == r[metric]]
                med.append(statistics.median(v) if v else math.nan)
                lo.append(min(v) if v else math.nan)
                hi.append(max(v) if v else math.nan)
            c, m, ls = STYLE.get(p, ("black", "x", "-"))
            ax.errorbar(rates, med, yerr=[[a - b for a, b in zip(med, lo, strict=True)],
                                          [b - a for a, b in zip(med, hi, strict=True)]],
                        color=c, marker=m, linestyle=ls, capsize=3, label=_label(p))
        ax.set_xlabel("Arrival rate (jobs/hour)")
        ax.grid(alpha=0.3)

    win = window_of(rows)
    fig, axes = plt.subplots(1, 2 if win else 1, figsize=(13, 5.5) if win else (8, 5.5), squeeze=False)
    panels = [("avg_jct", f"all {jobs} jobs (finished ones)")]
    if win:
        panels.append(("win_avg_jct", f"jobs {win[0]}-{win[1] - 1} only (a steady-state window)"))
    for ax, (metric, what) in zip(axes[0], panels, strict=True):
        vs_rate(ax, metric, 3600.0)
        ax.set_yscale("log")
        ax.set_ylabel("Average JCT (hours, log scale)")
        ax.set_title(f"Average JCT of {what}", fontsize=9)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Average JCT vs arrival rate: median over {len(seeds)} seeds, bars min-max\n{shape}, {seed_txt}",
                 fontsize=9)
    fig.tight_layout()
    p = plots / "avg_jct_vs_rate.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 5))
    vs_rate(a1, "rho_max", 1.0)
    a1.set_yscale("log")
    a1.set_ylabel("Worst finish-time fairness rho (JCT / isolated JCT, log scale)")
    a1.set_title("Worst rho (isolated: heterogeneous fluid of\nGavel's isolated policy)", fontsize=9)
    vs_rate(a2, "makespan", 3600.0)
    a2.set_ylabel("Makespan (hours, first arrival to last end)")
    a2.set_title("Makespan", fontsize=9)
    a2.legend(fontsize=8)
    fig.suptitle(f"median over {len(seeds)} seeds, bars min-max; {shape}, {seed_txt}", fontsize=9)
    fig.tight_layout()
    p = plots / "rho_makespan_vs_rate.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    if cdf_rate is not None:
        fig, ax = plt.subplots(figsize=(8, 5.5))
        for pol in policies:
            jcts: list[float] = []
            for r in rows:
                if r["policy"] == pol and math.isclose(r["rate"], cdf_rate):
                    df = pd.read_csv(Path(r["dir"]) / "jobs.csv")
                    done = df[df["end"].notna()]
                    jcts.extend(((done["end"] - done["submit"]) / 3600.0).tolist())
            if not jcts:
                continue
            jcts.sort()
            c, _, ls = STYLE.get(pol, ("black", "x", "-"))
            ax.step(jcts, [(k + 1) / len(jcts) for k in range(len(jcts))], where="post", color=c, linestyle=ls,
                    label=_label(pol))
        ax.set_xscale("log")
        ax.set_xlabel("JCT (hours, log scale)")
        ax.set_ylabel("Fraction of finished jobs")
        ax.set_title(f"JCT CDF at {cdf_rate:g} jobs/hour, jobs of {len(seeds)} seeds pooled\n{shape}, {seed_txt}",
                     fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = plots / f"jct_cdf_{cdf_rate:g}jph.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2,3,4", help="generator seeds, comma-separated")
    ap.add_argument("--rates", default="0.5,1,1.5,2,2.5,3", help="arrival rates, jobs per hour, comma-separated")
    ap.add_argument("--jobs", type=int, default=500, help="jobs per trace")
    ap.add_argument("--cluster", default="v100=36,p100=36,k80=36", help="type=count,... (one GPU per server)")
    ap.add_argument("--max-scale", type=int, default=8, help="cap on GPUs per job (the generator's --max-scale)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_hetero"),
                    help="traces, runs (jobs.csv, meta.json) and runs.csv go here")
    ap.add_argument("--plots", type=Path, default=None, help="write the PNGs to this folder")
    ap.add_argument("--cdf-rate", type=float, default=None, help="rate of the JCT CDF (default: the middle rate)")
    ap.add_argument("--workers", type=int, default=1, help="simulations at once (processes)")
    ap.add_argument("--via", choices=("api", "cli"), default="api",
                    help="api: run_gavel in-process; cli: `hpcsched simulate --compat gavel --json --out` processes")
    ap.add_argument("--window", default=None,
                    help="FROM:TO: also the average JCT of the jobs with ids in [FROM, TO) (steady state, as in "
                         "Gavel's paper)")
    ap.add_argument("--all-pairs", action="store_true", help="also the long table: every pair, metric and rate")
    ap.add_argument("--from-csv", type=Path, default=None, help="skip the runs: tables and plots from a runs.csv")
    args = ap.parse_args(argv)

    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    window = None
    if args.window:
        lo, _, hi = args.window.partition(":")
        window = (int(lo), int(hi))
        if not 0 <= window[0] < window[1] <= args.jobs:
            ap.error(f"--window {args.window}: need 0 <= FROM < TO <= --jobs ({args.jobs})")
    rates = _floats(args.rates)
    t0 = time.perf_counter()
    if args.from_csv:
        rows = read_runs_csv(args.from_csv)
    else:
        rows = run_grid(seeds, rates, args.jobs, args.cluster, [p for p in args.policies.split(",") if p],
                        args.out, args.max_scale, args.workers, args.via, window)
        write_runs_csv(rows, args.out / "runs.csv")
    wall = time.perf_counter() - t0
    rates = sorted({r["rate"] for r in rows})
    if args.from_csv:  # what the runs were, not what the flags say
        args.jobs = rows[0]["jobs"]
        meta = json.loads((Path(rows[0]["dir"]) / "meta.json").read_text())
        args.cluster = meta["cluster"]
    print(f"Gavel continuous-arrival traces: {args.jobs} jobs, rates {', '.join(f'{r:g}' for r in rates)} jobs/h, "
          f"seeds {','.join(str(s) for s in sorted({r['seed'] for r in rows}))}, cluster {args.cluster}, "
          f"max scale {args.max_scale}; {len(rows)} runs in {wall:.0f} s")
    print("rho = JCT / JCT under a heterogeneous fluid of Gavel's isolated policy (calc's --isolated fluid has no "
          "solo time for a Gavel job); median over seeds [min, max]\n")
    print("\n".join(policy_table(rows)))
    print("\naware / agnostic per seed: median [min, max] over seeds, then k-l: seeds where aware is better / worse "
          "by more than 1% (lower is better for every metric)\n")
    print("\n".join(pair_matrix(rows)))
    if args.all_pairs:
        print()
        print("\n".join(pair_table(rows)))
    trouble = [r for r in rows if r["solver_trouble"]]
    for r in trouble:
        print(f"solver: {r['policy']} rate {r['rate']:g} seed {r['seed']}: {r['solver_trouble']}")
    dropped = [r for r in rows if r["dropped"]]
    if dropped:
        print("\njobs dropped by Gavel's mechanism (5 failed micro-tasks in a row; left out of the JCTs; the pair "
              "ratios of average JCT compare the jobs finished in both runs): "
              + "; ".join(f"{r['policy']} rate {r['rate']:g} seed {r['seed']}: {r['dropped']}" for r in dropped))
    if args.plots:
        cdf = args.cdf_rate if args.cdf_rate is not None else rates[len(rates) // 2]
        for p in plot_all(rows, args.plots, args.cluster, args.jobs, cdf):
            print(f"plot: {p}")


if __name__ == "__main__":
    main()
