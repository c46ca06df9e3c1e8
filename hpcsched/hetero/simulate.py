"""``hpcsched simulate --compat gavel``: a Gavel trace, a ``type=count`` cluster and one of Gavel's policies.

Glue between the command line and the round mechanism: reads the trace (Gavel's 10-column format, or any
format whose jobs carry a model the throughput table knows and a step count), runs
``hpcsched.hetero.rounds.simulate_rounds`` and summarises the run with the keys ``simulate --json`` prints
for every other run (``avg_jct``, ``makespan``, ...), plus what is particular to Gavel's accounting:
``rounds``, ``allocations``, ``gavel_total_duration`` (its printed "Total duration": the clock at the
last end, counted from 0 rather than from the first arrival) and ``solver`` (counters of LP solves and of
any trouble, also said on stderr).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcsched.errors import InputError
from hpcsched.hetero.rounds import ROUND_S, RoundJob, RoundsResult, simulate_rounds
from hpcsched.primitives.hetero_cluster import parse_hetero_cluster


def _read_plain_gavel(trace: str | Path) -> list[RoundJob] | None:
    """A plain (not gzipped) Gavel trace whose every line is well-formed, read directly; else None.

    Why: ``hpcsched.traces`` loads every trace format (and pydantic) to sniff one, a third of what a
    whole ``simulate --compat gavel`` process used to take. Anything unusual (gzip, a field this strict
    reading does not accept, blank lines) returns None, and the general reader then reads the file, with
    its error messages naming file and line.
    """
    import math

    try:
        raw = Path(trace).read_bytes()
    except OSError:
        return None
    if raw[:2] == b"\x1f\x8b":
        return None
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    jobs: list[RoundJob] = []
    for i, line in enumerate(lines):
        parts = line.rstrip("\r").split("\t")
        if len(parts) != 10:
            return None
        job_type, _, _, _, needs, steps, scale, weight, slo, arrival = parts
        if not job_type.strip() or needs.strip() not in ("0", "1"):
            return None
        steps, scale = steps.strip(), scale.strip()
        if not (steps.isascii() and steps.isdigit() and scale.isascii() and scale.isdigit()):
            return None
        try:
            w, slo_v, at = float(weight), float(slo), float(arrival)
        except ValueError:
            return None
        if not (math.isfinite(w) and math.isfinite(slo_v) and math.isfinite(at)) or w < 0 or at < 0:
            return None
        sf, n = int(scale), int(steps)
        if not 1 <= sf <= _MAX_COUNT or n > _MAX_COUNT:
            return None
        jobs.append(RoundJob(i, job_type, n, sf, at, w, slo_v if slo_v >= 0 else None))
    return jobs


_MAX_COUNT = 10**9
"""Above this a count is not plausible; the general reader's bound (``hpcsched.traces.base``) is the rule."""


def load_round_jobs(trace: str | Path) -> list[RoundJob]:
    """The trace's jobs in file order, ids 0.. as Gavel numbers them; InputError names the file and line."""
    fast = _read_plain_gavel(trace)
    if fast is not None:
        return fast
    from hpcsched.traces import open_trace

    jobs: list[RoundJob] = []
    opened = open_trace(trace)
    records = list(opened)
    bad = opened.report.anomalies.get("malformed_row", 0)
    if bad:  # a skipped line would renumber every later job: Gavel's reader stops there instead
        first = opened.report.first_details.get("malformed_row")
        raise InputError(trace, f"{bad} malformed line(s), the first: {first}",
                         opened.report.first_lines.get("malformed_row"))
    for i, j in enumerate(records):
        line = j.extra.get("line") if j.extra else None
        if not j.model or j.iterations is None or j.gpus < 1:
            raise InputError(trace, f"job {j.id}: Gavel's mechanism needs a job type, total steps and a scale "
                                    "factor (a Gavel trace has them)", line if isinstance(line, int) else None)
        weight = j.extra.get("priority_weight", 1.0) if j.extra else 1.0
        slo = j.extra.get("slo") if j.extra else None
        jobs.append(RoundJob(i, j.model, int(j.iterations), j.gpus, float(j.submit),
                             float(weight) if isinstance(weight, int | float) else 1.0,
                             float(slo) if isinstance(slo, int | float) else None))
    return jobs


def run_gavel(trace: str | Path, cluster: str, policy: str, *, seed: int = 0, round_s: float = ROUND_S,
              throughputs: str | Path | None = None, out: str | Path | None = None,
              solver: str = "auto") -> dict[str, Any]:
    """Simulate ``policy`` on ``trace`` with Gavel's accounting; returns the summary ``--json`` prints.

    With ``out``, also writes ``jobs.csv`` and ``meta.json`` there (what ``hpcsched calc`` reads).
    ``solver``: 'auto' (the default: 'ecos' when the cvxpy extra's ecos is installed, else 'highs' with a
    note), 'highs', or 'ecos' (Gavel's own programs and solver, ``hetero.ecos_programs``).
    """
    from hpcsched.hetero.policies import make_policy
    from hpcsched.hetero.throughputs import load_throughputs
    from hpcsched.metrics import summarize_results
    from hpcsched.results import JobResult, write_results

    try:
        spec = parse_hetero_cluster(cluster)
    except ValueError as e:
        raise InputError(None, f"--cluster {cluster!r}: {e}") from None
    if any(g != 1 for g in spec.gpus_per_server):
        raise InputError(None, f"--cluster {cluster!r}: Gavel's accounting (--compat gavel) has one GPU per server "
                               "(type=count)")
    table = load_throughputs(throughputs) if throughputs is not None else load_throughputs()
    jobs = load_round_jobs(trace)
    solver, note = resolve_solver(solver, policy)
    try:
        pol = make_policy(policy, seed, solver=solver)
    except KeyError as e:
        raise InputError(None, f"--solver {solver}: {e.args[0]}") from None
    try:
        res = simulate_rounds(jobs, spec, pol, table, round_s=round_s, seed=seed)
    except KeyError as e:  # a job type or scale factor the throughput table lacks
        raise InputError(trace, f"throughput table {table.source}: {e.args[0]}") from None
    except ValueError as e:
        raise InputError(trace, str(e)) from None
    results = [JobResult(job_id=str(j.id), submit=j.arrival, start=s, end=e, gpus=j.scale_factor,
                         gpu_seconds=g, status="completed" if e is not None else "failed")
               for j, s, e, g in zip(res.jobs, res.first_start, res.end, res.gpu_seconds, strict=True)]
    meta = _meta(res, str(trace), cluster, policy, seed, round_s, spec.total_gpus) | {"lp_solver": solver}
    if note:
        meta["lp_solver_note"] = note
    if out is not None:
        write_results(out, results, meta)
    summary = summarize_results(results, meta)
    return ({"dir": str(out)} if out is not None else {}) | summary | {
        "policy": policy, "compat": "gavel", "rounds": res.rounds, "allocations": res.allocations,
        "gavel_total_duration": res.makespan, "gavel_avg_jct": res.avg_jct, "solver": res.solver, "lp_solver": solver,
        "events": res.rounds, "wall_s": res.wall_s} | ({"lp_solver_note": note} if note else {})


def _meta(res: RoundsResult, trace: str, cluster: str, policy: str, seed: int, round_s: float,
          gpus: int) -> dict[str, Any]:
    return {"trace": trace, "cluster": cluster, "policy": policy, "compat": "gavel", "seed": seed,
            "round_s": round_s, "capacity_gpus": gpus, "rounds": res.rounds, "allocations": res.allocations,
            "solver": res.solver}


def simulate_command(trace: Path, cluster: str, policy: str, out: Path | None, as_json: bool,
                     solver: str = "auto") -> None:
    """``hpcsched simulate`` with ``--compat gavel``: print the summary (JSON or a line), exit 2 on bad input."""
    code = _simulate(trace, cluster, policy, out, as_json, solver)
    if code:
        import typer

        raise typer.Exit(code)


_FAST_OPTIONS = {"--trace": "trace", "--cluster": "cluster", "--policy": "policy", "--out": "out",
                 "--compat": "compat", "--solver": "solver"}


def fast_main(argv: list[str]) -> int | None:
    """``hpcsched simulate`` without Typer, for the plain ``--compat gavel`` line; None for anything else.

    Why: Typer and the pydantic it loads took as long to import as a whole Gavel run takes to simulate
    here. Only ``--trace``, ``--cluster``, ``--policy``, ``--compat gavel``, ``--out``, ``--solver`` (``--opt value``
    or ``--opt=value``, each once) and ``--json`` are read; any other word (``--help``, a typo, a missing
    option) returns None and Typer parses the line as it always did, with its own messages. Returns the
    exit code.
    """
    from hpcsched.argline import read_plain_line

    line = read_plain_line(argv, _FAST_OPTIONS)
    if line is None:
        return None
    opts, as_json = line
    if opts.get("compat") != "gavel" or not {"trace", "cluster", "policy"} <= set(opts):
        return None
    out = Path(opts["out"]) if "out" in opts else None
    return _simulate(Path(opts["trace"]), opts["cluster"], opts["policy"], out, as_json, opts.get("solver", "auto"))


SOLVERS = ("auto", "highs", "ecos")
"""``--solver`` with ``--compat gavel``: 'auto' (default) is Gavel's own programs and solver (ECOS 2.0.14, the
``cvxpy`` extra; ``hpcsched.hetero.ecos_programs``), whose allocations and so figures are Gavel's, when ecos is
installed, else HiGHS's interior point; 'highs' and 'ecos' force one."""
NO_ECOS_NOTE = ("ecos (the cvxpy extra) is not installed: the LPs are solved with HiGHS, whose choice among "
                "equally optimal allocations can differ from Gavel's, so figures may differ from Gavel's "
                "(pip install 'hpcsched[cvxpy]' for its exact path)")


NO_PROGRAM_NOTE = ("policy {policy!r} has no ECOS program of Gavel's here: its LPs are solved with HiGHS, whose "
                   "choice among equally optimal allocations can differ from Gavel's, so figures may differ")


def resolve_solver(solver: str, policy: str) -> tuple[str, str | None]:
    """'auto' -> 'ecos' (Gavel's exact path) when ecos is importable and the policy has an ECOS program (or needs
    no solver), else 'highs' with the note that says why figures may differ from Gavel's."""
    if solver != "auto":
        return solver, None
    from importlib.util import find_spec

    from hpcsched.hetero.ecos_programs import ECOS_POLICIES
    from hpcsched.hetero.policies import NO_SOLVER

    if policy in NO_SOLVER:
        return "highs", None  # solves nothing: the same either way, and no ecos import
    if find_spec("ecos") is None:
        return "highs", NO_ECOS_NOTE
    if policy not in ECOS_POLICIES:
        return "highs", NO_PROGRAM_NOTE.format(policy=policy)
    return "ecos", None


def _simulate(trace: Path, cluster: str, policy: str, out: Path | None, as_json: bool, solver: str = "auto") -> int:
    import json
    import sys

    from hpcsched.hetero.policies import POLICIES

    if policy not in POLICIES:
        print(f"error: unknown policy {policy!r} for --compat gavel; known: {', '.join(POLICIES)}", file=sys.stderr)
        return 2
    if solver not in SOLVERS:
        print(f"error: unknown --solver {solver!r} for --compat gavel; known: {', '.join(SOLVERS)}", file=sys.stderr)
        return 2
    _, note = resolve_solver(solver, policy)
    if note:  # before the run, which can take minutes; run_gavel puts it in meta.json and the summary
        print(f"note: {note}", file=sys.stderr)
    try:
        summary = run_gavel(trace, cluster, policy, out=out, solver=solver)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # ecos_programs.EcosMissing (not imported here: the default path never loads it)
        if type(e).__name__ != "EcosMissing":
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(summary))
        return 0
    print(f"hpcsched simulate {policy} (compat gavel, {solver}): {trace} on {cluster}: "
          f"avg JCT {summary['avg_jct']:.3f} s, "
          f"makespan {summary['makespan']:.3f} s, {summary['jobs']} jobs ({summary['unfinished']} failed), "
          f"{summary['rounds']} rounds, {summary['allocations']} allocations in {summary['wall_s']:.2f} s"
          + (f"; results in {out}" if out is not None else ""))
    return 0
