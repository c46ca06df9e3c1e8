"""``hpcsched slurm ...``: look at a live Slurm's harvestable pool, watch it change, harvest it."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from hpcsched.slurm.config import HarvestFile

# The harvester (the MILP allocator, yaml) and rich are imported inside the commands, so that `hpcsched --help`
# and the other commands do not pay for them.

slurm_app = typer.Typer(help="Harvest the nodes a live Slurm leaves idle (scripts/slurm_cluster.sh up for a test one).",
                        no_args_is_help=True)


def _need_slurm() -> None:
    from hpcsched.slurm import commands

    why = commands.available()
    if why:
        print(f"error: {why}", file=sys.stderr)
        raise typer.Exit(3)


@slurm_app.command("nodes")
def nodes(as_json: bool = typer.Option(False, "--json", help="One JSON object: nodes, pool, why_not.")) -> None:
    """Each node's Slurm state, whether it is harvestable now, and why not."""
    from rich.console import Console
    from rich.table import Table

    from hpcsched.slurm.source import SlurmIdleSource

    _need_slurm()
    snap = SlurmIdleSource().snapshot()
    if as_json:
        print(json.dumps({"nodes": {n: s.raw for n, s in snap.states.items()}, "pool": list(snap.pool),
                          "why_not": snap.why_not}))
        return
    t = Table(title=f"harvestable pool: {len(snap.pool)} of {len(snap.states)} nodes")
    for c in ("node", "state", "harvestable", "why not"):
        t.add_column(c)
    for n, s in snap.states.items():
        t.add_row(n, s.raw, "yes" if n in snap.pool else "no", snap.why_not.get(n, ""))
    Console().print(t)


@slurm_app.command("watch")
def watch(
    poll_s: float = typer.Option(0.5, "--poll", help="Seconds between polls."),
    duration: float = typer.Option(0.0, "--for", help="Stop after this many seconds (0: until Ctrl-C)."),
) -> None:
    """Print one JSON line per pool change: {"t", "joined", "left", "reasons"} (the replayer's events)."""
    from hpcsched.slurm.source import SlurmIdleSource

    _need_slurm()
    src = SlurmIdleSource()
    end = time.monotonic() + duration if duration > 0 else float("inf")
    while time.monotonic() < end:
        ev = src.poll()
        if ev is not None:
            print(json.dumps({"t": round(ev.time, 3), "joined": list(ev.joined), "left": list(ev.left),
                              "reasons": src.reasons, "pool": list(src.pool)}), flush=True)
        time.sleep(poll_s)


@slurm_app.command("harvest")
def harvest(
    config: Path = typer.Argument(..., help="Harvest config (YAML; see hpcsched/slurm/config.py)."),
    out: Path = typer.Option(Path("out/slurm-harvest"), "--out", help="Writes events.csv, jobs.csv, meta.json."),
    timeout: float = typer.Option(3600.0, "--timeout", help="Stop (checkpointing every job) after this many s."),
    as_json: bool = typer.Option(False, "--json", help="Print meta.json's summary as JSON at the end."),
) -> None:
    """Run the config's elastic jobs on idle Slurm nodes until they finish; `hpcsched calc OUT` reports it.

    Mode controller (the default): the runtime's controller runs in this process with node_source slurm: pilot
    jobs in the partition run `hpcsched worker`, the controller sizes the jobs (MILP) and its workers launch them;
    Slurm preempts pilots for batch work (SIGTERM -> checkpoint), the jobs shrink, then grow back.
    Mode scavenger: each run is an sbatch job in the preemptible partition; Slurm preempts it for batch
    work (SIGTERM -> checkpoint) and the harvester restarts it smaller, then grows it back.
    Mode local: own processes on idle nodes, vacated (SIGTERM) when Slurm allocates their node.
    """
    from rich.console import Console

    from hpcsched.slurm.config import read_harvest_config

    hf = read_harvest_config(config)
    _need_slurm()
    if hf.mode == "controller":
        _harvest_with_controller(hf, config, out, timeout, as_json)
        return
    from hpcsched.slurm.executors import LocalExecutor, ScavengerExecutor
    from hpcsched.slurm.harvester import Harvester
    from hpcsched.slurm.record import Recorder
    from hpcsched.slurm.source import SlurmIdleSource

    executor = (ScavengerExecutor(hf.partition, out / "logs") if hf.mode == "scavenger"
                else LocalExecutor(out / "logs"))
    h = Harvester(SlurmIdleSource(), executor, hf.specs, Recorder(out), hf.config)
    err = Console(stderr=True)
    signal.signal(signal.SIGTERM, _interrupt)  # killed politely: checkpoint and stop the runs, like Ctrl-C
    try:
        with err.status("harvesting") as status:
            def show(hv: Harvester) -> None:
                runs = ", ".join(f"{j}:{len(r.nodes)}n" for j, r in hv.runs.items()) or "none"
                status.update(f"pool {len(hv.source.pool)} nodes | running {runs} | "
                              f"finished {len(hv.finished)}/{len(hv.specs)}")

            h.run(timeout, on_step=show)
    except KeyboardInterrupt:
        err.print("interrupted: runs were checkpointed and stopped")
    finally:
        d = h.write({"config": str(config)})
    meta = json.loads((d / "meta.json").read_text())
    keys = ("harvested_node_hours", "preemptions", "max_lost_steps", "capacity_node_seconds", "nonoptimal_decisions")
    summary = {k: meta[k] for k in keys} | {"finished": len(h.finished), "out": str(d)}
    if summary["nonoptimal_decisions"]:
        err.print(f"[yellow]warning:[/] {summary['nonoptimal_decisions']} allocator decisions were not optimal "
                  f"({meta['nonoptimal_by_status']}): see the decision rows of events.csv")
    if as_json:
        print(json.dumps(summary))
    else:
        Console().print(summary)
    if not h.done:
        raise typer.Exit(1)


SUMMARY_KEYS = ("harvested_node_hours", "preemptions", "max_lost_steps", "capacity_node_seconds",
                "nonoptimal_decisions")


def _harvest_with_controller(hf: HarvestFile, config: Path, out: Path, timeout: float, as_json: bool) -> None:
    """Mode controller (``controller_mode``): the same progress line, summary and exit codes as the other modes."""
    from rich.console import Console

    from hpcsched.slurm.controller_mode import ControllerHarvest

    h = ControllerHarvest(hf, out)
    err = Console(stderr=True)
    signal.signal(signal.SIGTERM, _interrupt)  # killed politely: the controller stops, its pilots are cancelled
    began = time.monotonic()
    try:
        with err.status("starting the controller") as status:
            address = h.start()
            err.print(f"controller at {address} (log {out / 'controller.log'}); jobs "
                      + ", ".join(f"{v.id}={v.job_id}" for v in h.jobs.values()))
            if h.duplicates:
                err.print(f"[yellow]resumed:[/] {', '.join(h.duplicates)} were submitted by an earlier run on {out}: "
                          "their jobs continue (from their checkpoints), not submitted again")

            def show(hv: ControllerHarvest) -> None:
                parts = []
                for v in hv.jobs.values():
                    eta = ""
                    if v.state == "running" and v.started and v.steps_done:
                        rate = v.steps_done / max(1e-9, time.time() - v.started)
                        eta = f" ETA {(v.steps - v.steps_done) / rate:.0f}s" if rate > 0 else ""
                    parts.append(f"{v.id}: {v.state} {v.procs}p {v.steps_done}/{v.steps}{eta}")
                status.update(f"{time.monotonic() - began:.0f}s | pool {len(hv.source.pool)} nodes | "
                              + " | ".join(parts) + f" | finished {len(hv.finished)}/{len(hv.jobs)}")

            h.run(timeout, hf.config.poll_s, on_step=show)
    except KeyboardInterrupt:
        err.print("interrupted: the controller stops and cancels its pilots (their tasks checkpoint)")
    finally:
        h.stop()  # run() stopped it already unless start() failed or was interrupted
        d = h.write({"config": str(config)})
    meta = json.loads((d / "meta.json").read_text())
    summary = {k: meta[k] for k in SUMMARY_KEYS} | {"finished": len(h.finished), "out": str(d)}
    bad = {v.id: v.state for v in h.jobs.values() if v.state not in ("completed",)}
    if meta["failed_attempts"]:
        err.print(f"[yellow]warning:[/] {meta['failed_attempts']} failed attempts (restarted from their checkpoints): "
                  "see the failed rows of events.csv and the controller log")
    if summary["nonoptimal_decisions"]:
        err.print(f"[yellow]warning:[/] {summary['nonoptimal_decisions']} scheduling steps sized jobs with a MILP "
                  f"answer that was not optimal ({meta['nonoptimal_by_status']}): see the controller log")
    if bad:
        err.print(f"[yellow]not completed:[/] {bad}")
    if as_json:
        print(json.dumps(summary))
    else:
        Console().print(summary)
    if bad:
        raise typer.Exit(1)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def register(app: typer.Typer) -> None:
    app.add_typer(slurm_app, name="slurm")

