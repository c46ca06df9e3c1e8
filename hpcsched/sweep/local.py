"""Run cells on this machine's cores, one child process per cell, each with an optional time limit.

A process per cell (rather than a pool of long-lived workers) is what lets a cell be stopped: a cell
that exceeds ``timeout_s`` is killed and recorded as failed with that reason, and a cell whose process
dies (out of memory, a crash in native code) is recorded with its exit code, while the other cells
go on. Children come from a forkserver that has already imported the simulator, so starting one
costs milliseconds, and they do not inherit the progress bar's thread (fork after threads can
deadlock). Each child writes its own ``cell.json``; the parent only reads it.
"""

from __future__ import annotations

import multiprocessing
import shutil
import signal
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from hpcsched.sweep.cell import Cell
from hpcsched.sweep.execute import execute
from hpcsched.sweep.store import cell_dir, failed_record, read_record, save_record

# imported once by the forkserver, so every cell's process starts with them loaded
PRELOAD = ["pandas", "hpcsched.sweep.local", "hpcsched.sim.runs", "hpcsched.metrics", "hpcsched.policies",
           "hpcsched.cluster_spec"]

Done = Callable[[dict[str, Any]], None]


def run_cell_here(cell: Cell, root: Path, out: Path) -> dict[str, Any]:
    """Run one cell in this process into its own folder and mark it (the body of every child)."""
    d = cell_dir(out, cell)
    if d.exists():
        shutil.rmtree(d)  # leftovers of an interrupted or failed attempt
    record = execute(cell, root, d)
    save_record(out, record)
    return record


def run_local(todo: list[Cell], root: Path, out: Path, workers: int, done: Done,
              timeout_s: float | None = None) -> None:
    """Run ``todo`` with at most ``workers`` cells at once, in the given order; ``done`` gets each record."""
    for cell in todo:
        cell_dir(out, cell).parent.mkdir(parents=True, exist_ok=True)
    if workers <= 1 and timeout_s is None:  # nothing to stop and nothing to overlap: stay in-process
        for cell in todo:
            done(run_cell_here(cell, root, out) | {"label": cell.label()})
        return
    ctx = multiprocessing.get_context("forkserver" if sys.platform.startswith("linux") else "spawn")
    if sys.platform.startswith("linux"):
        ctx.set_forkserver_preload(PRELOAD)
    queue = list(todo)
    running: dict[int, tuple[BaseProcess, Cell, float]] = {}  # by the process's sentinel
    try:
        while queue or running:
            while queue and len(running) < workers:
                cell = queue.pop(0)
                proc = ctx.Process(target=run_cell_here, args=(cell, root, out), name=f"cell-{cell.id}")
                proc.start()
                running[proc.sentinel] = (proc, cell, time.monotonic())
            limit = None
            if timeout_s is not None:
                limit = max(0.0, min(t0 for _, _, t0 in running.values()) + timeout_s - time.monotonic())
            for sentinel in wait(list(running), timeout=limit):
                proc, cell, t0 = running.pop(sentinel)  # type: ignore[call-overload]
                proc.join()
                done(_finished(proc, cell, out, time.monotonic() - t0) | {"label": cell.label()})
            if timeout_s is not None:
                now = time.monotonic()
                for sentinel, (proc, cell, t0) in list(running.items()):
                    if now - t0 >= timeout_s:
                        if proc.exitcode is not None:  # it finished just after wait(): keep what it wrote
                            del running[sentinel]
                            done(_finished(proc, cell, out, now - t0) | {"label": cell.label()})
                            continue
                        _stop(proc)
                        del running[sentinel]
                        rec = failed_record(cell, f"timed out: stopped after {timeout_s:g} s wall "
                                                  "(--cell-timeout); it runs again on resume", now - t0)
                        save_record(out, rec)
                        done(rec | {"label": cell.label()})
    except BaseException:  # Ctrl-C or a bug here: leave no cell running behind us
        for proc, _, _ in running.values():
            _stop(proc)
        raise


def _finished(proc: BaseProcess, cell: Cell, out: Path, wall_s: float) -> dict[str, Any]:
    """The record the child wrote, or a failed one naming how the child died."""
    rec = read_record(out, cell) if proc.exitcode == 0 else None
    if rec is not None:
        return rec
    code = proc.exitcode
    how = f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
    hint = " (out of memory?)" if code == -signal.SIGKILL else ""
    rec = failed_record(cell, f"worker died: {how}{hint}", wall_s)
    save_record(out, rec)
    return rec


def _stop(proc: BaseProcess) -> None:
    proc.kill()
    proc.join()
