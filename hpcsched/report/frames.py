"""Reshape a sweep's tidy table into what the report shows: contexts, seed means, normalised ratios.

A *context* is everything about a simulate cell except the trace, the policy and the seed (cluster,
compat mode, arrival scale): bars are only comparable inside one context. Seeds are averaged first,
then each (context, trace) is divided by its baseline policy's value, so the baseline's bar is 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

SIM_CONTEXT = ("cluster", "compat", "arrival_scale")
REPLAY_CONTEXT = ("idle", "log", "bounds", "curves", "nodes", "solver", "objective", "accounting", "max_jobs",
                  "time_limit", "arrival_scale")
BAR_METRICS = ("avg_jct", "p99_jct", "makespan")


def ok_rows(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    return df[(df["kind"] == kind) & (df["status"] == "ok")].copy()


def context_label(row: pd.Series | dict, columns: Sequence[str], varying: Sequence[str]) -> str:
    """A short name for a context, naming only the columns that vary across the sweep."""
    bits = []
    for c in columns:
        if c in varying:
            v = row[c]
            v = str(v).rsplit("/", 1)[-1] if isinstance(v, str) else v
            bits.append(f"{c}={v:g}" if isinstance(v, float) else f"{c}={v}")
    return ", ".join(bits) or "all"


def varying_columns(df: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    return [c for c in columns if c in df.columns and df[c].nunique(dropna=False) > 1]


def with_context(df: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``df`` plus a ``context`` column (text label); missing context columns count as constant."""
    out = df.copy()
    present = [c for c in columns if c in out.columns]
    varying = varying_columns(out, present)
    out["context"] = [context_label(r, present, varying) for _, r in out.iterrows()] if len(out) else []
    return out


def context_title(cells: pd.DataFrame, columns: Sequence[str]) -> str:
    """Every value these cells have in ``columns``, constant ones included ('cluster=n8g8, compat=muri').

    ``context_label`` names only what varies, which is enough to tell contexts apart but leaves a
    one-cluster sweep's figures without their cluster; titles use this instead. An arrival scale of 1
    (the trace as recorded) is left out; a replay without ``nodes`` harvested all of its log's nodes.
    """
    bits = []
    for c in columns:
        if c not in cells.columns:
            continue
        values = list(dict.fromkeys(cells[c].tolist()))
        if c == "nodes":
            values = ["all" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values]
        values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
        if not values or (c == "arrival_scale" and values == [1.0]):
            continue
        shown = [trace_name(v) if isinstance(v, str) and "/" in v else (f"{v:g}" if isinstance(v, float) else str(v))
                 for v in values]
        bits.append(f"{c}={'/'.join(dict.fromkeys(shown))}")
    return ", ".join(bits) or "unknown context"


def trace_name(path: str) -> str:
    name = str(path).rsplit("/", 1)[-1]
    for suffix in (".gz", ".csv", ".yaml"):
        name = name.removesuffix(suffix)
    return name


def seed_means(sim: pd.DataFrame, metrics: Sequence[str] = BAR_METRICS) -> pd.DataFrame:
    """One row per (context, trace, policy): each metric averaged over seeds."""
    df = with_context(sim, SIM_CONTEXT)
    df["trace_name"] = df["trace"].map(trace_name)
    present = [m for m in metrics if m in df.columns]
    return df.groupby(["context", "trace_name", "policy"], sort=False)[present].mean().reset_index()


def normalized(sim: pd.DataFrame, baseline: str, metrics: Sequence[str] = BAR_METRICS) -> pd.DataFrame:
    """Each metric divided by the baseline policy's value in the same context and trace.

    Rows whose (context, trace) has no baseline cell get NaN, so a missing baseline is visible
    rather than silently normalised to something else.
    """
    means = seed_means(sim, metrics)
    present = [m for m in metrics if m in means.columns]
    base = means.loc[means["policy"] == baseline, ["context", "trace_name", *present]]
    joined = means.merge(base, on=["context", "trace_name"], how="left", suffixes=("", "__base"))
    out = joined[["context", "trace_name", "policy"]].copy()
    for m in present:
        out[m] = joined[m] / joined[f"{m}__base"]
    return out
