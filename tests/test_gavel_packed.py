"""Gavel's other space-sharing policies (``hetero/packed_policies.py``) against Gavel's own simulator (issue 19).

The figures are what Gavel's simulator (stanford-futuredata/gavel at c4fa400, MIT) printed for the two traces in
``trace-data/gavel/`` with the command of ../shared/reference/gavel/README.md (ECOS), after reverting 40a22a7's
changes to ``policies/policy.py`` and ``policies/max_min_fairness.py`` (its packed constraint crashes with
multi-GPU jobs) and, for the minimum-cost variant only, reading ``state.get('SLOs', {})`` in its
``_compute_allocation`` (its trace driver never sets SLOs, so the variant raised KeyError): average JCT (its
``get_average_jct``) and makespan ("Total duration"), s. The contract is 1%; ``fifo-packed`` needs no solver and
matches to the millisecond. docs/hetero.md ("Space sharing") has the table and the gaps.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_gavel_compat import TRACES, assert_packed_fits, packed_fit_case  # reference traces, shared checks

from hpcsched.hetero.policies import POLICIES, AllocationInput, gavel_horizon, make_policy
from hpcsched.hetero.rounds import simulate_rounds
from hpcsched.hetero.simulate import load_round_jobs
from hpcsched.hetero.throughputs import load_throughputs
from hpcsched.primitives.hetero_cluster import parse_hetero_cluster

GAVEL = {  # (trace, policy): (average JCT, makespan) printed by Gavel's simulator
    ("A", "fifo-packed"): (61437.784, 1497336.979),
    ("A4", "fifo-packed"): (225916.168, 1699888.739),
    ("A", "finish-time-fairness-packed"): (60519.774, 1499221.012),
    ("A4", "finish-time-fairness-packed"): (76604.995, 1563712.906),
    ("A", "min-total-duration-packed"): (69089.501, 1497733.387),
    ("A4", "min-total-duration-packed"): (159276.744, 1496039.633),
    ("A", "max-sum-throughput-normalized-by-cost-packed-SLOs"): (57917.732, 1495896.107),
    ("A4", "max-sum-throughput-normalized-by-cost-packed-SLOs"): (72475.755, 1537684.176),
}
# Known gaps (docs/hetero.md, "Space sharing"): min total duration's answer is *any* point of a feasibility set,
# and Gavel's is the one ECOS stops at; Gavel's own programs solved by ECOS inside our mechanism give Gavel's
# figures to the millisecond on both traces, so the gap is the solver's choice. (figure, bound we do meet)
GAPS = {("A", "min-total-duration-packed"): ("avg_jct", 0.05), ("A4", "min-total-duration-packed"): ("avg_jct", 0.18)}
NEW = ("fifo-packed", "finish-time-fairness-packed", "min-total-duration-packed",
       "max-sum-throughput-normalized-by-cost-packed-SLOs")


@pytest.fixture(scope="module")
def table():  # noqa: ANN201 - a fixture
    return load_throughputs()


@pytest.fixture(scope="module")
def runs(table):  # noqa: ANN001, ANN201 - fixtures
    """(trace, policy) -> (average JCT, makespan), each run once for this module (the gap tests reuse them)."""
    done: dict[tuple[str, str], tuple[float, float]] = {}

    def run(trace: str, policy: str) -> tuple[float, float]:
        if (trace, policy) not in done:
            path, cluster = TRACES[trace]
            res = simulate_rounds(load_round_jobs(path), parse_hetero_cluster(cluster), make_policy(policy), table)
            assert all(e is not None for e in res.end), "every job of Gavel's traces completes"
            assert res.avg_jct is not None
            done[(trace, policy)] = (res.avg_jct, res.makespan)
        return done[(trace, policy)]
    return run


@pytest.mark.parametrize(("trace", "policy"), list(GAVEL))
def test_packed_figures_vs_gavel(trace: str, policy: str, runs) -> None:  # noqa: ANN001
    jct, makespan = runs(trace, policy)
    ref_jct, ref_makespan = GAVEL[(trace, policy)]
    if policy == "fifo-packed":  # no solver: the pair rules and Gavel's FIFO packing, to the millisecond
        assert jct == pytest.approx(ref_jct, abs=1e-3)
        assert makespan == pytest.approx(ref_makespan, abs=1e-3)
        return
    gap = GAPS.get((trace, policy))
    for name, ours, ref in (("avg_jct", jct, ref_jct), ("makespan", makespan, ref_makespan)):
        bound = gap[1] if gap is not None and gap[0] == name else 0.01
        assert abs(ours / ref - 1) <= bound, f"{trace} {policy} {name}: ours {ours:.3f}, Gavel's {ref:.3f}"


@pytest.mark.xfail(strict=True, reason="known gap, explained in docs/hetero.md: another feasible allocation")
@pytest.mark.parametrize(("trace", "policy"), list(GAPS))
def test_packed_gaps_within_contract(trace: str, policy: str, runs) -> None:  # noqa: ANN001
    jct, _ = runs(trace, policy)
    assert abs(jct / GAVEL[(trace, policy)][0] - 1) <= 0.01


# A loaded trace, where pairs run in many rounds (>= 191 of 1,346 here, against ~1% on A and A4): ``hpcsched trace
# generate gavel --seed 3 --jobs 40 --rate 3 --max-scale 4`` on 4:4:4, through Gavel with the same command and
# revert (docs/hetero.md also has finish-time-fairness-packed there: +0.89% / +0.56%, Gavel's with its programs).
LOADED_FIFO_PACKED = (139798.124, 484457.069)


def test_loaded_trace_fifo_packed_is_gavels_to_the_millisecond(table, tmp_path: Path) -> None:  # noqa: ANN001
    from hpcsched.hetero.workload import generate, write_trace

    path = tmp_path / "L_40jobs_3jph_seed3_sfmax4.trace"
    write_trace(generate(40, 3.0, 3, max_scale=4), path)
    res = simulate_rounds(load_round_jobs(path), parse_hetero_cluster("v100=4,p100=4,k80=4"),
                          make_policy("fifo-packed"), table)
    assert all(e is not None for e in res.end)
    assert res.avg_jct == pytest.approx(LOADED_FIFO_PACKED[0], abs=1e-3)
    assert res.makespan == pytest.approx(LOADED_FIFO_PACKED[1], abs=1e-3)


def test_registered_with_gavels_names() -> None:
    for name in NEW:
        assert name in POLICIES
        pol = make_policy(name)
        assert pol.space_sharing and pol.name == name
    assert make_policy("fifo-packed").skip_zero_priority  # Gavel's FIFO never runs a priority-0 combination


def _two(iso: tuple[float, float], pair: tuple[float, float], *, rem: float = 1e6, slo_left: float = np.inf,
         ) -> AllocationInput:
    """Two jobs on one V100 (one GPU), isolated rates ``iso``, rates ``pair`` when they share it."""
    return AllocationInput((0, 1), ("v100",), np.array([[iso[0]], [iso[1]]]), np.ones(2), np.ones(2),
                           np.full(2, rem), np.zeros(2), np.array([1.0]), slo_left=np.array([slo_left, np.inf]),
                           pairs=((0, 1),), pair_throughputs=np.array([[pair]]))


def test_fifo_packed_by_hand() -> None:
    """Job 0 takes the V100; job 1 packs onto it only when the pair keeps > 1.5 of their normalised rates."""
    x = make_policy("fifo-packed").allocate(_two((1.0, 2.0), (0.8, 1.8)))  # 0.8 + 0.9 = 1.7
    assert x[:, 0].tolist() == [0.0, 0.0, 1.0]  # rows: job 0, job 1, pair (0, 1)
    x = make_policy("fifo-packed").allocate(_two((1.0, 2.0), (0.7, 1.5)))  # 0.7 + 0.75 = 1.45
    assert x[:, 0].tolist() == [1.0, 0.0, 0.0]
    # FIFO order: job 1 packs with nobody, so job 2 is not packed either, although (0, 2) would pay
    inp = AllocationInput((0, 1, 2), ("v100",), np.array([[1.0], [1.0], [1.0]]), np.ones(3), np.ones(3),
                          np.full(3, 1e6), np.zeros(3), np.array([1.0]), pairs=((0, 1), (0, 2), (1, 2)),
                          pair_throughputs=np.array([[[0.5, 0.5]], [[0.9, 0.9]], [[0.9, 0.9]]]))
    assert make_policy("fifo-packed").allocate(inp)[:, 0].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    # each job its fastest type with room (here the K80, by the table's numbers it would rarely be)
    inp = AllocationInput((0,), ("k80", "v100"), np.array([[3.0, 2.0]]), np.ones(1), np.ones(1), np.full(1, 1e6),
                          np.zeros(1), np.array([1.0, 1.0]))
    assert make_policy("fifo-packed").allocate(inp).tolist() == [[1.0, 0.0]]


def test_finish_time_fairness_packed_by_hand() -> None:
    """Two jobs of 100 steps at 1 step/s alone: the isolated share (half the GPU) finishes both at 200 s, rho 1.
    Sharing the GPU runs each at 0.8: both end at 125 s, rho 0.625, and nothing else reaches it
    (x_a = x_b = a, x_p = 1 - 2a gives each 0.8 - 0.6a): the whole GPU to the pair."""
    x = make_policy("finish-time-fairness-packed").allocate(_two((1.0, 1.0), (0.8, 0.8), rem=100.0))
    assert x[:, 0] == pytest.approx([0.0, 0.0, 1.0], abs=1e-6)
    # a pair that slows both below half their rate never beats the isolated share
    x = make_policy("finish-time-fairness-packed").allocate(_two((1.0, 1.0), (0.4, 0.4), rem=100.0))
    assert x[:, 0] == pytest.approx([0.5, 0.5, 0.0], abs=1e-6)


def test_min_total_duration_packed_by_hand() -> None:
    """The same two jobs: alone they need 200 s, paired 125 s (lambda* = 0.8 / 100). Gavel's bisection stops at
    T = gavel_horizon(125) and any allocation giving each job 100 / T steps/s is its answer; alone (x_a = x_b =
    1/2) gives 0.5 < 100 / T, so the pair must get at least (100 / T - 0.5) / 0.3 of the GPU."""
    x = make_policy("min-total-duration-packed").allocate(_two((1.0, 1.0), (0.8, 0.8), rem=100.0))[:, 0]
    need = 100.0 / gavel_horizon(125.0)
    assert need > 0.5
    assert x[0] + 0.8 * x[2] >= need - 1e-7 and x[1] + 0.8 * x[2] >= need - 1e-7
    assert x.sum() <= 1 + 1e-7 and x[2] >= (need - 0.5) / 0.3 - 1e-6


def test_min_cost_packed_by_hand() -> None:
    """Max total steps/s (per dollar): a pair earns both jobs' rates, so it wins when they sum above the
    fastest job alone; an SLO (job 0: 50 steps in 100 s) holds its job at 0.5 steps/s; an unmeetable one
    is dropped (counted) as Gavel drops it."""
    name = "max-sum-throughput-normalized-by-cost-packed-SLOs"
    assert make_policy(name).allocate(_two((1.0, 2.0), (0.8, 1.8)))[:, 0] == pytest.approx([0, 0, 1], abs=1e-6)
    assert make_policy(name).allocate(_two((1.0, 2.0), (0.3, 1.2)))[:, 0] == pytest.approx([0, 1, 0], abs=1e-6)
    x = make_policy(name).allocate(_two((1.0, 2.0), (0.3, 1.2), rem=50.0, slo_left=100.0))
    assert x[:, 0] == pytest.approx([0.5, 0.5, 0.0], abs=1e-6)
    pol = make_policy(name)
    x = pol.allocate(_two((1.0, 2.0), (0.3, 1.2), rem=500.0, slo_left=100.0))
    assert x[:, 0] == pytest.approx([0, 1, 0], abs=1e-6) and pol.stats["slo_infeasible"] == 1
    # prices: 3 steps/s on a V100 at 4 $/h is less per dollar than 1 on a K80 at 1 $/h
    inp = AllocationInput((0,), ("k80", "v100"), np.array([[1.0, 3.0]]), np.ones(1), np.ones(1), np.full(1, 1e6),
                          np.zeros(1), np.array([1.0, 1.0]), prices=np.array([1.0, 4.0]))
    assert make_policy(name).allocate(inp) == pytest.approx(np.array([[1.0, 0.0]]), abs=1e-6)


@pytest.mark.parametrize("name", NEW)
def test_packed_allocations_fit_the_cluster(name: str, table) -> None:  # noqa: ANN001
    """Per type sum(sf x) <= GPUs counting a pair once; per job its alone and pair time sums to <= 1."""
    inp = packed_fit_case(table, 1e5, 100.0)
    assert_packed_fits(make_policy(name).allocate(inp), inp)


def test_packed_cli(tmp_path: Path) -> None:
    """A new packed policy through the issue's command line contract (the fast path), writing results."""
    import contextlib
    import io

    from hpcsched.hetero.simulate import fast_main

    path, cluster = TRACES["A"]
    out = tmp_path / "run"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = fast_main(["--trace", str(path), "--cluster", cluster, "--policy", "fifo-packed",
                        "--compat", "gavel", "--out", str(out), "--json"])
    assert rc == 0
    summary = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert summary["avg_jct"] == pytest.approx(GAVEL[("A", "fifo-packed")][0], abs=1e-3)
    assert summary["unfinished"] == 0 and (out / "jobs.csv").exists()


def test_fifo_packed_needs_no_solver_so_either_runs_it() -> None:
    assert type(make_policy("fifo-packed", solver="ecos")) is type(make_policy("fifo-packed"))
    with pytest.raises(KeyError, match="no ECOS program"):
        make_policy("min-total-duration-packed", solver="ecos")
