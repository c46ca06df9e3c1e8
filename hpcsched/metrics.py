"""Job completion time, percentiles, makespan and utilisation from a results table; JCT CDF plots.

Definitions are chosen for comparability with the peers:
- ``p99_jct`` is Muri's ``sorted(jct)[int(0.99 * n)]``; ``p99_jct_interp`` the interpolated one.
- ``makespan`` is the last end minus the first submit (``span`` is the same figure, kept under its old
  name), so it means the same for every trace; ``last_end`` and ``first_submit`` are the absolute times
  behind it. Muri's simulator reports its last end time as the makespan; on its traces (first submit
  0) the two agree, and ``hpcsched.report.published`` compares with Muri's definition where they do not.
  Before this, ``makespan`` was the last end time, which for a trace with calendar times (Philly, an
  idle log) is an epoch timestamp, not a duration.
- ``utilization`` is resource-seconds held / (capacity x span), GPUs if the run has GPUs, else nodes;
  a run whose capacity varies (harvesting) gives ``capacity_node_seconds`` in its metadata instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from hpcsched.model import Job
    from hpcsched.results import JobResult

# numpy and pandas are imported only where a frame or a plot is handled: `hpcsched simulate` summarises its run
# from the job records (``summarize_results``) and must not pay for importing them (issue 14).

SUMMARY_KEYS = ("jobs", "avg_jct", "p50_jct", "p95_jct", "p99_jct", "makespan", "utilization")
# Facts a run records in meta.json that no jobs table can recompute (harvesting, preemption); shown as they are.
_META_PASSTHROUGH = ("policy", "trace", "cluster", "tool", "harvested_node_hours", "preemptions", "max_lost_steps")
# The jobs-table columns the summary reads.
_NUMERIC = ("submit", "start", "end", "gpus", "nodes", "gpu_seconds", "node_seconds")
_NAN = float("nan")


def muri_percentile(sorted_values: Sequence[float], q: float) -> float:
    """Muri's percentile: the element at index int(q * n) of the sorted values (clamped)."""
    n = len(sorted_values)
    return float(sorted_values[min(int(q * n), n - 1)])


def summarize(df: pd.DataFrame, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The summary every tool prints; keys in ``SUMMARY_KEYS`` are a contract.

    ``df`` is a jobs table (``hpcsched.results.read_results``). The figures are computed by the same code as
    ``summarize_results`` (job records, no pandas), so a run's summary is the same whichever way it is read.
    """
    cols = {}
    for c in _NUMERIC:
        if c in df.columns:
            values, missing = df[c].tolist(), df[c].isna().tolist()
            cols[c] = [_NAN if m else v for v, m in zip(values, missing, strict=True)]
    return _summarize(cols, len(df), meta or {})


def summarize_results(results: Iterable[JobResult], meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``summarize`` of the jobs table these records would make, without building it (or importing pandas).

    What ``hpcsched simulate`` prints; the same numbers, to the last bit, as ``summarize`` of the table read
    back from the files it writes.
    """
    rows = list(results)
    cols = {c: [_NAN if (v := getattr(r, c)) is None else v for r in rows] for c in _NUMERIC}
    return _summarize(cols, len(rows), meta or {})


def _summarize(cols: Mapping[str, list[Any]], n: int, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The summary of a jobs table given as columns (a missing value is NaN).

    Every figure is computed as numpy and pandas compute it (``_np_sum``'s summation order, numpy's median
    and linear percentile, pandas' NaN-skipping sums and means), not merely to the same precision: these
    numbers were printed and stored with pandas before, and a run's figures must not move by a last bit
    because the code that prints them no longer imports it.
    """
    submit, start, end = cols["submit"], cols["start"], cols["end"]
    done = [i for i in range(n) if end[i] == end[i]]
    jct = [float(end[i] - submit[i]) for i in done]
    out: dict[str, Any] = {"jobs": len(done), "unfinished": n - len(done)}
    if jct:
        jct = _np_sort(jct)
        nan = jct[-1] != jct[-1]  # numpy's median and percentile of data holding a NaN are NaN
        out |= {
            "avg_jct": _np_sum(jct) / len(jct),
            "p50_jct": _NAN if nan else _np_median(jct),
            "p95_jct": muri_percentile(jct, 0.95),
            "p99_jct": muri_percentile(jct, 0.99),
            "p99_jct_interp": _NAN if nan else _np_percentile(jct, 99),
            "max_jct": jct[-1],
        }
    else:
        out |= {k: None for k in ("avg_jct", "p50_jct", "p95_jct", "p99_jct", "p99_jct_interp", "max_jct")}
    started = [i for i in range(n) if start[i] == start[i]]
    out["avg_queue"] = _nanmean([start[i] - submit[i] for i in started]) if started else None
    ends = [end[i] for i in done]
    last_end = float(max(ends)) if ends else None
    submits = [v for v in submit if v == v]
    first_submit = (float(min(submits)) if submits else _NAN) if n else None
    span = last_end - first_submit if last_end is not None and first_submit is not None else None
    out["makespan"] = span
    out["span"] = span
    out["first_submit"] = first_submit
    out["last_end"] = last_end
    out["utilization"] = _utilization(cols, n, meta, span)
    for k in _META_PASSTHROUGH:
        if k in meta:
            out[k] = meta[k]
    return out


def _utilization(cols: Mapping[str, list[Any]], n: int, meta: Mapping[str, Any], span: float | None) -> float | None:
    if meta.get("capacity_node_seconds"):
        return float(_nansum(cols.get("node_seconds", []))) / float(meta["capacity_node_seconds"])
    if not span:
        return None
    for held, cap, size in (("gpu_seconds", "capacity_gpus", "gpus"), ("node_seconds", "capacity_nodes", "nodes")):
        capacity = meta.get(cap)
        if capacity and held in cols and _nansum(cols[held]) > 0:
            return float(_nansum(cols[held])) / (float(capacity) * span)
        if capacity and size in cols and _nansum(cols[size]) > 0:  # no held-time column: assume start..end
            start, end, sizes = cols["start"], cols["end"], cols[size]
            held_s = [sizes[i] * (end[i] - start[i]) for i in range(n) if end[i] == end[i] and start[i] == start[i]]
            return float(_nansum(held_s)) / (float(capacity) * span)
    return None


def _np_sum(values: Sequence[Any]) -> Any:
    """``numpy.add.reduce`` of a float64 array, in numpy's own order (pairwise: blocks of up to 128 values
    summed in 8 interleaved partial sums, larger runs split in two at a multiple of 8), so that the result
    equals numpy's to the last bit; Python's left-to-right ``sum`` differs in the last digits."""
    return 0.0 + _pairwise(values, 0, len(values))


def _pairwise(a: Sequence[Any], lo: int, n: int) -> Any:
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= 128:
        r0, r1, r2, r3, r4, r5, r6, r7 = a[lo:lo + 8]
        stop = lo + n - n % 8
        for i in range(lo + 8, stop, 8):
            r0 += a[i]
            r1 += a[i + 1]
            r2 += a[i + 2]
            r3 += a[i + 3]
            r4 += a[i + 4]
            r5 += a[i + 5]
            r6 += a[i + 6]
            r7 += a[i + 7]
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for i in range(stop, lo + n):
            res += a[i]
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(a, lo, n2) + _pairwise(a, lo + n2, n - n2)


def _nansum(values: Sequence[Any]) -> Any:
    """pandas' ``Series.sum()``: NaNs replaced by 0 in place, then numpy's sum."""
    return _np_sum([0.0 if v != v else v for v in values])


def _nanmean(values: Sequence[Any]) -> float:
    """pandas' ``Series.mean()``: the NaN-skipping float64 sum (integers too) over the count of non-NaN values
    (NaN if none)."""
    count = sum(1 for v in values if v == v)
    return _np_sum([0.0 if v != v else float(v) for v in values]) / count if count else _NAN


def _np_sort(values: list[float]) -> list[float]:
    """``numpy.sort``: ascending, NaNs last."""
    nans = [v for v in values if v != v]
    return sorted(v for v in values if v == v) + nans if nans else sorted(values)


def _np_median(sorted_values: Sequence[float]) -> float:
    """``numpy.median`` of sorted values: the middle one, or numpy's mean of the middle two."""
    n = len(sorted_values)
    h = n // 2
    return _np_sum(sorted_values[h:h + 1]) / 1 if n % 2 else _np_sum(sorted_values[h - 1:h + 1]) / 2


def _np_percentile(sorted_values: Sequence[float], q: float) -> float:
    """``numpy.percentile(values, q)`` (method 'linear') of sorted values, with numpy's interpolation."""
    n = len(sorted_values)
    virtual = (n - 1) * (q / 100)
    if virtual >= n - 1:
        return float(sorted_values[-1])
    below = math.floor(virtual)
    a, b = float(sorted_values[below]), float(sorted_values[below + 1])
    gamma = virtual - below
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


# The unit (and, where the name alone misleads, the definition) of each summary key, for tables.
METRIC_UNITS = {
    "jobs": "finished",
    "unfinished": "jobs",
    "avg_jct": "s",
    "p50_jct": "s",
    "p95_jct": "s, Muri's index",
    "p99_jct": "s, Muri's index",
    "p99_jct_interp": "s, interpolated",
    "max_jct": "s",
    "makespan": "s, from first submit",
    "span": "s, = makespan",
    "first_submit": "s, trace clock",
    "last_end": "s, trace clock",
    "avg_queue": "s",
    "utilization": "of capacity x span",
}


# Run facts that can tell two runs of one policy apart, most telling first (paths are shown by stem).
_LABEL_KEYS = ("trace", "cluster", "compat", "arrival_scale", "restart_s", "jobs_file", "tfwd", "objective",
               "accounting", "max_jobs", "time_limit", "predict_tfwd", "exact_events", "seed")
_PATH_KEYS = ("trace", "cluster", "jobs_file", "dir")


def _stem(value: object) -> str:
    name = str(value).rstrip("/").rsplit("/", 1)[-1]
    for suffix in (".gz", ".csv", ".swf", ".yaml", ".yml"):
        name = name.removesuffix(suffix)
    return name


def _label_bit(key: str, value: object) -> str:
    if key in ("trace", "cluster"):
        return _stem(value) if value is not None else f"{key} unknown"
    if key in _PATH_KEYS:
        return f"{key}={_stem(value)}"
    if key == "compat" and value is None:
        return "compat=default"
    return f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"


def run_labels(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """One label per run, distinct wherever runs share a policy name.

    ``runs`` are meta.json mappings, each with ``dir`` where known. A run is labelled by its policy
    (else its directory's name); runs sharing one get, in brackets, the facts that differ between them
    (trace, cluster, compat mode, a parameter), else their directory names, else a number, so three
    replays of ``bftrainer-highs`` in one table or legend are never three identical columns or lines.
    """
    base = [str(r.get("policy") or _stem(r.get("dir") or "") or f"run {i + 1}") for i, r in enumerate(runs)]
    labels = list(base)
    groups: dict[str, list[int]] = {}
    for i, b in enumerate(base):
        groups.setdefault(b, []).append(i)
    for b, idx in groups.items():
        if len(idx) < 2:
            continue
        bits: dict[int, list[str]] = {i: [] for i in idx}
        for key in _LABEL_KEYS:
            values = [_label_bit(key, runs[i].get(key)) for i in idx]
            if len(set(values)) > 1:
                for i, v in zip(idx, values, strict=True):
                    bits[i].append(v)
                if _distinct(bits):
                    break
        if not _distinct(bits):  # the same run twice, or facts meta.json does not hold: fall back to the folder
            dirs = [str(runs[i].get("dir") or "") for i in idx]
            names = [_stem(d) for d in dirs]
            for i, name, d in zip(idx, names, dirs, strict=True):
                bits[i].append(name if len(set(names)) == len(names) else d)
        if not _distinct(bits):
            for k, i in enumerate(idx):
                bits[i].append(f"#{k + 1}")
        for i in idx:
            labels[i] = f"{b} ({', '.join(x for x in bits[i] if x)})"
    return labels


def _distinct(bits: Mapping[int, list[str]]) -> bool:
    return len({tuple(b) for b in bits.values()}) == len(bits)


def _names(values: Sequence[str], most: int = 4) -> str:
    unique = list(dict.fromkeys(values))
    if len(unique) <= most:
        return ", ".join(unique)
    return f"{', '.join(unique[:most - 1])} and {len(unique) - most + 1} more"


def runs_subject(runs: Sequence[Mapping[str, Any]]) -> str:
    """'trace3 on n8g8 (64 GPUs), compat=muri': what a set of runs ran on, for plot and table titles.

    A reader of a figure cut out of its context must still see which trace and cluster it shows; a
    fact meta.json does not hold is written as unknown rather than left out.
    """
    traces = _names([_stem(r["trace"]) if r.get("trace") else "trace unknown" for r in runs])
    clusters = []
    for r in runs:
        name = str(r.get("cluster") or "cluster unknown")
        gpus = r.get("capacity_gpus")
        clusters.append(f"{name} ({gpus} GPUs)" if gpus and "GPU" not in name else name)
    text = f"{traces} on {_names(clusters)}"
    if any(r.get("compat") for r in runs):  # the default mode is named only beside another one
        text += f", compat={'/'.join(dict.fromkeys(str(r.get('compat') or 'default') for r in runs))}"
    return text


def plot_jct_cdf(runs: Sequence[tuple[str, pd.DataFrame]], out_png: str | Path, subject: str | None = None) -> Path:
    """One JCT CDF per run on shared log-scaled axes, for comparing policies at a glance.

    ``subject`` names the trace and cluster (``runs_subject``); the title says so, because a CDF
    without them cannot be told from another trace's.
    """
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hpcsched.report.plots import log_x_by_decades

    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = [np.array([])]
    for label, df in runs:
        done = df[df["end"].notna()]
        jct = np.maximum(np.sort((done["end"] - done["submit"]).to_numpy(dtype=float)), 1e-3)
        if len(jct):
            ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=label)
            drawn.append(jct)
    log_x_by_decades(ax, np.concatenate(drawn))
    ax.set_xlabel("job completion time (s, log scale)")
    ax.set_ylabel("fraction of finished jobs")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title(f"JCT CDF: {subject or 'trace and cluster unknown'}", fontsize="medium")
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


# ---- Fairness and accounting (issue 19): finish-time fairness, Jain's index, per-entity GPU-hours and cost ----
#
# Each figure needs inputs a results table may not hold; a figure whose inputs are missing is left out and its
# reason is given under ``unavailable`` (metric -> reason), never computed from a guessed default.

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
    return math.fsum(xs) ** 2 / (len(xs) * sq) if sq > 0 else _NAN


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
    from hpcsched.hetero.cluster import looks_hetero, parse_hetero_cluster

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
                    "ftf_rho_p50": _np_percentile(values, 50), "ftf_rho_p90": _np_percentile(values, 90),
                    "ftf_rho_p99": _np_percentile(values, 99), "ftf_rho_mean": math.fsum(values) / len(values)}
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
        for k, (n, h) in enumerate(zip(names, hours, strict=True)):
            if n is None:
                unknown += 1
                continue
            by.setdefault(n, []).append(h)
            if cost_hours is not None:
                cost_by.setdefault(n, []).append(cost_hours[k])
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
    duration) x the 1.015 solo factor of ``hpcsched.core.speed``, restarts left out (Gavel's isolated
    throughput has none). The rule is ``hpcsched.sim.jobrun.iterations_of``'s, which this module may not import
    (tests/test_architecture.py: only the simulation tools depend on the simulator)."""
    from hpcsched.core.speed import SOLO_FACTOR

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


# ------------------------------------------------------------------------------------- controller runs (issue 18)
# A controller run (``hpcsched calc STATE.db``): the figures of harvesting with pilot jobs, from the store's events
# (``pilot`` events the pilot manager records, the jobs' start / stopped / completed / stop events) and progress.
PILOT_UNITS = {
    "harvested_node_hours": "pilot node-hours",
    "pilot_busy_node_hours": "pilot node-hours with a task",
    "pilot_utilization": "busy / harvested",
    "pilots": "that ran",
    "pilots_preempted": "ended by Slurm",
    "pilots_window_end": "left at their idle window's end",
}
_ATTEMPT_END = ("stopped", "completed")


def _union_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by the union of ``intervals``."""
    total, cur_a, cur_b = 0.0, None, None
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b <= a:
            continue
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


Attempt = tuple[float, float, tuple[str, ...]]  # (from, to, workers) of one attempt of a job


def job_attempts(events: Sequence[Mapping[str, Any]], end: float) -> dict[str, list[Attempt]]:
    """Per job: (from, to, workers) of each attempt, from its ``start`` event to its ``stopped`` / ``completed``
    (or the next ``start``; ``end`` while it still ran). In-place resizes keep the attempt's worker."""
    out: dict[str, list[Attempt]] = {}
    open_: dict[str, tuple[float, tuple[str, ...]]] = {}
    for e in sorted(events, key=lambda e: e["time"]):
        jid = e.get("job_id")
        if not jid:
            continue
        if e["kind"] == "start" or e["kind"] in _ATTEMPT_END:
            if jid in open_:
                t0, workers = open_.pop(jid)
                out.setdefault(jid, []).append((t0, e["time"], workers))
            if e["kind"] == "start":
                open_[jid] = (e["time"], tuple(e.get("workers") or ()))
    for jid, (t0, workers) in open_.items():
        out.setdefault(jid, []).append((t0, max(t0, end), workers))
    return out


def restart_lost_steps(progress: Sequence[Mapping[str, Any]]) -> list[int]:
    """Per restart of a job (each attempt after the first that reported): the last step its previous attempt
    reported minus the checkpoint step it resumed from (its first reported step if it says none)."""
    by_job: dict[str, dict[int, list[Mapping[str, Any]]]] = {}
    for r in progress:
        by_job.setdefault(r["job_id"], {}).setdefault(int(r["generation"]), []).append(r)
    out = []
    for gens in by_job.values():
        order = sorted(gens)
        for prev, gen in zip(order, order[1:], strict=False):
            last = max(int(r["step"]) for r in gens[prev])
            resumed = [int(r["resumed_from"]) for r in gens[gen] if r.get("resumed_from") is not None]
            start = max(resumed) if resumed else min(int(r["step"]) for r in gens[gen])
            out.append(max(0, last - max(start, 0)))
    return out


def cancelled_pilot_workers(events: Sequence[Mapping[str, Any]]) -> set[str]:
    """Workers of the pilots the controller cancelled itself (stopping, idle, hung), from all its pilot events: a job
    stopped because such a worker left was not preempted. From all events, since the manager records its cancel after
    scancel returns and the worker's Leave can reach the store first."""
    return {e["worker"] for e in events if e["kind"] == "pilot" and e.get("worker") and (
        e.get("event") == "cancel" or e.get("event") == "gone" and e.get("cancelled"))}


def pilot_metrics(events: Sequence[Mapping[str, Any]], progress: Sequence[Mapping[str, Any]],
                  end: float | None = None) -> dict[str, Any]:
    """Harvesting figures of a controller run from its store (``Store.events()`` rows: time, job_id, kind and
    the detail's keys; ``Store.progress()`` rows).

    - ``harvested_node_hours``: pilot node time, each pilot from the poll that first saw it running to the one
      that found it gone from Slurm's queue (``end``, the store's last record by default, while it still runs);
      to within the pilot manager's ``poll_s``.
    - ``pilot_busy_node_hours``: of that, the time its worker held a task of some job (co-located jobs count
      once); ``pilot_utilization`` = busy / harvested.
    - ``pilots``: pilots that ran; ``pilots_preempted``: of those, the ones Slurm ended, not this controller
      (preemption, their time limit, an operator's scancel); ``pilots_window_end``: the ones that left by
      themselves at the end of their idle window (``time_limit: fit-idle-window``), counted apart because
      leaving then is the plan, not a loss.
    - ``preemptions``: job stops for a pilot (or any worker) leaving or preempted (``stop`` events, reason
      ``preempt``), not for a pilot this controller cancelled (``cancelled_pilot_workers``); ``lost_steps``: steps
      lost past the last checkpoint, summed over every restart of a job
      (preemption, resize, failure), ``max_lost_steps`` the largest one.
    - ``pilot_release_s_p50`` / ``_p99`` / ``_max``: how long a pilot Slurm ended held its node after Slurm
      signalled it (a preemption): the delay it added to the batch job that wanted the node.

    Figures that need pilots are left out and listed under ``unavailable`` with the reason when the run has
    none (``node_source: static``, or a store written before pilot events were recorded)."""
    if end is None:
        end = max([e["time"] for e in events] + [r["time"] for r in progress], default=0.0)
    out: dict[str, Any] = {}
    cancelled = cancelled_pilot_workers(events)
    stops = [e for e in events if e["kind"] == "stop" and e.get("reason") == "preempt"
             and e.get("worker_left") not in cancelled]
    lost = restart_lost_steps(progress)
    out["preemptions"] = len(stops)
    out["lost_steps"] = sum(lost)
    out["max_lost_steps"] = max(lost, default=0)
    pilot_ev = [e for e in events if e["kind"] == "pilot" and e.get("slurm_job")]
    runs: dict[str, dict[str, Any]] = {}
    for e in sorted(pilot_ev, key=lambda e: e["time"]):
        p = runs.setdefault(e["slurm_job"], {"worker": e.get("worker") or f"pilot-{e['slurm_job']}", "from": None,
                                             "to": None, "cancelled": False, "window_end": False})
        kind = e.get("event")
        if p["from"] is None and (kind == "running" or kind == "adopt" and e.get("state") == "RUNNING"):
            p["from"] = e["time"]
        elif kind == "cancel":
            p["cancelled"] = True
        elif kind == "gone" and p["to"] is None:
            p["to"] = e["time"]
            p["cancelled"] = p["cancelled"] or bool(e.get("cancelled"))
            p["window_end"] = bool(e.get("window_end"))
    ran = {jid: p for jid, p in runs.items() if p["from"] is not None}
    if not ran:
        out["unavailable"] = {k: "no pilot ran in this controller run (node_source static, or a store from before "
                                 "pilots were recorded)" if not runs else
                              f"none of its {len(runs)} pilots ever ran (pending until cancelled)"
                              for k in ("harvested_node_hours", "pilot_busy_node_hours", "pilot_utilization")}
        return out
    busy_by_worker: dict[str, list[tuple[float, float]]] = {}
    for attempts in job_attempts(events, end).values():
        for t0, t1, workers in attempts:
            for w in workers:
                busy_by_worker.setdefault(w, []).append((t0, t1))
    held = busy = 0.0
    for p in ran.values():
        lo, hi = p["from"], p["to"] if p["to"] is not None else max(end, p["from"])
        held += hi - lo
        busy += _union_length(busy_by_worker.get(p["worker"], []), lo, hi)
    out["harvested_node_hours"] = held / 3600.0
    out["pilot_busy_node_hours"] = busy / 3600.0
    out["pilot_utilization"] = busy / held if held > 0 else None
    out["pilots"] = len(ran)
    ended = [p for p in ran.values() if p["to"] is not None and not p["cancelled"]]
    out["pilots_preempted"] = sum(1 for p in ended if not p["window_end"])
    out["pilots_window_end"] = sum(1 for p in ended if p["window_end"])
    # The cost a site pays: how long a preempted pilot held its node after Slurm signalled it, i.e. what it added
    # to the start of the batch job that preempted it (the pilot's script times it: slurm/pilot_config.py).
    release = sorted(float(e["release_s"]) for e in pilot_ev if e.get("event") == "gone"
                     and e.get("release_s") is not None and not e.get("cancelled"))
    if release:
        out["pilot_release_s_p50"] = release[(len(release) - 1) // 2]
        out["pilot_release_s_p99"] = release[min(len(release) - 1, math.ceil(0.99 * len(release)) - 1)]
        out["pilot_release_s_max"] = release[-1]
    elif out["pilots_preempted"]:
        out.setdefault("unavailable", {})["pilot_release_s"] = (
            "no preempted pilot timed its release (pilots from before the sentinel script, or worker_step: true)")
    return out
