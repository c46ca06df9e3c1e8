"""``hpcsched simulate --compat pollux``: load the artifact's workload, run its loop (``hpcsched.compat.pollux``),
write, summarise.

Writes the results schema (``jobs.csv`` + ``meta.json``: per job its submission, first start, completion, the most
GPUs and nodes it held, and its GPU-seconds held) and ``rounds.csv`` (per 60 s round: busy GPUs, running and
active jobs). Tiresias and Optimus are deterministic; Pollux is seeded (``--seed``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpcsched.compat.pollux import PolluxPolicy, PolluxRun, simulate_pollux
from hpcsched.compat.pollux_ga import ga_search
from hpcsched.results import JobResult, write_csv, write_results

POLICIES = ("tiresias", "optimus", "pollux")
ROUNDS_FILE = "rounds.csv"


def make_policy(name: str, nodes: int, gpus_per_node: int, seed: int = 0, optimiser: str = "ga") -> PolluxPolicy:
    """The ``--compat pollux`` policy ``name``; KeyError naming the known ones otherwise."""
    if name == "tiresias":
        from hpcsched.compat.pollux_baselines import TiresiasPolicy

        return TiresiasPolicy(nodes, gpus_per_node)
    if name == "optimus":
        from hpcsched.compat.pollux_baselines import OptimusPolicy

        return OptimusPolicy(nodes, gpus_per_node)
    if name == "pollux":
        from hpcsched.compat.pollux_ga import PolluxGAPolicy

        pop, generations, stall = ga_search(optimiser)
        return PolluxGAPolicy(nodes, gpus_per_node, seed, pop, generations, stall=stall)
    raise KeyError(f"unknown policy {name!r} for --compat pollux; known: {', '.join(POLICIES)}")


def results_of(run: PolluxRun) -> list[JobResult]:
    """The results schema's records, in workload order."""
    return [JobResult(j.name, j.submission_time, j.first_start, j.completion_time, j.max_gpus, j.max_nodes,
                      j.gpu_seconds, 0.0, "completed" if j.completion_time is not None else "unfinished")
            for j in run.jobs]


def run_pollux_command(trace: Path, cluster: Path, policy: str, out: Path, as_json: bool, seed: int = 0,
                       optimiser: str = "ga") -> dict[str, Any]:
    """Run and write one ``--compat pollux`` simulation; returns (and prints, with ``as_json``) its summary."""
    from hpcsched.cluster_spec import read_cluster_spec
    from hpcsched.goodput import APPLICATIONS
    from hpcsched.metrics import summarize_results
    from hpcsched.traces.pollux import read_pollux_workload

    spec = read_cluster_spec(cluster)
    workload = read_pollux_workload(trace, tuple(APPLICATIONS))
    pol = make_policy(policy, spec.nodes, spec.gpus_per_node, seed, optimiser)
    run = simulate_pollux(workload, pol, spec.nodes, spec.gpus_per_node)
    results = results_of(run)
    meta = run.meta | {"trace": str(trace), "cluster": getattr(spec, "name", None), "capacity_gpus": spec.gpus}
    if policy == "pollux":
        # offspring slots the search left empty because every re-draw was a duplicate (small state spaces)
        meta |= {"seed": seed, "pollux_optimiser": optimiser,
                 "ga_unfilled_offspring": getattr(pol, "duplicates_left", None),
                 # generations searched over all rounds, and the rounds ended early by ga-stall:K (else 0)
                 "ga_generations": getattr(pol, "generations_run", None),
                 "ga_stopped_early_rounds": getattr(pol, "stopped_early", None)}
    write_results(out, results, meta | {"wall_s": round(run.wall_s, 4)})
    write_csv(out / ROUNDS_FILE, ("time", "busy_gpus", "running_jobs", "active_jobs"), run.rounds)
    summary = {"dir": str(out)} | summarize_results(results, meta) | {"rounds": len(run.rounds),
                                                                       "wall_s": run.wall_s,
                                                                       "restarts": run.meta["restarts"]}
    summary |= {k: meta[k] for k in ("compat", "seed", "pollux_optimiser") if k in meta}
    if as_json:
        print(json.dumps(summary))
    return summary
