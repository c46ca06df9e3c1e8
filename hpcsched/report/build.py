"""``make_report``: a sweep directory -> README.md + PNG figures + the results table, in one folder.

The Markdown names the commands that made the sweep and the report, so a reader of the committed
report can regenerate it; the numbers behind every figure are also printed as tables.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hpcsched.errors import InputError
from hpcsched.metrics.labels import run_labels
from hpcsched.report import plots, published
from hpcsched.report.frames import (
    BAR_METRICS,
    REPLAY_CONTEXT,
    SIM_CONTEXT,
    context_title,
    normalized,
    ok_rows,
    trace_name,
    with_context,
)
from hpcsched.sweep.execute import TIMELINE_FILE
from hpcsched.sweep.runner import SWEEP_JSON
from hpcsched.sweep.store import CELLS_DIR
from hpcsched.sweep.table import CSV_FILE, read_table

REPORT_FILE = "README.md"
REPLAY_EVENTS = "events.csv"  # written by the replayer: one row per idle-pool event
_SIM_COLUMNS = ("jobs", "avg_jct", "p99_jct", "makespan", "utilization", "events", "wall_s", "cpu_s")
_REPLAY_COLUMNS = ("tfwd", "pool_nodes", "events", "jobs_done", "idle_node_hours", "used_node_hours", "utilization",
                   "rescales", "wall_s", "cpu_s")


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if v.is_integer() and abs(v) < 1e6:
            return f"{int(v)}"
        return f"{v:.3f}" if abs(v) < 100 else f"{v:,.2f}"
    return str(v)


def md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def _slug(text: str) -> str:
    keep = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)
    return keep.strip("_") or "all"


def _manifest(sweep_dir: Path) -> dict[str, Any]:
    p = sweep_dir / SWEEP_JSON
    if not p.is_file():
        return {}
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise InputError(p, f"invalid JSON: {e.msg}", e.lineno) from None


def make_report(sweep_dir: str | Path, out_dir: str | Path | None = None, baseline: str | None = None,
                command: Sequence[str] | None = None) -> Path:
    """Write the report of ``sweep_dir`` into ``out_dir`` (default ``sweep_dir/report``); returns README.md."""
    sweep_dir = Path(sweep_dir)
    out = Path(out_dir) if out_dir else sweep_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    df, stale = _makespans_from_first_submit(read_table(sweep_dir), sweep_dir)
    manifest = _manifest(sweep_dir)
    name = manifest.get("name") or sweep_dir.name
    md: list[str] = [f"# Sweep `{name}`", ""]
    if manifest.get("description"):
        md += [manifest["description"].strip(), ""]
    md += _commands(manifest, command)
    md += _overview(df, manifest)
    if stale:
        md += [f"**Makespan of {len(stale)} cell(s) is their last end time, not last end - first submit**: they "
               f"predate the change and their jobs.csv is gone ({', '.join(stale)}).", ""]
    sim = ok_rows(df, "simulate")
    if len(sim):
        baseline = baseline or (manifest.get("report") or {}).get("baseline") or str(sim["policy"].iloc[0])
        md += _published_section(sim, (manifest.get("report") or {}).get("published") or [], baseline)
        md += _simulate_section(sim, baseline, sweep_dir, out)
    rep = ok_rows(df, "replay")
    if len(rep):
        md += _replay_section(rep, sweep_dir, out)
    failed = df[df["status"] != "ok"]
    if len(failed):
        md += ["## Failed cells", "", md_table(failed[["cell_id", "kind", "error"]].fillna("")), ""]
    df.to_csv(out / CSV_FILE, index=False)  # CSV only: the report folder may be committed
    readme = out / REPORT_FILE
    readme.write_text("\n".join(md).rstrip() + "\n")
    return readme


def _commands(manifest: dict[str, Any], command: Sequence[str] | None) -> list[str]:
    lines = ["Made with:", "", "```sh"]
    sweeps = [r["command"] for r in manifest.get("runs", []) if r.get("ran") and r.get("command")]
    if not sweeps and manifest.get("command"):
        sweeps = [manifest["command"]]
    for cmd in dict.fromkeys(" ".join(c) for c in sweeps):  # every run that computed cells, in order
        lines.append(cmd)
    if command:
        lines.append(" ".join(command))
    lines += ["```", ""]
    return lines if len(lines) > 5 else []


def _overview(df: pd.DataFrame, manifest: dict[str, Any]) -> list[str]:
    ok = int((df["status"] == "ok").sum())
    cell_s = float(pd.to_numeric(df["wall_s"], errors="coerce").sum())
    line = f"{len(df)} cells ({ok} ok, {len(df) - ok} failed); wall time inside the cells {cell_s:,.1f} s"
    if "cpu_s" in df:
        line += f", CPU time {float(pd.to_numeric(df['cpu_s'], errors='coerce').sum()):,.1f} s"
    runs = [r for r in manifest.get("runs", []) if r.get("ran")]
    if runs:
        wall = sum(float(r.get("wall_s") or 0.0) for r in runs)
        line += (f"; `hpcsched sweep` ran them in {len(runs)} run(s) taking {wall:,.1f} s wall in all "
                 f"(last finished {runs[-1].get('finished', '?')})")
    md = [line + ".", "", "The full table, one row per cell: [results.csv](results.csv).", ""]
    missing = [c["label"] for c in manifest.get("cells", []) if c.get("id") not in set(df["cell_id"])]
    if missing:
        md += [f"**Not run yet: {len(missing)} of the config's {len(manifest['cells'])} cells** "
               f"(resume with the sweep command): {', '.join(missing)}.", ""]
    return md


def _makespans_from_first_submit(df: pd.DataFrame, sweep_dir: Path) -> tuple[pd.DataFrame, list[str]]:
    """Cells run before makespan counted from the first submit (no ``first_submit`` in their metrics)
    recomputed from their jobs.csv, so one table never mixes the two definitions; returns the ids of
    those it could not recompute (warned on stderr and named in the report)."""
    if "makespan" not in df.columns:
        return df, []
    out = df.copy()
    for c in ("first_submit", "last_end"):
        if c not in out.columns:
            out[c] = np.nan
    stale = out.index[(out["status"] == "ok") & out["makespan"].notna() & out["first_submit"].isna()]
    missing = []
    for i in stale:
        p = sweep_dir / CELLS_DIR / str(out.at[i, "cell_id"]) / "jobs.csv"
        if not p.is_file():
            missing.append(str(out.at[i, "cell_id"]))
            continue
        jobs = pd.read_csv(p, usecols=["submit", "end"])
        first, last = float(jobs["submit"].min()), float(jobs["end"].max())
        out.loc[i, ["first_submit", "last_end", "makespan"]] = [first, last, last - first]
        if "span" in out.columns:
            out.at[i, "span"] = last - first
    if missing:
        print(f"warning: {len(missing)} cell(s) of {sweep_dir} have no jobs.csv: their makespan stays the last end "
              f"time ({', '.join(missing)})", file=sys.stderr)
    return out, missing


def _jcts(sweep_dir: Path, cell_id: str) -> np.ndarray:
    p = sweep_dir / CELLS_DIR / cell_id / "jobs.csv"
    if not p.is_file():
        return np.array([])
    jobs = pd.read_csv(p, usecols=["submit", "end"])
    jobs = jobs[jobs["end"].notna()]
    return np.sort((jobs["end"] - jobs["submit"]).to_numpy(dtype=float))


def _timeline(sweep_dir: Path, cell_id: str) -> pd.DataFrame:
    """Busy fraction over time: GPUs busy / capacity (simulate), or nodes used / idle pool (replay)."""
    d = sweep_dir / CELLS_DIR / cell_id
    if (d / REPLAY_EVENTS).is_file():
        return _binned_pool_use(pd.read_csv(d / REPLAY_EVENTS, usecols=["time", "pool", "used"]))
    if not (d / TIMELINE_FILE).is_file():
        return pd.DataFrame(columns=["time", "utilization"])
    tl = pd.read_csv(d / TIMELINE_FILE)
    meta = json.loads((d / "meta.json").read_text()) if (d / "meta.json").is_file() else {}
    cap = meta.get("capacity_gpus")
    # hours since the first submit (the simulator's first event), whatever clock the trace keeps
    t0 = float(pd.read_csv(d / "jobs.csv", usecols=["submit"])["submit"].min()) if (d / "jobs.csv").is_file() \
        else float(tl["time"].min()) if len(tl) else 0.0
    if "busy_gpus" in tl and cap:
        return pd.DataFrame({"time": tl["time"] - t0, "utilization": tl["busy_gpus"] / float(cap)})
    if "utilization" in tl:
        return pd.DataFrame({"time": tl["time"] - t0, "utilization": tl["utilization"]})
    return pd.DataFrame(columns=["time", "utilization"])


def _binned_pool_use(ev: pd.DataFrame, bins: int = 150) -> pd.DataFrame:
    """Used / idle node-seconds per time bin: the pool is often empty, so per-event ratios only flicker."""
    if ev.empty:
        return pd.DataFrame(columns=["time", "utilization"])
    t = (ev["time"] - ev["time"].iloc[0]).to_numpy(dtype=float)
    dur = np.diff(t, append=t[-1])  # each row's state holds until the next event
    width = max(t[-1] / bins, 60.0)
    b = (t // width).astype(int)
    used = np.bincount(b, weights=ev["used"].to_numpy(dtype=float) * dur)
    idle = np.bincount(b, weights=ev["pool"].to_numpy(dtype=float) * dur)
    keep = idle > 0
    return pd.DataFrame({"time": np.nonzero(keep)[0] * width, "utilization": used[keep] / idle[keep]})


def _published_section(sim: pd.DataFrame, blocks: list[dict[str, Any]], baseline: str) -> list[str]:
    """The config's published figures beside ours, raw and normalised to the baseline."""
    md: list[str] = []
    for block in blocks:
        matches = published.ours_for(sim, block)
        note = published.makespan_note(sim, block)
        head = f"## Published vs ours: {block['trace']}, compat={block['compat']}"
        if not matches:
            md += [head, "", f"No finished cell of this sweep matches ({block['source']}).", ""]
            continue
        for context, ours in matches.items():
            md += [head + (f" ({context})" if len(matches) > 1 else ""), "",
                   f"Published: {block['source']}. diff % = (ours - published) / published; seconds."
                   + (f" {note}" if note else ""), "",
                   md_table(_signed_percent(published.comparison(ours, block))), ""]
            norm = published.normalised_comparison(ours, block, baseline)
            if len(norm.columns) > 1:
                md += [f"Normalised to {baseline} (the heights of the paper's bars):", "", md_table(norm), ""]
    return md


def _signed_percent(df: pd.DataFrame) -> pd.DataFrame:
    """'diff %' columns as +1.23 / -0.45 text: a sign reads faster than a ratio, and 0.00 is exact enough."""
    out = df.copy()
    for c in out.columns:
        if c.endswith("diff %"):
            out[c] = [f"{round(v, 2) + 0.0:+.2f}" if np.isfinite(v) else "-" for v in out[c].astype(float)]
    return out


def _simulate_section(sim: pd.DataFrame, baseline: str, sweep_dir: Path, out: Path) -> list[str]:
    md = ["## Simulations", "", f"Bars are each policy's value divided by `{baseline}`'s on the same trace "
          "and context (averaged over seeds first); the dashed line is the baseline. "
          "p99 is Muri's sorted(jct)[int(0.99 n)]; makespan is the last end minus the first submit.", ""]
    norm = normalized(sim, baseline)
    ctx = with_context(sim, SIM_CONTEXT)
    ctx["trace_name"] = ctx["trace"].map(trace_name)
    policies = list(dict.fromkeys(sim["policy"]))
    for context, g in norm.groupby("context", sort=False):
        slug = _slug(context)
        cells = ctx[ctx["context"] == context]
        where = context_title(cells, SIM_CONTEXT)  # cluster and mode, named even where the sweep has one
        md += [f"### Context: {context}", ""]
        png = f"bars_{slug}.png"
        traces = list(dict.fromkeys(g["trace_name"]))
        plots.normalized_bars(g, baseline, f"Normalised to {baseline}: {_listed(traces, 'trace')} on {where}",
                              out / png, policies=policies)
        md += [f"![normalised bars]({png})", ""]
        for m in BAR_METRICS:
            if m in g:
                wide = g.pivot_table(index="trace_name", columns="policy", values=m, sort=False).reset_index()
                wide = wide[["trace_name", *[p for p in policies if p in wide.columns]]]
                md += [f"{m} / {baseline}:", "", md_table(wide.rename(columns={"trace_name": "trace"})), ""]
        cdf_runs: dict[str, list[tuple[str, np.ndarray]]] = {}
        tl_runs: dict[str, list[tuple[str, pd.DataFrame]]] = {}
        first_seed = cells[cells["seed"] == cells["seed"].min()]
        for trace, tc in first_seed.groupby("trace_name", sort=False):
            for label, (_, r) in zip(_series_labels(tc, "policy"), tc.iterrows(), strict=True):
                cdf_runs.setdefault(trace, []).append((label, _jcts(sweep_dir, r["cell_id"])))
                tl_runs.setdefault(trace, []).append((label, _timeline(sweep_dir, r["cell_id"])))
        plots.jct_cdfs(cdf_runs, f"JCT CDF, one panel per trace, on {where}", out / f"cdf_{slug}.png")
        plots.utilisation_over_time(tl_runs, f"GPU utilisation over time, one panel per trace, on {where}",
                                    out / f"util_{slug}.png", ylabel="busy GPUs / GPUs")
        md += [f"![JCT CDFs](cdf_{slug}.png)", "", f"![utilisation over time](util_{slug}.png)", ""]
        raw = cells[["trace_name", "policy", "seed", *[c for c in _SIM_COLUMNS if c in cells.columns]]]
        md += ["Raw numbers (seconds):", "", md_table(raw.rename(columns={"trace_name": "trace"})), ""]
    return md


def _replay_section(rep: pd.DataFrame, sweep_dir: Path, out: Path) -> list[str]:
    ctx = with_context(rep, REPLAY_CONTEXT)
    where = context_title(ctx, ("idle", "log", "nodes", "solver"))  # the replay's trace and cluster
    md = ["## Idle-node harvesting replays", ""]
    if ctx["tfwd"].nunique() > 1:
        plots.harvest_vs_tfwd(ctx, out / "harvest_vs_tfwd.png", where)
        md += ["![harvest vs Tfwd](harvest_vs_tfwd.png)", ""]
    for context, g in ctx.groupby("context", sort=False):
        cols = [*(["seed"] if g["seed"].nunique() > 1 else []), *[c for c in _REPLAY_COLUMNS if c in g.columns]]
        md += [f"### Context: {context}", "", md_table(g[cols]), ""]
    tl_runs: dict[str, list[tuple[str, pd.DataFrame]]] = {}
    for context, g in ctx.groupby("context", sort=False):
        for label, (_, r) in zip(_series_labels(g.assign(tfwd_label=[f"Tfwd {t:g} s" for t in g["tfwd"]]),
                                                "tfwd_label"), g.iterrows(), strict=True):
            tl = _timeline(sweep_dir, r["cell_id"])
            if len(tl):
                tl_runs.setdefault(str(context), []).append((label, tl))
    if tl_runs:
        plots.utilisation_over_time(tl_runs, f"Idle-pool utilisation over time, one panel per context: {where}",
                                    out / "util_replay.png", xlabel="time since the first idle-pool event (h)",
                                    ylabel="used / idle nodes")
        md += ["![utilisation over time](util_replay.png)", ""]
    return md


def _listed(names: Sequence[str], what: str, most: int = 8) -> str:
    """'traces trace1, trace2' or '12 traces': a title names them while that stays readable."""
    if len(names) == 1:
        return f"{what} {names[0]}"
    return f"{what}s {', '.join(names)}" if len(names) <= most else f"{len(names)} {what}s"


def _series_labels(cells: pd.DataFrame, base: str) -> list[str]:
    """Legend labels for cells drawn in one panel: ``base``'s value, told apart by the parameters that
    differ (seed, ...) or the cell id where two cells share one (``hpcsched.metrics.labels.run_labels``)."""
    rows = [{k: v for k, v in r.items() if not (isinstance(v, float) and np.isnan(v))} | {"policy": r[base],
            "dir": r["cell_id"]} for r in cells.to_dict("records")]
    return run_labels(rows)
