"""``--compat gavel`` against Gavel's own simulator (issue 19).

The figures are what Gavel's simulator (stanford-futuredata/gavel at c4fa400, MIT) printed for the two
traces in ``trace-data/gavel/`` (made by Gavel's generator; ../shared/reference/gavel/README.md has the
exact command and patches): average JCT (its ``get_average_jct``) and makespan (its "Total duration"), s.
The contract is 1% (FIFO 2%) for the HiGHS default; docs/hetero.md explains the gaps the xfail'd checks
record. ``--solver ecos`` (Gavel's programs as its cvxpy hands them to ECOS) must give Gavel's figures to the
millisecond, on those traces and on three more our generator wrote (``MORE``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hpcsched.hetero.policies import AllocationInput, FifoPolicy, MaxMinFairnessPacked, MaxMinFairnessPerf, make_policy
from hpcsched.hetero.rounds import RoundJob, simulate_rounds
from hpcsched.hetero.simulate import load_round_jobs, run_gavel
from hpcsched.hetero.throughputs import load_throughputs
from hpcsched.hetero.workload import generate, write_trace
from hpcsched.primitives.hetero_cluster import parse_hetero_cluster

DATA = Path(__file__).resolve().parents[1] / "trace-data" / "gavel"
TRACES = {"A": (DATA / "A_120jobs_0.5jph_seed0.trace", "v100=8,p100=8,k80=8"),
          "A4": (DATA / "A4_120jobs_0.5jph_seed0_sfmax4.trace", "v100=4,p100=4,k80=4")}
GAVEL = {  # (trace, policy): (average JCT, makespan) printed by Gavel's simulator
    ("A", "fifo"): (218070.916, 3158229.516),
    ("A", "max-min-fairness"): (81622.661, 1689322.607),
    ("A", "max-min-fairness-perf"): (59132.703, 1495971.184),
    ("A", "finish-time-fairness-perf"): (59003.281, 1495898.329),
    ("A", "min-total-duration-perf"): (62133.718, 1495971.113),
    ("A", "max-sum-throughput-perf"): (57908.782, 1495896.112),
    ("A", "max-min-fairness-packed"): (59415.813, 1495971.156),
    ("A4", "fifo"): (438483.590, 2220045.983),
    ("A4", "max-min-fairness"): (106177.536, 1747305.070),
    ("A4", "max-min-fairness-perf"): (76697.720, 1544395.149),
    ("A4", "finish-time-fairness-perf"): (77602.098, 1575867.725),
    ("A4", "min-total-duration-perf"): (173978.429, 1507684.505),
    ("A4", "max-sum-throughput-perf"): (72842.524, 1542344.507),
    ("A4", "max-min-fairness-packed"): (75492.953, 1531567.592),
}
# Known gaps (docs/hetero.md, "Gaps"): which of Gavel's many optimal allocations its solver returns decides
# the schedule; ours is another interior point. (figure, bound we do meet)
GAPS = {("A", "min-total-duration-perf"): ("avg_jct", 0.02), ("A4", "min-total-duration-perf"): ("avg_jct", 0.025),
        ("A4", "max-min-fairness"): ("makespan", 0.03)}


needs_ecos = pytest.mark.skipif(importlib.util.find_spec("ecos") is None,
                                reason="--solver ecos needs ecos: pip install 'hpcsched[cvxpy]' (the cvxpy extra)")


@pytest.fixture(scope="module")
def table():  # noqa: ANN201 - a fixture
    return load_throughputs()


def _run(trace: str, policy: str, table, solver: str = "highs") -> tuple[float, float]:  # noqa: ANN001
    path, cluster = TRACES[trace]
    res = simulate_rounds(load_round_jobs(path), parse_hetero_cluster(cluster), make_policy(policy, solver=solver),
                          table)
    assert all(e is not None for e in res.end), "every job of Gavel's traces completes"
    assert res.avg_jct is not None
    return res.avg_jct, res.makespan


CASES = list(GAVEL)


@pytest.mark.parametrize(("trace", "policy"), CASES)
def test_gavel_figures(trace: str, policy: str, table) -> None:  # noqa: ANN001
    jct, makespan = _run(trace, policy, table)
    ref_jct, ref_makespan = GAVEL[(trace, policy)]
    tol = 0.02 if policy == "fifo" else 0.01
    gap = GAPS.get((trace, policy))
    for name, ours, ref in (("avg_jct", jct, ref_jct), ("makespan", makespan, ref_makespan)):
        bound = gap[1] if gap is not None and gap[0] == name else tol
        assert abs(ours / ref - 1) <= bound, f"{trace} {policy} {name}: ours {ours:.3f}, Gavel's {ref:.3f}"


@pytest.mark.xfail(strict=True, reason="known gaps, explained in docs/hetero.md: another optimal allocation")
@pytest.mark.parametrize(("trace", "policy"), list(GAPS))
def test_gavel_gaps_within_contract(trace: str, policy: str, table) -> None:  # noqa: ANN001
    name, _ = GAPS[(trace, policy)]
    jct, makespan = _run(trace, policy, table)
    ours, ref = (jct, GAVEL[(trace, policy)][0]) if name == "avg_jct" else (makespan, GAVEL[(trace, policy)][1])
    assert abs(ours / ref - 1) <= 0.01


@pytest.mark.parametrize("trace", ["A", "A4"])
def test_fifo_is_gavels_to_the_millisecond(trace: str, table) -> None:  # noqa: ANN001
    """FIFO involves no solver, so the mechanism and Gavel's FIFO (its quirks included) must match exactly."""
    jct, makespan = _run(trace, "fifo", table)
    assert jct == pytest.approx(GAVEL[(trace, "fifo")][0], abs=1e-3)
    assert makespan == pytest.approx(GAVEL[(trace, "fifo")][1], abs=1e-3)


# Gavel's simulator on traces our generator wrote (``hpcsched trace generate gavel``, Gavel's generator byte for
# byte; trace-data/SOURCES.md has each command), run with the README's command (Gavel c4fa400, Python 3.11,
# numpy 1.26.4, scipy 1.13.1, cvxpy 1.5.4, ecos 2.0.14, --seed 0 --solver ECOS; the packed policy with the README's
# revert of 40a22a7), as ``.../scheduler/scripts/drivers/simulate_scheduler_with_trace.py -t TRACE -p POLICY
# -c V100:P100:K80 --seed 0 --solver ECOS --time_per_iteration 360 --throughputs_file simulation_throughputs.json
# --num_gpus_per_server 1:1:1``. B and D4 on 4:4:4 (scale factors capped at 4), C on 8:8:8.
TRACES |= {"B": (DATA / "B_80jobs_1jph_seed1_sfmax4.trace", "v100=4,p100=4,k80=4"),
           "C": (DATA / "C_100jobs_1jph_seed2.trace", "v100=8,p100=8,k80=8"),
           "D4": (DATA / "D4_120jobs_1jph_seed3_sfmax4.trace", "v100=4,p100=4,k80=4")}
MORE = {
    ("B", "fifo"): (609599.875, 2745910.080),
    ("B", "max-min-fairness"): (155728.813, 1582977.030),
    ("B", "max-min-fairness-perf"): (122478.064, 1334999.758),
    ("B", "finish-time-fairness-perf"): (120304.792, 1317001.769),
    ("B", "min-total-duration-perf"): (570722.918, 1178581.405),
    ("B", "max-sum-throughput-perf"): (213370.647, 1447789.802),
    ("B", "max-min-fairness-packed"): (108107.505, 1285033.571),
    ("C", "fifo"): (203009.570, 2118939.639),
    ("C", "max-min-fairness"): (118728.733, 1338067.726),
    ("C", "max-min-fairness-perf"): (89755.116, 964164.680),
    ("C", "finish-time-fairness-perf"): (89151.610, 971986.445),
    ("C", "min-total-duration-perf"): (142860.400, 938755.725),
    ("C", "max-sum-throughput-perf"): (92552.174, 940882.139),
    ("C", "max-min-fairness-packed"): (87369.406, 965797.551),
    ("D4", "fifo"): (573421.442, 3364076.778),
    ("D4", "max-min-fairness"): (181630.415, 1730054.806),
    ("D4", "max-min-fairness-perf"): (145553.150, 1479489.512),
    ("D4", "finish-time-fairness-perf"): (145545.343, 1449706.669),
    ("D4", "min-total-duration-perf"): (797732.630, 1311423.819),
    ("D4", "max-sum-throughput-perf"): (325829.915, 1446970.352),
    ("D4", "max-min-fairness-packed"): (124358.863, 1422107.890),
}
# The HiGHS default's gaps on these (docs/hetero.md, "Gaps"): (avg JCT bound, makespan bound) we do meet, where
# one is above the 1% contract; the ECOS path closes every one of them (test_ecos_is_gavels_to_the_millisecond).
MORE_GAPS = {("B", "max-sum-throughput-perf"): (0.05, 0.035), ("C", "min-total-duration-perf"): (0.10, 0.01),
             ("D4", "max-min-fairness"): (0.015, 0.01), ("D4", "min-total-duration-perf"): (0.02, 0.01),
             ("D4", "max-sum-throughput-perf"): (0.07, 0.01)}


# Every case costs a simulation (0.2-1 s of CPU); the suite runs a subset that covers each program and every gap
# the ECOS path closes, HPCSCHED_GAVEL_ALL=1 runs all of them (51 runs, ~25 s of CPU).
ALL_CASES = os.environ.get("HPCSCHED_GAVEL_ALL") == "1"
MORE_DEFAULT = {("B", "fifo"), ("B", "max-min-fairness-perf"), ("B", "max-sum-throughput-perf"),
                ("C", "max-min-fairness-perf"), ("D4", "fifo"), ("D4", "max-min-fairness-perf")}
ECOS_DEFAULT = {("A", "max-min-fairness-perf"), ("A", "finish-time-fairness-perf"), ("A", "max-sum-throughput-perf"),
                ("A", "max-min-fairness-packed"), *GAPS, ("B", "max-sum-throughput-perf"),
                ("C", "min-total-duration-perf")}


@pytest.mark.parametrize(("trace", "policy"), [k for k in MORE if ALL_CASES or k in MORE_DEFAULT])
def test_generated_traces_vs_gavel(trace: str, policy: str, table) -> None:  # noqa: ANN001
    """The HiGHS default on the generated traces: 1% (FIFO to the millisecond), but for the recorded gaps."""
    jct, makespan = _run(trace, policy, table)
    ref_jct, ref_makespan = MORE[(trace, policy)]
    if policy == "fifo":  # no solver: the mechanism alone, exact
        assert (jct, makespan) == (pytest.approx(ref_jct, abs=1e-3), pytest.approx(ref_makespan, abs=1e-3))
        return
    bound_jct, bound_makespan = MORE_GAPS.get((trace, policy), (0.01, 0.01))
    assert abs(jct / ref_jct - 1) <= bound_jct, f"{trace} {policy}: avg JCT {jct:.3f} vs Gavel's {ref_jct:.3f}"
    assert abs(makespan / ref_makespan - 1) <= bound_makespan, f"{trace} {policy}: makespan {makespan:.3f}"


def test_generated_traces_are_the_generators(table, tmp_path: Path) -> None:  # noqa: ANN001
    """The shipped B, C, D4 are what ``hpcsched trace generate gavel`` writes (the commands in SOURCES.md)."""
    for name, (jobs, rate, seed, max_scale) in {"B": (80, 1.0, 1, 4), "C": (100, 1.0, 2, 8),
                                                "D4": (120, 1.0, 3, 4)}.items():
        out = tmp_path / f"{name}.trace"
        write_trace(generate(jobs, rate, seed, table, max_scale=max_scale), out)
        assert out.read_bytes() == TRACES[name][0].read_bytes(), name


# FIFO solves nothing: the same code with either solver
ECOS_CASES = [k for k in (GAVEL | MORE) if k[1] != "fifo" and (ALL_CASES or k in ECOS_DEFAULT)]


@needs_ecos
@pytest.mark.parametrize(("trace", "policy"), ECOS_CASES)
def test_ecos_is_gavels_to_the_millisecond(trace: str, policy: str, table) -> None:  # noqa: ANN001
    """``--solver ecos`` hands ECOS the very arrays Gavel's cvxpy does, so the allocations, the schedule and the
    figures are Gavel's, to the millisecond it prints, the known HiGHS gaps included."""
    jct, makespan = _run(trace, policy, table, "ecos")
    ref_jct, ref_makespan = (GAVEL | MORE)[(trace, policy)]
    assert jct == pytest.approx(ref_jct, abs=1e-3), f"{trace} {policy}: avg JCT {jct:.4f} vs Gavel's {ref_jct:.3f}"
    assert makespan == pytest.approx(ref_makespan, abs=1e-3), f"{trace} {policy}: makespan {makespan:.4f}"


def test_cli_contract() -> None:
    """The command line other tools rely on: no --out needed, JSON with simulate's keys and Gavel's."""
    from hpcsched.cli import app

    path, cluster = TRACES["A"]
    r = CliRunner().invoke(app, ["simulate", "--trace", str(path), "--cluster", cluster, "--policy", "fifo",
                                 "--compat", "gavel", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["avg_jct"] == pytest.approx(GAVEL[("A", "fifo")][0], abs=1e-3)
    assert out["makespan"] == pytest.approx(GAVEL[("A", "fifo")][1], abs=1e-3)
    assert out["jobs"] == 120 and out["unfinished"] == 0 and out["compat"] == "gavel"
    assert {"p99_jct", "utilization", "rounds", "allocations", "solver", "wall_s"} <= set(out)
    bad = CliRunner().invoke(app, ["simulate", "--trace", str(path), "--cluster", cluster, "--policy", "las",
                                   "--compat", "gavel"])
    assert bad.exit_code == 2 and "max-min-fairness-perf" in bad.output
    bad = CliRunner().invoke(app, ["simulate", "--trace", str(path), "--cluster", cluster, "--policy", "fifo",
                                   "--compat", "gavel", "--solver", "cplex"])
    assert bad.exit_code == 2 and "known: auto, highs, ecos" in bad.output


@needs_ecos
def test_cli_solver_ecos(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--solver ecos`` through the command line: Gavel's figure exactly, the solver named in the JSON; a policy
    without an ECOS program and a missing ecos package are one-line errors (exit 2) naming what to do."""
    import sys

    from hpcsched.cli import app

    path, cluster = TRACES["A4"]
    line = ["simulate", "--trace", str(path), "--cluster", cluster, "--compat", "gavel", "--json", "--solver", "ecos"]
    r = CliRunner().invoke(app, [*line, "--policy", "max-sum-throughput-perf"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert (out["avg_jct"], out["makespan"]) == (pytest.approx(GAVEL[("A4", "max-sum-throughput-perf")][0], abs=1e-3),
                                                 pytest.approx(GAVEL[("A4", "max-sum-throughput-perf")][1], abs=1e-3))
    assert out["lp_solver"] == "ecos" and out["solver"]["ecos_solves"] > 0 and "lp_solves" not in out["solver"]
    r = CliRunner().invoke(app, [*line, "--policy", "max-min-fairness-water-filling"])
    assert r.exit_code == 2 and "no ECOS program" in r.output
    monkeypatch.setitem(sys.modules, "ecos", None)  # as if the cvxpy extra were not installed
    r = CliRunner().invoke(app, [*line, "--policy", "max-min-fairness"])
    assert r.exit_code == 2 and "pip install 'hpcsched[cvxpy]'" in r.output and "Traceback" not in r.output


@needs_ecos
def test_default_solver_is_gavels_exact_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without --solver, --compat gavel gives Gavel's figures (ECOS) where the cvxpy extra is installed; without
    ecos it runs HiGHS and says so on stderr and in meta.json (figures may differ)."""
    import sys

    from hpcsched.cli import app

    path, cluster = TRACES["A4"]
    line = ["simulate", "--trace", str(path), "--cluster", cluster, "--compat", "gavel", "--json", "--policy",
            "max-sum-throughput-perf", "--out"]
    r = CliRunner().invoke(app, [*line, str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["lp_solver"] == "ecos" and "lp_solver_note" not in out
    assert (out["avg_jct"], out["makespan"]) == (pytest.approx(GAVEL[("A4", "max-sum-throughput-perf")][0], abs=1e-3),
                                                 pytest.approx(GAVEL[("A4", "max-sum-throughput-perf")][1], abs=1e-3))
    monkeypatch.setitem(sys.modules, "ecos", None)  # as if the cvxpy extra were not installed
    r = CliRunner().invoke(app, [*line, str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert "note: ecos (the cvxpy extra) is not installed" in r.stderr
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    assert meta["lp_solver"] == "highs" and "may differ" in meta["lp_solver_note"]
    monkeypatch.delitem(sys.modules, "ecos")
    r = CliRunner().invoke(app, [*line[:-2], "max-sum-throughput-normalized-by-cost-perf", "--out",
                                 str(tmp_path / "c")])
    assert r.exit_code == 0, r.output  # no ECOS program of Gavel's for it: HiGHS, said
    assert "has no ECOS program" in r.stderr and json.loads(r.stdout.strip().splitlines()[-1])["lp_solver"] == "highs"


def test_run_writes_results(tmp_path: Path) -> None:
    path, cluster = TRACES["A4"]
    s = run_gavel(path, cluster, "max-sum-throughput-perf", out=tmp_path / "run", solver="highs")
    assert (tmp_path / "run" / "jobs.csv").read_text().count("\n") == 121
    solver = s["solver"]
    assert solver["lp_solves"] + solver.get("lp_reused", 0) == s["allocations"] and "lp_not_optimal" not in solver


def test_bad_cluster_and_unrunnable_job_are_errors(tmp_path: Path) -> None:
    from hpcsched.errors import InputError

    path, _ = TRACES["A"]
    with pytest.raises(InputError, match="one GPU per server"):
        run_gavel(path, "v100=2x4,p100=8,k80=8", "fifo")
    with pytest.raises(InputError, match="fits no GPU type"):  # A has 8-GPU jobs: Gavel would spin forever
        run_gavel(path, "v100=4,p100=4,k80=4", "fifo")
    lines = path.read_text().splitlines(keepends=True)
    broken = tmp_path / "broken.trace"
    broken.write_text("".join(lines[:14]) + "not\ta\tgavel\tline\n" + "".join(lines[14:20]))
    with pytest.raises(InputError, match=r"broken.trace:15: 1 malformed line"):
        run_gavel(broken, "v100=8,p100=8,k80=8", "fifo")


# ---- policies -------------------------------------------------------------------------------------------------

def _inp(thr: np.ndarray, sf: list[int], gpus: list[int]) -> AllocationInput:
    m = len(thr)
    return AllocationInput(tuple(range(m)), ("k80", "p100", "v100"), np.asarray(thr, float), np.array(sf, float),
                           np.ones(m), np.full(m, 1e6), np.zeros(m), np.array(gpus, float))


@pytest.mark.parametrize("solver", ["highs", pytest.param("ecos", marks=needs_ecos)])
@pytest.mark.parametrize("name", ["max-min-fairness", "max-min-fairness-perf", "finish-time-fairness-perf",
                                  "min-total-duration-perf", "max-sum-throughput-perf"])
def test_allocations_fit_the_cluster(name: str, solver: str) -> None:
    rng = np.random.default_rng(7)
    thr = rng.uniform(0.5, 10.0, (9, 3)) * np.array([1.0, 2.0, 4.0])
    sf = [1, 1, 2, 1, 4, 1, 2, 1, 1]
    gpus = [2, 3, 4]
    x = make_policy(name, solver=solver).allocate(_inp(thr, sf, gpus))
    assert x.shape == (9, 3) and (x >= 0).all()
    assert (x.sum(axis=1) <= 1 + 1e-6).all()
    assert ((np.array(sf)[:, None] * x).sum(axis=0) <= np.array(gpus) + 1e-6).all()


def test_max_min_perf_is_optimal_and_interior() -> None:
    """Two identical jobs on one V100 each get half; the aware policy moves a V100-loving job to the V100."""
    x = MaxMinFairnessPerf(name="m").allocate(_inp(np.array([[1.0, 2.0, 4.0]] * 2), [1, 1], [0, 0, 1]))
    assert x[:, 2] == pytest.approx([0.5, 0.5], abs=1e-6)
    thr = np.array([[1.0, 1.0, 10.0], [1.0, 1.0, 1.2]])  # job 0 gains 10x on a V100, job 1 hardly
    x = MaxMinFairnessPerf(name="m").allocate(_inp(thr, [1, 1], [1, 0, 1]))
    assert x[0, 2] > 0.5 > x[1, 2]


def test_fifo_keeps_gavels_assignment_rule() -> None:
    """Gavel's FIFO gives queued jobs the last type (by name) with free GPUs, even past its capacity."""
    p = FifoPolicy(name="fifo", heterogeneity_aware=False, skip_zero_priority=True, seed=0)
    x = p.allocate(_inp(np.ones((3, 3)), [1, 1, 1], [1, 1, 1]))
    assert x[:, 2].tolist() == [1.0, 1.0, 1.0]  # all on v100 ('k80' < 'p100' < 'v100'), though it has one GPU


def test_round_mechanism_single_job(table) -> None:  # noqa: ANN001
    """One job alone: it runs every round on the fastest type the allocation gives it, ends when its steps do."""
    thr = table.isolated("ResNet-18 (batch size 64)", "v100", 1)
    job = RoundJob(0, "ResNet-18 (batch size 64)", int(thr * 1000), 1, 0.0)
    res = simulate_rounds([job], parse_hetero_cluster("v100=1,p100=1,k80=1"), make_policy("max-min-fairness-perf"),
                          table)
    assert res.end[0] == pytest.approx(job.total_steps / thr, rel=1e-3)
    assert res.rounds == 3  # 360 + 360 + the rest


def test_fast_cli_path_is_typers(tmp_path: Path) -> None:
    """``hpcsched simulate --compat gavel`` skips Typer (start-up): same output and exit codes as through Typer,
    and any other word on the line is left to Typer."""
    import subprocess
    import sys

    from hpcsched.hetero.simulate import fast_main

    path, cluster = TRACES["A4"]
    args = ["simulate", "--trace", str(path), "--cluster", cluster, "--policy", "max-sum-throughput-perf",
            "--compat", "gavel", "--json"]
    assert fast_main(args[1:] + ["--help"]) is None
    assert fast_main(args[1:] + ["--seed", "3"]) is None
    assert fast_main([a for a in args[1:] if a not in ("--compat", "gavel")]) is None
    assert fast_main(args[1:] + ["--policy", "fifo"]) is None  # twice: Typer's rule, not ours
    code = ("import sys; from hpcsched import cli; sys.argv = ['hpcsched'] + sys.argv[1:]; "
            "cli.main() if sys.argv[-1] != 'typer' else (sys.argv.pop(), cli.__getattr__('app')())")
    fast = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
    slow = subprocess.run([sys.executable, "-c", code, *args, "typer"], capture_output=True, text=True,
                          check=False)
    assert fast.returncode == slow.returncode == 0, fast.stderr + slow.stderr
    a, b = json.loads(fast.stdout), json.loads(slow.stdout)
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b
    assert "typer" not in subprocess.run(
        [sys.executable, "-c", "import sys; from hpcsched import cli; print(sorted(m for m in sys.modules "
                               "if m.split('.')[0] in ('typer', 'pydantic')))"],
        capture_output=True, text=True, check=True).stdout.replace("[]", "")
    bad = [*args[:6], "las", "--compat", "gavel"]
    fast = subprocess.run([sys.executable, "-c", code, *bad], capture_output=True, text=True, check=False)
    slow = subprocess.run([sys.executable, "-c", code, *bad, "typer"], capture_output=True, text=True, check=False)
    assert fast.returncode == slow.returncode == 2 and fast.stderr == slow.stderr and "known: fifo" in fast.stderr


# ---- minimum cost and hierarchical (water-filling) fairness: small cases solved by hand -----------------------

def _inp2(thr: list[list[float]], sf: list[int], gpus: list[int], *, prices: list[float] | None = None,
          rem: list[float] | None = None, slo_left: list[float] | None = None,
          entities: tuple[str, ...] = ()) -> AllocationInput:
    """Two types, (k80, v100) in Gavel's (name) order."""
    m = len(thr)
    return AllocationInput(tuple(range(m)), ("k80", "v100"), np.asarray(thr, float), np.array(sf, float), np.ones(m),
                           np.array(rem if rem is not None else [1e6] * m, float), np.zeros(m),
                           np.array(gpus, float), prices=None if prices is None else np.array(prices, float),
                           slo_left=None if slo_left is None else np.array(slo_left, float), entities=entities)


def test_min_cost_by_hand() -> None:
    """One job, 1 step/s on a $0.5/h K80, 4 steps/s on a $3/h V100. Steps per dollar: 2 on the K80, 1.33 on the
    V100, so min cost puts it on the K80 alone (max-sum throughput would pick the V100). With an SLO needing
    2 steps/s the K80 (1 step/s) is not enough: on x_k + x_v = 1, 2 x_k + 1.33 x_v falls as x_v grows, so the
    optimum is the least V100 share meeting x_k + 4 x_v >= 2: x_v = 1/3, x_k = 2/3."""
    thr, cheap_gpus, prices = [[1.0, 4.0]], [1, 1], [0.5, 3.0]
    x = make_policy("max-sum-throughput-normalized-by-cost-perf").allocate(_inp2(thr, [1], cheap_gpus, prices=prices))
    assert x[0] == pytest.approx([1.0, 0.0], abs=1e-6)
    assert make_policy("max-sum-throughput-perf").allocate(_inp2(thr, [1], cheap_gpus))[0] == pytest.approx(
        [0.0, 1.0], abs=1e-6)
    p = make_policy("max-sum-throughput-normalized-by-cost-perf-SLOs")
    x = p.allocate(_inp2(thr, [1], cheap_gpus, prices=prices, rem=[2000.0], slo_left=[1000.0]))
    assert x[0] == pytest.approx([2 / 3, 1 / 3], abs=1e-6)
    assert "slo_infeasible" not in p.stats
    # an SLO of 5 steps/s cannot be met (4 at most): Gavel solves again without SLOs, and so do we, counted
    x = p.allocate(_inp2(thr, [1], cheap_gpus, prices=prices, rem=[5000.0], slo_left=[1000.0]))
    assert x[0] == pytest.approx([1.0, 0.0], abs=1e-6) and p.stats["slo_infeasible"] == 1


def test_min_cost_without_prices_is_max_sum_throughput(table) -> None:  # noqa: ANN001
    """Gavel without a price file costs every type 1: the figure is max-sum-throughput's, to the last bit."""
    path, cluster = TRACES["A4"]
    # one solver for both (auto would give the second Gavel's ECOS program, which the first has not)
    a = run_gavel(path, cluster, "max-sum-throughput-normalized-by-cost-perf", solver="highs")
    b = run_gavel(path, cluster, "max-sum-throughput-perf", solver="highs")
    assert (a["avg_jct"], a["makespan"]) == (b["avg_jct"], b["makespan"])


def test_water_filling_by_hand() -> None:
    """K80 x2, V100 x1. Job 0 runs only on K80s (1 step/s), jobs 1-3 only on the V100 (1 step/s). Equal shares:
    job 0 gets 2/3 x 1, jobs 1-3 1/3 each, so normalised throughput is 1.5 x_0 for job 0 and 3 x_i for the
    others. Max-min: jobs 1-3 share the V100, 1/3 each, level 1; job 0 needs only x_0 >= 2/3. Water filling
    freezes jobs 1-3 at 1 and raises job 0 to its cap, x_0 = 1 (level 1.5)."""
    thr = [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]]
    wf = make_policy("max-min-fairness-water-filling-perf")
    x = wf.allocate(_inp2(thr, [1] * 4, [2, 1]))
    assert x[0, 0] == pytest.approx(1.0, abs=1e-6)
    assert x[1:, 1] == pytest.approx([1 / 3] * 3, abs=1e-6)
    assert wf.stats["milp_solves"] == 2  # the second round finds job 0 capped too
    plain = make_policy("max-min-fairness-perf").allocate(_inp2(thr, [1] * 4, [2, 1]))
    assert 2 / 3 - 1e-6 <= plain[0, 0] < 1.0 - 1e-3  # any point of the face; not raised to the cap


def test_hierarchical_fairness_by_hand() -> None:
    """One V100, three identical jobs; user u1 owns jobs 0 and 1, u2 owns job 2, users weighted 1:1. u1's weight
    is split over its two jobs (1/2 each), so the weighted max-min gives job 2 twice a u1 job's share:
    y_0 = y_1 = t/2, y_2 = t, sum 1 -> t = 1/2: 1/4, 1/4, 1/2 (each user 1/2). Without entities: 1/3 each.
    Weights 3:1 for u1:u2 give u1 3/4 (3/8 per job) and u2 1/4."""
    thr, gpus = [[0.0, 1.0]] * 3, [0, 1]
    users = ("u1", "u1", "u2")
    x = make_policy("max-min-fairness-water-filling-perf", entity_weights={"u1": 1, "u2": 1}).allocate(
        _inp2(thr, [1] * 3, gpus, entities=users))
    assert x[:, 1] == pytest.approx([0.25, 0.25, 0.5], abs=1e-6)
    x = make_policy("max-min-fairness-water-filling-perf").allocate(_inp2(thr, [1] * 3, gpus, entities=users))
    assert x[:, 1] == pytest.approx([1 / 3] * 3, abs=1e-6)
    x = make_policy("max-min-fairness-water-filling", entity_weights={"u1": 3, "u2": 1}).allocate(
        _inp2(thr, [1] * 3, gpus, entities=users))
    assert x[:, 1] == pytest.approx([3 / 8, 3 / 8, 1 / 4], abs=1e-6)


# ---- space sharing (max-min-fairness-packed) ------------------------------------------------------------------

def _packed(iso: list[float], pair: tuple[float, float]) -> np.ndarray:
    """Two jobs on one V100 (one GPU), isolated rates ``iso``, rates ``pair`` when they share it."""
    inp = AllocationInput((0, 1), ("v100",), np.array([[iso[0]], [iso[1]]]), np.ones(2), np.ones(2), np.full(2, 1e6),
                          np.zeros(2), np.array([1.0]), pairs=((0, 1),), pair_throughputs=np.array([[pair]]))
    return MaxMinFairnessPacked(name="packed").allocate(inp)


def test_packed_lp_by_hand() -> None:
    """Job a keeps 0.8 of its rate in the pair, b 0.9 (rates 1 and 2 alone: normalised by each job's own).

    max t: x_a + 0.8 x_p >= t, x_b + 0.9 x_p >= t, x_a + x_b + x_p <= 1. The duals (9/11, 2/11 on the jobs,
    9/11 on the GPU) make x_b = 0 and both rows tight: x_p = 1 / 1.1 = 10/11, x_a = 1/11, t = 9/11."""
    x = _packed([1.0, 2.0], (0.8, 1.8))
    assert x.shape == (3, 1)  # job 0, job 1, pair (0, 1)
    assert x[:, 0] == pytest.approx([1 / 11, 0.0, 10 / 11], abs=1e-6)
    # a pair that slows both jobs below half their rate is never chosen: each job gets half the GPU alone
    x = _packed([1.0, 2.0], (0.3, 0.6))
    assert x[:, 0] == pytest.approx([0.5, 0.5, 0.0], abs=1e-6)


def packed_fit_case(table, remaining: float, since: float) -> AllocationInput:  # noqa: ANN001
    """Five jobs of sizes 1 and 2 on two GPUs of each type, every same-size pair allowed: an input on which a packed
    policy's allocation is checked against the cluster (``assert_packed_fits``)."""
    kinds = ["ResNet-18 (batch size 16)", "ResNet-50 (batch size 32)", "ResNet-18 (batch size 64)",
             "ResNet-18 (batch size 256)", "ResNet-50 (batch size 64)"]
    types = ("k80", "p100", "v100")
    sf = [1, 1, 2, 1, 2]
    thr = np.array([[table.isolated(k, t, s) for t in types] for k, s in zip(kinds, sf, strict=True)])
    pairs = tuple((a, b) for a in range(5) for b in range(a + 1, 5) if sf[a] == sf[b])
    pthr = np.array([[table.colocated(kinds[a], kinds[b], t, sf[a]) for t in types] for a, b in pairs])
    return AllocationInput(tuple(range(5)), types, thr, np.array(sf, float), np.ones(5), np.full(5, remaining),
                           np.full(5, since), np.array([2.0, 2.0, 2.0]), pairs=pairs, pair_throughputs=pthr)


def assert_packed_fits(x: np.ndarray, inp: AllocationInput) -> None:
    """Per type sum(sf x) <= GPUs counting a pair once; per job its alone and pair time sums to <= 1."""
    n, pairs = len(inp.job_ids), inp.pairs
    assert x.shape == (n + len(pairs), 3) and (x >= 0).all()
    sfc = np.array(list(inp.scale_factors) + [inp.scale_factors[a] for a, _ in pairs], float)
    assert ((sfc[:, None] * x).sum(axis=0) <= inp.gpus + 1e-6).all()
    for i in range(n):
        rows = [i] + [n + p for p, ab in enumerate(pairs) if i in ab]
        assert x[rows].sum() <= 1 + 1e-6


def test_packed_allocations_fit_the_cluster(table) -> None:  # noqa: ANN001
    """Per type sum(sf x) <= GPUs counting a pair once; per job its alone and pair time sums to <= 1."""
    inp = packed_fit_case(table, 1e6, 0.0)
    x = make_policy("max-min-fairness-packed").allocate(inp)
    assert_packed_fits(x, inp)
    assert x[5:].sum() > 0.1  # sharing pays on this table: some pair gets time


def test_packed_mechanism_pair_by_hand(table) -> None:  # noqa: ANN001
    """Two ResNet-18 jobs on one V100 share it (the table gives each its full rate in the pair): both run every
    round from t = 0; job 0 ends with the first round; the pair dies with it and job 1 runs alone after that."""
    kind = "ResNet-18 (batch size 16)"
    iso = table.isolated(kind, "v100")
    r0, r1 = table.colocated(kind, kind, "v100")
    s0, s1 = int(r0 * 360), int(r1 * 360)
    first = max(s0 / r0, s1 / r1)  # the pair's round ends when its slower job does
    alone = int(iso * 360)
    jobs = [RoundJob(0, kind, s0, 1, 0.0), RoundJob(1, kind, s1 + alone, 1, 0.0)]
    seen: list[tuple[float, dict[int, str]]] = []
    res = simulate_rounds(jobs, parse_hetero_cluster("v100=1"), make_policy("max-min-fairness-packed"), table,
                          on_round=lambda t, s: seen.append((t, dict(s))))
    assert seen[0] == (0.0, {0: "v100", 1: "v100"})  # both jobs on the one GPU in the first round
    assert res.end[0] == pytest.approx(first, rel=1e-12)
    assert res.end[1] == pytest.approx(first + alone / iso, rel=1e-12)
    assert seen[1] == (pytest.approx(first, rel=1e-12), {1: "v100"})
    assert res.rounds == 2


def test_packed_cli() -> None:
    """The packed policy through the issue's command line contract (Typer and the fast path)."""
    from hpcsched.cli import app

    path, cluster = TRACES["A4"]
    r = CliRunner().invoke(app, ["simulate", "--trace", str(path), "--cluster", cluster, "--policy",
                                 "max-min-fairness-packed", "--compat", "gavel", "--json", "--solver", "highs"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    ref_jct, ref_makespan = GAVEL[("A4", "max-min-fairness-packed")]
    assert out["avg_jct"] == pytest.approx(ref_jct, rel=0.01)
    assert out["makespan"] == pytest.approx(ref_makespan, rel=0.01)
    assert out["unfinished"] == 0 and out["solver"]["lp_solves"] > 0
