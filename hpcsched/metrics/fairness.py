"""Fairness and accounting of one results table: finish-time fairness, Jain's index, per-entity GPU-hours
and cost; the isolated baselines rho is measured against.

Each figure needs inputs a results table may not hold; a figure whose inputs are missing is left out and its
reason is given under ``unavailable`` (metric -> reason), never computed from a guessed default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcsched.metrics import np_percentile

if TYPE_CHECKING:
    import pandas as pd

    from hpcsched.model import Job


NAN = float("nan")


FAIRNESS_UNITS = {
    "ftf_rho_max": "JCT / baseline JCT, worst job",
    "ftf_rho_p50": "interpolated",
    "ftf_rho_p90": "interpolated",
    "ftf_rho_p99": "interpolated",
    "ftf_rho_mean": "",
    "ftf_jobs": "finished in both runs",
    "ftf_unmatched": "jobs without a rho",
    "jain_share": "1 = equal shares",
    "gpu_hours": "GPU-h held",
    "cost": "GPU-h x price",
}


def _jain(xs: Sequence[float]) -> float:
    """Jain's index (sum x)^2 / (n sum x^2): 1 when all x are equal, 1/n when one job gets everything."""
    sq = math.fsum(x * x for x in xs)
    return math.fsum(xs) ** 2 / (len(xs) * sq) if sq > 0 else NAN


def parse_prices(text: str) -> dict[str | None, float]:
    """``--price``: one number (the price of every GPU-hour) or ``type=price,...`` (per GPU type), in money
    per GPU-hour. The one-number form is keyed None."""
    out: dict[str | None, float] = {}
    try:
        if "=" not in text:
            out[None] = float(text)
        else:
            for part in text.split(","):
                name, _, value = part.partition("=")
                if not name.strip():
                    raise ValueError(part)
                out[name.strip().lower()] = float(value)
    except ValueError:
        raise ValueError(f"--price {text!r}: give a number per GPU-hour or type=number,... (v100=2.48,k80=0.45)") \
            from None
    if any(not (p >= 0 and math.isfinite(p)) for p in out.values()):
        raise ValueError(f"--price {text!r}: prices must be finite numbers >= 0")
    return out


def _cluster_prices(meta: Mapping[str, Any]) -> tuple[dict[str | None, float] | None, list[str]]:
    """Prices and GPU types from a heterogeneous cluster string in meta.json (``v100=8@2.48,...``), if any."""
    cluster = meta.get("cluster")
    if not isinstance(cluster, str):
        return None, []
    from hpcsched.primitives.hetero_cluster import looks_hetero, parse_hetero_cluster

    if not looks_hetero(cluster):
        return None, []
    try:
        c = parse_hetero_cluster(cluster)
    except ValueError:
        return None, []
    types = list(c.types)
    if all(p is not None for p in c.prices):
        return {t: float(p) for t, p in zip(c.types, c.prices, strict=True) if p is not None}, types
    return None, types


def fairness_metrics(
    df: pd.DataFrame,
    meta: Mapping[str, Any],
    baseline: pd.DataFrame | Mapping[str, float] | None = None,
    baseline_name: str | None = None,
    entities: Mapping[str, str] | None = None,
    entity_source: str | None = None,
    prices: Mapping[str | None, float] | None = None,
    baseline_unavailable: str | None = None,
) -> dict[str, Any]:
    """Finish-time fairness, Jain's index of shares, GPU-hours and cost per entity, of one results table.

    - ``ftf_rho_*``: a job's rho is its JCT in this run over its JCT in ``baseline`` (matched by job id),
      as Gavel computes finish-time fairness: against the run of its ``isolated`` policy, where each job
      has 1/N of the cluster (Themis's rho: shared-cluster time / time alone on 1/N of the cluster).
      ``baseline`` is that run's jobs table, or its JCTs by job id (``isolated_jcts``). The results hold
      no job's time alone, so without a baseline there is no rho. Jobs unfinished in either run, or
      missing from the baseline, have none: ``ftf_unmatched`` counts them.
    - ``jain_share``: Jain's index over finished jobs of the share each received, resource-seconds held /
      (its size x its JCT) (GPUs if the run has GPU-seconds, else nodes; ``nodes`` is the largest size an
      elastic job ran at): 1 when every job held its request for the same fraction of its time in the system.
    - ``gpu_hours_by_entity`` / ``cost_by_entity``: GPU-seconds held per user or project, from a ``user`` or
      ``project`` column of jobs.csv, else ``entities`` (job id -> name, e.g. users read from the trace).
      ``cost``: GPU-hours x price; one price for every GPU-hour, or a price per GPU type, which needs
      per-type GPU-seconds (``gpu_seconds_<type>`` columns) unless the run has one GPU type. Prices come
      from ``prices`` or from the run's heterogeneous cluster string (``v100=8@2.48,...``).
    """
    out: dict[str, Any] = {}
    why: dict[str, str] = {}
    ids = [str(x) for x in df["job_id"].tolist()]
    submit, end = df["submit"].tolist(), df["end"].tolist()
    finished = {i: float(e - s) for i, s, e in zip(ids, submit, end, strict=True) if e == e}

    # finish-time fairness
    if baseline is None:
        why["ftf_rho"] = baseline_unavailable or (
            "no baseline: rho = a job's JCT / its JCT with 1/N of the cluster (Gavel's isolated policy), which "
            "jobs.csv does not hold; give --isolated fluid (computed from the trace) or --isolated DIR (a run)")
    else:
        if isinstance(baseline, Mapping):
            base = {str(i): float(v) for i, v in baseline.items()}
        else:
            b_end, b_submit = baseline["end"].tolist(), baseline["submit"].tolist()
            base = {str(i): float(e - s) for i, s, e in zip(baseline["job_id"].tolist(), b_submit, b_end,
                                                             strict=True) if e == e}
        rho = {i: jct / base[i] for i, jct in finished.items() if i in base and base[i] > 0}
        out["ftf_baseline"] = baseline_name
        out["ftf_jobs"] = len(rho)
        out["ftf_unmatched"] = len(ids) - len(rho)
        if rho:
            values = sorted(rho.values())
            worst = max(rho, key=lambda i: (rho[i], i))
            out |= {"ftf_rho_max": values[-1], "ftf_rho_worst_job": worst,
                    "ftf_rho_p50": np_percentile(values, 50), "ftf_rho_p90": np_percentile(values, 90),
                    "ftf_rho_p99": np_percentile(values, 99), "ftf_rho_mean": math.fsum(values) / len(values)}
        else:
            why["ftf_rho"] = f"no job finished in both this run and the baseline {baseline_name}"

    # Jain's index of shares
    gpu_s = df["gpu_seconds"].tolist() if "gpu_seconds" in df.columns else None
    uses_gpus = gpu_s is not None and any(v > 0 for v in gpu_s if v == v)
    held_col, size_col = ("gpu_seconds", "gpus") if uses_gpus else ("node_seconds", "nodes")
    if held_col not in df.columns or size_col not in df.columns:
        why["jain_share"] = f"jobs.csv has no {held_col} or {size_col} column"
    else:
        held, size = df[held_col].tolist(), df[size_col].tolist()
        shares = [h / (n * (e - s)) for h, n, s, e in zip(held, size, submit, end, strict=True)
                  if e == e and e > s and n == n and n > 0 and h == h]
        if shares:
            out["jain_share"] = _jain(shares)
            out["jain_jobs"] = len(shares)
        else:
            why["jain_share"] = f"no finished job with a {size_col} size > 0 and a JCT > 0"

    # GPU-hours and cost, in total and per entity
    if not uses_gpus:
        for k in ("gpu_hours_by_entity", "cost"):
            why[k] = "the run holds no GPU-seconds (node-sized jobs)"
        return out | ({"unavailable": why} if why else {})
    hours = [0.0 if v != v else v / 3600.0 for v in (gpu_s or [])]
    out["gpu_hours"] = math.fsum(hours)
    names: list[str | None] | None = None
    for col in ("user", "project"):
        if col in df.columns:
            names = [None if (v != v or v is None or str(v) == "") else str(v) for v in df[col].tolist()]
            out["entity"], out["entity_source"] = col, "jobs.csv"
            break
    if names is None and entities is not None:
        names = [entities.get(i) for i in ids]
        out["entity"], out["entity_source"] = "user", entity_source
    if names is None:
        why["gpu_hours_by_entity"] = ("jobs.csv has no user or project column; give the trace with --trace FILE to "
                                      "take each job's user from it")
    elif all(n is None for n in names):
        why["gpu_hours_by_entity"] = f"no job has a {out['entity']} in {out['entity_source']}"
        names = None

    cost_hours = _cost_hours(df, meta, prices, hours, why)
    if cost_hours is not None:
        out["cost"] = math.fsum(cost_hours)
        out["price_per_gpu_hour"] = {("*" if k is None else k): v for k, v in (prices or {}).items()} or \
            {k: v for k, v in (_cluster_prices(meta)[0] or {}).items()}
    if names is not None:
        by: dict[str, list[float]] = {}
        cost_by: dict[str, list[float]] = {}
        unknown = 0
        for i, (n, h) in enumerate(zip(names, hours, strict=True)):
            if n is None:
                unknown += 1
                continue
            by.setdefault(n, []).append(h)
            if cost_hours is not None:
                cost_by.setdefault(n, []).append(cost_hours[i])
        out["gpu_hours_by_entity"] = {n: math.fsum(v) for n, v in sorted(by.items())}
        out["entity_unknown_jobs"] = unknown
        if cost_hours is not None:
            out["cost_by_entity"] = {n: math.fsum(v) for n, v in sorted(cost_by.items())}
        if len(by) > 1:
            out["jain_entity_gpu_hours"] = _jain([math.fsum(v) for v in by.values()])
    return out | ({"unavailable": why} if why else {})


def _cost_hours(df: pd.DataFrame, meta: Mapping[str, Any], prices: Mapping[str | None, float] | None,
                hours: list[float], why: dict[str, str]) -> list[float] | None:
    """Each job's cost (GPU-hours x price of the type it held), or None with the reason put in ``why``."""
    meta_prices, types = _cluster_prices(meta)
    p = dict(prices) if prices else meta_prices
    if not p:
        why["cost"] = ("no price per GPU-hour: give --price P (every GPU-hour) or --price TYPE=P,... (or run on a "
                       "cluster string with @price)")
        return None
    if None in p:
        return [h * p[None] for h in hours]
    per_type = {t: f"gpu_seconds_{t}" for t in p}
    have = [c for c in per_type.values() if c in df.columns]
    if have:
        extra = [c for c in df.columns if str(c).startswith("gpu_seconds_") and c not in per_type.values()]
        if extra:
            why["cost"] = f"no price for {', '.join(str(c)[len('gpu_seconds_'):] for c in extra)} (--price)"
            return None
        cols = {t: [0.0 if v != v else v / 3600.0 for v in df[c].tolist()] for t, c in per_type.items() if c in have}
        split = [math.fsum(cols[t][k] for t in cols) for k in range(len(hours))]
        if any(abs(a - h) > 1e-6 * max(1.0, h) for a, h in zip(split, hours, strict=True)):
            why["cost"] = "the gpu_seconds_<type> columns do not add up to gpu_seconds for every job"
            return None
        return [math.fsum(cols[t][k] * p[t] for t in cols) for k in range(len(hours))]
    if len(types) == 1 and types[0] in p:
        return [h * p[types[0]] for h in hours]
    why["cost"] = ("prices per GPU type need each job's GPU-seconds per type (gpu_seconds_<type> columns), which "
                   f"jobs.csv does not have{' for a cluster of ' + ', '.join(types) if types else ''}; give one "
                   "price with --price P if every GPU-hour costs the same")
    return None


def entities_from_trace(path: str | Path) -> dict[str, str]:
    """Job id -> user, read from a job trace with the project's readers (jobs without a user are left out)."""
    from hpcsched.traces import read_jobs

    return {j.id: j.user for j in read_jobs(path) if j.user}


def solo_seconds(job: Job) -> float:
    """Seconds ``job`` takes alone on its GPUs at the simulator's speed: iterations x iteration time (else its
    duration) x the 1.015 solo factor of ``hpcsched.primitives.speed``, restarts left out (Gavel's isolated
    throughput has none). The rule is ``hpcsched.sim.jobrun.iterations_of``'s, which this module may not import
    (tests/test_architecture.py: only the simulation tools depend on the simulator)."""
    from hpcsched.primitives.speed import SOLO_FACTOR

    if job.iterations and job.iterations > 0 and job.iteration_time and job.iteration_time > 0:
        return job.iterations * job.iteration_time * SOLO_FACTOR
    if job.duration is not None and job.duration > 0:
        return job.duration * SOLO_FACTOR
    raise ValueError(f"job {job.id}: no iterations with an iteration time, and no duration: no solo time")


def isolated_jcts(jobs: Sequence[Job], capacity_gpus: float) -> dict[str, float]:
    """Each job's JCT under Gavel's isolated policy, as a fluid: while m jobs are in the system each runs at
    min(1, C / (m g)) of its solo speed (1/m of the C GPUs, at most its own g; Gavel's ``IsolatedPolicy``
    for one GPU type), from its submit time until its solo work (``solo_seconds``) is done.

    Gavel gets this from a separate simulation in 360-s rounds; the fluid is that allocation's limit (no
    rounds, no restarts), so rho against it measures the policy, not the rounding.
    """
    import numpy as np

    if not capacity_gpus > 0:
        raise ValueError(f"capacity must be > 0 GPUs, got {capacity_gpus!r}")
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].submit, i))
    submit = [float(jobs[i].submit) for i in order]
    gpus = np.array([max(jobs[i].gpus, 1) for i in order], dtype=float)
    work = np.array([solo_seconds(jobs[i]) for i in order])
    jct = fluid_share_jcts(submit, work, gpus, np.ones(len(order)), capacity_gpus)
    return {jobs[i].id: jct[k] for k, i in enumerate(order)}


def fluid_share_jcts(submit: Sequence[float], work: Any, gpus: Any, full_speed: Any, capacity: float) -> list[float]:
    """JCTs of jobs (sorted by ``submit``) that share ``capacity`` GPUs equally while they are in the system:
    each runs at min(1, C / (m g)) x its ``full_speed`` (work units per second with all it asks for) until its
    ``work`` is done. The fluid behind Gavel's isolated policy, for one GPU type (``isolated_jcts``: speed 1,
    work in solo seconds) or several (speed: the job's throughput averaged over the types' shares). One numpy
    step over the jobs in the system per arrival or completion."""
    import numpy as np

    work = np.array(work, dtype=float)
    gpus = np.asarray(gpus, dtype=float)
    full_speed = np.asarray(full_speed, dtype=float)
    end = np.full(len(submit), np.nan)
    active = np.zeros(0, dtype=np.int64)
    t, nxt, n = (submit[0] if len(submit) else 0.0), 0, len(submit)
    while nxt < n or len(active):
        while nxt < n and submit[nxt] <= t:
            active = np.append(active, nxt)
            nxt += 1
        if not len(active):
            t = submit[nxt]
            continue
        rate = np.minimum(1.0, capacity / (len(active) * gpus[active])) * full_speed[active]
        finish = work[active] / rate
        dt = float(finish.min())
        if nxt < n and submit[nxt] - t < dt:  # an arrival comes first: progress up to it
            dt = submit[nxt] - t
            work[active] -= rate * dt
            t = submit[nxt]
            continue
        done = finish <= dt * (1 + 1e-12)
        work[active] -= rate * dt
        t += dt
        end[active[done]] = t
        active = active[~done]
    return [float(end[k] - submit[k]) for k in range(n)]
