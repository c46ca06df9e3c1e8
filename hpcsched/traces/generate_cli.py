"""``hpcsched trace generate``: the seeded synthetic traces of the scale benchmarks, as a command.

Only typer is imported here; the generators (``hpcsched.traces.synth``) load when the command runs, so
``hpcsched --help`` stays fast.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

_DEFAULT_JOBS = {"cobalt": 22500, "philly": 150000}
_DEFAULT_NODES = {"cobalt": 49152, "swf": 160000}
_DEFAULT_LOAD = {"cobalt": 0.6, "swf": 0.6, "philly": 0.8}


T = TypeVar("T")


def _cluster_gpus(spec: str) -> int:
    """GPUs of a cluster given as ``nXgY`` (X nodes x Y GPUs) or as a cluster spec file."""
    m = re.fullmatch(r"n(\d+)g(\d+)", spec.strip().lower())
    if m:
        return int(m.group(1)) * int(m.group(2))
    from hpcsched.cluster_spec import read_cluster_spec

    return read_cluster_spec(spec).gpus


def generate_cmd(
    kind: str = typer.Argument(..., help="cobalt | swf | philly | gavel | blox."),
    seed: int = typer.Option(..., "--seed", help="Seed: the same seed writes the same bytes."),
    out: Path = typer.Option(..., "--out", help="Output file (.gz compresses, still byte-for-byte reproducible)."),
    jobs: int | None = typer.Option(None, "--jobs", help="Jobs (cobalt: 22,500; philly: 150,000)."),
    nodes: int | None = typer.Option(None, "--nodes", help="Machine nodes (cobalt: 49,152; swf: 160,000)."),
    days: float = typer.Option(365.0, "--days", help="swf: days of submits."),
    load: float | None = typer.Option(None, "--load", help="Offered load (cobalt, swf: 0.6 of node-s; philly: 0.8 "
                                                          "of GPU-s)."),
    cluster: str = typer.Option("n128g8", "--cluster", help="philly: cluster as nXgY or a cluster spec file."),
    max_days: float = typer.Option(60.0, "--max-days", help="philly: longest job, days."),
    start: int = typer.Option(1704067200, "--start", help="cobalt, swf: epoch of the first day (2024-01-01 UTC)."),
    cores_per_node: int = typer.Option(64, "--cores-per-node", help="cobalt: cpu_num per node (Theta: 64)."),
    rate: float = typer.Option(0.5, "--rate", help="gavel: arrivals, jobs per hour (Poisson)."),
    max_scale: int = typer.Option(8, "--max-scale", help="gavel: cap on GPUs per job (1, 2, 4 or 8)."),
    jobs_per_hour: float = typer.Option(6.0, "--jobs-per-hour", help="blox: arrivals, jobs per hour (Poisson)."),
    cluster_job_log: Path | None = typer.Option(
        None, "--cluster-job-log", help="blox: the Philly cluster_job_log Blox parsed, to reproduce its FIRST run's "
                                        "stream (no pickle cache yet); without it, every later run's stream."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """Write a seeded synthetic trace: a Cobalt log, a year-long SWF log or a Philly-like DL trace.

    cobalt: Theta-shaped jobs on a 49,152-node machine (Cobalt CSV, read by `trace inspect` / `replay --log`;
    name the file after a known machine, e.g. mira-synth.csv, or pass --machine-nodes when reading).

    swf: the same job mix for a year on a 160,000-node machine (SWF 2.2 with MaxNodes in the header).

    philly: 150,000 Philly-like jobs for cluster n128g8 with jobs up to 60 days, in the Muri CSV the simulator
    reads. Distributions and rules: docs/traces.md. Progress with ETA on stderr when it is a TTY.

    gavel: Gavel's own generator (hpcsched/hetero/workload.py), in its 10-field tab trace; seed 0, 120 jobs,
    --rate 0.5 writes Gavel's trace byte for byte. Default --jobs 120.

    blox: Blox's synthetic Philly-like stream (1-GPU jobs, Poisson arrivals at --jobs-per-hour), in the Tiresias
    CSV `job_id,num_gpu,submit_time,duration`; --seed 1 is Blox's stream byte for byte. Default --jobs 5000
    (a --window must finish before the trace ends).
    """
    kind = kind.lower()
    if kind == "blox":
        _generate_blox(out, seed, jobs if jobs is not None else 5000, jobs_per_hour, cluster_job_log, as_json)
        return
    if kind == "gavel":
        _generate_gavel(out, seed, jobs if jobs is not None else 120, rate, max_scale, as_json)
        return
    from hpcsched.traces.synth import KINDS, generate

    if kind not in KINDS:
        print(f"error: unknown kind {kind!r}; known: {', '.join(KINDS)}", file=sys.stderr)
        raise typer.Exit(2)
    options: dict[str, object] = {"load": load if load is not None else _DEFAULT_LOAD[kind]}
    if kind in ("cobalt", "philly"):
        options["jobs"] = jobs if jobs is not None else _DEFAULT_JOBS[kind]
    elif jobs is not None:
        print("error: swf is generated for --days, not a job count (drop --jobs)", file=sys.stderr)
        raise typer.Exit(2)
    if kind in ("cobalt", "swf"):
        options["nodes"] = nodes if nodes is not None else _DEFAULT_NODES[kind]
        options["start"] = start
    if kind == "cobalt":
        options["cores_per_node"] = cores_per_node
    if kind == "swf":
        options["days"] = days
    if kind == "philly":
        try:
            options["cluster_gpus"] = _cluster_gpus(cluster)
        except (OSError, ValueError) as e:
            print(f"error: --cluster {cluster}: {e}", file=sys.stderr)
            raise typer.Exit(2) from None
        options["max_days"] = max_days
    from hpcsched.progress import wanted

    progress = wanted(as_json, quiet)
    result = _written(out, lambda: generate(kind, out, seed, progress=progress, **options))
    _report(out, kind, seed, result.jobs, result.bytes, result.seconds, options, as_json)


def _generate_gavel(out: Path, seed: int, jobs: int, rate: float, max_scale: int, as_json: bool) -> None:
    """Gavel's workload: a separate generator because it reproduces Gavel's random-number sequence exactly."""
    import time

    from hpcsched.hetero.workload import generate, write_trace

    t0 = time.perf_counter()
    n_bytes = _written(out, lambda: write_trace(generate(jobs, rate, seed, max_scale=max_scale), out))
    _report(out, "gavel", seed, jobs, n_bytes, time.perf_counter() - t0, {"rate": rate, "max_scale": max_scale},
            as_json)


def _generate_blox(out: Path, seed: int, jobs: int, jobs_per_hour: float, log: Path | None, as_json: bool) -> None:
    """Blox's workload: its own random-number sequence, so its own generator (``hpcsched.traces.blox``)."""
    import time

    from hpcsched.errors import InputError
    from hpcsched.traces.blox import count_passing, generate, write_trace

    t0 = time.perf_counter()
    try:
        passing = count_passing(log) if log is not None else None
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    if passing is not None and passing < jobs:
        print(f"note: {log}: {passing} jobs pass Blox's filter, fewer than --jobs {jobs}: durations repeat "
              f"every {passing} jobs, as in Blox", file=sys.stderr)
    n_bytes = _written(out, lambda: write_trace(generate(jobs, jobs_per_hour, seed, passing), out))
    _report(out, "blox", seed, jobs, n_bytes, time.perf_counter() - t0,
            {"jobs_per_hour": jobs_per_hour, "cluster_job_log": str(log) if log else None,
             "passing_jobs": passing, "pickle_cache": log is None}, as_json)


def _written(out: Path, write: Callable[[], T]) -> T:
    """``write()``, with bad options and an unwritable ``out`` said on stderr (exit 2), as every kind does."""
    try:
        return write()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    except OSError as e:
        print(f"error: {out}: cannot write: {e.strerror or e}", file=sys.stderr)
        raise typer.Exit(2) from None


def _report(out: Path, kind: str, seed: int, jobs: int, n_bytes: int, seconds: float, options: dict[str, Any],
            as_json: bool) -> None:
    if as_json:
        print(json.dumps({"kind": kind, "seed": seed, "out": str(out), "jobs": jobs, "bytes": n_bytes,
                          "seconds": round(seconds, 3), "options": options}))
    else:
        print(f"{out}: {jobs:,} jobs, {n_bytes:,} bytes, {seconds:.1f} s (kind {kind}, seed {seed})")


def register(trace_app: typer.Typer) -> None:
    """Add ``generate`` to the ``trace`` group."""
    trace_app.command("generate")(generate_cmd)
