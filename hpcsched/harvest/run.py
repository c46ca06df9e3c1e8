"""One replay from files to files: the single code path behind ``hpcsched replay`` and a sweep's replay cell.

``run_replay(request, out)`` reads the elastic jobs, builds the idle-pool timeline (from BFTrainer
idle intervals or by replaying a batch log first-fit), runs the replayer and writes ``jobs.csv``,
``meta.json``, ``events.csv`` and ``job_progress.csv`` into ``out``. The CLI adds option parsing and
printing, the sweep adds arrival scaling and its cell bookkeeping; neither re-implements a step, so a
sweep cell and the command with the same parameters give the same files.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.harvest.event_rows import EventRows
from hpcsched.harvest.pool import PoolTimeline, timeline_from_intervals, timeline_from_log
from hpcsched.harvest.replay import EVENT_COLUMNS, ReplayConfig, ReplayResult, replay
from hpcsched.model import ElasticJob
from hpcsched.results import write_results

EVENTS_FILE = "events.csv"
PROGRESS_FILE = "job_progress.csv"

JobsHook = Callable[[list[ElasticJob]], list[ElasticJob]]


@dataclass(frozen=True)
class ReplayRequest:
    """Everything one replay needs: the jobs, exactly one source of idle nodes, and the allocator's config.

    ``nodes`` means the first N names of the node order for ``idle``, and the machine size for ``log``
    (None: what the log or its machine says, else its peak use). ``start`` (epoch s) is the replay's
    start; None: the first elastic submit for ``idle``, the log's first job start for ``log``.
    ``skip_warmup`` (``log`` only) starts where the log's use first reaches its typical level.
    """

    jobs_file: Path
    curves: Path
    idle: Path | None = None
    log: Path | None = None
    nodes: int | None = None
    node_order: Path | None = None
    start: float | None = None
    config: ReplayConfig = field(default_factory=ReplayConfig)
    skip_warmup: bool = False
    log_format: str | None = None  # ``log``: its format (None: detected)
    log_options: dict[str, object] = field(default_factory=dict)  # ``log``: reader options (columns, delimiter)
    goodput: Path | None = None  # goodput profiles of some jobs (``hpcsched.harvest.goodput``); None: none
    value: str = "goodput"  # what the MILP values profiled jobs by: goodput, or their throughput at that batch

    def __post_init__(self) -> None:
        if (self.idle is None) == (self.log is None):
            raise ValueError("give exactly one of idle (idle intervals) or log (a batch job log)")
        if self.skip_warmup and self.log is None:
            raise ValueError("skip_warmup applies to a batch log (--log) only: idle intervals record busy nodes")


@dataclass
class ReplayRun:
    """What ``run_replay`` produced: the replayer's result, the pool it harvested, and what it wrote.

    ``notes`` are facts a reader of the figures needs (machine size and its source, the log's rows);
    ``warnings`` are conditions that make a figure approximate or partial. Both are in meta.json too.
    """

    result: ReplayResult
    timeline: PoolTimeline
    meta: dict[str, object]
    submit_shift_s: float
    out: Path
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def summary(self) -> dict[str, object]:
        return self.result.summary


def shift_into_log(jobs: Sequence[ElasticJob], start: float, end: float) -> tuple[list[ElasticJob], float]:
    """Move the jobs so the first submits at the log's start when their times miss the log.

    BFTrainer's job files use their own epoch; against a real log they would otherwise arrive before
    or after every idle node. Returns the moved jobs and the shift (0 when they already fall inside).
    """
    first = min(j.submit for j in jobs)
    if start <= first <= end:
        return list(jobs), 0.0
    shift = start - first
    return [dataclasses.replace(j, submit=j.submit + shift) for j in jobs], shift


def idle_timeline(idle: Path, nodes: int | None, order_file: Path | None, start: float) -> PoolTimeline:
    """The pool from idle intervals; ``nodes`` keeps the first N names of the node order.

    The node order defaults to ``node-order.txt`` beside the idle file (the bundled data's layout).
    ``notes`` say the machine size and where it came from, as for a log.
    """
    from hpcsched.traces.bftrainer import read_idle_intervals, read_node_order

    if order_file is None and (idle.parent / "node-order.txt").is_file():
        order_file = idle.parent / "node-order.txt"
    names: list[str] | None = read_node_order(order_file) if order_file is not None else None
    if nodes is not None:
        if names is None:
            raise InputError(idle, "--nodes N takes the first N names of a node-order file; give --node-order")
        if not 1 <= nodes <= len(names):
            raise InputError(order_file, f"--nodes {nodes}: the node order lists {len(names)} nodes")
        names = names[:nodes]
        source = f"--nodes {nodes}: the first {nodes} names of {order_file}"
    elif names is not None:
        source = f"every node of {order_file}"
    else:
        source = f"every node named in {idle}"
    tl = timeline_from_intervals(read_idle_intervals(idle), names, start)
    tl.notes = {"machine_nodes": len(tl.nodes), "machine_nodes_source": source}
    return tl


def run_replay(
    request: ReplayRequest,
    out: Path,
    *,
    prepare_jobs: JobsHook | None = None,
    progress: Callable[[int, int], None] | None = None,
    meta_extra: Mapping[str, object] | None = None,
    log_progress: Callable[[int, int, str], None] | None = None,
) -> ReplayRun:
    """Replay ``request`` and write its files into ``out``.

    ``prepare_jobs`` alters the jobs right after they are read (the sweep scales their arrivals);
    ``progress(done, total)`` follows the replayer's events, ``log_progress(done, total, what)`` the reading of
    a ``--log`` (bytes) and its first fit (jobs); ``meta_extra`` is merged into meta.json.
    Bad input raises InputError; a solver that is not installed raises SolverUnavailable.
    """
    from hpcsched.traces.bftrainer import read_elastic_jobs

    jobs = read_elastic_jobs(request.jobs_file, request.curves)
    if prepare_jobs is not None:
        jobs = prepare_jobs(jobs)
    if not jobs:
        raise InputError(request.jobs_file, "no jobs")
    shift = 0.0
    if request.idle is not None:
        t0 = request.start if request.start is not None else min(j.submit for j in jobs)
        tl = idle_timeline(request.idle, request.nodes, request.node_order, t0)
    else:
        assert request.log is not None
        tl = timeline_from_log(request.log, request.nodes, request.log_format, start=request.start,
                               skip_warmup=request.skip_warmup, options=request.log_options, progress=log_progress)
        jobs, shift = shift_into_log(jobs, tl.start, tl.end)
    valuation, described = None, {}
    if request.goodput is not None:
        from hpcsched.harvest.goodput import GoodputValuation, read_goodput_profiles

        valuation = GoodputValuation(read_goodput_profiles(request.goodput), request.value)
        try:
            jobs = valuation.prepare(jobs)
        except ValueError as e:
            raise InputError(request.goodput, str(e)) from None
        described = {"goodput": {"file": str(request.goodput), **valuation.describe()}}
    cfg = request.config
    res = replay(tl, jobs, cfg, progress=progress, valuation=valuation)
    s = res.summary
    notes, warnings = explain(tl, res, shift, cfg)
    meta: dict[str, object] = {
        "tool": "replay", "policy": f"bftrainer-{cfg.solver}", "trace": str(request.idle or request.log),
        "jobs_file": str(request.jobs_file), "cluster": f"{len(tl.nodes)} nodes", "capacity_nodes": len(tl.nodes),
        "capacity_node_seconds": float(s["idle_node_hours"]) * 3600.0,  # type: ignore[arg-type]
        "tfwd": cfg.tfwd, "objective": str(cfg.objective), "accounting": cfg.accounting,
        "predict_tfwd": cfg.predict_tfwd, "exact_events": cfg.exact_events, "no_pause": cfg.no_pause,
        "max_jobs": cfg.max_jobs, **described,
        "submit_shift_s": shift, **(meta_extra or {}), **tl.notes, "summary": s,
        "nonoptimal_by_status": res.nonoptimal_by_status, "notes": notes, "warnings": warnings,
    }
    write_replay(out, res, meta)
    return ReplayRun(res, tl, meta, shift, out, notes, warnings)


def _utc(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _f(v: object) -> float:
    return float(v)  # type: ignore[arg-type]


NONOPTIMAL_MEANING = {
    "time_limit": "the MILP hit --time-limit and its best incumbent was used",
    "fallback": "the MILP found no incumbent in time and greedy's answer was used",
    "heuristic": "a heuristic solver (greedy, equal) decided, without an optimality proof",
}


def explain(tl: PoolTimeline, res: ReplayResult, shift: float, cfg: ReplayConfig) -> tuple[list[str], list[str]]:
    """The notes and warnings a replay's figures need beside them, as self-contained sentences.

    Each answers a question the figures alone leave open: which machine size and why, which log rows
    and jobs were left out, whether the start is a warm-up, how much held node-time was past Pmax,
    and whether every allocator decision was optimal.
    """
    n, s = tl.notes, res.summary
    machine = f"machine: {len(tl.nodes):,} nodes, from {n.get('machine_nodes_source', 'the idle data')}"
    if "log_peak_nodes" in n:
        machine += f"; the log's peak concurrent use is {_f(n['log_peak_nodes']):,.0f} nodes"
    notes, warnings = [machine], []
    if "log_jobs" in n:
        notes.append(f"log: {n['log_rows_summary']}")
        no_room, no_times, no_size = (int(_f(n[f"skipped_{k}"])) for k in ("no_room", "no_times", "no_size"))
        zero = int(_f(n.get("skipped_zero_run", 0)))
        left, total = no_room + no_times + zero + no_size, int(_f(n["log_jobs"]))
        if left:
            parts = [f"{no_room:,} found no room on {len(tl.nodes):,} nodes at their recorded start"
                     + (" (is the machine size right? --nodes sets it)" if no_room else ""),
                     f"{no_times:,} had no start or end (or ended before they started)",
                     f"{zero:,} ran 0 s (no node-time to replay)", f"{no_size:,} had no size"]
            warnings.append(f"{left:,} of {total:,} log jobs ({100 * left / total:.1f}%) were not replayed, so their "
                            f"nodes count as idle: {'; '.join(parts)}")
        notes.extend(str(x) for x in n.get("log_notes", []))  # type: ignore[attr-defined]
        placed = n.get("log_placement")
        if isinstance(placed, dict):  # which nodes are idle when depends on it: said beside the figures
            notes.append(str(placed["note"]))
        partly = n.get("partly_used_nodes")
        if isinstance(partly, dict) and partly["peak_nodes"]:
            notes.append(f"nodes shared by cores ({int(_f(n['cores_per_node']))} a node): besides the idle and the "
                         f"full ones, up to {int(_f(partly['peak_nodes'])):,} nodes "
                         f"(mean {_f(partly['mean_nodes']):,.1f}, "
                         f"{_f(partly['node_hours']):,.1f} node-h) were partly used by log jobs smaller than a node; "
                         "the pool holds wholly idle nodes only, so their free cores are not harvested")
        empty = n.get("log_empty")
        if isinstance(empty, dict):
            warnings.append(f"sparse log: for {empty['empty_days']:,.1f} of the replayed "
                            f"{empty['span_days']:,.1f} days "
                            f"({empty['stretches']:,} stretch(es) of a week or more, the longest "
                            f"{empty['longest_days']:,.1f} days) no log job runs: the machine replays as idle there, "
                            "and the utilisation mostly measures those stretches (--start picks a start)")
        warm = n.get("warmup")
        if isinstance(warm, dict) and "skipped_from" in warm:
            notes.append(f"warm-up skipped (--skip-warmup): the replay starts at {_utc(tl.start)}, "
                         f"{(tl.start - _f(warm['skipped_from'])) / 3600:.1f} h after the log's first job start, "
                         f"where its use first reaches the typical {_f(warm['typical_busy_nodes']):,.0f} busy nodes")
        elif isinstance(warm, dict) and warm["detected"]:
            warnings.append(
                f"the log starts with the machine nearly empty: for {_f(warm['warmup_hours']):.1f} h from the replay "
                f"start its jobs held {_f(warm['warmup_mean_busy_nodes']):,.0f} nodes on average, against a typical "
                f"{_f(warm['typical_busy_nodes']):,.0f} (time-weighted median over the log). Jobs already running "
                "when the log begins are missing from it, so this stretch replays as a huge idle window. "
                f"--skip-warmup starts where use first reaches the typical level ({_utc(_f(warm['warmup_end']))}); "
                "--start EPOCH picks a start")
    if shift:
        notes.append(f"elastic jobs moved {shift / 86400:+,.1f} days so the first is submitted at the replay start "
                     "(their file's clock misses the log)")
    past, held, over = _f(s["held_past_pmax_node_hours"]), _f(s["used_node_hours"]), _f(s["samples_past_pmax"])
    if past > 1e-6 * held:  # below that it is the rounding of exact completion times
        line = (f"{past:,.1f} of the {held:,.1f} node-h held were held by jobs that had already reached Pmax "
                f"({over:.4g} samples computed past Pmax, {over / max(_f(s['samples']), 1e-300):.2f}x what the jobs "
                "needed): BFTrainer's event rule notices a completion only at the next pool change, and utilisation "
                f"counts those nodes as used. Useful work: {_f(s['useful_node_hours']):,.1f} node-h, useful "
                f"utilisation {_f(s['useful_utilization']):.4f}"
                + ("" if cfg.exact_events else "; --exact-events completes jobs at Pmax"))
        (warnings if past >= 0.05 * held else notes).append(line)
    if cfg.no_pause and _f(s["held_at_minimum"]):
        notes.append(f"--no-pause held {int(_f(s['held_at_minimum'])):,} job(s) at their minimum where the allocator "
                     "would have paused them (summed over decisions; the others were sized again over the rest)")
    bad = res.nonoptimal_by_status
    if bad:
        warnings.append(f"{sum(bad.values()):,} of {int(_f(s['decisions'])):,} allocator decisions were not proven "
                        "optimal: " + "; ".join(f"{k} {v:,} ({NONOPTIMAL_MEANING.get(k, k)})" for k, v in bad.items()))
    if not s["finished"]:
        warnings.append(f"the idle data ran out before every elastic job finished ({s['jobs_done']}/{s['jobs']} "
                        "done): figures cover the replayed span only")
    return notes, warnings


def _float_text(v: float) -> str:
    return f"{v:.6f}".rstrip("0").rstrip(".") or "0"


def _num(v: object) -> object:
    return _float_text(v) if isinstance(v, float) else v


def write_replay(out: Path, res: ReplayResult, meta: dict[str, object]) -> None:
    """jobs.csv + meta.json (the simulator's schema, so ``hpcsched calc`` reads them), events, progress."""
    write_results(out, res.jobs, meta)
    with open(out / EVENTS_FILE, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(EVENT_COLUMNS)
        if isinstance(res.events, EventRows):
            res.events.write_csv(f, _float_text)
        else:
            for row in res.events:
                w.writerow([_num(v) for v in row])
    with open(out / PROGRESS_FILE, "w", newline="") as f:
        per_job = csv.DictWriter(f, fieldnames=["job_id", "samples", "rescales", "preemptions",
                                                "node_seconds_past_pmax"])
        per_job.writeheader()
        per_job.writerows(res.per_job)
