"""The tidy results table: one row per cell, its parameters then its metrics.

Always written as ``results.csv`` (readable anywhere); also as ``results.parquet`` when pyarrow is
installed (typed columns, fast to load for large sweeps). ``read_table`` prefers the CSV's
neighbour only when it is at least as new, so a hand-edited CSV is never silently ignored.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from hpcsched.errors import InputError
from hpcsched.sweep.cell import KINDS

CSV_FILE = "results.csv"
PARQUET_FILE = "results.parquet"
LEAD_COLUMNS = ("cell_id", "kind", "status")
# Metadata echoed by summarize() that duplicates a parameter column or is text: not a metric.
_NOT_METRICS = {"policy", "trace", "cluster", "tool", "compat"}


def param_columns() -> list[str]:
    """Every kind's parameters, each once, in the order the kinds declare them."""
    cols: list[str] = []
    for specs in KINDS.values():
        cols += [n for n in specs if n not in cols]
    return cols


def build_table(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows from cell records (``execute``'s return value); metrics that are not numbers are dropped."""
    rows = []
    metric_cols: list[str] = []
    for rec in records:
        row: dict[str, Any] = {"cell_id": rec["id"], "kind": rec["kind"], "status": rec.get("status")}
        row |= dict(rec.get("params", {}))
        row["wall_s"] = rec.get("wall_s")
        row["cpu_s"] = rec.get("cpu_s")
        row["error"] = rec.get("error")
        for k, v in (rec.get("metrics") or {}).items():
            if k in _NOT_METRICS or not (v is None or isinstance(v, (int, float))) or isinstance(v, bool):
                continue
            row[k] = v
            if k not in metric_cols:
                metric_cols.append(k)
        rows.append(row)
    params = [c for c in param_columns() if any(c in r for r in rows)]
    columns = [*LEAD_COLUMNS, *params, "wall_s", "cpu_s", "error", *metric_cols]
    return pd.DataFrame(rows, columns=columns)


def write_table(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Write the table; returns the files written (CSV, and Parquet when pyarrow is present)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / CSV_FILE]
    df.to_csv(written[0], index=False)
    if importlib.util.find_spec("pyarrow") is not None:
        df.to_parquet(out_dir / PARQUET_FILE, index=False)
        written.append(out_dir / PARQUET_FILE)
    return written


def read_table(sweep_dir: str | Path) -> pd.DataFrame:
    """The results table of a sweep directory (or a results file given directly)."""
    d = Path(sweep_dir)
    csv = d / CSV_FILE if d.is_dir() else d
    parquet = csv.with_name(PARQUET_FILE)
    if d.is_dir() and parquet.is_file() and csv.is_file() and parquet.stat().st_mtime >= csv.stat().st_mtime:
        if importlib.util.find_spec("pyarrow") is not None:
            return pd.read_parquet(parquet)
    if csv.suffix == ".parquet":
        return pd.read_parquet(csv)
    if not csv.is_file():
        raise InputError(csv, f"no sweep results here (expected {CSV_FILE}, written by hpcsched sweep)")
    try:
        df = pd.read_csv(csv)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise InputError(csv, f"not a sweep results table: {e}") from None
    missing = [c for c in LEAD_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(csv, f"not a sweep results table: missing columns {missing}", 1)
    return df
