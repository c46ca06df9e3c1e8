"""The report's PNG figures, each a function of tidy data so it can be checked without looking at it.

Every function returns what it drew (bar heights, line counts) besides writing the PNG, so tests can
assert the figure shows the right numbers. Figures are kept small (dpi 100) to live in the repo.
Each title names what a figure cut out of the report still needs to say (trace, cluster, mode: the
caller passes them), every axis has its unit, and value axes of bars, node-hours and utilisation start
at 0: a truncated axis makes a 2% difference look like a factor of two.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from hpcsched.metrics.plot import log_x_by_decades  # noqa: E402

DPI = 100
_MIN_WIDTH = 7.0  # inches: a one-panel figure still has room for a title naming trace and cluster
_LABELS = {"avg_jct": "average JCT", "p99_jct": "p99 JCT", "makespan": "makespan"}


def _grid(n: int, max_cols: int = 4) -> tuple[int, int]:
    cols = min(n, max_cols)
    return math.ceil(n / cols), cols


def _save(fig: plt.Figure, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return out


def _finish_panels(fig: plt.Figure, axes: np.ndarray, used: int, ylabel: str, title: str, out: Path) -> Path:
    """The common end of a one-panel-per-trace figure: blank the spare cells of the grid, label and
    legend the first panel only (all panels share policies and units), title and save."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize="x-small")
    fig.suptitle(_wrap(title, fig), fontsize="medium")
    return _save(fig, out)


def _wrap(title: str, fig: plt.Figure) -> str:
    """A title broken to the figure's width: cut off at the edge it would lose the cluster's name."""
    return textwrap.fill(title, width=max(int(fig.get_figwidth() * 11), 40))


def _panels(n: int) -> tuple[plt.Figure, np.ndarray]:
    rows, cols = _grid(n)
    return plt.subplots(rows, cols, figsize=(max(3.6 * cols, _MIN_WIDTH), 2.9 * rows + 0.4), squeeze=False)


def normalized_bars(norm: pd.DataFrame, baseline: str, title: str, out: Path,
                    metrics: Sequence[str] = ("avg_jct", "p99_jct", "makespan"),
                    policies: Sequence[str] | None = None) -> dict[str, dict[tuple[str, str], float]]:
    """Muri's Figure 9/10 layout: one panel per metric, traces on x, one bar per policy, baseline = 1.

    Returns ``{metric: {(trace, policy): bar height}}`` read back from the drawn bars.
    """
    metrics = [m for m in metrics if m in norm.columns]
    traces = list(dict.fromkeys(norm["trace_name"]))
    policies = list(policies or dict.fromkeys(norm["policy"]))
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    width = 0.8 / max(len(policies), 1)
    drawn: dict[str, dict[tuple[str, str], float]] = {}
    x = np.arange(len(traces))
    out.parent.mkdir(parents=True, exist_ok=True)
    for ax, m in zip(axes[0], metrics, strict=True):
        drawn[m] = {}
        table = norm.pivot_table(index="trace_name", columns="policy", values=m, aggfunc="first", dropna=False)
        for i, pol in enumerate(policies):
            heights = [float(table.at[t, pol]) if pol in table.columns and t in table.index else np.nan
                       for t in traces]
            bars = ax.bar(x + (i - (len(policies) - 1) / 2) * width, heights, width, label=pol)
            for t, b in zip(traces, bars, strict=True):
                drawn[m][(t, pol)] = float(b.get_height())
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_ylim(bottom=0)
        ax.set_xticks(x, traces, rotation=30, ha="right", fontsize="small")
        ax.set_xlabel("trace", fontsize="small")
        ax.set_ylabel(f"{_LABELS.get(m, m)} / {baseline}'s (ratio)")
        ax.set_title(_LABELS.get(m, m))
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(policies), fontsize="small", frameon=False)
    fig.suptitle(_wrap(title, fig), fontsize="medium")
    fig.tight_layout(rect=(0, 0.08, 1, 1))  # room for the legend below the panels
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return drawn


def jct_cdfs(runs: Mapping[str, Sequence[tuple[str, np.ndarray]]], title: str, out: Path) -> int:
    """One panel per trace, one CDF per policy (log-x); ``runs[trace] = [(policy, sorted jcts)]``."""
    fig, axes = _panels(len(runs))
    lines = 0
    for ax, (trace, series) in zip(axes.flat, runs.items(), strict=False):
        for policy, jct in series:
            if len(jct):
                ax.step(np.maximum(jct, 1e-3), np.arange(1, len(jct) + 1) / len(jct), where="post", label=policy)
                lines += 1
        log_x_by_decades(ax, np.concatenate([np.maximum(j, 1e-3) for _, j in series] or [np.array([])]))
        ax.set_title(trace, fontsize="small")
        ax.set_xlabel("JCT (s, log scale)", fontsize="small")
        ax.set_ylim(0, 1.01)
        ax.grid(True, which="major", alpha=0.3)
    _finish_panels(fig, axes, len(runs), "fraction of jobs", title, out)
    return lines


def utilisation_over_time(runs: Mapping[str, Sequence[tuple[str, pd.DataFrame]]], title: str, out: Path,
                          xlabel: str = "time since first submit (h)", ylabel: str = "busy fraction") -> int:
    """One panel per trace, one step line per policy: busy fraction of the cluster vs hours.

    ``runs[trace] = [(policy, frame with columns time, utilization)]``, time in seconds from the
    origin ``xlabel`` names.
    """
    fig, axes = _panels(len(runs))
    lines = 0
    for ax, (trace, series) in zip(axes.flat, runs.items(), strict=False):
        for policy, tl in series:
            if len(tl):
                ax.step(tl["time"] / 3600.0, tl["utilization"], where="post", label=policy, linewidth=0.8)
                lines += 1
        ax.set_title(trace, fontsize="small")
        ax.set_xlabel(xlabel, fontsize="small")
        ax.set_ylim(0, 1.05)
        ax.grid(True, alpha=0.3)
    _finish_panels(fig, axes, len(runs), ylabel, title, out)
    return lines


def harvest_vs_tfwd(rep: pd.DataFrame, out: Path, subject: str = "idle log and nodes unknown") -> int:
    """Idle-pool utilisation and harvested node-hours against Tfwd, one line per replay context.

    ``subject`` names the idle log and the nodes harvested (the replay's trace and cluster).
    """
    fig, (ax_u, ax_h) = plt.subplots(1, 2, figsize=(9, 3.4))
    lines = 0
    top = 0.0
    for ctx, g in rep.groupby("context", sort=False):
        g = g.groupby("tfwd", as_index=False).mean(numeric_only=True).sort_values("tfwd")
        if "utilization" in g:
            ax_u.plot(g["tfwd"], g["utilization"], marker="o", label=ctx)
            lines += 1
        if "used_node_hours" in g:
            ax_h.plot(g["tfwd"], g["used_node_hours"], marker="o", label=ctx)
            top = max(top, float(g["used_node_hours"].max()))
    for ax, label in ((ax_u, "idle-pool utilisation (used / idle node-h)"), (ax_h, "harvested node-hours (node-h)")):
        ax.set_xscale("log")
        ax.set_xlabel("Tfwd (s, log scale)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_u.set_ylim(0, 1.05)
    ax_h.set_ylim(0, top * 1.08 or 1.0)  # from 0: node-hours of 254-260 drawn from 254 would look like a factor of 6
    ax_u.legend(fontsize="x-small")
    fig.suptitle(_wrap(f"Harvesting idle nodes vs the look-ahead window: {subject}", fig), fontsize="medium")
    _save(fig, out)
    return lines
