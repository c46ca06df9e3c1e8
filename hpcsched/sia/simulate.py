"""``simulate --compat sia``: the Sia artifact's round loop over a heterogeneous cluster.

Every round (60 s for Sia, 360 s for its Gavel baseline) each job advances by the round, then the policy
allocates for the next one among the jobs submitted by then and not finished; a job whose GPU type changes
migrates, one whose GPUs per node change on the same type restarts (each round an event of the simulators'
event core, ``hpcsched.primitives.event_core``: ``SiaRounds``). The run ends when every job has
finished. Reads the artifact's workload CSV as it is (``name,time,application,num_replicas,batch_size``)
and a cluster spec listing GPU types (``gpu_type,num_nodes,gpus_per_node``, e.g. ``cluster_spec/saturn.csv``).
The profiles are the artifact's ``traces`` directory (``--profiles``; not shipped: the artifact has no
licence).
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcsched.errors import InputError
from hpcsched.primitives.event_core import EventCore
from hpcsched.sia.job import SiaJob
from hpcsched.sia.profiles import load_profiles

POLICIES = ("sia", "gavel", "pollux")
INTERVALS = {"sia": 60.0, "gavel": 360.0, "pollux": 60.0}
"""The artifact's rounds: Sia and its (heterogeneity-unaware) Pollux baseline re-plan every minute; its Gavel
baseline uses Gavel's 6-minute rounds."""
NCF_BATCH = 32768
"""Sia runs ncf at this fixed batch on one GPU (its profiles stop there); the artifact sets it for Sia."""


@dataclass(frozen=True)
class WorkloadJob:
    name: str
    time: float
    application: str
    num_replicas: int
    batch_size: int


def read_workload(path: Path) -> list[WorkloadJob]:
    """The artifact's workload CSV; a bad row is an InputError naming file and line."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InputError(path, f"cannot read ({e.strerror})") from None
    rows = list(csv.reader(text.splitlines()))
    need = ("name", "time", "application", "num_replicas", "batch_size")
    if not rows or any(c not in rows[0] for c in need):
        raise InputError(path, line=1, message=f"expected the header columns {','.join(need)}")
    col = {c: rows[0].index(c) for c in need}
    jobs = []
    for n, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        try:
            jobs.append(WorkloadJob(row[col["name"]], float(row[col["time"]]), row[col["application"]],
                                    int(row[col["num_replicas"]]), int(row[col["batch_size"]])))
        except (ValueError, IndexError):
            raise InputError(path, line=n, message="expected name,time,application,num_replicas,batch_size") from None
        if jobs[-1].time < 0 or jobs[-1].num_replicas < 1 or jobs[-1].batch_size < 1:
            raise InputError(path, line=n, message="time must be >= 0, num_replicas and batch_size >= 1")
    if not jobs:
        raise InputError(path, "no jobs")
    return jobs


def read_cluster(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """({GPU type: nodes}, {GPU type: GPUs per node}) in file order from a ``gpu_type,num_nodes,gpus_per_node``
    spec."""
    try:
        rows = list(csv.DictReader(Path(path).read_text().splitlines()))
    except OSError as e:
        raise InputError(path, f"cannot read ({e.strerror})") from None
    nodes, gpus = {}, {}
    for n, r in enumerate(rows, start=2):
        try:
            t, nn, g = r["gpu_type"].strip(), int(r["num_nodes"]), int(r["gpus_per_node"])
        except (KeyError, ValueError, TypeError, AttributeError):
            raise InputError(path, line=n, message="expected gpu_type,num_nodes,gpus_per_node") from None
        if nn < 1 or g not in (4, 8) or t in nodes:
            raise InputError(path, line=n, message="num_nodes >= 1, gpus_per_node 4 or 8 (Sia's menus), each type once")
        nodes[t], gpus[t] = nn, g
    if not nodes:
        raise InputError(path, "no GPU types")
    return nodes, gpus


def placement_of(nodes: list[int]) -> tuple[int, ...]:
    """GPUs per node from a node index per GPU (runs of the same node)."""
    out: list[int] = []
    for i, n in enumerate(nodes):
        if i == 0 or n != nodes[i - 1]:
            out.append(1)
        else:
            out[-1] += 1
    return tuple(out)


class SiaRounds:
    """The artifact's round loop as a strategy of the event core (``hpcsched.primitives.event_core``): a round
    event every ``interval`` s while a job is unfinished; at each, every job advances by the round and the
    policy allocates among the jobs submitted by then and not finished."""

    def __init__(self, jobs: list[SiaJob], sched: Any, interval: float,
                 on_round: Callable[[float, list[SiaJob]], None] | None) -> None:
        self.jobs, self.sched, self.interval, self.on_round = jobs, sched, interval, on_round
        self.rounds = 0
        self.allocations: dict[str, tuple[str | None, list[int]]] = {}

    def next_round(self, t: float) -> float | None:
        """The round ending at ``t + interval`` (the event is at the round's end, when the policy decides)."""
        return t + self.interval if not self.done() else None

    def done(self) -> bool:
        return all(j.completion_time is not None for j in self.jobs)

    def handle(self, now: float, event: object) -> None:
        for j in self.jobs:
            j.step(self.interval)
        self.rounds += 1
        active = [j for j in self.jobs if j.submission_time <= now and j.completion_time is None]
        if not active:
            return
        allocations = {k: v for k, v in self.allocations.items() if any(k == j.name for j in active)}
        new = self.sched.optimize(active, now)
        for j in active:
            j.contention.append(len(active))
            got = new.get(j.name)
            if got == allocations.get(j.name):
                continue
            gpu_type, alloc = got if got is not None else (None, [])
            placement = placement_of(list(alloc))
            if j.current_cluster != gpu_type:
                j.migrate(gpu_type, placement)
            else:
                j.reallocate(placement)
        self.allocations = new
        if self.on_round is not None:
            self.on_round(now, active)


def run(workload: list[WorkloadJob], nodes: dict[str, int], gpus_per_node: dict[str, int], policy: str,
        profiles_dir: str, solver: str = "highs", on_round: Callable[[float, list[SiaJob]], None] | None = None,
        tie_break: str = "prev-high", tie_seed: int = 0, share_fits: bool = True, seed: int = 0,
        pollux_search: tuple[int, int] = (100, 100)) -> dict[str, Any]:
    """Simulate to the end; the summary (``avg_jct`` ...) and per-job rows. ``tie_break``/``tie_seed``: how Sia's
    program chooses among equally good optima (``hpcsched.sia.policy.SiaPolicy``). ``share_fits``: jobs that saw the
    same observations in the same order share one model fit (the same result, fewer fits). ``seed`` and
    ``pollux_search`` (population, generations): the pollux policy's search (``hpcsched.sia.pollux_unaware``)."""
    if policy not in POLICIES:
        raise InputError(None, f"--compat sia runs --policy {' or '.join(POLICIES)}, not {policy!r}")
    from hpcsched.sia.blas import limit_blas_threads
    from hpcsched.sia.gavel import GavelBaseline
    from hpcsched.sia.policy import SiaPolicy

    blas_libs = limit_blas_threads(1)
    types = tuple(nodes)
    profiles = load_profiles(str(profiles_dir), types, tuple(sorted({w.application for w in workload})))
    sia = policy == "sia"
    adaptive = policy in ("sia", "pollux")  # tunes batch sizes from a learned model (Gavel: fixed, no model)
    fit_cache: dict[tuple, Any] = {}
    jobs = [SiaJob(name=w.name, app=w.application, submission_time=w.time, apps=profiles[w.application],
                   target_num_replicas=w.num_replicas,
                   target_batch_size=NCF_BATCH if adaptive and w.application == "ncf" else w.batch_size,
                   tune_bsz=adaptive, fit_models=adaptive, unaware=policy == "pollux",
                   fit_cache=fit_cache if share_fits else None) for w in workload]
    sched: Any
    if policy == "pollux":
        from hpcsched.sia.pollux_unaware import UnawarePollux

        sched = UnawarePollux(nodes, gpus_per_node, seed=seed, pop_size=pollux_search[0], n_gen=pollux_search[1])
    elif sia:
        sched = SiaPolicy(nodes, gpus_per_node, dict(nodes), tie_break=tie_break, tie_seed=tie_seed)
    else:
        sched = GavelBaseline(nodes, gpus_per_node, solver=solver)
    interval = INTERVALS[policy]
    t0 = time.perf_counter()
    loop = SiaRounds(jobs, sched, interval, on_round)
    core = EventCore()
    core.start_rounds(loop.next_round(0.0))
    core.run(loop)
    rounds = loop.rounds
    wall = time.perf_counter() - t0
    done = {j.name: float(j.completion_time or 0.0) for j in jobs}  # every job has finished by now
    jct = {j.name: done[j.name] - j.submission_time for j in jobs}
    vals = sorted(jct.values())
    rows: list[dict[str, Any]] = [{"name": j.name, "application": j.app, "submission_time": j.submission_time,
             "completion_time": j.completion_time, "jct": jct[j.name], "restarts": j.num_restarts or 0,
             "gpu_seconds": {t: round(v, 3) for t, v in sorted(j.gpu_seconds.items())}} for j in jobs]
    gpu_s = sum(j.attained_service for j in jobs)  # allocated GPU-seconds, restore pauses included
    return {"policy": policy, "compat": "sia", "tie_break": tie_break if sia else None,
            "seed": seed if policy == "pollux" else None,
            "pollux_search": list(pollux_search) if policy == "pollux" else None, "jobs": len(jobs),
            "avg_jct": sum(vals) / len(vals),
            "p99_jct": vals[int(0.99 * len(vals))], "makespan": max(done.values()) -
            min(j.submission_time for j in jobs), "avg_restarts": sum(r["restarts"] for r in rows) / len(rows),
            "rounds": rounds, "round_s": interval, "gpu_hours_per_job": gpu_s / 3600 / len(jobs),
            "model_fits": sum(j.fits for j in jobs), "model_fits_reused": sum(j.fit_reuses for j in jobs),
            "solver": {k: round(v, 4) if isinstance(v, float) else v for k, v in sched.stats.items()},
            "blas_single_threaded": blas_libs, "wall_s": round(wall, 3), "per_job": rows}


def write_out(summary: dict[str, Any], out: Path) -> None:
    """``summary.json`` and ``jobs.csv`` (one row per job) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "per_job"}, indent=2)
                                      + "\n")
    with open(out / "jobs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "application", "submission_time", "completion_time", "jct", "restarts"])
        for r in summary["per_job"]:
            w.writerow([r["name"], r["application"], r["submission_time"], r["completion_time"], r["jct"],
                        r["restarts"]])


def simulate_command(trace: Path, cluster: Path, policy: str, out: Path | None, as_json: bool,
                     profiles: Path | None, solver: str = "auto", seed: int = 0, optimiser: str = "ga") -> int:
    """``hpcsched simulate --compat sia``: run, write ``out`` (if given), print the summary; the exit code
    (2 on bad input, with one line naming the file and line)."""
    import sys
    from importlib.util import find_spec

    try:
        if profiles is None:
            raise InputError(None, "--compat sia needs --profiles DIR: the Sia artifact's sia-simulator/traces "
                                   "directory (its profiles have no licence, so they are not shipped)")
        if find_spec("scipy") is None:
            raise InputError(None, "--compat sia needs scipy (its profile interpolation and model fit): "
                             "pip install 'hpcsched[goodput]'")
        lp_solver, note = "highs", None
        if policy == "gavel":
            from hpcsched.hetero.simulate import SOLVERS, resolve_solver

            if solver not in SOLVERS:
                raise InputError(None, f"--solver {solver!r}: known {', '.join(SOLVERS)}")
            lp_solver, note = resolve_solver(solver, "max-sum-throughput-perf")
        elif solver != "auto":
            raise InputError(None, "--solver is for --policy gavel's LP (Sia's integer program is always HiGHS)")
        if (seed != 0 or optimiser != "ga") and policy != "pollux":
            raise InputError(None, "--seed/--pollux-optimiser are for --policy pollux")
        from hpcsched.compat.pollux_ga import ga_budget

        try:
            search = ga_budget(optimiser)
        except KeyError as e:
            raise InputError(None, str(e.args[0])) from None
        if note:
            print(f"note: {note}", file=sys.stderr)
        nodes, gpus = read_cluster(cluster)
        summary = run(read_workload(trace), nodes, gpus, policy, str(profiles), solver=lp_solver, seed=seed,
                      pollux_search=search)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary["lp_solver"] = {"gavel": lp_solver, "sia": "highs-mip"}.get(policy)
    if out is not None:
        write_out(summary, out)
    shown = {k: v for k, v in summary.items() if k != "per_job"}
    if as_json:
        print(json.dumps(shown))
    else:
        print(f"{policy} (--compat sia) on {Path(trace).name}: {summary['jobs']} jobs, avg JCT "
              f"{summary['avg_jct']:.1f} s, p99 {summary['p99_jct']:.0f} s, makespan {summary['makespan']:.0f} s, "
              f"{summary['avg_restarts']:.2f} restarts/job, {summary['rounds']} rounds, {summary['wall_s']:.1f} s wall")
    return 0
