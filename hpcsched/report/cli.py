"""``hpcsched report DIR``: turn a sweep directory into README.md + PNG plots."""

from __future__ import annotations

import sys
from pathlib import Path

import typer


def report(
    sweep_dir: Path = typer.Argument(..., help="A directory written by `hpcsched sweep`."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Report folder (default: SWEEP_DIR/report)."),
    baseline: str | None = typer.Option(None, "--baseline", help="Policy the bars are normalised to "
                                        "(default: the config's report.baseline, else the first policy)."),
) -> None:
    """Write a Markdown summary and PNG plots: JCT CDFs per trace, avg/p99 JCT and makespan bars
    normalised to a baseline policy (Muri's Figures 9-10 layout), utilisation over time, and
    harvested node-hours / utilisation vs Tfwd for replays. The numbers behind each plot are
    printed as tables too, and results.csv is copied beside them.
    """
    from rich.console import Console

    from hpcsched.report.build import make_report  # matplotlib: loaded only when a report is made

    command = ["hpcsched", "report", *sys.argv[2:]] if len(sys.argv) > 1 and sys.argv[1] == "report" else None
    readme = make_report(sweep_dir, out, baseline, command)
    Console(stderr=True).print(f"report written to {readme}")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
