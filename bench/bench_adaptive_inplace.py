"""Goodput-adapted batch vs a fixed batch, on the same in-place resize schedule (elastic Horovod, 1 -> 3 -> 2).

The scenario of ``tests/test_runtime_adaptive_batch_horovod.py`` (real controller and worker processes, a real
elastic ``horovodrun`` on CPU, ``workloads/adaptive_train.py``, CNN, lr 0.2 tuned at batch 64, 30 ms emulated I/O
per step): the job starts at 1 process beside a 2-process job, grows in place to 3 when that one ends, shrinks in
place to 2 when a 1-process job arrives. Run once with ``batch: {base: 64, max: 512, lr_scaling: sqrt}`` (the
controller picks the goodput-best batch at each size from the job's reported gradient statistics and tells it
with each resize) and once without (batch 64 throughout, the LR as tuned). For each run: the samples, steps and
seconds (from the first report) until the loss, averaged over the last ``--window`` reports (2 steps each), is at
or under ``--target``; and the batch at each size.

    .venv/bin/python bench/bench_adaptive_inplace.py [--steps 300] [--target 0.5] [--runs 1] [--json]

Wall-clock figures depend on the machine's load (say it beside them); samples and steps to the target do not,
except through where in the run the resizes land.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_runtime_adaptive_batch_horovod import _reports, horovod_missing, resize_scenario  # noqa: E402

ADAPTED = "batch: {base: 64, max: 512, lr_scaling: sqrt}\n"


def to_target(reports: list[dict], target: float, window: int) -> dict:
    """Samples, steps and seconds until the mean loss of the last ``window`` reports is at or under ``target``."""
    rows = [r for r in reports if r["step"] > 0 and "loss" in r]
    samples, last_step, hit = 0, 0, None
    for i, r in enumerate(rows):
        samples += r["batch_size"] * (r["step"] - last_step)
        last_step = r["step"]
        recent = rows[max(0, i - window + 1): i + 1]
        if len(recent) == window and sum(x["loss"] for x in recent) / window <= target:
            hit = {"samples": samples, "steps": r["step"], "seconds": round(r["time"] - reports[0]["time"], 1)}
            break
    sizes: dict[int, list[int]] = {}
    for r in rows:
        sizes.setdefault(r["world_size"], [])
        if r["batch_size"] not in sizes[r["world_size"]]:
            sizes[r["world_size"]].append(r["batch_size"])
    return {"to_target": hit, "batch_by_size": sizes, "schedule": _schedule(rows)}


def _schedule(rows: list[dict]) -> list[tuple[int, int]]:
    """(world size, first step at it) in order: the resize schedule the run got."""
    out: list[tuple[int, int]] = []
    for r in rows:
        if not out or out[-1][0] != r["world_size"]:
            out.append((r["world_size"], r["step"]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--target", type=float, default=0.5, help="loss to reach (the CNN starts at ln 4 = 1.39)")
    ap.add_argument("--window", type=int, default=5, help="reports averaged (2 steps each)")
    ap.add_argument("--runs", type=int, default=1, help="runs of each (alternating)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if horovod_missing:
        print("Horovod with PyTorch is not installed (make horovod): nothing to measure", file=sys.stderr)
        return 1
    out: list[dict] = []
    for run in range(args.runs):
        for name, key in (("goodput-adapted", ADAPTED), ("fixed 64", "")):
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory(prefix="bench-adaptive-") as tmp:
                job, _, progress = resize_scenario(Path(tmp), key, steps=args.steps)
                row = {"run": run, "batch": name, "state": job.state, "generation": job.generation,
                       "load_start": round(load, 1), "load_end": round(os.getloadavg()[0], 1),
                       **to_target(_reports(progress), args.target, args.window)}
            out.append(row)
            if not args.json:
                hit = row["to_target"]
                got = f"{hit['samples']} samples, {hit['steps']} steps, {hit['seconds']} s" if hit else "not reached"
                print(f"{name:16s} run {run}: {row['state']}, schedule {row['schedule']}, batches "
                      f"{row['batch_by_size']}; to loss {args.target}: {got}"
                      f" (load {row['load_start']} -> {row['load_end']})", flush=True)
    if args.json:
        print(json.dumps(out))
    return 0 if all(r["state"] == "completed" for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
