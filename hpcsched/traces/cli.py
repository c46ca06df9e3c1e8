"""``hpcsched trace inspect``: what is in a trace, and what is wrong with it."""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

# numpy and rich are imported where used, so that `hpcsched --help` and the other commands do not pay for them.
from hpcsched.progress import Update, wanted
from hpcsched.traces import FORMATS, generate_cli, open_trace

trace_app = typer.Typer(help="Look inside trace files.", no_args_is_help=True)
generate_cli.register(trace_app)  # `trace generate`, in its own module

_QUANTILES = (0.0, 0.5, 0.9, 0.99, 1.0)
COLUMNS_HELP = ("sacct without a header line (sacct -P --noheader): its columns, the --format list it was made "
                "with (JobID,JobIDRaw,...), or a named archive layout: xdmod, apel. Implies --format slurm-sacct.")


def _dist(values: array[float]) -> dict[str, float] | None:
    if not values:
        return None
    import numpy as np

    a = np.frombuffer(values, dtype=float)
    return {f"p{int(q * 100)}": float(np.quantile(a, q)) for q in _QUANTILES} | {"mean": float(a.mean())}


SPARSE_GAP_S = 7 * 86400.0  # a week without a single submit is a hole in the log, not a quiet night
SPARSE_SHARE = 0.2  # such holes covering this share of the span make the log sparse


def sparse_note(submits: array[float], span_s: float) -> str | None:
    """A note when week-long stretches without any submit make up a large share of the span: rates, use
    and utilisation averaged over the span then mostly describe time the log says nothing about."""
    if len(submits) < 2 or span_s <= 0:
        return None
    import numpy as np

    gaps = np.diff(np.sort(np.frombuffer(submits, dtype=float)))
    holes = gaps[gaps >= SPARSE_GAP_S]
    if not len(holes) or holes.sum() < SPARSE_SHARE * span_s:
        return None
    days = holes.sum() / 86400
    return (f"sparse log: {len(holes):,} gap(s) of a week or more without a submit (longest {holes.max() / 86400:,.1f} "
            f"days) cover {days:,.1f} of its {span_s / 86400:,.1f} days ({100 * holes.sum() / span_s:.0f}%); "
            "figures averaged over the span mostly describe time the log says nothing about")


def _records_label(bar: Update, name: str) -> Callable[[int], None]:
    """What the columnar reader calls every so many records: the bar's label says how many were read."""
    return lambda k: bar(label=f"reading {name}: {k:,} records")


def inspect_trace(
    path: Path, fmt: str | None = None, strict: bool = False, progress: bool = False,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Stream the trace once and summarise it; the dict is what ``--json`` prints.

    Sizes and durations are kept in compact float arrays (8 bytes a job) for the quantiles, so a
    450k-job log costs a few MB beyond the reader's own streaming state. A clean SWF log is summarised
    by columns (``swf_columns``: same figures, no ``Job`` per row); the reader option ``rows`` forces
    the row reader (the tests compare the two).
    """
    from hpcsched.progress import progress_bar

    trace = open_trace(path, fmt, strict, options)
    count = 0
    first = last = None
    sizes: array[float] = array("d")
    durations: array[float] = array("d")
    submits: array[float] = array("d")
    nodes_max = gpus_max = 0
    with progress_bar(f"reading {path.name}", path.stat().st_size if path.is_file() else None, progress) as bar:
        if bar is not None:
            trace.report.progress = bar
        cols = None
        if trace.format.name == "swf" and not (options or {}).get("rows"):
            from hpcsched.traces.swf_columns import summarise

            cols = summarise(trace.path, trace.report, None if bar is None else _records_label(bar, path.name))
        if cols is not None:  # a clean SWF log, summarised by columns (same figures, no Job per row)
            count, submits, sizes, durations, nodes_max = (cols.count, cols.submits, cols.sizes, cols.durations,
                                                           cols.nodes_max)
            if submits:
                first, last = min(submits), max(max(submits), max(cols.ends) if cols.ends else -math.inf)
        elif trace.format.kind == "jobs":  # the hot loop: plain attribute reads and appends, no per-job min/max
            ends: array[float] = array("d")
            add_submit, add_size, add_duration, add_end = (submits.append, sizes.append, durations.append,
                                                           ends.append)
            label_at = 20000 if bar is not None else -1
            for rec in trace:
                count += 1
                if count == label_at:
                    bar(label=f"reading {path.name}: {count:,} records")  # type: ignore[misc]
                    label_at += 20000
                add_submit(rec.submit)
                n, g = rec.nodes, rec.gpus
                add_size(g or n)
                if n > nodes_max:
                    nodes_max = n
                if g > gpus_max:
                    gpus_max = g
                d, e = rec.duration, rec.end
                if d is not None:
                    add_duration(d)
                if e is not None:
                    add_end(e)
            if submits:
                first, last = min(submits), max(submits)
                if ends:
                    last = max(last, max(ends))
            del ends
        else:
            for rec in trace:
                count += 1
                if bar is not None and count % 20000 == 0:
                    bar(label=f"reading {path.name}: {count:,} records")
                t = getattr(rec, "submit", None)
                if t is None:
                    t = getattr(rec, "start", None)
                end = getattr(rec, "end", None)
                if t is not None:
                    first = t if first is None else min(first, t)
                    last = t if last is None else max(last, t)
                if end is not None:
                    last = end if last is None else max(last, end)
    rep = trace.report
    span = (last - first) if first is not None and last is not None else 0.0
    notes = list(rep.notes)
    sparse = sparse_note(submits, span)
    if sparse:
        notes.append(sparse)
    return {
        "file": str(path),
        "format": rep.format,
        "kind": trace.format.kind,
        "jobs": count,
        "span_s": span,
        "first_time": first,
        "last_time": last,
        "machine": {k: v for k, v in rep.meta.items() if k.startswith("machine")}
        | {"max_job_nodes": nodes_max, "max_job_gpus": gpus_max},
        "size": _dist(sizes),
        "duration_s": _dist(durations),
        "anomalies": dict(sorted(rep.anomalies.items())),
        "anomaly_first_lines": rep.first_lines,
        "conversions": rep.conversions,
        "notes": notes,
        "meta": {k: dict(v) if isinstance(v, dict) else v for k, v in rep.meta.items() if not k.startswith("machine")},
    }


@trace_app.command("inspect")
def inspect_cmd(
    file: Path = typer.Argument(..., help="Trace file (.gz read transparently)."),
    fmt: str | None = typer.Option(None, "--format", help=f"Force a format: {', '.join(FORMATS)}."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    strict: bool = typer.Option(False, "--strict", help="Fail on the first anomaly instead of counting it."),
    cores_per_node: float | None = typer.Option(
        None, "--cores-per-node", help="SWF: processors per node for procs -> nodes (default: MaxProcs/MaxNodes)."
    ),
    machine_nodes: int | None = typer.Option(
        None, "--machine-nodes", "--nodes",
        help="Machine size in nodes for the larger-than-machine check (overrides headers).",
    ),
    delimiter: str | None = typer.Option(
        None, "--delimiter", help="sacct: the field delimiter (tab, pipe, comma, table, or the characters); "
        "default: read from the header."
    ),
    columns: str | None = typer.Option(None, "--columns", help=COLUMNS_HELP),
) -> None:
    """Jobs, time span, machine size, size and duration distributions, and anomaly counts.

    The format is detected from the first lines (or given with --format); .gz is read transparently.

    Counted: unknown (-1) fields, zero/negative run times, run time over request, jobs over machine size.

    Also counted: unsorted submits, duplicate ids, censored jobs; --strict stops at the first anomaly.

    A file that cannot be read prints one error naming file and line, exit code 2.
    """
    from rich.console import Console
    from rich.table import Table

    options = _options(cores_per_node, machine_nodes, delimiter, columns)
    info = inspect_trace(file, fmt, strict, progress=wanted(as_json), options=options)
    if as_json:
        print(json.dumps(info))
        return
    c = Console()
    t = Table(title=f"{file.name} ({info['format']}, {info['kind']})", show_header=False)
    t.add_row("records", f"{info['jobs']:,}")
    t.add_row("span", f"{info['span_s']:,.0f} s ({info['span_s'] / 86400:.1f} days)")
    for k, v in info["machine"].items():
        t.add_row(k.replace("_", " "), str(v))
    for name in ("size", "duration_s"):
        d = info[name]
        if d:
            t.add_row(name, "  ".join(f"{q}={v:,.1f}" for q, v in d.items()))
    for note in info["conversions"]:
        t.add_row("conversion", note)
    for note in info["notes"]:
        t.add_row("note", note)
    for k, v in info["meta"].items():
        t.add_row(k.replace("_", " "), ", ".join(f"{a}={b}" for a, b in v.items()) if isinstance(v, dict) else str(v))
    c.print(t)
    if info["anomalies"]:
        a = Table(title="anomalies")
        a.add_column("kind")
        a.add_column("count", justify="right")
        a.add_column("first line", justify="right")
        for k, n in info["anomalies"].items():
            a.add_row(k, f"{n:,}", str(info["anomaly_first_lines"].get(k, "-")))
        c.print(a)
    else:
        c.print("no anomalies")


def _options(cores_per_node: float | None, machine_nodes: int | None, delimiter: str | None,
             columns: str | None = None) -> dict[str, Any]:
    """Reader options from the command line (only those given)."""
    return {k: v for k, v in (("cores_per_node", cores_per_node), ("machine_nodes", machine_nodes),
                              ("delimiter", delimiter), ("columns", columns)) if v}


@trace_app.command("convert")
def convert_cmd(
    file: Path = typer.Argument(..., help="Job trace in any format hpcsched reads (.gz read transparently)."),
    to: str = typer.Option(..., "--to", help="Target format: swf, muri (the simulator's CSV), slurm-sacct, "
                           "pbs-accounting, lsf-acct (LSF lsb.acct), sge-accounting (Grid Engine)."),
    out: Path | None = typer.Option(None, "--out", help="Output file (.gz compresses); default: stdout."),
    fmt: str | None = typer.Option(None, "--format", help="Input format (default: detected)."),
    allow_loss: bool = typer.Option(
        False, "--allow-loss", help="Drop the jobs the target cannot use (counted) instead of stopping."
    ),
    gpus_per_node: int | None = typer.Option(
        None, "--gpus-per-node", min=1, help="--to muri: GPUs = nodes x this, for batch jobs without GPU counts."
    ),
    rebase: bool = typer.Option(False, "--rebase", help="--to muri: submit times start at 0."),
    out_delimiter: str = typer.Option(
        "|", "--out-delimiter", help="--to slurm-sacct: delimiter (tab, pipe, comma, or characters; 'table': the "
        "fixed-width table)."
    ),
    parsable: bool = typer.Option(False, "--parsable", help="--to slurm-sacct: a delimiter after the last field "
                                  "too (sacct -p; default: -P)."),
    cores_per_node: float | None = typer.Option(None, "--cores-per-node", help="SWF input: processors per node."),
    machine_nodes: int | None = typer.Option(
        None, "--machine-nodes", "--nodes", help="Machine size in nodes (overrides headers and known machines)."
    ),
    delimiter: str | None = typer.Option(None, "--delimiter", help="sacct input: the field delimiter."),
    columns: str | None = typer.Option(None, "--columns", help=COLUMNS_HELP),
    strict: bool = typer.Option(False, "--strict", help="Fail on the first anomaly of the input."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress and no notes on stderr."),
) -> None:
    """Convert a job trace to another format: SWF, the simulator's Muri CSV, sacct or PBS accounting.

    What the target has no field for is listed on stderr. A conversion that would leave jobs unusable
    (no GPU count or run time for the simulator, no size for SWF) stops with an error naming the count
    and the first line; --allow-loss drops those jobs instead. Progress shows on stderr for big files.
    """
    import sys

    from hpcsched.traces.convert import convert_trace
    from hpcsched.traces.slurm import delimiter_option

    show = not quiet and sys.stderr.isatty()
    out_d = delimiter_option(out_delimiter) or "|"
    kwargs: dict[str, Any] = dict(fmt=fmt, options=_options(cores_per_node, machine_nodes, delimiter, columns),
                                  allow_loss=allow_loss, gpus_per_node=gpus_per_node, rebase=rebase,
                                  delimiter=out_d, trailing=parsable, strict=strict)
    if show and file.is_file() and file.stat().st_size > _PROGRESS_BYTES:
        from hpcsched.progress import progress_bar

        with progress_bar(f"reading {file.name}", file.stat().st_size, True) as bar:

            def tick(phase: str, done: int, total: int) -> None:
                bar(done, total, f"{phase} {file.name}")  # type: ignore[misc]

            result = convert_trace(file, to, out, progress=tick, **kwargs)
    else:
        result = convert_trace(file, to, out, **kwargs)
    if not quiet:
        if result.anomalies:
            dropped = result.anomalies.get("malformed_row", 0)
            flagged = ", ".join(f"{n:,} {k}" for k, n in sorted(result.anomalies.items()) if k != "malformed_row")
            print(f"input: {dropped:,} row(s) dropped as malformed; kept but flagged: {flagged or 'none'} "
                  "(hpcsched trace inspect shows where)", file=sys.stderr)
        for loss in result.losses:
            verb = "dropped (--allow-loss)" if loss.required else "not carried over"
            print(f"note: {loss.count:,} job(s): {loss.what}: {verb}", file=sys.stderr)
        for note in result.notes:
            print(f"note: {note}", file=sys.stderr)
        print(result.summary() + (f" -> {out}" if out else ""), file=sys.stderr)


_PROGRESS_BYTES = 256 << 10  # smaller files convert in well under a second: no bar to read


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
