"""``hpcsched testbed``: replay a DL trace through the real runtime, then hold two simulations to it.

    hpcsched testbed --trace trace-data/muri/cluster_trace.csv --cluster SPEC --policy fifo \\
        --local --jobs 12 --out out/testbed
    hpcsched testbed --compare out/testbed/sim-measured out/testbed

``--local`` starts a controller and one worker per node of the cluster spec on this machine (slots = GPUs
per node); ``--controller HOST:PORT`` uses a running one instead (give ``--state`` to read what it
measured, and run it with the same policy). ``--fast-forward N`` trains N real steps per job between skips
of steady training (``hpcsched.testbed.fastforward``), so long jobs fit in minutes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hpcsched.errors import InputError

if TYPE_CHECKING:  # rich is imported inside the command, so that `hpcsched --help` does not pay for it
    from rich.console import Console


def testbed_cmd(
    trace: Path = typer.Option(None, "--trace", help="DL trace to replay (Muri/Tiresias CSV or any DL trace reader)."),
    cluster: Path = typer.Option(None, "--cluster", help="Cluster spec: workers = nodes, slots = GPUs per node."),
    policy: str = typer.Option("fifo", "--policy", help="Policy of the controller and of both simulations."),
    controller: str = typer.Option(None, "--controller", help="Running controller HOST:PORT (or use --local)."),
    local: bool = typer.Option(False, "--local", help="Start a controller and workers here for the run."),
    state: Path = typer.Option(None, "--state", help="The controller's state file (measurements); --local knows it."),
    token_file: Path = typer.Option(None, "--token-file", help="Token for --controller (else $HPCSCHED_TOKEN)."),
    out: Path = typer.Option(None, "--out", help="Run folder: jobs.csv (real), sim-trace/, sim-measured/, profile/."),
    time_scale: str = typer.Option("auto", "--time-scale", help="Trace seconds per real second, or 'auto'."),
    jobs: int = typer.Option(12, "--jobs", help="How many jobs of the trace to replay (in submit order)."),
    skip: int = typer.Option(0, "--skip", help="Jobs of the trace to skip before the replayed ones."),
    min_steps: int = typer.Option(40, "--min-steps", help="Fewest real steps of a job (short jobs are lengthened)."),
    max_steps: int = typer.Option(400, "--max-steps", help="Most real steps of a job (long jobs are shortened)."),
    max_procs: int = typer.Option(1, "--max-procs", help="Most processes of one job (trace GPUs are capped)."),
    timeout: float = typer.Option(1800, "--timeout", help="Real seconds before unfinished jobs are cancelled."),
    profiles_from: Path = typer.Option(None, "--profiles-from",
                                       help="An earlier testbed run: also predict this one from its profiles."),
    fast_forward: int = typer.Option(
        0, "--fast-forward", metavar="N",
        help="Train N real steps per job, then skip ahead at each job's measured pace (0: off). A skip waits "
             "until every training job has done its N steps and none is stopping or finishing; submissions, "
             "start-ups, preemptions and finishes stay real (a job starting during a skip is credited the "
             "time later). Use it for long jobs (raise --min-steps/--max-steps) to fit a long trace in minutes."),
    max_jump: float = typer.Option(30.0, "--max-jump",
                                   help="Fast-forward: most real-equivalent seconds one skip covers."),
    checkpoint_root: Path = typer.Option(None, "--checkpoint-root",
                                         help="Fast-forward with --controller: the controller's checkpoint root."),
    launcher: str = typer.Option("torchrun", "--launcher",
                                 help="How workers start each job: torchrun, or direct (no torchrun agent: "
                                      "one process importing torch fewer per job, a shorter start-up)."),
    probes: int = typer.Option(3, "--probes", help="Start-up probe samples (median) taken before the first job; "
                               "--profiles-from scales the learned start-up by the ratio of two runs' probes."),
    declare_profiles: bool = typer.Option(
        True, "--declare-profiles/--no-declare-profiles",
        help="Job files declare the trace's stage profile (at the workload's real pace), so muri-s/muri-l group "
             "jobs from submission (group members take turns per stage) instead of only once each has run; the "
             "simulations show the policy the same declared profiles. --no-declare-profiles: the controller "
             "learns every profile from the job's own reports (few groups form)."),
    reanalyse: Path = typer.Option(None, "--reanalyse", help="A finished run folder: simulate and compare again."),
    compare: tuple[Path, Path] | None = typer.Option(None, "--compare", help="SIM_DIR REAL_DIR: print the table."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison(s) as JSON."),
) -> None:
    """Replay a trace through the real controller and workers; compare with the simulator."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from hpcsched.testbed.compare import compare_runs, render_tables

    console = Console(width=120)
    if compare:
        res = compare_runs(compare[0], compare[1])
        if as_json:
            print(json.dumps(res, default=str))
        else:
            render_tables(res, f"{compare[0]} vs {compare[1]}", console)
        return
    if reanalyse is not None:
        from hpcsched.testbed.run import reanalyse as again

        _report(again(reanalyse, profiles_from), reanalyse, as_json, console)
        return
    missing = [n for n, v in (("--trace", trace), ("--cluster", cluster), ("--out", out)) if v is None]
    if missing:
        raise InputError(None, f"testbed needs {', '.join(missing)} (or --compare SIM_DIR REAL_DIR)")
    if local == bool(controller):
        raise InputError(None, "give exactly one of --local or --controller HOST:PORT")
    from hpcsched.testbed.run import RunOptions, run_testbed

    opts = RunOptions(trace=trace, cluster=cluster, policy=policy, out=out, jobs=jobs, skip=skip,
                      min_steps=min_steps, max_steps=max_steps, max_procs=max_procs, timeout_s=timeout,
                      controller=controller, state=state, token_file=token_file, time_scale=time_scale,
                      profiles_from=profiles_from, fast_forward=fast_forward, max_jump_s=max_jump,
                      checkpoint_root=checkpoint_root, launcher=launcher, probes=probes,
                      declare_profiles=declare_profiles)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("testbed: jobs done", total=jobs)
        results = run_testbed(opts, lambda d, n: bar.update(task, completed=d, total=n),
                              lambda msg: bar.console.print(msg))
    _report(results, out, as_json, console)


def _report(results: dict, out: Path, as_json: bool, console: Console) -> None:
    from hpcsched.testbed.compare import render_markdown, render_tables
    from hpcsched.testbed.plot import plot_comparison

    names = list(results)
    (out / "comparison.md").write_text(render_markdown([results[n] for n in names], names))
    (out / "comparison.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    plot_comparison(results, out / "comparison.png")
    if as_json:
        print(json.dumps(results, default=str))
        return
    for n in names:
        render_tables(results[n], f"{n} vs real", console)
    print(f"results in {out} (real jobs.csv, {', '.join(names)}, profile/, comparison.md, comparison.png)",
          file=sys.stderr)


def register(app: typer.Typer) -> None:
    app.command("testbed")(testbed_cmd)
