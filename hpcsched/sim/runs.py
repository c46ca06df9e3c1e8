"""Load a trace for simulation, run it, and write what a run leaves behind.

Shared by ``hpcsched simulate`` and ``hpcsched compare`` (and by sweeps): turns every reason a trace
cannot be simulated into an ``InputError`` naming the file and line, and writes the results schema
(``jobs.csv`` + ``meta.json``) plus ``timeline.csv``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from hpcsched.model import ClusterSpec, Job
from hpcsched.results import write_csv, write_results
from hpcsched.sim.engine import TIMELINE_COLUMNS, SimResult, simulate
from hpcsched.sim.jobrun import iterations_of
from hpcsched.sim.trace_jobs import load_checked_jobs

if TYPE_CHECKING:
    from hpcsched.sim.core_decisions import AsController

TIMELINE_FILE = "timeline.csv"
DECISIONS_FILE = "decisions.jsonl"


def load_jobs(path: str | Path, fmt: str | None = None) -> tuple[list[Job], dict[str, int]]:
    """Jobs of a DL trace, checked for what the simulator needs; also the reader's anomaly counts."""
    return load_checked_jobs(path, iterations_of, fmt)


def run_policy(
    jobs: list[Job],
    cluster: ClusterSpec,
    policy: str,
    compat: str | None,
    trace: str,
    progress: Callable[[int, int], None] | None = None,
    restart_s: float | None = None,
    as_controller: AsController | None = None,
    slowdown: float | None = None,
) -> SimResult:
    """``simulate`` with a policy name, turning an unknown name into a clear error.

    The name is looked up on its own (``get_policy``: "unknown policy ...; known: ...", or why a registered one
    cannot run here) before the run, so that a KeyError from inside the simulation is never taken for a bad
    name; and not by listing every name, which would load every policy module (start-up time: a registry that loads
    only the module of the name asked for keeps `hpcsched simulate --policy srsf` off numpy and rustworkx).
    """
    from hpcsched.policies import get_policy

    get_policy(policy)
    return simulate(jobs, cluster, policy, compat, progress=progress, trace=trace, restart_s=restart_s,
                    as_controller=as_controller, slowdown=slowdown)


def write_run(out_dir: str | Path, result: SimResult) -> Path:
    """jobs.csv + meta.json (the schema ``hpcsched calc`` reads), timeline.csv, and decisions.jsonl for a run
    that decided as the controller does.

    Without pandas (``write_csv``: the bytes its ``to_csv`` wrote), so that writing a run costs no import.
    """
    out = write_results(out_dir, result.results, result.meta | {"wall_s": round(result.wall_s, 4)})
    write_csv(out / TIMELINE_FILE, TIMELINE_COLUMNS, result.timeline_rows(), all_float=True)
    if result.decisions:  # runs that decided as the controller: each start and stop, as its event log has them
        with open(out / DECISIONS_FILE, "w") as f:
            f.writelines(json.dumps(asdict(d)) + "\n" for d in result.decisions)
    return out
