"""Where a sweep keeps its cells on disk, and the marker that says a cell is finished.

``OUT/cells/<id>/cell.json`` is written last and atomically by whoever ran the cell (a local worker
process, or the driver for a Ray task), so its presence with ``status: ok`` and the same parameters
is the one test of "finished" that resume relies on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hpcsched.sweep.cell import Cell
from hpcsched.sweep.execute import RECORD_FILE

CELLS_DIR = "cells"


def cell_dir(out: Path, cell: Cell) -> Path:
    return out / CELLS_DIR / cell.id


def load_record(out: Path, cell: Cell) -> dict[str, Any] | None:
    """The finished record of ``cell`` in ``out``, or None if it must (re)run."""
    rec = read_record(out, cell)
    if rec is None or rec.get("status") != "ok" or rec.get("params") != dict(cell.params):
        return None
    return rec


def read_record(out: Path, cell: Cell) -> dict[str, Any] | None:
    """Whatever record ``cell`` left in ``out`` (finished or failed), or None."""
    p = cell_dir(out, cell) / RECORD_FILE
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def save_record(out: Path, record: dict[str, Any]) -> None:
    """Write ``cell.json`` atomically: it is the cell's 'finished' marker."""
    d = out / CELLS_DIR / record["id"]
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{RECORD_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    os.replace(tmp, d / RECORD_FILE)


def failed_record(cell: Cell, error: str, wall_s: float | None = None) -> dict[str, Any]:
    """The record of a cell that died without writing its own (killed, timed out, worker lost)."""
    return {"id": cell.id, "kind": cell.kind, "params": dict(cell.params), "status": "failed", "metrics": {},
            "error": error, "wall_s": wall_s, "cpu_s": None}
