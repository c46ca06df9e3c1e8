"""The sim-vs-real table: per-job JCT error, avg / p99 JCT and makespan error, iteration times by group size.

Errors are ``(sim - real) / real``: positive means the simulator is pessimistic. Makespan here is the
span from the first submission to the last completion (the trace may not start at 0).

Iteration times compare what the real run measured in each report window (``REAL_DIR/iterations.csv``,
trace seconds per step) with what the simulation assumed for that job in that window, two ways:

- by **group size** (``groups``: solo, 2, 3, 4 interleaved on the same slots): alone, the job's
  ``SIM_DIR/trace.csv`` iteration time x the simulator's 1.015 solo factor; in a group of k, the pipeline
  period of the training members' stage profiles as the simulation had them (``trace.csv`` resource times)
  x the group factor the simulation ran k-member groups at (``SIM_DIR/meta.json`` ``group_factors``, else
  the simulator's default). The two s/iter columns are medians over the same windows; the error is the
  median over those windows of each window's own error (simulated vs measured pace of that window), which
  is what a group's speed model gets right or wrong. The difference of the two medians (``medians_error``
  in ``--json``) is not: it sets the median window of one group against the median of another, and windows
  of groups with different periods pooled that way showed a pair fitted at 1.03 as -24%. The
  measured factors of the real run (``REAL_DIR/profile/group-factors.csv``) are shown beside them, with
  the windows behind a size that had too few to be fitted (the default was used);
- by **sharing** (``iterations``): how many of the run's jobs held the worker, whatever their slots,
  against the job's solo iteration time: what CPU contention between slots costs.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from hpcsched.errors import InputError
from hpcsched.metrics import summarize
from hpcsched.primitives.speed import SOLO_FACTOR
from hpcsched.results import read_results

ITERATIONS_FILE = "iterations.csv"


def _err(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return (sim - real) / real


def compare_runs(sim_dir: Path, real_dir: Path) -> dict[str, Any]:
    """Everything the table shows, as plain data (the CLI prints it, ``--json`` dumps it)."""
    sim, sim_meta = read_results(sim_dir)
    real, real_meta = read_results(real_dir)
    s, r = summarize(sim, sim_meta), summarize(real, real_meta)
    ids_real, ids_sim = set(real["job_id"]), set(sim["job_id"])
    only = sorted(ids_real ^ ids_sim)
    if not ids_real & ids_sim:
        raise InputError(sim_dir, f"no job ids in common with {real_dir}: not runs of the same jobs")
    both = real.merge(sim, on="job_id", suffixes=("_real", "_sim"), how="inner")  # the real run's order
    jobs = []
    for _, row in both.iterrows():
        rj = row["end_real"] - row["submit_real"] if pd.notna(row["end_real"]) else None
        sj = row["end_sim"] - row["submit_sim"] if pd.notna(row["end_sim"]) else None
        jobs.append({"job_id": row["job_id"], "real_jct": rj, "sim_jct": sj, "error": _err(sj, rj)})
    summary = {}
    for key, label in (("avg_jct", "avg JCT"), ("p99_jct", "p99 JCT"), ("span", "makespan")):
        summary[label] = {"real": r.get(key), "sim": s.get(key), "error": _err(s.get(key), r.get(key))}
    errs = [abs(j["error"]) for j in jobs if j["error"] is not None]
    return {"sim_dir": str(sim_dir), "real_dir": str(real_dir), "jobs": jobs, "summary": summary,
            "mean_abs_job_error": statistics.mean(errs) if errs else None, "only_in_one": only,
            "real_unfinished": r.get("unfinished"), "sim_unfinished": s.get("unfinished"),
            "iterations": iteration_rows(sim_dir, real_dir), "groups": group_rows(sim_dir, real_dir)}


def iteration_rows(sim_dir: Path, real_dir: Path) -> list[dict[str, Any]]:
    """Measured vs assumed seconds per iteration (trace scale), by jobs sharing the worker."""
    it_file, trace = real_dir / ITERATIONS_FILE, sim_dir / "trace.csv"
    if not it_file.is_file() or not trace.is_file():
        return []
    win = pd.read_csv(it_file, dtype={"job_id": str})
    prof = pd.read_csv(trace, dtype={"job_id": str})
    assumed = dict(zip(prof["job_id"], prof["iteration_time"] * 1e-3 * SOLO_FACTOR, strict=True))
    win = win[win["job_id"].isin(assumed)]
    rows = []
    for k, g in win.groupby("sharing"):
        meas = float(g["pace_s"].median())
        prof_k = float(statistics.median(assumed[j] for j in g["job_id"]))
        rows.append({"sharing": int(k), "windows": len(g), "jobs": int(g["job_id"].nunique()),
                     "measured_s": meas, "profiled_s": prof_k, "error": _err(prof_k, meas)})
    return rows


def group_rows(sim_dir: Path, real_dir: Path) -> list[dict[str, Any]]:
    """Measured vs simulated seconds per iteration (trace scale), by interleaved group size (module docstring)."""
    import json

    from hpcsched.interleave.period import MAX_GROUP
    from hpcsched.primitives.speed import group_factor
    from hpcsched.testbed.groupfit import FILE, raw_period, read_group_fits

    it_file, trace = real_dir / ITERATIONS_FILE, sim_dir / "trace.csv"
    if not it_file.is_file() or not trace.is_file():
        return []
    win = pd.read_csv(it_file, dtype={"job_id": str, "group_members": str})
    if "group_size" not in win.columns:  # a run measured before group sizes were recorded
        return []
    prof = pd.read_csv(trace, dtype={"job_id": str})
    solo = dict(zip(prof["job_id"], prof["iteration_time"] * 1e-3 * SOLO_FACTOR, strict=True))
    cols = [prof[f"resource_time_{i}"] * 1e-3 for i in range(3)]
    stages = {j: (a, b, c) for j, a, b, c in zip(prof["job_id"], *cols, strict=True)}
    meta_file = sim_dir / "meta.json"
    used = json.loads(meta_file.read_text()).get("group_factors") if meta_file.is_file() else None
    factor = {k: group_factor(k) for k in range(2, MAX_GROUP + 1)} | {int(k): float(f) for k, f in (used or {}).items()}
    fits = {g.k: g for g in read_group_fits(real_dir / "profile" / FILE)}
    periods: dict[tuple[str, ...], float] = {}

    def assumed(row) -> float | None:
        k = int(row.group_size)
        if k == 1:
            return solo.get(row.job_id)
        members = tuple(str(row.group_members).split(";"))
        if len(members) != k or any(sum(stages.get(j, (0.0,))) <= 0 for j in members):
            return None
        if members not in periods:
            periods[members] = raw_period([stages[j] for j in members])
        return periods[members] * factor.get(k, factor[MAX_GROUP])  # the engine's rule

    win = win[win["job_id"].isin(solo)].copy()
    win["assumed"] = [assumed(r) for r in win.itertuples()]
    rows = []
    for k, g in win.groupby("group_size"):
        k = int(k)
        g = g[g["assumed"].notna()]
        if g.empty:
            continue
        meas, sim = float(g["pace_s"].median()), float(g["assumed"].median())
        per_window = (g["assumed"] / g["pace_s"] - 1.0)[g["pace_s"] > 0]
        fit = fits.get(k)
        rows.append({"group_size": k, "windows": len(g), "jobs": int(g["job_id"].nunique()),
                     "measured_s": meas, "sim_s": sim,
                     "error": float(per_window.median()) if len(per_window) else None,
                     "medians_error": _err(sim, meas),
                     "sim_factor": SOLO_FACTOR if k == 1 else factor.get(k, factor[MAX_GROUP]),
                     "measured_factor": fit.factor if fit is not None and fit.source == "fit" else None,
                     "fit_windows": fit.windows if fit is not None else None,
                     "fit_source": fit.source if fit is not None else None,
                     "fit_median": fit.median if fit is not None else None})
    return rows


def _measured_factor(row: dict[str, Any]) -> str:
    """The fitted factor; for a size with too few windows, what they showed and that the default ran."""
    if row.get("fit_source") == "default":
        return f"{row['fit_median']:.3f} ({row['fit_windows']} windows: default used)"
    return "-" if row.get("measured_factor") is None else f"{row['measured_factor']:.3f}"


def _group_label(k: int) -> str:
    return "solo" if k == 1 else f"{k} interleaved"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def render_markdown(results: list[dict[str, Any]], names: list[str]) -> str:
    """One Markdown report for one real run against one or more simulations (for docs)."""
    lines = ["| metric | real | " + " | ".join(f"{n} | error" for n in names) + " |",
             "|---|---:|" + "---:|---:|" * len(names)]
    for label in ("avg JCT", "p99 JCT", "makespan"):
        real = results[0]["summary"][label]["real"]
        cells = " | ".join(f"{_num(r['summary'][label]['sim'])} | {_pct(r['summary'][label]['error'])}"
                           for r in results)
        lines.append(f"| {label} (s) | {_num(real)} | {cells} |")
    cells = " | ".join(f"| {_pct(r['mean_abs_job_error'])}" for r in results)
    lines.append(f"| mean abs per-job JCT error | | {cells} |")
    lines += ["", "| job | real JCT (s) | " + " | ".join(f"{n} JCT | error" for n in names) + " |",
              "|---|---:|" + "---:|---:|" * len(names)]
    per = [{j["job_id"]: j for j in r["jobs"]} for r in results]
    for j in results[0]["jobs"]:
        cells = " | ".join(f"{_num(p[j['job_id']]['sim_jct'])} | {_pct(p[j['job_id']]['error'])}" for p in per)
        lines.append(f"| {j['job_id']} | {_num(j['real_jct'])} | {cells} |")
    if any(r["iterations"] for r in results):
        lines += ["", "| jobs on the worker | windows | measured s/iter | " +
                  " | ".join(f"{n} s/iter | error" for n in names) + " |",
                  "|---:|---:|---:|" + "---:|---:|" * len(names)]
        by = [{row["sharing"]: row for row in r["iterations"]} for r in results]
        for row in results[0]["iterations"]:
            k = row["sharing"]
            cells = " | ".join(f"{b[k]['profiled_s']:,.1f} | {_pct(b[k]['error'])}" if k in b else "- | -" for b in by)
            lines.append(f"| {k} | {row['windows']} | {row['measured_s']:,.1f} | {cells} |")
    if any(r.get("groups") for r in results):
        lines += ["", "| group size | windows | measured s/iter | measured factor | " +
                  " | ".join(f"{n} s/iter | factor | error" for n in names) + " |",
                  "|---|---:|---:|---:|" + "---:|---:|---:|" * len(names)]
        gb = [{row["group_size"]: row for row in r.get("groups", [])} for r in results]
        for row in results[0]["groups"]:
            k = row["group_size"]
            cells = " | ".join(f"{b[k]['sim_s']:,.1f} | {b[k]['sim_factor']:.3f} | {_pct(b[k]['error'])}" if k in b
                               else "- | - | -" for b in gb)
            mf = _measured_factor(row)
            lines.append(f"| {_group_label(k)} | {row['windows']} | {row['measured_s']:,.1f} | {mf} | {cells} |")
    return "\n".join(lines) + "\n"


def render_tables(result: dict[str, Any], title: str, console) -> None:
    """Rich tables for one comparison (stdout)."""
    from rich.table import Table

    t = Table(title=f"{title}: summary")
    for c in ("metric", "real", "sim", "error"):
        t.add_column(c, justify="left" if c == "metric" else "right")
    for label, v in result["summary"].items():
        t.add_row(f"{label} (s)", _num(v["real"]), _num(v["sim"]), _pct(v["error"]))
    t.add_row("mean |per-job JCT error|", "", "", _pct(result["mean_abs_job_error"]))
    console.print(t)
    t = Table(title=f"{title}: per job")
    for c in ("job", "real JCT (s)", "sim JCT (s)", "error"):
        t.add_column(c, justify="left" if c == "job" else "right")
    for j in result["jobs"]:
        t.add_row(str(j["job_id"]), _num(j["real_jct"]), _num(j["sim_jct"]), _pct(j["error"]))
    console.print(t)
    if result["iterations"]:
        t = Table(title=f"{title}: seconds per iteration (trace scale) by jobs sharing the worker")
        for c in ("jobs on worker", "windows", "jobs", "measured", "profiled", "error"):
            t.add_column(c, justify="right")
        for row in result["iterations"]:
            t.add_row(str(row["sharing"]), str(row["windows"]), str(row["jobs"]), f"{row['measured_s']:,.1f}",
                      f"{row['profiled_s']:,.1f}", _pct(row["error"]))
        console.print(t)
    if result.get("groups"):
        t = Table(title=f"{title}: seconds per iteration (trace scale) by interleaved group size")
        for c in ("group size", "windows", "jobs", "measured", "measured factor", "sim", "sim factor", "error"):
            t.add_column(c, justify="right")
        for row in result["groups"]:
            mf = _measured_factor(row)
            t.add_row(_group_label(row["group_size"]), str(row["windows"]), str(row["jobs"]),
                      f"{row['measured_s']:,.1f}", mf, f"{row['sim_s']:,.1f}", f"{row['sim_factor']:.3f}",
                      _pct(row["error"]))
        console.print(t)
