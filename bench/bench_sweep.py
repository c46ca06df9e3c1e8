"""End-to-end time of Muri's whole simulation grid through ``hpcsched sweep``, against the peers' days.

The peers quote 1-4 days per figure (the reference simulator manages ~0.5 scheduling events/s and did
not finish Muri-S on trace1 in 15 minutes). This runs every cell of ``sweeps/muri.yaml`` (6 policies x
8 traces x 2 simulator modes = 96 cells) from scratch on every local core and prints the wall time,
the CPU seconds (this process plus every cell's own process), cells per minute, the slowest cells and
the speed-up over one and four days, then one summary line.

    .venv/bin/python bench/bench_sweep.py                         # the whole grid, in a temp dir
    .venv/bin/python bench/bench_sweep.py --compat muri           # one mode (48 cells)
    .venv/bin/python bench/bench_sweep.py --out out/sweep-muri    # keep the results (always fresh)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from hpcsched.sweep import load_config, read_table, run_sweep

ROOT = Path(__file__).resolve().parents[1]
DAY_S = 86400.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "sweeps" / "muri.yaml"))
    ap.add_argument("--compat", default="both", choices=["muri", "default", "both"])
    ap.add_argument("--out", help="sweep directory, emptied first (default: a temp dir, removed at the end)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cell-timeout", type=float, default=None, help="stop a cell after this many wall seconds")
    args = ap.parse_args()

    cfg = load_config(args.config)
    cells = tuple(c for c in cfg.cells if args.compat == "both" or c.params.get("compat") == args.compat)
    cfg = dataclasses.replace(cfg, cells=cells)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    if out.exists() and any(out.iterdir()):
        if not (out / "sweep.json").is_file():
            sys.exit(f"{out} is not empty and holds no sweep.json: refusing to delete it")
        shutil.rmtree(out)  # a clean directory: nothing is resumed, every cell runs
    t0, cpu0 = time.perf_counter(), time.process_time()
    outcome = run_sweep(cfg, out, workers=args.workers, fresh=True, progress=True, timeout_s=args.cell_timeout,
                        command=["python", "bench/bench_sweep.py", *sys.argv[1:]])
    wall = time.perf_counter() - t0
    table = read_table(out)
    ok = table[table["status"] == "ok"]
    cell_cpu = float(table["cpu_s"].fillna(0).sum())
    cpu = time.process_time() - cpu0 + cell_cpu  # the cells run in their own processes and report their CPU
    slow = ok.sort_values("cpu_s", ascending=False).head(5)
    result = {
        "cells": outcome.cells,
        "ok": len(ok),
        "failed": len(outcome.failed),
        "workers": args.workers,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "cell_cpu_s_sum": round(cell_cpu, 1),
        "cell_wall_s_sum": round(float(table["wall_s"].fillna(0).sum()), 1),
        "cells_per_min": round(60.0 * outcome.cells / wall, 2),
        "events": int(ok["events"].sum()) if "events" in ok else None,
        "slowest_cpu": [f"{r.policy} {Path(r.trace).stem} {r.compat}: {r.cpu_s:.1f} CPU-s, {r.wall_s:.1f} s wall"
                        for r in slow.itertuples()],
        "peers_days_per_figure": [1, 4],
        "speedup_vs_1_day": round(DAY_S / wall, 1),
        "speedup_vs_4_days": round(4 * DAY_S / wall, 1),
        "load_avg_1min_end": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result, indent=1))
    for f in outcome.failed:
        print(f"FAILED {f['id']}: {f['error']}")
    print(f"{cfg.name} grid: {len(ok)}/{outcome.cells} cells ok (compat={args.compat}) in {wall:.1f} s wall, "
          f"{cpu:.1f} CPU-s, {result['cells_per_min']} cells/min on {args.workers} workers; "
          f"peers 1-4 days per figure: {DAY_S / wall:,.0f}x-{4 * DAY_S / wall:,.0f}x faster")
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)
    if outcome.failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
