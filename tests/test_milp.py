"""The harvesting allocator: exact against brute force, backends agree, mapping rules, bad input."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from hpcsched.errors import InputError
from hpcsched.milp import MilpJob, Objective, Problem, allocate, check_job, job_values, objective_value
from hpcsched.milp.backends import SolverUnavailable
from hpcsched.milp.formulation import build, pieces_of
from hpcsched.milp.mapping import map_nodes
from hpcsched.model import ElasticJob, ScalingCurve
from hpcsched.traces.bftrainer import read_elastic_jobs

BF = "trace-data/bftrainer/"
SHUFFLE = ScalingCurve((0.0, 1, 2, 4, 8, 16, 32, 64), (0.0, 2831, 5259, 9988, 20379.2, 38895.3, 74125.1, 145081.5))


def _job(i: int, curve: ScalingCurve = SHUFFLE, jmin: int = 1, jmax: int = 64, up: float = 18, dw: float = 12):
    return ElasticJob(f"j{i}", 0.0, jmin, jmax, curve, 1e8, up, dw)


def _random_problem(rng: random.Random) -> Problem:
    """Small instances with non-concave, possibly discontinuous curves and random holdings."""
    n_jobs = rng.randint(1, 3)
    pool = [f"n{k}" for k in range(rng.randint(0, 11))]
    free = list(pool)
    states = []
    for i in range(n_jobs):
        xs = sorted(rng.sample(range(0, 12), rng.randint(2, 5)))
        curve = ScalingCurve(tuple(float(x) for x in xs), tuple(rng.uniform(0, 100) for _ in xs))
        jmin = rng.randint(1, 4)
        job = _job(i, curve, jmin, rng.randint(jmin, 9), rng.uniform(0, 30), rng.uniform(0, 30))
        c = rng.randint(0, min(len(free), job.jmax))
        lost = frozenset({"gone"}) if rng.random() < 0.3 else frozenset()
        states.append(MilpJob(job, tuple(free[:c]), lost))
        free = free[c:]
    return Problem(tuple(states), tuple(pool), rng.choice([1.0, 10.0, 60.0]), rng.choice(list(Objective)))


def _brute_force(problem: Problem) -> float:
    values = job_values(problem)
    size = len(problem.pool)
    return max(
        objective_value(values, c)
        for c in itertools.product(range(size + 1), repeat=len(values))
        if sum(c) <= size and all(math.isfinite(v.value(n)) for v, n in zip(values, c, strict=True))
    )


def _solvers() -> list[str]:
    out = ["highs", "dp"]
    try:
        import mip  # noqa: F401

        out.append("cbc")
    except ImportError:
        pass
    return out


def test_exact_solvers_match_brute_force_on_random_non_concave_instances() -> None:
    rng = random.Random(7)
    checked = 0
    solvers = _solvers()
    for k in range(80):
        p = _random_problem(rng)
        best = _brute_force(p)
        for solver in solvers if k < 25 else solvers[:2]:  # cbc is slow to start: fewer rounds
            d = allocate(p, solver)
            assert d.objective == pytest.approx(best, rel=1e-7, abs=1e-6), (solver, p)
            assert sum(d.counts.values()) <= len(p.pool)
            for s in p.jobs:
                n = d.counts[s.job.id]
                assert n == 0 or s.job.jmin <= n <= s.job.jmax
            checked += 1
    assert checked >= 160


def test_pieces_reproduce_the_value_function_exactly() -> None:
    """Every feasible count is covered by exactly one piece and the piece's affine value is exact."""
    rng = random.Random(3)
    for _ in range(60):
        p = _random_problem(rng)
        for j, jv in enumerate(job_values(p)):
            covered: dict[int, float] = {}
            for pc in pieces_of(j, jv):
                for n in range(pc.lo, pc.hi + 1):
                    assert n not in covered
                    covered[n] = pc.v_lo + pc.slope * (n - pc.lo)
            feasible = [0, *jv.domain]
            assert sorted(covered) == feasible
            for n in feasible:
                assert covered[n] == pytest.approx(jv.value(n), rel=1e-9, abs=1e-9)


def test_reference_objective_by_hand() -> None:
    """One job on 2 nodes (rate 5259), pool of 4: growing to 4 earns Tfwd*9988 - 18*5259."""
    job = _job(0)
    p = Problem((MilpJob(job, ("a", "b")),), ("a", "b", "c", "d"), 300.0)
    d = allocate(p)
    assert d.counts == {"j0": 4}
    assert d.objective == pytest.approx(300 * 9988 - 18 * 5259)
    assert d.nodes["j0"][:2] == ("a", "b")  # keeps its nodes
    # with Tfwd=10 growing does not pay for itself (99880 - 94662 < 52590): the job stays put
    d1 = allocate(Problem((MilpJob(job, ("a", "b")),), ("a", "b", "c", "d"), 10.0))
    assert d1.counts == {"j0": 2} and d1.objective == pytest.approx(52590)


def test_window_objective_charges_start_up_and_not_twice_after_preemption() -> None:
    job = _job(0)
    # starting from zero is a scale-up inside the window: (Tfwd - Tup) * S(n), worthless if Tfwd <= Tup
    p = Problem((MilpJob(job),), ("a", "b"), 10.0, Objective.WINDOW)
    assert allocate(p).objective == 0.0
    p = Problem((MilpJob(job),), ("a", "b"), 60.0, Objective.WINDOW)
    d = allocate(p)
    assert d.counts == {"j0": 2} and d.objective == pytest.approx((60 - 18) * 5259)
    # preempted at this event: one restart (Tdw) whatever size it restarts at
    pre = MilpJob(job, ("a",), frozenset({"z"}))
    d = allocate(Problem((pre,), ("a", "b", "c", "d"), 60.0, Objective.WINDOW))
    assert d.counts == {"j0": 4} and d.objective == pytest.approx((60 - 12) * 9988)


@pytest.mark.parametrize("solver", ["highs", "dp", "cbc", "gurobi"])
def test_backends_agree_on_bundled_jobs(solver: str) -> None:
    if solver == "cbc":
        pytest.importorskip("mip", reason="cbc backend needs the [cbc] extra (python-mip 1.15)")
    if solver == "gurobi":
        pytest.importorskip("gurobipy", reason="gurobi backend needs the [gurobi] extra (gurobipy)")
    jobs = read_elastic_jobs(BF + "ImageNet-imgps-Jbnd-1001J.csv", BF + "ImageNet-imgps-JNPs-1001J.csv")[:12]
    rng = random.Random(11)
    pool = [f"n{k}" for k in range(300)]
    free = list(pool)
    states = []
    for j in jobs:
        c = rng.choice([0, 0, 3, 9, 17, 40])
        states.append(MilpJob(j, tuple(free[:c])))
        free = free[c:]
    for tfwd in (10.0, 120.0):
        p = Problem(tuple(states), tuple(pool), tfwd)
        ref = allocate(p, "highs")
        try:
            d = allocate(p, solver)
        except SolverUnavailable as e:
            pytest.skip(str(e))
        assert d.status == "optimal"
        assert d.objective == pytest.approx(ref.objective, rel=1e-9)
        assert d.objective >= allocate(p, "greedy").objective - 1e-6
        assert d.objective >= allocate(p, "equal").objective - 1e-6


def test_time_limit_never_returns_an_empty_allocation() -> None:
    jobs = [_job(i) for i in range(60)]
    pool = tuple(f"n{k}" for k in range(2000))
    p = Problem(tuple(MilpJob(j) for j in jobs), pool, 10.0)
    d = allocate(p, "highs", time_limit=1e-6)
    assert d.status in ("time_limit", "fallback", "optimal")
    assert sum(d.counts.values()) > 0
    assert d.objective >= allocate(p, "greedy").objective - 1e-6


def test_mapping_keeps_nodes_and_never_returns_preempted_nodes() -> None:
    a, b = _job(0), _job(1)
    # job a lost n2 and n3 at this event, yet the (buggy or racing) pool lists them as idle again
    sa = MilpJob(a, ("n0", "n1"), frozenset({"n2", "n3"}))
    sb = MilpJob(b, ("n4",))
    pool = ("n0", "n1", "n2", "n3", "n4", "n5", "n6")
    nodes = map_nodes((sb, sa), pool, (3, 4))
    assert nodes["j0"][:2] == ("n0", "n1")
    assert not set(nodes["j0"]) & {"n2", "n3"}
    assert nodes["j1"][0] == "n4"
    assert not set(nodes["j0"]) & set(nodes["j1"])
    assert len(nodes["j0"]) == 4 and len(nodes["j1"]) == 3
    # shrinking releases the newest nodes first
    assert map_nodes((MilpJob(a, ("n0", "n1", "n2")),), ("n0", "n1", "n2"), (1,))["j0"] == ("n0",)


def test_allocate_maps_preempted_jobs_away_from_lost_nodes_end_to_end() -> None:
    a = _job(0)
    s = MilpJob(a, ("n0",), frozenset({"n1", "n2"}))
    d = allocate(Problem((s, MilpJob(_job(1))), ("n0", "n1", "n2", "n3"), 300.0))
    assert not set(d.nodes["j0"]) & {"n1", "n2"}
    assert sorted(n for ns in d.nodes.values() for n in ns) == sorted(set(n for ns in d.nodes.values() for n in ns))


def test_bad_bounds_and_curves_are_clear_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="Jmin"):
        _job(0, jmin=5, jmax=2)
    with pytest.raises(ValueError, match="increasing"):
        ScalingCurve((0.0, 4.0, 2.0), (0.0, 1.0, 2.0))
    with pytest.raises(ValueError, match=">= 0"):
        ScalingCurve((0.0, 1.0), (0.0, -3.0))
    bounds = tmp_path / "b.csv"
    curves = tmp_path / "c.csv"
    bounds.write_text("job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\nJ0,18,12,8,4,1000,0\n")
    curves.write_text('job,Ns,Ps,Os,Tsub\nJ0,"[0, 1, 2]","[0, 1, 2]","[0, 1, 2]",0\n')
    with pytest.raises(InputError) as e:
        read_elastic_jobs(bounds, curves)
    assert "b.csv" in str(e.value) and ":2" in str(e.value)
    bounds.write_text("job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\nJ0,18,12,1,4,1000,0\n")
    curves.write_text('job,Ns,Ps,Os,Tsub\nJ0,"[0, 2, 1]","[0, 1, 2]","[0, 1, 2]",0\n')
    with pytest.raises(InputError, match="increasing"):
        read_elastic_jobs(bounds, curves)
    curves.write_text('job,Ns,Ps,Os,Tsub\nJ0,"[0, 1, 2]","[0, -1, 2]","[0, 1, 2]",0\n')
    with pytest.raises(InputError, match=">= 0"):
        read_elastic_jobs(bounds, curves)
    # a record built around the constructor's checks is still refused before any solve
    bad = object.__new__(ElasticJob)
    for k, v in dict(id="x", submit=0.0, jmin=3, jmax=1, curve=SHUFFLE, total_samples=1.0,
                     scale_up_s=0.0, scale_down_s=0.0).items():
        object.__setattr__(bad, k, v)
    with pytest.raises(ValueError, match="Jmin"):
        check_job(bad)
    with pytest.raises(ValueError, match="Jmin"):
        Problem((MilpJob(bad),), ("n0",), 10.0)


def test_problem_rejects_inconsistent_holdings() -> None:
    with pytest.raises(ValueError, match="two jobs"):
        Problem((MilpJob(_job(0), ("n0",)), MilpJob(_job(1), ("n0",))), ("n0",), 10.0)
    with pytest.raises(ValueError, match="not in the idle pool"):
        Problem((MilpJob(_job(0), ("x",)),), ("n0",), 10.0)
    with pytest.raises(ValueError, match="Tfwd"):
        Problem((), (), 0.0)


def test_model_is_small_and_independent_of_pool_size() -> None:
    """The count model needs ~10 pieces per job whatever the pool (the node-level model needs J x N)."""
    jobs = tuple(MilpJob(_job(i)) for i in range(100))
    small = build(job_values(Problem(jobs, tuple(f"n{k}" for k in range(100)), 10.0)), 100)
    big = build(job_values(Problem(jobs, tuple(f"n{k}" for k in range(4000)), 10.0)), 4000)
    assert big.n_vars <= 2000 and big.n_vars <= 2 * small.n_vars


def test_gurobi_free_licence_limit_is_reported_clearly() -> None:
    pytest.importorskip("gurobipy", reason="gurobi backend needs the [gurobi] extra (gurobipy)")
    jobs = tuple(MilpJob(_job(i)) for i in range(200))
    p = Problem(jobs, tuple(f"n{k}" for k in range(3000)), 10.0)
    try:
        d = allocate(p, "gurobi")
    except SolverUnavailable as e:
        assert "2000" in str(e) and "--solver highs" in str(e)
        return
    assert d.status == "optimal"  # an unrestricted licence solves it
    assert d.objective == pytest.approx(allocate(p, "highs").objective, rel=1e-9)


def test_vectorised_value_table_equals_the_scalar_definition() -> None:
    rng = random.Random(5)
    for _ in range(80):
        p = _random_problem(rng)
        for jv in job_values(p):
            for n in range(jv.cap + 1):
                assert jv.table[n] == pytest.approx(jv.value(n), rel=1e-12, abs=1e-9) or (
                    math.isinf(jv.table[n]) and math.isinf(jv.value(n)))


# Issue 17: many identical jobs. Interchangeable jobs are one class in the model (formulation.job_classes).


def _identical_decision(n_jobs: int = 300, pool: int = 2000) -> Problem:
    """The busy-replay shape that timed out: n identical shufflenet jobs waiting at 0 nodes."""
    return Problem(tuple(MilpJob(_job(i)) for i in range(n_jobs)), tuple(f"n{k}" for k in range(pool)), 10.0)


def _mixed_decision() -> Problem:
    """300 jobs in a few classes: three curves (shufflenet and two ImageNet models, each with its own bounds
    and rescale costs), waiting at 0 or running at 4, 8 or 16 nodes, plus five jobs that differ from all."""
    imagenet = read_elastic_jobs(BF + "ImageNet-imgps-Jbnd-1001J.csv", BF + "ImageNet-imgps-JNPs-1001J.csv")
    templates = [_job(0), imagenet[0], imagenet[1]]
    pool = [f"n{k}" for k in range(3000)]
    free, states = list(pool), []
    for i in range(295):
        t = templates[i % 3]
        c = (0, 0, 4, 8, 16)[(i // 3) % 5]
        job = ElasticJob(f"m{i}", 0.0, t.jmin, t.jmax, t.curve, t.total_samples, t.scale_up_s, t.scale_down_s)
        states.append(MilpJob(job, tuple(free[:c])))
        free = free[c:]
    for i, j in enumerate(imagenet[10:15]):
        states.append(MilpJob(j, tuple(free[:i + 1])))
        free = free[i + 1:]
    return Problem(tuple(states), tuple(pool), 10.0)


@pytest.mark.parametrize("make", [_identical_decision, _mixed_decision], ids=["300-identical", "300-mixed"])
def test_many_identical_jobs_solve_optimal_quickly_and_equal_the_dp(make) -> None:
    p = make()
    classes = build(job_values(p), len(p.pool)).classes
    assert len(classes) <= 20  # a few classes, not one per job
    d = allocate(p, "highs", time_limit=10.0)
    # job by job this took HiGHS past its 10 s limit (status time_limit); as classes it takes ~0.03 s
    assert d.status == "optimal"
    assert d.seconds < 3.0
    dp = allocate(p, "dp")
    assert d.objective == pytest.approx(dp.objective, rel=1e-9)
    assert sum(d.counts.values()) <= len(p.pool)
    for s in p.jobs:
        n = d.counts[s.job.id]
        assert n == 0 or s.job.jmin <= n <= s.job.jmax
    for members in classes:  # larger counts to earlier jobs of a class: one deterministic order
        got = [d.counts[p.jobs[j].job.id] for j in members]
        assert got == sorted(got, reverse=True)
    assert allocate(p, "highs").counts == d.counts  # reproducible


def _random_duplicated_problem(rng: random.Random) -> Problem:
    """Small instances where jobs repeat (same curve, bounds, costs and count), some preempted alike."""
    pool = [f"n{k}" for k in range(rng.randint(0, 11))]
    free, states = list(pool), []
    for t in range(rng.randint(1, 2)):
        xs = sorted(rng.sample(range(0, 12), rng.randint(2, 5)))
        curve = ScalingCurve(tuple(float(x) for x in xs), tuple(rng.uniform(0, 100) for _ in xs))
        jmin = rng.randint(1, 4)
        jmax, up, dw = rng.randint(jmin, 9), rng.uniform(0, 30), rng.uniform(0, 30)
        c = rng.randint(0, 2)
        lost = frozenset({"gone"}) if rng.random() < 0.3 else frozenset()
        for k in range(rng.randint(1, 2)):
            job = ElasticJob(f"t{t}-{k}", 0.0, jmin, jmax, curve, 1e8, up, dw)
            held = tuple(free[:c]) if len(free) >= c else ()
            free = free[len(held):]
            states.append(MilpJob(job, held, lost))
    return Problem(tuple(states), tuple(pool), rng.choice([1.0, 10.0, 60.0]), rng.choice(list(Objective)))


def test_class_model_is_exact_against_brute_force() -> None:
    """Forced to use classes (``per_job_up_to=0``), the model reaches the brute-force optimum and its
    counts are feasible; a class's counts go in descending order to its jobs."""
    from hpcsched.milp.backends import solve_highs

    rng = random.Random(17)
    merged = 0
    for _ in range(120):
        p = _random_duplicated_problem(rng)
        values = job_values(p)
        model = build(values, len(p.pool), per_job_up_to=0)
        merged += model.n_jobs - len(model.classes)
        sol = solve_highs(model, 10.0)
        assert sol is not None and sol.optimal
        counts = model.counts(sol.x)
        assert objective_value(values, counts) == pytest.approx(_brute_force(p), rel=1e-7, abs=1e-6), p
        assert sum(counts) <= len(p.pool)
        assert all(math.isfinite(v.value(n)) for v, n in zip(values, counts, strict=True))
        for members in model.classes:
            got = [counts[j] for j in members]
            assert got == sorted(got, reverse=True)
        # a count vector and its model vector round-trip (the warm start), up to order within a class
        again = model.counts(model.vector(counts))
        assert again == counts
    assert merged >= 60  # the instances did put jobs together


def test_classes_group_only_interchangeable_jobs_and_small_decisions_stay_per_job() -> None:
    a, b = _job(0), _job(1)
    other = _job(2, up=19)
    pool = tuple(f"n{k}" for k in range(40))
    states = (MilpJob(a, ("n0",)), MilpJob(b, ("n1",)), MilpJob(other, ("n2",)),
              MilpJob(_job(3), ("n3", "n4")), MilpJob(_job(4), ("n5",), frozenset({"x"})), MilpJob(_job(5)))
    from hpcsched.milp.formulation import job_classes

    # same everything and the same count: one class; another Tup, count or preemption: its own
    assert job_classes(job_values(Problem(states, pool, 10.0))) == ((0, 1), (2,), (3,), (4,), (5,))
    ten = Problem(tuple(MilpJob(_job(i)) for i in range(10)), pool, 10.0)
    eleven = Problem(tuple(MilpJob(_job(i)) for i in range(11)), pool, 10.0)
    assert build(job_values(ten), 40).classes == tuple((j,) for j in range(10))  # as before issue 17
    assert build(job_values(eleven), 40).classes == (tuple(range(11)),)
