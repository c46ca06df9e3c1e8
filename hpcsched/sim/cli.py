"""``hpcsched simulate`` (one policy) and ``hpcsched compare`` (several, with a table and a JCT CDF)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import typer

from hpcsched.progress import progress_bar, wanted

# The simulator, metrics and rich are imported inside the commands, so that `hpcsched --help` and the other
# commands do not pay for them; `simulate` does not import pandas at all (summarize_results), `compare` does (its plot).

_BAR_MIN_JOBS = 2000  # smaller traces finish before a bar would be readable

TRACE_OPT = typer.Option(..., "--trace", help="DL job trace (Muri/Tiresias CSV, Philly CSV, ...).")
CLUSTER_OPT = typer.Option(..., "--cluster", help="Cluster spec: Muri CSV (cluster_spec/n8g8.csv) or YAML.")
COMPAT_OPT = typer.Option(
    None, "--compat", help="'muri': reproduce the reference simulator's accounting (published numbers); 'gavel': "
                           "Gavel's policies and round mechanism on a type=count cluster (docs/hetero.md); 'blox': "
                           "Blox's round loop and its fifo/srtf/optimus/las/tiresias (docs/simulator.md); 'pollux': "
                           "the Pollux artifact's loop: tiresias/optimus/pollux on its workload CSV; 'sia': the Sia "
                           "artifact's simulator, --policy sia|gavel on a GPU-type cluster spec (docs/sia.md)."
)


def _fail_policy(e: KeyError) -> None:
    print(f"error: {e.args[0]}", file=sys.stderr)
    raise typer.Exit(2)


def _check_compat(compat: str | None) -> None:
    from hpcsched.compat import MODES as COMPAT_MODES

    if compat is not None and compat not in COMPAT_MODES:
        print(f"error: unknown --compat {compat!r}; known: {', '.join(COMPAT_MODES)}", file=sys.stderr)
        raise typer.Exit(2)


def simulate_cmd(
    trace: Path = TRACE_OPT,
    cluster: Path = CLUSTER_OPT,
    policy: str = typer.Option(..., "--policy", help="Policy name (fifo, srtf, srsf, las, tiresias, themis, ...)."),
    out: Path | None = typer.Option(None, "--out", help="Result directory: jobs.csv, meta.json, timeline.csv "
                                    "(required but with --compat gavel)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON (keys as `hpcsched calc --json`)."),
    compat: str | None = COMPAT_OPT,
    restart_s: float | None = typer.Option(
        None, "--restart-s", min=0.0, metavar="SECONDS",
        help="Every job's restart cost (paid as wall time at each start, first included) instead of the "
             "per-model table: a measured start-up + tear-down per launch, e.g. a testbed run's median from "
             "profile/overheads.csv x its time scale (a testbed simulation's meta.json has it as restart_s). "
             "Ignored with --compat (the reference's table)."),
    as_controller: bool = typer.Option(
        False, "--as-controller",
        help="Decide as the runtime's controller does (the shared decision core): it knows a job's length and "
             "profile only once the job has run, never moves running jobs to form groups, and keeps an attempt "
             "for --min-runtime-s. What `hpcsched controller` would do with this policy; each start and stop is "
             "written to decisions.jsonl. Not with --compat."),
    min_runtime_s: float = typer.Option(
        10.0, "--min-runtime-s", min=0.0, metavar="SECONDS",
        help="With --as-controller: the controller's hysteresis (its config's min_runtime_s; 10 by default), "
             "in trace seconds."),
    admission: str = typer.Option(
        "accept-all", "--admission",
        help="With --as-controller: which new jobs the policy sees at all (hpcsched.admission): accept-all, or "
             "load-based (oldest first while the admitted jobs ask at most --load-threshold x the GPUs)."),
    load_threshold: float = typer.Option(1.0, "--load-threshold", min=0.0,
                                         help="With --admission load-based: the admitted load, x the GPUs."),
    solver: str = typer.Option(
        "auto", "--solver",
        help="With --compat gavel: the LP solver: auto (default: ecos when the cvxpy extra is installed, else highs "
             "with a note), ecos (Gavel's own programs and solver, ECOS 2.0.14 from the cvxpy extra, GPL-3: its "
             "allocations, so its figures, are Gavel's) or highs (docs/hetero.md)."),
    placement: str = typer.Option(
        "consolidated", "--placement",
        help="With --as-controller: where a job's GPUs go (hpcsched.placements): consolidated (fewest nodes, "
             "first fit), spread (one at a time on the node with most free), resource-aware (only GPUs whose "
             "node has the CPUs and memory to feed them), throughput-aware (the GPU type fastest for the job's "
             "model; the simulated nodes have no type, so here it places as consolidated)."),
    slowdown_factor: float | None = typer.Option(
        None, "--slowdown-factor", metavar="FACTOR",
        help="A solo job's iteration period over its profiled iteration time (default 1.015, the speed model's "
             "1.5% step overhead; 1.0 turns it off). Default mode only; meta.json says the value used, with "
             "restart_cost (the per-model table, or --restart-s; --restart-s 0 turns restarts off)."),
    window: str | None = typer.Option(
        None, "--window", metavar="A-B",
        help="Figures over the jobs with ids A..B only (Blox's --start/--stop-id-track). --compat blox stops when "
             "they are all done; other modes run the whole trace (the window's figures are the same)."),
    round_s: float = typer.Option(300.0, "--round-s", min=1e-9, help="With --compat blox: the round, seconds."),
    profiles: Path | None = typer.Option(
        None, "--profiles", metavar="DIR",
        help="With --compat sia: the Sia artifact's profiles (its sia-simulator/traces directory, not shipped)."),
    blox_optimus_load: float | None = typer.Option(
        None, "--blox-optimus-load", metavar="JOBS_PER_HOUR",
        help="With --compat blox --policy optimus: reproduce Blox's bug of looking its speed-up table up by the "
             "experiment's load (1-9 jobs/h: 5, 3, 1.4, 1.2, 1.1, then 1.0). Without it: no speed-up."),
    seed: int = typer.Option(0, "--seed", help="With --compat pollux|sia --policy pollux: the optimiser's seed."),
    pollux_optimiser: str | None = typer.Option(
        None, "--pollux-optimiser",
        help="With --compat pollux|sia --policy pollux: ga (our seeded NSGA-II-like search of Pollux's objective, "
             "the artifact's population 100 x 100 generations), ga:POPxGEN (a smaller search, e.g. ga:50x25) or "
             "ga-stall:K (100 x at most 100 generations, a round's search ending once its choice has not "
             "improved for K generations). Default: ga-stall:20 with --compat pollux (the authors' mean within "
             "0.4 %, ~2.4x cheaper than ga), ga with --compat sia. meta.json says which ran."),
) -> None:
    """Simulate one policy on a DL trace; write per-job results and the cluster timeline.

    Example: hpcsched simulate --trace trace-data/muri/trace3.csv --cluster cluster_spec/n8g8.csv
    --policy srsf --out out/srsf --compat muri
    """
    _check_compat(compat)
    if compat not in ("pollux", "sia") and (seed != 0 or pollux_optimiser is not None):
        raise typer.BadParameter("only with --compat pollux or sia", param_hint="--seed/--pollux-optimiser")
    if compat == "pollux":
        _simulate_pollux(trace, cluster, policy, out, as_json, seed, pollux_optimiser)
        return
    win = _window(window)
    if compat == "sia":
        from hpcsched.sia.simulate import simulate_command as sia_command

        if win is not None or as_controller or restart_s is not None:
            raise typer.BadParameter("not with --compat sia (the Sia artifact's own loop)", param_hint="--compat")
        code = sia_command(trace, cluster, policy, out, as_json, profiles, solver, seed, pollux_optimiser or "ga")
        if code:
            raise typer.Exit(code)
        return
    if profiles is not None:
        raise typer.BadParameter("only with --compat sia", param_hint="--profiles")
    if compat != "blox" and (round_s != 300.0 or blox_optimus_load is not None):
        raise typer.BadParameter("only with --compat blox", param_hint="--round-s/--blox-optimus-load")
    if compat == "blox":
        if out is None:
            raise typer.BadParameter("required", param_hint="--out")
        if as_controller or restart_s is not None or solver != "auto":
            raise typer.BadParameter("--compat blox runs Blox's own loop (no restart cost, no controller, no LP)",
                                     param_hint="--compat")
        _simulate_blox(trace, cluster, policy, out, as_json, win, round_s, blox_optimus_load)
        return
    if compat == "gavel" or ("=" in str(cluster) and "/" not in str(cluster)):  # a type=count cluster string:
        # Gavel's policies and round mechanism (``hetero_cluster.looks_hetero``, not imported: start-up)
        from hpcsched.hetero.simulate import simulate_command  # before the simulator's imports: start-up counts

        if win is not None:
            raise typer.BadParameter("not with --compat gavel (its summary is Gavel's own)", param_hint="--window")
        simulate_command(trace, str(cluster), policy, out, as_json, solver)
        return
    if solver != "auto":
        raise typer.BadParameter("only with --compat gavel (Gavel's policies' programs)", param_hint="--solver")
    from hpcsched.cluster_spec import read_cluster_spec
    from hpcsched.metrics import summarize_results
    from hpcsched.sim.runs import load_jobs, run_policy, write_run

    if out is None:
        raise typer.BadParameter("required (but with --compat gavel)", param_hint="--out")
    if restart_s is not None and not math.isfinite(restart_s):
        raise typer.BadParameter(f"must be a finite number of seconds, got {restart_s}", param_hint="--restart-s")
    if as_controller and compat is not None:
        raise typer.BadParameter("--as-controller decides by the controller's rules, --compat by the reference's: "
                                 "pick one", param_hint="--as-controller")
    if slowdown_factor is not None and (compat is not None or not (slowdown_factor > 0
                                                                    and math.isfinite(slowdown_factor))):
        raise typer.BadParameter("a finite factor > 0, without --compat (the references' own speed models)",
                                 param_hint="--slowdown-factor")
    if not math.isfinite(min_runtime_s):
        raise typer.BadParameter(f"must be a finite number of seconds, got {min_runtime_s}",
                                 param_hint="--min-runtime-s")
    if not as_controller and (admission, placement, load_threshold) != ("accept-all", "consolidated", 1.0):
        raise typer.BadParameter("--admission, --placement and --load-threshold are steps of the decision core: "
                                 "they need --as-controller", param_hint="--as-controller")
    core = None
    if as_controller:
        from hpcsched.admission import get_admission
        from hpcsched.core.decide import DecideOptions
        from hpcsched.placements import get_placement
        from hpcsched.sim.core_decisions import AsController

        for get, name, hint in ((get_admission, admission, "--admission"), (get_placement, placement, "--placement")):
            try:
                get(name)
            except KeyError as e:
                raise typer.BadParameter(str(e.args[0]), param_hint=hint) from None
        core = AsController(DecideOptions(min_runtime_s=min_runtime_s, admission=admission,
                                          load_threshold=load_threshold, placement=placement))
    spec = read_cluster_spec(cluster)
    jobs, anomalies = load_jobs(trace)
    try:
        with progress_bar(f"simulate {policy}", len(jobs), wanted(as_json) and len(jobs) >= _BAR_MIN_JOBS) as cb:
            result = run_policy(jobs, spec, policy, compat, str(trace), cb, restart_s, core, slowdown_factor)
    except KeyError as e:
        _fail_policy(e)
    write_run(out, result)
    shown = result.results
    if win is not None:
        from hpcsched.window import in_window

        try:
            shown = in_window(result.results, win)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--window") from None
    summary = ({"dir": str(out)} | summarize_results(shown, result.meta)
               | {"events": result.events, "wall_s": result.wall_s}
               | ({"window": window, "jobs_simulated": len(result.results)} if win is not None else {}))
    if anomalies:
        from hpcsched.harvest.log_checks import describe_rows

        print(f"note: {trace}: {describe_rows(len(jobs), anomalies)}", file=sys.stderr)
    if result.rejected:
        print(f"warning: {len(result.rejected)} jobs larger than the cluster never ran (status rejected)",
              file=sys.stderr)
    if result.meta.get("untimed_colocated_jobs"):
        print(f"note: {result.meta['untimed_colocated_jobs']} co-located jobs had no stage profile in the trace; "
              "their groups ran at a compute-only period (meta.json untimed_colocated_jobs)", file=sys.stderr)
    if as_json:
        print(json.dumps(summary))
        return
    how = f", decided as the controller (min_runtime_s {min_runtime_s:g})" if as_controller else ""
    _table([summary], f"hpcsched simulate {policy}: {_subject(trace, spec, compat)}{how}")
    print(f"{result.events} events in {result.wall_s:.2f} s; results in {out}")


def _window(window: str | None) -> tuple[int, int] | None:
    if window is None:
        return None
    from hpcsched.window import parse_window

    try:
        return parse_window(window)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--window") from None


def _simulate_pollux(trace: Path, cluster: Path, policy: str, out: Path | None, as_json: bool, seed: int,
                     optimiser: str | None) -> None:
    """The Pollux artifact's loop (``hpcsched.compat.pollux``); bad input is a clear error, never a traceback.
    ``optimiser`` None: ``pollux_ga.DEFAULT_OPTIMISER``."""
    import os

    # One BLAS thread: Pollux's jobs refit a 7-parameter model thousands of times, and OpenBLAS' threads make
    # each tiny L-BFGS-B fit ~9x slower (measured here). Read when numpy loads, which this command does next.
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    from hpcsched.compat.pollux_ga import DEFAULT_OPTIMISER
    from hpcsched.errors import InputError
    from hpcsched.sim.pollux_run import run_pollux_command

    optimiser = optimiser or DEFAULT_OPTIMISER
    if out is None:
        raise typer.BadParameter("required", param_hint="--out")
    try:
        summary = run_pollux_command(trace, cluster, policy, out, as_json, seed, optimiser)
    except KeyError as e:
        _fail_policy(e)
        return
    except (ValueError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    if not as_json:
        _table([summary], f"hpcsched simulate {policy}: {_subject(trace, Path(cluster), 'pollux')}")
        print(f"{summary['rounds']} rounds in {summary['wall_s']:.2f} s; results in {out}")


def _simulate_blox(trace: Path, cluster: Path, policy: str, out: Path, as_json: bool, win: tuple[int, int] | None,
                   round_s: float, optimus_load: float | None) -> None:
    """Blox's loop (``hpcsched.compat.blox``); a bad policy, option or trace is a clear error, never a traceback."""
    from hpcsched.errors import InputError
    from hpcsched.sim.blox_run import run_blox_command

    try:
        summary = run_blox_command(trace, cluster, policy, out, as_json, win, round_s, optimus_load)
    except KeyError as e:
        _fail_policy(e)
        return
    except (ValueError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    if not as_json:
        _table([summary], f"hpcsched simulate {policy}: {_subject(trace, Path(cluster), 'blox')}"
                          + (f", window {summary['window']}" if win else ""))
        print(f"{summary['events']} rounds in {summary['wall_s']:.2f} s; results in {out}")


def compare_cmd(
    trace: Path = TRACE_OPT,
    cluster: Path = CLUSTER_OPT,
    policies: str = typer.Option("fifo,srtf,srsf,las,tiresias,themis", "--policies",
                                 help="Comma-separated policy names; 'all' for every registered one."),
    out: Path = typer.Option(..., "--out", help="Directory: one sub-directory per policy, jct_cdf.png, summary.json."),
    as_json: bool = typer.Option(False, "--json", help="Print the summaries as a JSON list."),
    compat: str | None = COMPAT_OPT,
) -> None:
    """Simulate several policies on one trace; print a comparison table and write a JCT CDF plot."""
    from hpcsched.cluster_spec import read_cluster_spec
    from hpcsched.metrics import summarize
    from hpcsched.metrics.plot import plot_jct_cdf
    from hpcsched.policies import REGISTRY
    from hpcsched.sim.runs import load_jobs, run_policy, write_run

    _check_compat(compat)
    if compat in ("gavel", "blox", "pollux", "sia"):  # their own round loops run per policy, through `simulate`
        print(f"error: compare does not run --compat {compat}; run `hpcsched simulate --compat {compat}` once per "
              "policy (docs/hetero.md, docs/simulator.md)", file=sys.stderr)
        raise typer.Exit(2)
    names = REGISTRY.names() if policies == "all" else [p.strip() for p in policies.split(",") if p.strip()]
    if len(set(names)) < len(names):  # one directory per policy: a repeated name would overwrite its own run
        print(f"warning: --policies repeats {', '.join(sorted({p for p in names if names.count(p) > 1}))}; "
              "each runs once", file=sys.stderr)
        names = list(dict.fromkeys(names))
    unknown = [p for p in names if p not in REGISTRY.names()]
    if unknown:
        print(f"error: unknown policy {', '.join(unknown)}; known: {', '.join(REGISTRY.names())}", file=sys.stderr)
        raise typer.Exit(2)
    spec = read_cluster_spec(cluster)
    jobs, _ = load_jobs(trace)
    summaries, runs = [], []
    with progress_bar("compare", len(names), wanted(as_json)) as cb:
        for i, name in enumerate(names):
            result = run_policy(jobs, spec, name, compat, str(trace))
            write_run(out / name, result)
            df = result.frame()
            summaries.append({"dir": str(out / name)} | summarize(df, result.meta) | {"wall_s": result.wall_s})
            runs.append((name, df))
            if cb:
                cb(i + 1, len(names))
    png = plot_jct_cdf(runs, out / "jct_cdf.png", _subject(trace, spec, compat))
    (out / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n")
    if as_json:
        print(json.dumps(summaries))
        return
    _table(summaries, _subject(trace, spec, compat))
    print(f"JCT CDF: {png}; per-policy results under {out}/")


def _subject(trace: Path, spec: object, compat: str | None) -> str:
    """'trace3 on n8g8 (64 GPUs), compat=muri': the title of every table and plot of a run."""
    from hpcsched.metrics.labels import runs_subject

    return runs_subject([{"trace": str(trace), "cluster": getattr(spec, "name", None),
                          "capacity_gpus": getattr(spec, "gpus", None), "compat": compat}])


def _table(summaries: list[dict], title: str) -> None:
    """Policies' figures side by side; makespan counts from the first submit, whatever the trace's clock."""
    from rich.console import Console
    from rich.table import Table

    from hpcsched.metrics.labels import run_labels

    absolute = any(s.get("first_submit") for s in summaries)  # calendar times: show the last end too
    table = Table(title=title, caption="makespan = last end - first submit; p99 = Muri's sorted JCTs at int(0.99 n); "
                                       "utilisation = GPU-s held / (GPUs x makespan)")
    cols = ["policy", "jobs", "avg JCT (s)", "p99 JCT (s)", "makespan (s)", *(["last end (s, trace clock)"] if absolute
                                                                             else []), "utilisation", "sim time (s)"]
    for col in cols:
        table.add_column(col, justify="left" if col == "policy" else "right")
    for s, label in zip(summaries, run_labels(summaries), strict=True):
        table.add_row(label, str(s["jobs"]), _num(s.get("avg_jct")), _num(s.get("p99_jct")), _num(s.get("makespan")),
                      *([_num(s.get("last_end"))] if absolute else []),
                      f"{s['utilization']:.3f}" if s.get("utilization") else "-",
                      f"{s['wall_s']:.2f}" if "wall_s" in s else "-")
    Console(width=120).print(table)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}"


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)
    app.command("compare")(compare_cmd)
