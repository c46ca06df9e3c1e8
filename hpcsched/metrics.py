"""Job completion time, percentiles, makespan and utilisation from a results table; JCT CDF plots.

Definitions are chosen for comparability with the peers:
- ``p99_jct`` is Muri's ``sorted(jct)[int(0.99 * n)]``; ``p99_jct_interp`` the interpolated one.
- ``makespan`` is the last end time (Muri), ``span`` the last end minus the first submit.
- ``utilization`` is resource-seconds held / (capacity x span), GPUs if the run has GPUs, else nodes;
  a run whose capacity varies (harvesting) gives ``capacity_node_seconds`` in its metadata instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

SUMMARY_KEYS = ("jobs", "avg_jct", "p50_jct", "p95_jct", "p99_jct", "makespan", "utilization")
# Facts a run records in meta.json that no jobs table can recompute (harvesting, preemption); shown as they are.
_META_PASSTHROUGH = ("policy", "trace", "cluster", "tool", "harvested_node_hours", "preemptions", "max_lost_steps")


def muri_percentile(sorted_values: np.ndarray, q: float) -> float:
    """Muri's percentile: the element at index int(q * n) of the sorted values (clamped)."""
    n = len(sorted_values)
    return float(sorted_values[min(int(q * n), n - 1)])


def summarize(df: pd.DataFrame, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The summary every tool prints; keys in ``SUMMARY_KEYS`` are a contract."""
    meta = meta or {}
    done = df[df["end"].notna()]
    jct = np.sort((done["end"] - done["submit"]).to_numpy(dtype=float))
    out: dict[str, Any] = {"jobs": int(len(done)), "unfinished": int(len(df) - len(done))}
    if len(jct):
        out |= {
            "avg_jct": float(jct.mean()),
            "p50_jct": float(np.median(jct)),
            "p95_jct": muri_percentile(jct, 0.95),
            "p99_jct": muri_percentile(jct, 0.99),
            "p99_jct_interp": float(np.percentile(jct, 99)),
            "max_jct": float(jct[-1]),
        }
    else:
        out |= {k: None for k in ("avg_jct", "p50_jct", "p95_jct", "p99_jct", "p99_jct_interp", "max_jct")}
    started = df[df["start"].notna()]
    out["avg_queue"] = float((started["start"] - started["submit"]).mean()) if len(started) else None
    last_end = float(done["end"].max()) if len(done) else None
    first_submit = float(df["submit"].min()) if len(df) else None
    out["makespan"] = last_end
    out["span"] = last_end - first_submit if last_end is not None and first_submit is not None else None
    out["utilization"] = _utilization(df, meta, out["span"])
    for k in _META_PASSTHROUGH:
        if k in meta:
            out[k] = meta[k]
    return out


def _utilization(df: pd.DataFrame, meta: Mapping[str, Any], span: float | None) -> float | None:
    if meta.get("capacity_node_seconds"):
        return float(df.get("node_seconds", pd.Series(dtype=float)).sum()) / float(meta["capacity_node_seconds"])
    if not span:
        return None
    for held, cap, size in (("gpu_seconds", "capacity_gpus", "gpus"), ("node_seconds", "capacity_nodes", "nodes")):
        capacity = meta.get(cap)
        if capacity and held in df.columns and df[held].sum() > 0:
            return float(df[held].sum()) / (float(capacity) * span)
        if capacity and size in df.columns and df[size].sum() > 0:  # no held-time column: assume start..end
            ran = df[df["end"].notna() & df["start"].notna()]
            return float((ran[size] * (ran["end"] - ran["start"])).sum()) / (float(capacity) * span)
    return None


def plot_jct_cdf(runs: Sequence[tuple[str, pd.DataFrame]], out_png: str | Path) -> Path:
    """One JCT CDF per run on shared log-scaled axes, for comparing policies at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, df in runs:
        done = df[df["end"].notna()]
        jct = np.sort((done["end"] - done["submit"]).to_numpy(dtype=float))
        if len(jct):
            ax.step(np.maximum(jct, 1e-3), np.arange(1, len(jct) + 1) / len(jct), where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title("JCT CDF")
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
