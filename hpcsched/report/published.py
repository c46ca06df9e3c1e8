"""Our numbers beside a paper's: the table that says how far a reproduction is from the published run.

A config's ``report.published`` blocks (see ``hpcsched.sweep.config``) give per metric the seconds a
paper printed for each policy on one trace in one simulator mode. The report matches them to the
cells of that trace and ``compat`` mode at arrival scale 1 (seeds averaged) and prints both with the
relative difference, and the same comparison after normalising to the baseline policy, which is what
the paper's bar figures show.

Makespan: ours counts from the first submit; Muri's simulator printed its last end time. The two agree
on every bundled Muri trace (first submit 0). Where a ``compat: muri`` block's trace starts later, the
comparison takes our ``last_end`` (Muri's definition) and ``makespan_note`` says so.
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


def _matching(sim: pd.DataFrame, block: dict[str, Any]) -> pd.DataFrame:
    df = with_context(sim, SIM_CONTEXT)
    return df[(df["trace"].map(trace_name) == block["trace"]) & (df["compat"] == block["compat"])
              & (df["arrival_scale"] == 1.0)]


def _first_submits(df: pd.DataFrame) -> list[float]:
    return sorted(set(df["first_submit"].dropna().astype(float))) if "first_submit" in df.columns else []


def _uses_last_end(df: pd.DataFrame, block: dict[str, Any]) -> bool:
    """Muri's own makespan (the last end time) is compared where it differs from ours: compat=muri, late start."""
    return (block.get("compat") == "muri" and "last_end" in df.columns
            and any(t != 0.0 for t in _first_submits(df)))


def ours_for(sim: pd.DataFrame, block: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """Seed-averaged metrics per policy for the block's trace and mode, one frame per matching context."""
    df = _matching(sim, block)
    if _uses_last_end(df, block):
        df = df.assign(makespan=df["last_end"])
    metrics = [m for m in BAR_METRICS if m in df.columns]
    return {str(ctx): g.groupby("policy", sort=False)[metrics].mean() for ctx, g in df.groupby("context", sort=False)}


def makespan_note(sim: pd.DataFrame, block: dict[str, Any]) -> str:
    """One sentence saying which makespan the block's comparison uses, so a reader can trust the column."""
    if "makespan" not in block:
        return ""
    df = _matching(sim, block)
    starts = _first_submits(df)
    at = ", ".join(f"{t:,.2f}" for t in starts)
    if _uses_last_end(df, block):
        return (f"Makespan here is our last end time, Muri's definition (this trace's first submit is {at} s); "
                "elsewhere in this report it counts from the first submit.")
    if starts == [0.0]:
        return ("Makespan: last end - first submit; this trace's first submit is 0, so it is also Muri's "
                "definition (the last end time).")
    if starts:
        return (f"Makespan: ours is last end - first submit (first submit {at} s); a published figure counted "
                "from time 0 differs by that much.")
    return "Makespan: last end - first submit."


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
