"""hpcsched.goodput held against the Pollux OSDI'21 artifact's own functions.

tests/data/pollux/goodput_reference.json was written by tests/data/pollux/make_goodput_reference.py, which imports
the artifact (petuum/adaptdl osdi21-artifact c793c70, simulator/) in its own environment (numpy 1.26 + alias shim,
scipy 1.17, pandas 1.5, autograd) and evaluates its Application, fit_perf_params, GoodputFunction and
SpeedupFunction on a fixed grid for all six applications. Our profile reading and goodput functions must give the
same numbers (1e-12: the two pandas versions parse some CSV floats one ulp apart); our fit (an analytic gradient
where the artifact uses autograd) must predict the same step times within 1 %.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("scipy", reason="the goodput extra (scipy) is needed to fit and interpolate profiles")

from hpcsched.goodput import (  # noqa: E402
    APPLICATIONS,
    GoodputFunction,
    GoodputModel,
    PerfParams,
    ProfileError,
    SpeedupFunction,
    fit_perf_params,
    load_profile,
    step_time,
)

REF = json.loads((Path(__file__).parent / "data" / "pollux" / "goodput_reference.json").read_text())
REL = 1e-12


def _close(a: object, b: object, rel: float = REL) -> bool:
    return bool(np.allclose(np.asarray(a, float), np.asarray(b, float), rtol=rel, atol=0))


def test_reference_covers_every_application() -> None:
    assert sorted(REF) == sorted(APPLICATIONS)


@pytest.mark.parametrize("name", sorted(REF))
def test_profile_matches_artifact(name: str) -> None:
    rec = REF[name]
    p = load_profile(name)
    assert (p.init_batch_size, p.max_batch_size, p.min_local_bsz, p.max_local_bsz, p.max_epochs) == (
        rec["init_batch_size"], rec["max_batch_size"], rec["min_local_bsz"], rec["max_local_bsz"], rec["max_epochs"])
    measured = 0
    for placement, bsz, expected in rec["throughput"]:
        try:
            got = p.step_time(tuple(placement), bsz)
        except ValueError:
            got = None
        if expected is None:  # outside the profile: the artifact raises, so must we
            assert got is None, (placement, bsz, got)
        else:
            measured += 1
            assert got is not None and _close(got, expected), (placement, bsz, got, expected)
    assert measured >= len(rec["throughput"]) // 2
    for b, e, sqr, var in rec["grad_stats"]:
        assert _close(p.grad_stats(b, e), (sqr, var)), (b, e)
    for b, e, it in rec["iterations"]:
        assert _close(p.iterations(b, e), it), (b, e)
    for b, e, metric in rec["best_metric"]:
        got = p.best_metric(b, e)
        assert (got is None and metric is None) or _close(got, metric), (b, e, got, metric)
    assert _close([p.progress_at(e) for e in range(p.max_epochs + 1)], rec["progress"])


def _predictions(params: PerfParams | list[float], grid: list[tuple[int, int, int]]) -> np.ndarray:
    n, r, b = (np.array(c) for c in zip(*grid, strict=True))
    return step_time(PerfParams(*params), n, r, b)


@pytest.mark.parametrize("name", sorted(REF))
def test_fit_predicts_like_artifact(name: str) -> None:
    rec = REF[name]
    p = load_profile(name)
    lo, hi = p.min_local_bsz, p.max_local_bsz
    grid = [(n, r, b) for n, r in ((1, 1), (1, 2), (1, 4), (2, 8), (4, 16), (16, 64)) for b in (lo, (lo + hi) // 2, hi)]
    ours = GoodputModel.load(name).perf
    assert np.max(np.abs(_predictions(ours, grid) / _predictions(rec["fit_full"], grid) - 1)) < 0.01
    for fit in rec["fits"]:  # what an agent knows after a few configurations: pinned parameters included
        configs = [(tuple(c[0]), c[1]) for c in fit["configs"]]
        times = [p.step_time(pl, b) for pl, b in configs]
        params = fit_perf_params([len(pl) for pl, _ in configs], [sum(pl) for pl, _ in configs],
                                 [b for _, b in configs], [s - y for s, y in times], [s for s, _ in times])
        seen = [(len(pl), sum(pl), b) for pl, b in configs]
        assert np.max(np.abs(_predictions(params, seen) / _predictions(fit["params"], seen) - 1)) < 0.01
        assert np.max(np.abs(_predictions(params, grid) / _predictions(fit["params"], grid) - 1)) < 0.05
        pinned = [i for i, v in enumerate(fit["params"]) if v == 1e-8]
        assert all(params[i] == pytest.approx(1e-8) or i in (2, 3) for i in pinned)


@pytest.mark.parametrize("name", sorted(REF))
def test_goodput_functions_match_artifact(name: str) -> None:
    rec = REF[name]
    p = load_profile(name)
    rng = (p.min_local_bsz, p.max_local_bsz)
    for g in rec["goodput"]:
        fn = GoodputFunction(rec["fit_full"], g["grad"], p.init_batch_size)
        assert _close(p.grad_stats(p.init_batch_size, g["epoch"]), g["grad"])
        for n, r, b, k, goodput, throughput in g["evaluate"]:
            assert _close(fn.evaluate(n, r, b, k), goodput) and _close(fn.throughput(n, r, b, k), throughput)
        for b, eff in g["efficiency"]:
            assert _close(fn.efficiency(b), eff)
        nodes = np.array([o[0] for o in g["optimize"]])
        reps = np.array([o[1] for o in g["optimize"]])
        goodput, atomic, accum = fn.optimize(nodes, reps, p.max_batch_size, rng, True)
        assert _close(goodput, [o[2] for o in g["optimize"]])
        assert atomic.tolist() == [o[3] for o in g["optimize"]] and accum.tolist() == [o[4] for o in g["optimize"]]
        one = fn.optimize(1, 1, p.max_batch_size, rng, True)
        assert _close(one[0], g["optimize_1"][0]) and list(one[1:]) == g["optimize_1"][1:]
        sp = SpeedupFunction(fn, p.max_batch_size, rng, accumulation=True)
        for n, r, s in g["speedup"]:
            assert _close(sp(n, r), s), (n, r)


def test_goodput_model_api() -> None:
    m = GoodputModel.load("cifar10")
    assert m.name == "cifar10" and m.gpu_type == "t4"
    assert m.efficiency(m.profile.init_batch_size) == pytest.approx(1.0)
    assert m.efficiency(4096) < m.efficiency(1024) < 1.0
    # throughput: more GPUs at the same batch is faster; goodput = throughput x efficiency
    assert m.throughput(2, 8, 1024) > m.throughput(1, 1, 1024)
    assert m.goodput(2, 8, 1024) == pytest.approx(m.throughput(2, 8, 1024) * m.efficiency(1024))
    # the best batch grows with the allocation, and is never worse than a fixed one
    small, big = m.best_batch(1, 1), m.best_batch(4, 16)
    assert big.local_bsz * 16 > small.local_bsz * 1
    assert big.goodput >= m.goodput(4, 16, 16 * 32) * (1 - 1e-12)
    assert m.speedup(1, 4) > 1.0
    # late in training the gradient noise is larger: large batches are more efficient, so more GPUs pay off
    late = m.at_epoch(m.profile.max_epochs - 1)
    assert late.efficiency(4096) > m.efficiency(4096)
    assert late.speedup(4, 16) > m.speedup(4, 16)
    s = m.split(1, 1024)
    assert s.accum_steps >= 1 and s.atomic_bsz * (s.accum_steps + 1) >= 1024
    with pytest.raises(ValueError, match="epoch"):
        m.at_epoch(m.profile.max_epochs)
    with pytest.raises(KeyError, match="known"):
        GoodputModel.load("gpt5")
    with pytest.raises(KeyError, match="GPU type"):
        GoodputModel.load("cifar10", gpu_type="a100")


def test_bad_profile_names_file_and_line(tmp_path: Path) -> None:
    src = load_profile("ncf")
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, table, cols in (("placements", src.placements, ["placement", "local_bsz", "step_time", "sync_time"]),
                              ("scalability", src.scalability, list(src.scalability))):
        lines = [",".join(cols)] + [",".join(repr(table[c][r]) for c in cols) for r in range(len(table[cols[0]]))]
        (folder / f"{name}.csv").write_text("\n".join(lines) + "\n")
    rows = (Path(__file__).parents[1] / "hpcsched/goodput/data/pollux/ncf/validation-256.csv").read_text().splitlines()
    rows[3] = "1.0,2,oops,0.1,0.2"
    (folder / "validation-256.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(ProfileError, match=r"validation-256\.csv:4: column metric"):
        load_profile("mine", folder=folder)
    assert math.isfinite(load_profile("ncf").step_time((1,), 64)[0])


def test_profiles_read_as_pandas_reads_them() -> None:
    """The profiles are read with the csv module (pandas' import costs a simulation more than its work), so every
    value must be the double pandas parses, and the per-placement means the interpolator triangulates must be
    pandas' groupby means to the bit (the baselines' greedy choices compare interpolated step times)."""
    pd = pytest.importorskip("pandas")
    from hpcsched.goodput.profiles import POLLUX_DIR, group_means

    checked = 0
    for name in APPLICATIONS:
        p = load_profile(name)
        tables = [("placements.csv", p.placements), ("scalability.csv", p.scalability)]
        tables += [(f"validation-{b}.csv", cols) for b, cols in p.validation.items()]
        for file, cols in tables:
            df = pd.read_csv(POLLUX_DIR / name / file)
            for c in df.columns:
                assert [float(v) for v in df[c]] == [float(v) for v in cols[c]], (name, file, c)
                checked += len(df)
        xs, ys = ["num_nodes", "num_replicas", "local_bsz"], ["step_time", "sync_time"]
        frame = pd.DataFrame({c: p.placements[c] for c in xs + ys})
        means = frame.groupby(xs)[xs + ys].mean()
        ours = group_means(p.placements, xs, ys)
        for c in xs + ys:
            assert [float(v) for v in means[c]] == [float(v) for v in ours[c]], (name, c)
    assert checked > 40_000


def test_linear_nd_equals_scipys_linear_nd_interpolator() -> None:
    """Step times at unmeasured placements come from :class:`LinearND` (scipy.interpolate's import cost a run more
    than its work): over every profile's (nodes, GPUs, per-GPU batch) grid, inside and outside the hull, each value
    must be the double scipy's ``LinearNDInterpolator`` gives (NaN there: None here)."""
    from scipy.interpolate import LinearNDInterpolator

    from hpcsched.goodput.linear_nd import LinearND
    from hpcsched.goodput.profiles import group_means

    inside = outside = 0
    for name in APPLICATIONS:
        p = load_profile(name)
        xs, ys = ["num_nodes", "num_replicas", "local_bsz"], ["step_time", "sync_time"]
        means = group_means(p.placements, xs, ys)
        table = {c: [float(v) for v in means[c] + p.scalability[c]] for c in xs + ys}
        pts, vals = np.array([table[c] for c in xs]).T, np.array([table[c] for c in ys]).T
        ref, ours = LinearNDInterpolator(pts, vals), LinearND(pts, vals)
        lo, hi = p.min_local_bsz, p.max_local_bsz
        grid = [(nodes, reps, b) for nodes in (1, 2, 3, 5, 8, 13, 16) for reps in range(nodes, 4 * nodes + 1, 3)
                for b in (lo, (lo + hi) // 2, hi, lo + 0.5, (lo + hi) / 3, hi + 1)]
        for x in grid:  # one point per call, as profiles query it (a batch walks from the last point's simplex)
            r, got = ref(list(x))[0], ours(x)
            if math.isnan(r[0]):
                assert got is None, (name, x)
                outside += 1
            else:
                assert got == (float(r[0]), float(r[1])), (name, x)
                inside += 1
    assert inside > 600 and outside > 200


def test_stored_triangulations_are_current_and_located_as_scipy_does() -> None:
    """Each shipped profile's triangulation is stored (so a run needs no scipy.spatial) and equals what Qhull gives
    for its points now (if a profile changes, rewrite it: ``hpcsched.goodput.delaunay.write_stored``). Which
    simplex a point on a shared face lands in decides an interpolated value's last bits: our walk must return
    scipy's simplex for every point (one fresh call each, as profiles query), on the grid's faces and edges and at
    random points in and around the hull."""
    from scipy.spatial import Delaunay

    from hpcsched.goodput.delaunay import STORE, Triangulation, points_key

    gen = np.random.default_rng(4)
    checked = outside = 0
    for name in APPLICATIONS:
        p = load_profile(name)
        pts = p.interpolation_points()[0]
        assert (STORE / f"{points_key(pts)}.npz").is_file(), f"{name}: no stored triangulation; write_stored it"
        ref, ours = Delaunay(pts), Triangulation.stored_or_built(pts)
        now = {"ndim": ref.ndim, "simplices": ref.simplices, "neighbors": ref.neighbors, "equations": ref.equations,
               "transform": ref.transform, "paraboloid_scale": ref.paraboloid_scale,
               "paraboloid_shift": ref.paraboloid_shift, "min_bound": ref.min_bound, "max_bound": ref.max_bound}
        for field, value in now.items():  # NaN where Qhull left a degenerate simplex: equal NaNs
            assert np.array_equal(np.array(getattr(ours, field)), value,
                                  equal_nan=field in ("transform", "equations")), (name, field)
        lo, hi = p.min_local_bsz, p.max_local_bsz
        grid = [(n, r, b) for n in (1, 2, 3, 4, 6, 9, 16) for r in range(n, 4 * n + 1, 2)
                for b in (lo, lo + 1, (lo + hi) // 2, (lo + hi) / 3, hi, hi + 1)]
        grid += [tuple(x) for x in gen.uniform(pts.min(axis=0) - 1, pts.max(axis=0) + 1, size=(150, 3))]
        for x in grid:
            want = int(ref.find_simplex(np.array([x], dtype=float))[0])
            assert ours.find_simplex([float(v) for v in x]) == want, (name, x)
            checked += 1
            outside += want < 0
    assert checked > 2000 and outside > 100


def test_step_times_need_no_scipy_spatial() -> None:
    """A Tiresias or Optimus run interpolates a few unmeasured placements; with the stored triangulations that
    must not import scipy.spatial (a third of such a run's CPU)."""
    code = ("import sys\nfrom hpcsched.goodput import load_profile\np = load_profile('cifar10')\n"
            "print(p.step_time((3, 2, 3), p.min_local_bsz), 'scipy.spatial' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "False", r.stdout
