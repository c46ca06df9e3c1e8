"""Run a sweep's cells as Ray tasks: the same cells and records as the local pool, on any Ray cluster.

Workers need hpcsched installed but NOT the input files or a shared file system: the driver puts each
distinct input file in Ray's object store once, a task writes the files it needs into a private
temporary folder, runs the cell there and returns its record together with the files it wrote, which
the driver stores under ``OUT/cells/<id>/`` exactly as the local runner does. Resume therefore works
the same whichever runner finished a cell.

``address``: ``local`` starts a private Ray instance on this machine; anything else (``auto``,
``HOST:PORT``, ``ray://HOST:PORT``) is passed to ``ray.init``. If Ray is already initialised in this
process (a test, a notebook) that instance is used and left running.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from hpcsched.errors import InputError
from hpcsched.sweep.cell import PATH_PARAMS, Cell
from hpcsched.sweep.execute import execute
from hpcsched.sweep.store import cell_dir, save_record


def _staged_name(value: str) -> str:
    """Where an input path lands inside a task's folder: relative paths keep their shape."""
    p = PurePosixPath(value)
    return "/".join(part for part in p.parts if part not in ("/", "..", "."))


def _ray_cell(cell: Cell, inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A Ray task: stage inputs, run the cell, return (record, {file name: content})."""
    import ray

    with tempfile.TemporaryDirectory(prefix=f"hpcsched-{cell.id}-") as tmp:
        root = Path(tmp) / "inputs"
        params = dict(cell.params)
        for name in PATH_PARAMS[cell.kind]:
            if params.get(name) is None:
                continue
            staged = _staged_name(params[name])
            target = root / staged
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(ray.get(inputs[params[name]]))
            params[name] = staged
        staged_cell = Cell(cell.id, cell.kind, params)
        run_dir = Path(tmp) / "run"
        record = execute(staged_cell, root, run_dir)
        record["params"] = dict(cell.params)  # report the cell as configured, not as staged
        files = {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file()}
    return record, files


def run_on_ray(todo: list[Cell], root: Path, out: Path, address: str,
               done: Callable[[dict[str, Any]], None]) -> None:
    """Run ``todo`` on Ray, storing each finished cell under ``out`` and reporting it to ``done``."""
    try:
        import ray
    except ImportError:
        raise InputError(None, "--ray needs the 'ray' extra: pip install -e '.[ray]'") from None
    started_here = False
    if not ray.is_initialized():
        try:
            if address == "local":
                ray.init(include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise InputError(None, f"cannot connect to Ray at {address!r}: {e}") from None
        started_here = True
    try:
        refs: dict[str, Any] = {}
        for cell in todo:
            for name in PATH_PARAMS[cell.kind]:
                v = cell.params.get(name)
                if v is not None and v not in refs:
                    refs[v] = ray.put((root / v).read_bytes())
        task = ray.remote(num_cpus=1, max_retries=1)(_ray_cell)
        pending = {
            task.remote(c, {v: refs[v] for n in PATH_PARAMS[c.kind] if (v := c.params.get(n)) is not None}): c
            for c in todo
        }
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                cell = pending.pop(ref)
                try:
                    record, files = ray.get(ref)
                except ray.exceptions.RayError as e:  # the worker died: record it, retry on resume
                    record = {"id": cell.id, "kind": cell.kind, "params": dict(cell.params), "status": "failed",
                              "metrics": {}, "error": f"ray: {type(e).__name__}: {e}", "wall_s": None}
                    files = {}
                d = cell_dir(out, cell)
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir(parents=True, exist_ok=True)
                for name, blob in files.items():
                    (d / name).write_bytes(blob)
                save_record(out, record)
                done(record | {"label": cell.label()})
    finally:
        if started_here:
            ray.shutdown()
