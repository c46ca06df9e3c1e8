"""Run one cell: the only place the sweep touches the simulator and the replayer.

``execute(cell, root, workdir)`` writes the run's files (``jobs.csv``, ``meta.json``, ``timeline.csv``)
into ``workdir`` and returns the cell's record: parameters, status, wall time and the summary metrics
that become its row in the results table. It never raises for a failing cell: the error is recorded,
so one bad cell does not sink a 48-cell sweep.

Arrival scaling (``arrival_scale = f``): every job's submit time becomes ``t0 + f x (submit - t0)``
with ``t0`` the first submit, i.e. every inter-arrival time is multiplied by ``f``; ``f = 0.5`` offers
twice the load, ``f = 2`` half. Job lengths and sizes are unchanged.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from hpcsched.errors import InputError
from hpcsched.sweep.cell import Cell

RECORD_FILE = "cell.json"
TIMELINE_FILE = "timeline.csv"

T = TypeVar("T")


def scale_arrivals(jobs: Sequence[T], factor: float) -> list[T]:
    """Multiply every inter-arrival time by ``factor`` (submit times stretch around the first submit)."""
    if factor == 1.0 or not jobs:
        return list(jobs)
    t0 = min(j.submit for j in jobs)  # type: ignore[attr-defined]
    return [dataclasses.replace(j, submit=t0 + factor * (j.submit - t0)) for j in jobs]  # type: ignore[type-var]


def execute(cell: Cell, root: Path, workdir: Path) -> dict[str, Any]:
    """Run ``cell`` with input paths resolved against ``root``; its files go to ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    record: dict[str, Any] = {"id": cell.id, "kind": cell.kind, "params": dict(cell.params)}
    try:
        runner = _RUNNERS[cell.kind]
        metrics = runner(cell.params, root, workdir)
        record |= {"status": "ok", "metrics": metrics, "error": None}
    except InputError as e:
        record |= {"status": "failed", "metrics": {}, "error": str(e)}
    except Exception as e:  # noqa: BLE001 - a cell's crash is data for the report, not the sweep's end
        tb = traceback.format_exc(limit=6)
        record |= {"status": "failed", "metrics": {}, "error": f"{type(e).__name__}: {e}", "traceback": tb}
    record["wall_s"] = time.perf_counter() - t0
    record["cpu_s"] = time.process_time() - cpu0  # what the cell cost, whatever else loads the machine
    return record


def _path(root: Path, value: str | None) -> Path | None:
    return None if value is None else (root / value)


def _run_simulate(params: dict[str, Any], root: Path, workdir: Path) -> dict[str, Any]:
    from hpcsched.cluster_spec import read_cluster_spec
    from hpcsched.metrics import summarize
    from hpcsched.results import read_results
    from hpcsched.sim.runs import load_jobs, run_policy, write_run

    jobs, _anomalies = load_jobs(_path(root, params["trace"]))
    jobs = scale_arrivals(jobs, params["arrival_scale"])
    cluster = read_cluster_spec(_path(root, params["cluster"]))
    compat = None if params["compat"] == "default" else params["compat"]
    try:
        res = run_policy(jobs, cluster, params["policy"], compat, trace=str(params["trace"]))
    except KeyError as e:  # unknown policy name
        raise InputError(None, str(e.args[0]) if e.args else str(e)) from None
    res.meta |= {"arrival_scale": params["arrival_scale"], "seed": params["seed"]}
    write_run(workdir, res)
    df, meta = read_results(workdir)
    return summarize(df, meta) | {"events": res.events, "sim_wall_s": res.wall_s, "rejected": len(res.rejected)}


def _run_replay(params: dict[str, Any], root: Path, workdir: Path) -> dict[str, Any]:
    """``hpcsched replay``'s own code path (``run_replay``) with the cell's parameters and arrival scaling."""
    from hpcsched.harvest.replay import ReplayConfig
    from hpcsched.harvest.run import ReplayRequest, run_replay
    from hpcsched.metrics import summarize
    from hpcsched.milp import Objective
    from hpcsched.results import read_results

    try:
        config = ReplayConfig(tfwd=params["tfwd"], solver=params["solver"], objective=Objective(params["objective"]),
                              accounting=params["accounting"], max_jobs=params["max_jobs"],
                              time_limit=params["time_limit"])
    except ValueError as e:
        raise InputError(None, str(e)) from None
    request = ReplayRequest(_path(root, params["bounds"]), _path(root, params["curves"]),  # type: ignore[arg-type]
                            idle=_path(root, params["idle"]), log=_path(root, params["log"]), nodes=params["nodes"],
                            config=config)
    run = run_replay(request, workdir, prepare_jobs=lambda jobs: scale_arrivals(jobs, params["arrival_scale"]),
                     meta_extra={"arrival_scale": params["arrival_scale"], "seed": params["seed"]})
    s = dict(run.summary)
    df, meta_read = read_results(workdir)
    jct = {k: v for k, v in summarize(df, meta_read).items() if k not in s}
    return s | {"pool_nodes": len(run.timeline.nodes)} | {k: v for k, v in jct.items() if k != "jobs"}


_RUNNERS = {"simulate": _run_simulate, "replay": _run_replay}
