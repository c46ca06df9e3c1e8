"""``hpcsched slurm ...``: look at a live Slurm's harvestable pool, watch it change, harvest it."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import typer

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

    Mode scavenger: each run is an sbatch job in the preemptible partition; Slurm preempts it for batch
    work (SIGTERM -> checkpoint) and the harvester restarts it smaller, then grows it back.
    Mode local: own processes on idle nodes, vacated (SIGTERM) when Slurm allocates their node.
    """
    from rich.console import Console

    from hpcsched.slurm.config import read_harvest_config
    from hpcsched.slurm.executors import LocalExecutor, ScavengerExecutor
    from hpcsched.slurm.harvester import Harvester
    from hpcsched.slurm.record import Recorder
    from hpcsched.slurm.source import SlurmIdleSource

    hf = read_harvest_config(config)
    _need_slurm()
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


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def register(app: typer.Typer) -> None:
    app.add_typer(slurm_app, name="slurm")

