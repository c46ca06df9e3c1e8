"""``hpcsched sweep CONFIG.yaml --out DIR``: run a grid of experiments, resumably, locally or on Ray."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import typer

# The sweep machinery (yaml, pandas, process pools) and rich are imported inside `sweep`, so that
# `hpcsched --help` and the other commands do not pay for them.


def sweep(
    config: Path = typer.Argument(..., help="Sweep config (YAML); see sweeps/*.yaml for examples."),
    out: Path = typer.Option(..., "--out", "-o", help="Sweep directory: cells/, results.csv, sweep.json."),
    workers: int = typer.Option(0, "--workers", "-j", help="Local processes (0: one per core)."),
    ray: str | None = typer.Option(None, "--ray", metavar="ADDRESS",
                                   help="Run the cells on a Ray cluster (auto, HOST:PORT, ray://HOST:PORT, "
                                        "or 'local' for a private instance). Needs the 'ray' extra."),
    fresh: bool = typer.Option(False, "--fresh", help="Redo every cell instead of resuming."),
    cell_timeout: float | None = typer.Option(None, "--cell-timeout", metavar="SECONDS", min=1,
                                              help="Stop a local cell after this many wall seconds and record it "
                                                   "as failed (it runs again on resume). Default: no limit."),
    only: list[str] = typer.Option([], "--only", metavar="KEY=VALUE",
                                   help="Run only matching unfinished cells now, e.g. --only trace=trace3 "
                                        "--only compat=muri (repeat a key for alternatives)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the cells (id, kind, parameters) and stop."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as one JSON object on stdout."),
) -> None:
    """Run every cell of a declarative grid (policies x traces x clusters x loads x seeds x compat, or
    replay parameters such as Tfwd and solver) and write one tidy table with a row per cell.

    A sweep resumes: cells already finished in DIR (same parameters, same id) are skipped, so an
    interrupted sweep is continued by running the same command again. Then `hpcsched report DIR`.

    A cell that fails (bad input, a crash, killed, over --cell-timeout) is recorded with its error in
    results.csv and the report while the other cells go on; the exit status is then 1, and the next
    run retries only the failed cells. The bar on stderr shows cells done, elapsed time and ETA.

    arrival_scale multiplies every inter-arrival time (0.5 = twice the load).
    """
    from rich.console import Console
    from rich.table import Table

    from hpcsched.sweep.cell import cell_filter
    from hpcsched.sweep.config import load_config
    from hpcsched.sweep.runner import run_sweep

    cfg = load_config(config)
    try:
        selected = cell_filter(only) if only else None
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--only") from None
    if selected is not None and not any(selected(c) for c in cfg.cells):
        raise typer.BadParameter(f"no cell of {config} matches {' '.join(only)}", param_hint="--only")
    if dry_run:
        if as_json:
            print(json.dumps([{"id": c.id, "kind": c.kind, **c.params} for c in cfg.cells
                              if selected is None or selected(c)]))
            return
        table = Table(title=f"sweep {cfg.name}: {len(cfg.cells)} cells")
        table.add_column("id")
        table.add_column("kind")
        table.add_column("cell")
        for c in cfg.cells:
            if selected is None or selected(c):
                table.add_row(c.id, c.kind, c.label())
        Console().print(table)
        return
    command = ["hpcsched", "sweep", *sys.argv[2:]] if len(sys.argv) > 1 and sys.argv[1] == "sweep" else None
    outcome = run_sweep(cfg, out, workers=workers or None, ray_address=ray, fresh=fresh,
                        progress=not as_json or sys.stderr.isatty(), command=command, only=selected,
                        timeout_s=cell_timeout)
    if as_json:
        print(json.dumps(outcome.as_json()))
    else:
        console = Console(stderr=True)
        console.print(f"{outcome.cells} cells: ran {outcome.ran}, skipped {outcome.skipped} already finished, "
                      f"{len(outcome.failed)} failed, {outcome.wall_s:.1f} s")
        for f in outcome.failed:
            console.print(f"[red]failed[/red] {f['id']}: {f['error']}")
        console.print(f"results: {', '.join(str(t) for t in outcome.tables)}")
        console.print(f"next: hpcsched report {shlex.quote(str(out))}")
    if outcome.failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
