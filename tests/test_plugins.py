"""Admission and placement plug-ins of the decision core (issue 19, Blox's plug-ins): a conformance test over
each whole registry (the contracts written in ``hpcsched.admission`` and ``hpcsched.placements``), hand-checked
cases of each step, and the steps at work in ``decide`` and in the simulator deciding as the controller."""

from __future__ import annotations

import random

import pytest

from hpcsched.admission import REGISTRY as ADMISSION
from hpcsched.admission import AdmissionView, get_admission
from hpcsched.allocator import Group, Snapshot
from hpcsched.core.decide import ClusterState, DecideOptions, DecideRequest, JobState, WorkerState, decide
from hpcsched.placements import REGISTRY as PLACEMENT
from hpcsched.placements import PlacementView, get_placement


def _jobs(rng: random.Random, n: int) -> tuple[JobState, ...]:
    out = []
    for k in range(n):
        running = rng.random() < 0.4
        started = running or rng.random() < 0.3
        procs = rng.choice((1, 2, 4, 8))
        out.append(JobState(f"j{k}", submit=rng.uniform(0, 100), running=running, procs=procs if running else 0,
                            min_procs=procs, max_procs=procs, first_start=1.0 if started else None))
    return tuple(out)


@pytest.mark.parametrize("name", ADMISSION.names())
def test_every_admission_step_keeps_the_contract(name: str) -> None:
    step = get_admission(name)
    assert step(AdmissionView(0.0, (), 16)) == {}
    rng = random.Random(7)
    for case in range(300):
        view = AdmissionView(float(case), _jobs(rng, rng.randrange(0, 30)), rng.choice((0, 4, 16, 64)),
                             rng.choice((0.5, 1.0, 1.5)))
        held = step(view)
        assert held == step(view)  # pure: same state, same answer
        never_started = {j.id for j in view.jobs if not j.running and j.first_start is None}
        assert set(held) <= never_started, (name, case)
        assert all(isinstance(r, str) and r for r in held.values())


def test_load_based_admission_is_a_fifo_queue_up_to_the_threshold() -> None:
    """8 slots, threshold 1: running 4 + the started-before 2 -> 6; the oldest new job (2) is checked at 6 <= 8
    and enters (8), the next at 8 <= 8 enters (10), the third at 10 > 8 waits, and so does every later one even
    if it would fit (a queue, not a backfill)."""
    jobs = (JobState("run", 0, True, 4, 4, 4, first_start=0.0), JobState("back", 1, False, 0, 2, 2, first_start=0.5),
            JobState("a", 2, False, 0, 2, 2), JobState("b", 3, False, 0, 2, 2), JobState("c", 4, False, 0, 4, 4),
            JobState("d", 5, False, 0, 1, 1))
    held = get_admission("load-based")(AdmissionView(10.0, jobs, 8, 1.0))
    assert sorted(held) == ["c", "d"] and "over 1 x 8 (8)" in held["c"]
    assert get_admission("load-based")(AdmissionView(10.0, jobs, 8, 2.0)) == {}
    assert get_admission("accept-all")(AdmissionView(10.0, jobs, 8, 0.1)) == {}


def _views(rng: random.Random) -> PlacementView:
    n = rng.randrange(1, 7)
    spn = rng.choice((1, 2, 4, 8))
    free = tuple(rng.randrange(-1, spn + 1) for _ in range(n))  # -1: a worker over-used (slots of a stopping job)
    cpus = tuple(rng.choice((None, rng.uniform(0, 32))) for _ in range(n))
    mem = tuple(rng.choice((None, rng.uniform(0, 64))) for _ in range(n))
    types = tuple(rng.choice(("k80", "p100", "v100", "h100", "")) for _ in range(n))  # "": not advertised
    model = rng.choice((None, "ResNet-50 (batch size 64)", "Recommendation (batch size 512)", "not-in-the-table"))
    return PlacementView(rng.randrange(1, 2 * spn + 2), free, spn, cpus, mem, rng.choice((0.0, 2.0, 6.0)),
                         rng.choice((0.0, 4.0)), types, model)


@pytest.mark.parametrize("name", PLACEMENT.names())
def test_every_placement_step_keeps_the_contract(name: str) -> None:
    step = get_placement(name)
    rng = random.Random(11)
    placed = 0
    for case in range(2000):
        view = _views(rng)
        got = step(view)
        assert got == step(view)  # pure
        if got is None:
            if name == "throughput-aware":
                assert get_placement("consolidated")(view) is None, (case, view)
            continue
        placed += 1
        idx = [i for i, _ in got]
        assert len(idx) == len(set(idx)) and all(0 <= i < len(view.free) for i in idx), (name, case, got)
        assert all(0 < k <= view.free[i] for i, k in got), (name, case, got, view)
        assert sum(k for _, k in got) == view.need, (name, case)
        if name == "resource-aware":
            usable = view.usable()
            assert all(k <= usable[i] for i, k in got), (case, got, view)
        if name == "throughput-aware":  # it only chooses among what consolidated would place: it never adds a wait
            assert get_placement("consolidated")(view) is not None, (case, view)
    assert placed > 200  # the cases exercised placing, not only refusals
    assert step(PlacementView(5, (2, 2), 4)) is None  # fewer free slots than needed


def test_spread_consolidated_and_resource_aware_differ_as_documented() -> None:
    four = PlacementView(4, (4, 4, 4, 4), 4)
    assert get_placement("consolidated")(four) == [(0, 4)]
    assert get_placement("spread")(four) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    # w0 has the slots but only 4 CPUs: a 2-process job needing 4 CPUs each goes to w1 when CPUs count
    cpu = PlacementView(2, (4, 4), 4, (4.0, 16.0), (None, None), 4.0, 0.0)
    assert get_placement("consolidated")(cpu) == [(0, 2)]
    assert get_placement("resource-aware")(cpu) == [(1, 2)]


def test_a_plugin_name_registered_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        PLACEMENT.register("spread")(lambda view: None)
    with pytest.raises(ValueError, match="registered twice"):
        ADMISSION.register("load-based")(lambda view: {})
    with pytest.raises(KeyError, match="unknown placement step 'nope'; known: consolidated"):
        get_placement("nope")


def test_decide_holds_jobs_out_of_the_policys_sight_and_places_with_the_chosen_step() -> None:
    seen: list[set[str]] = []

    def fifo(s: Snapshot) -> list[Group]:
        seen.append({j.id for j in s.jobs})
        return [Group((j.id,)) for j in sorted(s.jobs, key=lambda j: j.submit)]

    jobs = (JobState("a", 0, False, 0, 2, 2), JobState("b", 1, False, 0, 2, 2), JobState("c", 2, False, 0, 2, 2))
    workers = (WorkerState("w0", 4), WorkerState("w1", 4))
    state = ClusterState(5.0, jobs, workers)
    plan = decide(DecideRequest(state, fifo, DecideOptions(admission="load-based", load_threshold=0.25)))
    assert seen[-1] == {"a", "b"} and "held by load-based admission" in plan.waiting["c"]
    assert plan.starts == {"a": [("w0", 2)], "b": [("w0", 2)]}
    plan = decide(DecideRequest(state, fifo, DecideOptions(placement="spread")))
    assert plan.starts == {"a": [("w0", 1), ("w1", 1)], "b": [("w0", 1), ("w1", 1)], "c": [("w0", 1), ("w1", 1)]}
    fat = ClusterState(5.0, tuple(JobState(j.id, j.submit, False, 0, 2, 2, cpus_per_proc=8.0) for j in jobs),
                       (WorkerState("w0", 4, cpus=16.0), WorkerState("w1", 4, cpus=32.0)))
    plan = decide(DecideRequest(fat, fifo, DecideOptions(placement="resource-aware")))
    assert plan.starts == {"a": [("w0", 2)], "b": [("w1", 2)], "c": [("w1", 2)]}  # w0's CPUs feed one job only


def test_the_simulator_deciding_as_the_controller_uses_the_plugins(trace3, n8g8) -> None:  # noqa: ANN001
    """trace3 on n8g8, FIFO as the controller: load-based admission at 0.5 x the GPUs holds jobs back (they
    start later on average) and every job still completes; spread placement runs too."""
    from hpcsched.sim.core_decisions import AsController
    from hpcsched.sim.engine import simulate

    base = simulate(trace3, n8g8, "fifo", as_controller=AsController())
    held = simulate(trace3, n8g8, "fifo", as_controller=AsController(DecideOptions(admission="load-based",
                                                                                   load_threshold=0.5)))
    spread = simulate(trace3, n8g8, "fifo", as_controller=AsController(DecideOptions(placement="spread")))
    for r in (base, held, spread):
        assert all(x.status == "completed" for x in r.results)
    assert held.summary()["avg_jct"] > base.summary()["avg_jct"]
    multi = [d for d in spread.decisions if d.kind == "start" and d.procs > 1]
    assert multi and all(len(d.workers) > 1 for d in multi if d.procs <= n8g8.nodes)


def test_controller_config_names_the_steps_and_refuses_unknown_ones(tmp_path) -> None:  # noqa: ANN001
    """`admission:` / `placement:` in the controller's YAML choose the core's steps; an unknown name is an error
    naming the file, the key and the known names; and the controller's step passes them to the core."""
    from hpcsched.errors import InputError
    from hpcsched.runtime import scheduler
    from hpcsched.runtime.config import read_controller_config

    good = tmp_path / "c.yaml"
    good.write_text("policy: fifo\nadmission: load-based\nload_threshold: 0.5\nplacement: spread\n")
    cfg = read_controller_config(good)
    assert (cfg.admission, cfg.load_threshold, cfg.placement) == ("load-based", 0.5, "spread")
    bad = tmp_path / "b.yaml"
    bad.write_text("policy: fifo\nplacement: spred\n")
    with pytest.raises(InputError) as e:
        read_controller_config(bad)
    assert "b.yaml" in str(e.value) and "placement" in str(e.value) and "known: consolidated" in str(e.value)
    state = ClusterState(0.0, (JobState("a", 0, False, 0, 2, 2),), (WorkerState("w0", 4), WorkerState("w1", 4)))
    assert scheduler.plan(state, "fifo", placement=cfg.placement).starts == {"a": [("w0", 1), ("w1", 1)]}


def test_regroup_replan_moves_running_jobs_into_the_policys_groups_where_keep_does_not() -> None:
    """Two 1-slot workers run a and b apart; the policy now pairs them. "keep" (the controller's rule) leaves
    them where they are; "replan" (the simulator's default mode, by the same code: ``core.replan``) keeps a on
    its slot and stops b, which joins a's slot at the next decision once it has stopped."""
    pair = lambda s: [Group(("a", "b"), 1.0)]  # noqa: E731
    workers = (WorkerState("w0", 1), WorkerState("w1", 1))
    running = ClusterState(1.0, (JobState("a", 0, True, 1, 1, 1, group="a", placement=(("w0", 1),)),
                                 JobState("b", 0, True, 1, 1, 1, group="b", placement=(("w1", 1),))),
                           workers, {"w0": 1, "w1": 1})
    kept = decide(DecideRequest(running, pair))
    assert kept.stops == {} and kept.starts == {}
    moved = decide(DecideRequest(running, pair, DecideOptions(regroup="replan")))
    assert moved.stops == {"b": "preempt"} and moved.starts == {} and moved.sizes == {"a": 1}
    after = ClusterState(2.0, (running.jobs[0], JobState("b", 0, False, 0, 1, 1)), workers, {"w0": 1})
    joined = decide(DecideRequest(after, pair, DecideOptions(regroup="replan")))
    assert joined.starts == {"b": [("w0", 1)]} and joined.groups == {"b": "a"} and joined.stops == {}


def test_regroup_replan_preempts_for_priority_and_starts_once_the_slots_are_free() -> None:
    """FIFO on one 4-slot worker: c (2 slots, submitted at 5) runs; a (4 slots, submitted at 0) waits. Both rules
    stop c for a (priority); re-planning, too, starts a only at the next decision, when c's slots are free."""
    from hpcsched.policies import get_policy

    fifo = get_policy("fifo")
    w = (WorkerState("w0", 4),)
    before = ClusterState(6.0, (JobState("a", 0, False, 0, 4, 4),
                                JobState("c", 5, True, 2, 2, 2, group="c", placement=(("w0", 2),))), w, {"w0": 2})
    keep = decide(DecideRequest(before, fifo))
    assert keep.stops == {"c": "preempt"} and keep.starts == {} and "a" in keep.waiting
    plan = decide(DecideRequest(before, fifo, DecideOptions(regroup="replan")))
    assert plan.stops == {"c": "preempt"} and plan.starts == {} and "being freed" in plan.waiting["a"]
    after = ClusterState(7.0, (before.jobs[0], JobState("c", 5, False, 0, 2, 2)), w, {})
    plan = decide(DecideRequest(after, fifo, DecideOptions(regroup="replan")))
    assert plan.starts == {"a": [("w0", 4)]} and "not chosen" in plan.waiting["c"]
    with pytest.raises(ValueError, match="unknown regroup"):
        decide(DecideRequest(after, fifo, DecideOptions(regroup="sometimes")))


def test_the_sizing_solver_is_an_option_of_the_request() -> None:
    """Elastic sizing by the MILP with the solver the request names (any of ``milp.SOLVERS``): HiGHS and the exact
    DP give the best split of 4 slots between a flat and a linear scaler (a 1, b 3); the greedy solver, which
    the request may also name, is reported as such and not as optimal."""
    from hpcsched.model import ScalingCurve

    flat, linear = ScalingCurve((1, 2, 3, 4), (100, 110, 115, 118)), ScalingCurve((1, 2, 3, 4), (100, 200, 300, 400))
    jobs = (JobState("a", 0, False, 0, 1, 4, curve=flat), JobState("b", 1, False, 0, 1, 4, curve=linear))
    state = ClusterState(0, jobs, (WorkerState("w0", 2), WorkerState("w1", 2)))
    fifo = lambda s: [Group((j.id,)) for j in sorted(s.jobs, key=lambda j: j.submit)]  # noqa: E731
    for solver in ("highs", "dp"):
        p = decide(DecideRequest(state, fifo, DecideOptions(solver=solver)))
        assert p.sizes == {"a": 1, "b": 3} and p.sizing == {"a": "optimal", "b": "optimal"}, solver
    greedy = decide(DecideRequest(state, fifo, DecideOptions(solver="greedy")))
    assert set(greedy.sizing.values()) != {"optimal"}


def test_controller_config_regroup(tmp_path) -> None:  # noqa: ANN001
    """`regroup: replan` in the controller's YAML runs the policy's groups as designed (the simulator's default
    mode); anything but keep / replan is an error naming the file and key."""
    from hpcsched.errors import InputError
    from hpcsched.runtime import scheduler
    from hpcsched.runtime.config import read_controller_config

    (tmp_path / "c.yaml").write_text("policy: fifo\nregroup: replan\n")
    assert read_controller_config(tmp_path / "c.yaml").regroup == "replan"
    assert read_controller_config(_yaml(tmp_path, "d.yaml", "policy: fifo\n")).regroup == "keep"
    with pytest.raises(InputError, match="regroup"):
        read_controller_config(_yaml(tmp_path, "e.yaml", "regroup: sometimes\n"))
    pair = lambda s: [Group(("a", "b"), 1.0)]  # noqa: E731
    running = ClusterState(1.0, (JobState("a", 0, True, 1, 1, 1, group="a", placement=(("w0", 1),)),
                                 JobState("b", 0, True, 1, 1, 1, group="b", placement=(("w1", 1),))),
                           (WorkerState("w0", 1), WorkerState("w1", 1)), {"w0": 1, "w1": 1})
    assert scheduler.plan(running, pair).stops == {}
    assert scheduler.plan(running, pair, regroup="replan").stops == {"b": "preempt"}


def _yaml(d, name: str, text: str):  # noqa: ANN001, ANN202
    (d / name).write_text(text)
    return d / name


def test_an_admitted_elastic_job_the_milp_would_pause_is_held_at_its_minimum() -> None:
    """Two slots, two admitted elastic jobs of 1..2: the MILP alone would pause the flat one (0 + 2 nodes of the
    steep one: 230 samples/s against 100 + 100), but both were admitted and run. The flat one is held at its
    minimum, the steep one sized over what is left, and the status says a job was held (no longer 'does not
    fit: minimum sizes' with every size left as admitted)."""
    from hpcsched.model import ScalingCurve

    flat, steep = ScalingCurve((1, 2), (100, 100.5)), ScalingCurve((1, 2), (100, 230))
    jobs = (JobState("a", 0, False, 0, 1, 2, curve=flat), JobState("b", 1, False, 0, 1, 2, curve=steep))
    fifo = lambda s: [Group((j.id,)) for j in sorted(s.jobs, key=lambda j: j.submit)]  # noqa: E731
    p = decide(DecideRequest(ClusterState(0, jobs, (WorkerState("w0", 2),)), fifo))
    assert p.sizes == {"a": 1, "b": 1}
    assert p.sizing == {"a": "optimal, 1 held at their minimum", "b": "optimal, 1 held at their minimum"}
    three = decide(DecideRequest(ClusterState(0, jobs, (WorkerState("w0", 3),)), fifo))
    assert three.sizes == {"a": 1, "b": 2} and three.sizing["b"] == "optimal"  # room for both: the joint optimum
