"""Run a sweep's cells on local cores (or a Ray cluster), resuming where a previous run stopped.

Layout of a sweep directory ``OUT``::

    OUT/sweep.yaml            the config as given
    OUT/sweep.json            name, root, the command, the cells (id, kind, params), timings
    OUT/cells/<id>/           one folder per cell: jobs.csv, meta.json, timeline.csv, cell.json
    OUT/results.csv           the tidy table, one row per cell (and results.parquet with pyarrow)

A cell is finished when its ``cell.json`` says ``status: ok``; that file is written last, atomically,
so a sweep killed mid-cell redoes only that cell. Failed cells are retried on the next run.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from hpcsched.sweep.cell import PATH_PARAMS, Cell
from hpcsched.sweep.config import SweepConfig
from hpcsched.sweep.local import run_local
from hpcsched.sweep.store import CELLS_DIR, cell_dir, load_record
from hpcsched.sweep.table import build_table, write_table

SWEEP_JSON = "sweep.json"
SWEEP_YAML = "sweep.yaml"


@dataclass
class SweepOutcome:
    """What a run of ``run_sweep`` did; ``as_json`` is what ``hpcsched sweep --json`` prints."""

    out: Path
    cells: int
    ran: int
    skipped: int
    failed: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    tables: list[Path] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "cells": self.cells,
            "ran": self.ran,
            "skipped": self.skipped,
            "failed": len(self.failed),
            "failures": [{"id": f["id"], "error": f["error"]} for f in self.failed],
            "wall_s": round(self.wall_s, 3),
            "tables": [str(t) for t in self.tables],
        }


def _cost(cell: Cell, root: Path) -> float:
    """Rough cost for ordering: bigger inputs first, so the longest cells do not start last."""
    total = 0.0
    for name in PATH_PARAMS[cell.kind]:
        v = cell.params.get(name)
        if v is not None:
            try:
                total += (root / v).stat().st_size
            except OSError:
                pass
    return total


def run_sweep(
    config: SweepConfig,
    out: str | Path,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    fresh: bool = False,
    progress: bool = True,
    command: Sequence[str] | None = None,
    only: Callable[[Cell], bool] | None = None,
    timeout_s: float | None = None,
) -> SweepOutcome:
    """Run every unfinished cell of ``config`` into ``out`` and (re)write the results table.

    ``only`` restricts which unfinished cells run now (the table still lists every finished cell),
    so a large grid can be filled in the order that matters most. ``timeout_s`` stops a local cell
    that runs longer (wall seconds) and records it as failed, so one runaway cell cannot hold up a grid.
    """
    t0 = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if fresh and (out / CELLS_DIR).exists():
        for cell in config.cells:
            shutil.rmtree(cell_dir(out, cell), ignore_errors=True)
    records: dict[str, dict[str, Any]] = {}
    todo: list[Cell] = []
    for cell in config.cells:
        rec = load_record(out, cell)
        if rec is None:
            if only is None or only(cell):
                todo.append(cell)
        else:
            records[cell.id] = rec
    todo.sort(key=lambda c: -_cost(c, config.root))
    _write_manifest(config, out, command, status="running")
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task(f"sweep {config.name}", total=len(config.cells), completed=len(records))

        def done(rec: dict[str, Any]) -> None:
            records[rec["id"]] = rec
            mark = "ok" if rec["status"] == "ok" else "FAILED"
            bar.update(task, advance=1, description=f"sweep {config.name}: {mark} {rec.get('label', rec['id'])}")

        try:
            if todo and ray_address:
                from hpcsched.sweep.ray_runner import run_on_ray

                run_on_ray(todo, config.root, out, ray_address, done)
            elif todo:
                run_local(todo, config.root, out, workers or os.cpu_count() or 1, done, timeout_s)
        except KeyboardInterrupt:  # keep what finished: a table now, the rest on the next run
            kept = [records[c.id] for c in config.cells if c.id in records]
            tables = write_table(build_table(kept), out)
            ran = sum(1 for c in todo if c.id in records)
            partial = SweepOutcome(out, len(config.cells), ran, len(kept) - ran, [], time.perf_counter() - t0, tables)
            _write_manifest(config, out, command, status="interrupted", outcome=partial)
            raise
    ordered = [records[c.id] for c in config.cells if c.id in records]
    tables = write_table(build_table(ordered), out)
    failed = [r for r in ordered if r["status"] != "ok"]
    outcome = SweepOutcome(out, len(config.cells), len(todo), len(ordered) - len(todo), failed,
                           time.perf_counter() - t0, tables)
    _write_manifest(config, out, command, status="failed" if failed else "done", outcome=outcome)
    return outcome


def _write_manifest(config: SweepConfig, out: Path, command: Sequence[str] | None, status: str,
                    outcome: SweepOutcome | None = None) -> None:
    """``sweep.json`` and ``sweep.yaml``: what the report needs to say how the results were made."""
    (out / SWEEP_YAML).write_text(config.text)
    manifest: dict[str, Any] = {
        "name": config.name,
        "description": config.description,
        "config": str(config.path),
        "root": str(config.root),
        "command": list(command) if command else None,
        "report": config.report,
        "status": status,
        "cells": [{"id": c.id, "kind": c.kind, "label": c.label(), "params": dict(c.params)} for c in config.cells],
    }
    runs: list[dict[str, Any]] = []
    try:
        runs = list(json.loads((out / SWEEP_JSON).read_text()).get("runs", []))
    except (OSError, json.JSONDecodeError):
        pass
    if outcome is not None:
        manifest["outcome"] = outcome.as_json()
        runs.append({"command": manifest["command"], "ran": outcome.ran, "failed": len(outcome.failed),
                     "wall_s": round(outcome.wall_s, 3), "interrupted": status == "interrupted",
                     "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    manifest["runs"] = runs  # every run that touched this directory: the report sums them
    tmp = out / f".{SWEEP_JSON}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, out / SWEEP_JSON)
