"""Our numbers beside a paper's: the table that says how far a reproduction is from the published run.

A config's ``report.published`` blocks (see ``hpcsched.sweep.config``) give per metric the seconds a
paper printed for each policy on one trace in one simulator mode. The report matches them to the
cells of that trace and ``compat`` mode at arrival scale 1 (seeds averaged) and prints both with the
relative difference, and the same comparison after normalising to the baseline policy, which is what
the paper's bar figures show.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from hpcsched.report.frames import BAR_METRICS, SIM_CONTEXT, trace_name, with_context

_SHORT = {"avg_jct": "avg JCT", "p99_jct": "p99 JCT", "makespan": "makespan"}


def diff_percent(ours: float, published: float) -> float:
    """(ours - published) / published, in percent: negative means we report less."""
    return 100.0 * (ours - published) / published


def ours_for(sim: pd.DataFrame, block: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """Seed-averaged metrics per policy for the block's trace and mode, one frame per matching context."""
    df = with_context(sim, SIM_CONTEXT)
    df = df[(df["trace"].map(trace_name) == block["trace"]) & (df["compat"] == block["compat"])
            & (df["arrival_scale"] == 1.0)]
    metrics = [m for m in BAR_METRICS if m in df.columns]
    return {str(ctx): g.groupby("policy", sort=False)[metrics].mean() for ctx, g in df.groupby("context", sort=False)}


def comparison(ours: pd.DataFrame, block: dict[str, Any]) -> pd.DataFrame:
    """One row per published policy: published, ours and the difference in % for each published metric."""
    rows = []
    for policy in dict.fromkeys(p for m in BAR_METRICS for p in block.get(m, {})):
        row: dict[str, Any] = {"policy": policy}
        for m in BAR_METRICS:
            if m not in block:
                continue
            pub = block[m].get(policy, np.nan)
            mine = float(ours.at[policy, m]) if policy in ours.index and m in ours.columns else np.nan
            row[f"{_SHORT[m]} published"] = pub
            row[f"{_SHORT[m]} ours"] = mine
            row[f"{_SHORT[m]} diff %"] = diff_percent(mine, pub) if np.isfinite(mine) and np.isfinite(pub) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def normalised_comparison(ours: pd.DataFrame, block: dict[str, Any], baseline: str) -> pd.DataFrame:
    """Published / published baseline beside ours / our baseline: the heights of the paper's bars."""
    rows = []
    for policy in dict.fromkeys(p for m in BAR_METRICS for p in block.get(m, {})):
        row: dict[str, Any] = {"policy": policy}
        for m in BAR_METRICS:
            pub = block.get(m, {})
            if baseline not in pub:
                continue
            mine = ours[m] if m in ours.columns else pd.Series(dtype=float)
            row[f"{_SHORT[m]} published"] = pub.get(policy, np.nan) / pub[baseline]
            row[f"{_SHORT[m]} ours"] = (mine.get(policy, np.nan) / mine[baseline]) if baseline in mine.index \
                else np.nan
        rows.append(row)
    return pd.DataFrame(rows)
