"""Job completion time, percentiles, makespan and utilisation from a results table; JCT CDF plots.

Definitions are chosen for comparability with the peers:
- ``p99_jct`` is Muri's ``sorted(jct)[int(0.99 * n)]``; ``p99_jct_interp`` the interpolated one.
- ``makespan`` is the last end minus the first submit (``span`` is the same figure, kept under its old
  name), so it means the same for every trace; ``last_end`` and ``first_submit`` are the absolute times
  behind it. Muri's simulator reports its last end time as the makespan; on its traces (first submit
  0) the two agree, and ``hpcsched.report.published`` compares with Muri's definition where they do not.
  Before this, ``makespan`` was the last end time, which for a trace with calendar times (Philly, an
  idle log) is an epoch timestamp, not a duration.
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
    span = last_end - first_submit if last_end is not None and first_submit is not None else None
    out["makespan"] = span
    out["span"] = span
    out["first_submit"] = first_submit
    out["last_end"] = last_end
    out["utilization"] = _utilization(df, meta, span)
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


# The unit (and, where the name alone misleads, the definition) of each summary key, for tables.
METRIC_UNITS = {
    "jobs": "finished",
    "unfinished": "jobs",
    "avg_jct": "s",
    "p50_jct": "s",
    "p95_jct": "s, Muri's index",
    "p99_jct": "s, Muri's index",
    "p99_jct_interp": "s, interpolated",
    "max_jct": "s",
    "makespan": "s, from first submit",
    "span": "s, = makespan",
    "first_submit": "s, trace clock",
    "last_end": "s, trace clock",
    "avg_queue": "s",
    "utilization": "of capacity x span",
}


# Run facts that can tell two runs of one policy apart, most telling first (paths are shown by stem).
_LABEL_KEYS = ("trace", "cluster", "compat", "arrival_scale", "restart_s", "jobs_file", "tfwd", "objective",
               "accounting", "max_jobs", "time_limit", "predict_tfwd", "exact_events", "seed")
_PATH_KEYS = ("trace", "cluster", "jobs_file", "dir")


def _stem(value: object) -> str:
    name = str(value).rstrip("/").rsplit("/", 1)[-1]
    for suffix in (".gz", ".csv", ".swf", ".yaml", ".yml"):
        name = name.removesuffix(suffix)
    return name


def _label_bit(key: str, value: object) -> str:
    if key in ("trace", "cluster"):
        return _stem(value) if value is not None else f"{key} unknown"
    if key in _PATH_KEYS:
        return f"{key}={_stem(value)}"
    if key == "compat" and value is None:
        return "compat=default"
    return f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"


def run_labels(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """One label per run, distinct wherever runs share a policy name.

    ``runs`` are meta.json mappings, each with ``dir`` where known. A run is labelled by its policy
    (else its directory's name); runs sharing one get, in brackets, the facts that differ between them
    (trace, cluster, compat mode, a parameter), else their directory names, else a number, so three
    replays of ``bftrainer-highs`` in one table or legend are never three identical columns or lines.
    """
    base = [str(r.get("policy") or _stem(r.get("dir") or "") or f"run {i + 1}") for i, r in enumerate(runs)]
    labels = list(base)
    groups: dict[str, list[int]] = {}
    for i, b in enumerate(base):
        groups.setdefault(b, []).append(i)
    for b, idx in groups.items():
        if len(idx) < 2:
            continue
        bits: dict[int, list[str]] = {i: [] for i in idx}
        for key in _LABEL_KEYS:
            values = [_label_bit(key, runs[i].get(key)) for i in idx]
            if len(set(values)) > 1:
                for i, v in zip(idx, values, strict=True):
                    bits[i].append(v)
                if _distinct(bits):
                    break
        if not _distinct(bits):  # the same run twice, or facts meta.json does not hold: fall back to the folder
            dirs = [str(runs[i].get("dir") or "") for i in idx]
            names = [_stem(d) for d in dirs]
            for i, name, d in zip(idx, names, dirs, strict=True):
                bits[i].append(name if len(set(names)) == len(names) else d)
        if not _distinct(bits):
            for k, i in enumerate(idx):
                bits[i].append(f"#{k + 1}")
        for i in idx:
            labels[i] = f"{b} ({', '.join(x for x in bits[i] if x)})"
    return labels


def _distinct(bits: Mapping[int, list[str]]) -> bool:
    return len({tuple(b) for b in bits.values()}) == len(bits)


def _names(values: Sequence[str], most: int = 4) -> str:
    unique = list(dict.fromkeys(values))
    if len(unique) <= most:
        return ", ".join(unique)
    return f"{', '.join(unique[:most - 1])} and {len(unique) - most + 1} more"


def runs_subject(runs: Sequence[Mapping[str, Any]]) -> str:
    """'trace3 on n8g8 (64 GPUs), compat=muri': what a set of runs ran on, for plot and table titles.

    A reader of a figure cut out of its context must still see which trace and cluster it shows; a
    fact meta.json does not hold is written as unknown rather than left out.
    """
    traces = _names([_stem(r["trace"]) if r.get("trace") else "trace unknown" for r in runs])
    clusters = []
    for r in runs:
        name = str(r.get("cluster") or "cluster unknown")
        gpus = r.get("capacity_gpus")
        clusters.append(f"{name} ({gpus} GPUs)" if gpus and "GPU" not in name else name)
    text = f"{traces} on {_names(clusters)}"
    if any(r.get("compat") for r in runs):  # the default mode is named only beside another one
        text += f", compat={'/'.join(dict.fromkeys(str(r.get('compat') or 'default') for r in runs))}"
    return text


def plot_jct_cdf(runs: Sequence[tuple[str, pd.DataFrame]], out_png: str | Path, subject: str | None = None) -> Path:
    """One JCT CDF per run on shared log-scaled axes, for comparing policies at a glance.

    ``subject`` names the trace and cluster (``runs_subject``); the title says so, because a CDF
    without them cannot be told from another trace's.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hpcsched.report.plots import log_x_by_decades

    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = [np.array([])]
    for label, df in runs:
        done = df[df["end"].notna()]
        jct = np.maximum(np.sort((done["end"] - done["submit"]).to_numpy(dtype=float)), 1e-3)
        if len(jct):
            ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=label)
            drawn.append(jct)
    log_x_by_decades(ax, np.concatenate(drawn))
    ax.set_xlabel("job completion time (s, log scale)")
    ax.set_ylabel("fraction of finished jobs")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title(f"JCT CDF: {subject or 'trace and cluster unknown'}", fontsize="medium")
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
