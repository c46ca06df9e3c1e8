"""End-to-end time of Muri's whole simulation grid (6 policies x 8 traces) through ``hpcsched sweep``.

The peers quote 1-4 days per figure (the reference simulator manages ~0.5 scheduling events/s and
did not finish Muri-S on trace1 in 15 minutes). This runs the cells of ``sweeps/muri.yaml`` in one
compat mode, fresh, on every local core, and prints the wall time, the cell time summed, the
slowest cells and the ratio to one day.

    .venv/bin/python bench/bench_sweep.py                  # compat=muri half, into a temp dir
    .venv/bin/python bench/bench_sweep.py --compat default --out out/sweep-muri --keep
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
    ap.add_argument("--compat", default="muri", choices=["muri", "default", "both"])
    ap.add_argument("--out", help="sweep directory (default: a temp dir, removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="do not delete the sweep directory (resume-friendly)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    cfg = load_config(args.config)
    cells = tuple(c for c in cfg.cells if args.compat == "both" or c.params.get("compat") == args.compat)
    cfg = dataclasses.replace(cfg, cells=cells)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    t0 = time.perf_counter()
    outcome = run_sweep(cfg, out, workers=args.workers, fresh=True, progress=True,
                        command=["python", "bench/bench_sweep.py", *sys.argv[1:]])
    wall = time.perf_counter() - t0
    table = read_table(out)
    ok = table[table["status"] == "ok"]
    slow = ok.sort_values("wall_s", ascending=False).head(5)
    result = {
        "cells": outcome.cells,
        "failed": len(outcome.failed),
        "workers": args.workers,
        "wall_s": round(wall, 1),
        "cell_s_sum": round(float(ok["wall_s"].sum()), 1),
        "events": int(ok["events"].sum()) if "events" in ok else None,
        "slowest": [f"{r.policy} {Path(r.trace).stem}: {r.wall_s:.1f} s" for r in slow.itertuples()],
        "vs_one_day": round(DAY_S / wall, 1),
    }
    print(json.dumps(result, indent=1))
    print(f"{outcome.cells} cells (compat={args.compat}) in {wall:.1f} s wall on {args.workers} workers; "
          f"the peers need 1-4 days per figure: {DAY_S / wall:,.0f}x - {4 * DAY_S / wall:,.0f}x faster")
    for f in outcome.failed:
        print(f"FAILED {f['id']}: {f['error']}")
    if not args.out and not args.keep:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
