"""Evaluate the Pollux OSDI'21 artifact's own functions on a fixed grid, for tests/test_goodput.py.

Run in the reference environment (not the project's), from anywhere:
    /work/ref/venv/bin/python tests/data/pollux/make_goodput_reference.py /work/ref/pollux-osdi21/simulator OUT.json
The environment: numpy<2 with the np.int alias shim, scipy, pandas<2, autograd (docs/compat.md, Pollux section).
"""

import json
import math
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
from applications import APPLICATIONS  # noqa: E402
from goodput import GoodputFunction, fit_perf_params  # noqa: E402
from speedup import SpeedupFunction  # noqa: E402

PLACEMENTS = [(1,), (2,), (4,), (1, 1), (2, 2), (1, 3), (4, 4), (4, 2), (4, 4, 4), (4, 4, 4, 4), (4,) * 8, (2, 1, 1),
              (3, 3, 3), (4,) * 16]
ALLOCS = [(1, 1), (1, 2), (1, 4), (2, 2), (2, 8), (3, 12), (4, 16), (8, 32), (16, 64)]


def num(x):
    x = float(x)
    return None if math.isnan(x) else x


def thr(app, pl, b):
    try:
        return [float(v) for v in app.get_throughput(pl, b)]
    except (ValueError, AssertionError):
        return None  # out of the profiled range: the artifact raises


def fit_subset(app, configs):
    nodes, reps, bsz, comp, step = [], [], [], [], []
    for placement, b in configs:
        st, sy = thr(app, placement, b)
        nodes.append(len(placement))
        reps.append(sum(placement))
        bsz.append(b)
        comp.append(st - sy)
        step.append(st)
    p = fit_perf_params(np.array(nodes), np.array(reps), np.array(bsz), np.array(comp), np.array(step))
    return {"configs": [[list(pl), b] for pl, b in configs], "params": [float(v) for v in p]}


out = {}
for name, app in APPLICATIONS.items():
    lo, hi = int(app.min_local_bsz), int(app.max_local_bsz)
    bszs = sorted({int(round(v)) for v in np.geomspace(lo, hi, 4)})
    rec = {"init_batch_size": int(app.init_batch_size), "max_batch_size": int(app.max_batch_size),
           "min_local_bsz": lo, "max_local_bsz": hi, "max_epochs": int(app.max_epochs)}
    rec["throughput"] = [[list(pl), b, thr(app, pl, b)]
                         for pl in PLACEMENTS for b in bszs]
    batches = sorted({int(round(v)) for v in np.geomspace(app.init_batch_size, app.max_batch_size, 5)})
    epochs = sorted({0, app.max_epochs // 2, app.max_epochs - 1})
    rec["grad_stats"] = [[b, e, *map(float, app.get_grad_stats(b, e))] for b in batches for e in epochs]
    rec["iterations"] = [[b, e, float(app.get_iteration(b, e))] for b in batches for e in epochs]
    rec["progress"] = [float(app.get_progress(e)) for e in range(app.max_epochs + 1)]
    rec["best_metric"] = [[b, e, num(app.get_best_metric(b, e)) if e else None] for b in batches for e in epochs]
    # The full-profile fit.
    obs_n = np.concatenate([app.placements.num_nodes.values, app.scalability.num_nodes.values])
    obs_r = np.concatenate([app.placements.num_replicas.values, app.scalability.num_replicas.values])
    obs_b = np.concatenate([app.placements.local_bsz.values, app.scalability.local_bsz.values])
    obs_s = np.concatenate([app.placements.step_time.values, app.scalability.step_time.values])
    obs_y = np.concatenate([app.placements.sync_time.values, app.scalability.sync_time.values])
    full = fit_perf_params(obs_n, obs_r, obs_b, obs_s - obs_y, obs_s)
    rec["fit_full"] = [float(v) for v in full]
    # Online-like fits: what a Pollux agent has seen after a few configurations.
    b0 = max(app.init_batch_size, lo)
    b0 = min(b0, hi)
    mid = bszs[1]
    rec["fits"] = [
        fit_subset(app, [((1,), b0)]),
        fit_subset(app, [((1,), b0), ((1,), mid)]),
        fit_subset(app, [((1,), b0), ((2,), mid), ((4,), mid)]),
        fit_subset(app, [((1,), b0), ((2,), mid), ((4,), mid), ((4, 4), mid), ((4, 4, 4, 4), mid)]),
    ]
    # Goodput of the full-profile fit with epoch-0 and mid-epoch gradient statistics.
    rec["goodput"] = []
    for e in epochs:
        grad = app.get_grad_stats(app.init_batch_size, e)
        fn = GoodputFunction(full, grad, app.init_batch_size)
        evals = []
        for n, r in ALLOCS:
            for b in bszs:
                for k in (0, 1, 3):
                    if r * b * (k + 1) >= app.init_batch_size:
                        evals.append([n, r, b, k, float(fn.evaluate(n, r, b, k)), float(fn.throughput(n, r, b, k))])
        effs = [[b, float(fn.efficiency(b))] for b in batches]
        nodes = np.array([a[0] for a in ALLOCS])
        reps = np.array([a[1] for a in ALLOCS])
        g, at, ac = fn.optimize(nodes, reps, app.max_batch_size, (app.min_local_bsz, app.max_local_bsz), True)
        opts = [[int(n), int(r), float(gg), int(aa), int(cc)]
                for n, r, gg, aa, cc in zip(nodes, reps, g, at, ac, strict=True)]
        g1 = fn.optimize(1, 1, app.max_batch_size, (app.min_local_bsz, app.max_local_bsz), True)
        sp = SpeedupFunction(fn, app.max_batch_size, (app.min_local_bsz, app.max_local_bsz), accumulation=True)
        speed = [[int(n), int(r), float(sp(int(n), int(r)))] for n, r in ALLOCS]
        rec["goodput"].append({"epoch": e, "grad": [float(v) for v in grad], "evaluate": evals, "efficiency": effs,
                               "optimize": opts, "optimize_1": [float(g1[0]), int(g1[1]), int(g1[2])],
                               "speedup": speed})
    out[name] = rec

with open(sys.argv[2], "w") as f:
    json.dump(out, f, indent=0)
