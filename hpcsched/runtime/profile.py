"""``hpcsched profile``: what the runtime measured, in the formats the simulator reads.

- Interleaving profiles as a Muri CSV (milliseconds): per job its size, iterations, median iteration
  time and median data / compute / communication stage times (resource_time_0/1/2).
- Scaling curves as a BFTrainer ``JNPs`` CSV: per job the median throughput (samples/s) measured at each
  world size it ran at, with the point (0, 0) first as in the published files; and its ``Jbnd`` twin:
  the job's [min_procs, max_procs], the samples it processed (throughput integrated over its reports)
  and its measured resize costs (the longest recorded resize, 0 when it was never resized).
- Per-launch overheads (``overheads.csv``, seconds): per job its attempts, median start-up (launch decision ->
  first report of that attempt: process start, imports, rendezvous) and tear-down (last report -> recorded
  completion). Kept apart from the iteration times: they are paid per launch, not per step, and they
  follow the machine's load (the testbed scales them by a start-up probe to predict another run).
Medians, not means: the first report after a (re)start includes warm-up and would skew a mean.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path

from hpcsched.runtime.store import Store

MURI_COLUMNS = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "batch_size", "duration", "interval",
                "iteration_time", "resource_time_0", "resource_time_1", "resource_time_2", "priority")


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def write_profiles(store: Store, out_dir: Path) -> dict[str, object]:
    """Write ``profiles.csv`` (Muri) and ``scaling-JNPs.csv`` (BFTrainer); return what was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [j for j in store.jobs() if j.steps_done > 0]
    t0 = min((j.submit_time for j in jobs), default=0.0)
    by_job: dict[str, list[dict]] = defaultdict(list)
    for p in store.progress():
        if p["data_s"] is not None and p["samples_per_s"]:
            by_job[p["job_id"]].append(p)
    resize = defaultdict(float)
    for e in store.events(kind="resized"):
        resize[e["job_id"]] = max(resize[e["job_id"]], e["seconds"])
    muri = out_dir / "profiles.csv"
    jnps = out_dir / "scaling-JNPs.csv"
    jbnd = out_dir / "scaling-Jbnd.csv"
    rows = 0
    with open(muri, "w", newline="") as fm, open(jnps, "w", newline="") as fj, open(jbnd, "w", newline="") as fb:
        wm, wj, wb = csv.writer(fm), csv.writer(fj), csv.writer(fb)
        wm.writerow(MURI_COLUMNS)
        wj.writerow(("job", "Ns", "Ps", "Os", "Tsub"))
        wb.writerow(("job", "Tcup", "Tcdw", "Jmin", "Jmax", "Pmax", "Tsub"))
        for j in jobs:
            ps = by_job.get(j.id, [])
            if not ps:
                continue
            sizes = defaultdict(list)
            for p in ps:
                sizes[p["world_size"] or 1].append(p["samples_per_s"])
            size = max(sizes, key=lambda s: len(sizes[s]))
            stages = [_median([p[k] for p in ps]) * 1e3 for k in ("data_s", "compute_s", "comm_s")]
            duration = ((j.end_time or ps[-1]["time"]) - (j.start_time or j.submit_time)) * 1e3
            wm.writerow((j.id, size, round((j.submit_time - t0) * 1e3), j.spec.steps or j.steps_done, j.name, 0,
                         round(duration), 0, round(sum(stages), 3), *(round(s, 3) for s in stages), 0))
            ns = [0.0, *sorted(float(s) for s in sizes)]
            rates = [0.0, *(round(_median(sizes[int(n)]), 3) for n in ns[1:])]
            wj.writerow((j.id, json.dumps(ns), json.dumps(rates), json.dumps(rates), int(j.submit_time)))
            samples = sum(b["samples_per_s"] * (b["time"] - a["time"]) for a, b in zip(ps, ps[1:], strict=False)
                          if b["time"] > a["time"] and a["step"] < b["step"])
            wb.writerow((j.id, round(resize[j.id], 3), round(resize[j.id], 3), j.spec.min_procs, j.spec.max_procs,
                         round(max(samples, 1.0)), int(j.submit_time)))
            rows += 1
    overheads = write_overheads(store, out_dir / "overheads.csv")
    return {"jobs": rows, "profiles": str(muri), "scaling": str(jnps), "bounds": str(jbnd), "overheads": overheads}


def write_overheads(store: Store, path: Path) -> str:
    """``overheads.csv``: job, attempts, startup_s (median over attempts), teardown_s (empty if never completed)."""
    first: dict[tuple[str, int], float] = {}
    last: dict[str, float] = {}
    for p in store.progress():  # ordered by job, time
        first.setdefault((p["job_id"], p["generation"]), p["time"])
        last[p["job_id"]] = p["time"]
    startup: dict[str, list[float]] = defaultdict(list)
    for e in store.events(kind="start"):
        t = first.get((e["job_id"], int(e.get("generation", 0))))
        if t is not None:
            startup[e["job_id"]].append(max(0.0, t - e["time"]))
    done = {e["job_id"]: e["time"] for e in store.events(kind="completed")}
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("job_id", "attempts", "startup_s", "teardown_s"))
        for jid, xs in startup.items():
            tear = round(max(0.0, done[jid] - last[jid]), 3) if jid in done and jid in last else ""
            w.writerow((jid, len(xs), round(_median(xs), 3), tear))
    return str(path)
