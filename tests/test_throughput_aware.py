"""GPU types in the decision core (issue 19, the runtime row) and the ``throughput-aware`` placement step.

Hand-checked cases: a job that names GPU types goes only to workers of those types and waits, saying so, when none
can hold it; the throughput-aware step puts a unit on the type that trains its model fastest by Gavel's shipped
table (numbers quoted from ``hpcsched/hetero/simulation_throughputs.json.gz``) and places as ``consolidated``
where it cannot tell. The registry's contract is checked by tests/test_plugins.py.
"""

from __future__ import annotations

from hpcsched.allocator import Group, Snapshot
from hpcsched.core.decide import ClusterState, DecideOptions, DecideRequest, JobState, WorkerState, decide
from hpcsched.placements import PlacementView, get_placement
from hpcsched.placements.throughput_aware import model_rates


def _fifo(s: Snapshot) -> list[Group]:
    return [Group((j.id,)) for j in sorted(s.jobs, key=lambda j: j.submit)]


# k80 first in worker order: first fit would take it whenever it has room
WORKERS = (WorkerState("a-k80", 4, gpu_type="k80"), WorkerState("b-p100", 4, gpu_type="p100"),
           WorkerState("c-v100", 4, gpu_type="v100"))
RESNET50 = "ResNet-50 (batch size 64)"  # v100 4.39 > p100 2.62 > k80 0.62 steps/s
RECOMMENDATION = "Recommendation (batch size 512)"  # p100 48.88 > k80 32.86 > v100 23.32 steps/s


def test_the_shipped_table_ranks_the_types_as_quoted() -> None:
    r = model_rates(RESNET50)
    assert r["v100"] > r["p100"] > r["k80"] and round(r["v100"], 2) == 4.39
    r = model_rates(RECOMMENDATION)
    assert r["p100"] > r["k80"] > r["v100"]
    assert model_rates("  resnet-50   (BATCH size 64) ") == model_rates(RESNET50)  # case and spacing ignored
    assert model_rates("my-own-model") == {} and model_rates(None) == {}


def test_a_job_naming_a_type_goes_only_to_workers_of_that_type() -> None:
    jobs = (JobState("v", 0, False, 0, 2, 2, gpu_types=("v100",)), JobState("any", 1, False, 0, 2, 2),
            JobState("pk", 2, False, 0, 4, 4, gpu_types=("p100", "k80")))
    plan = decide(DecideRequest(ClusterState(0, jobs, WORKERS), _fifo))
    assert plan.starts == {"v": [("c-v100", 2)], "any": [("a-k80", 2)], "pk": [("b-p100", 4)]}


def test_a_job_whose_type_has_no_room_waits_saying_which_type() -> None:
    jobs = (JobState("big", 0, False, 0, 6, 6, gpu_types=("v100",)), JobState("none", 1, False, 0, 1, 1,
                                                                             gpu_types=("a100",)))
    plan = decide(DecideRequest(ClusterState(0, jobs, WORKERS), _fifo))
    assert plan.starts == {}
    # not admitted at all: the v100 workers hold 4 slots, no worker is an a100 (admission counts a type's slots)
    assert plan.waiting["big"] == "needs 6 slots of GPU type v100, 4 left after higher-priority jobs"
    assert plan.waiting["none"] == "needs 1 slots of GPU type a100, 0 left after higher-priority jobs"
    # a worker that advertises no type ("": an older worker) takes no typed job, and any untyped one
    old = (WorkerState("old", 4),)
    plan = decide(DecideRequest(ClusterState(0, (jobs[1], JobState("u", 2, False, 0, 1, 1)), old), _fifo))
    assert plan.starts == {"u": [("old", 1)]} and "GPU type a100" in plan.waiting["none"]


def test_a_pending_group_member_does_not_join_an_anchor_on_a_type_it_refuses() -> None:
    pair = lambda s: [Group(("r", "p"), 1.0)]  # noqa: E731
    running = JobState("r", 0, True, 1, 1, 1, group="r", placement=(("a-k80", 1),))
    for types, joins in ((("v100",), False), (("k80", "v100"), True), ((), True)):
        state = ClusterState(1, (running, JobState("p", 0, False, 0, 1, 1, gpu_types=types)), WORKERS, {"a-k80": 1})
        plan = decide(DecideRequest(state, pair))
        assert ("p" in plan.starts) is joins, types
        if not joins:
            assert "runs on GPU types it does not accept" in plan.waiting["p"]


def test_throughput_aware_puts_each_model_on_its_fastest_type() -> None:
    step = get_placement("throughput-aware")
    types = ("k80", "p100", "v100")
    assert step(PlacementView(2, (4, 4, 4), 4, gpu_types=types, model=RESNET50)) == [(2, 2)]
    assert step(PlacementView(2, (4, 4, 4), 4, gpu_types=types, model=RECOMMENDATION)) == [(1, 2)]
    # the fastest type full: the next fastest, not the first worker
    assert step(PlacementView(2, (4, 4, 1), 4, gpu_types=types, model=RESNET50)) == [(1, 2)]
    # two workers of the fastest type: consolidated among them (whole idle worker first for a wide unit)
    assert step(PlacementView(6, (4, 2, 4, 4), 4, gpu_types=("k80", "v100", "v100", "p100"),
                              model=RESNET50)) == [(2, 4), (1, 2)]
    assert step(PlacementView(4, (4, 2, 4, 4), 4, gpu_types=("k80", "v100", "v100", "p100"),
                              model=RESNET50)) == [(2, 4)]


def test_throughput_aware_falls_back_to_consolidated_where_it_cannot_tell() -> None:
    step, first = get_placement("throughput-aware"), get_placement("consolidated")
    cases = [
        PlacementView(2, (4, 4, 4), 4, gpu_types=("k80", "p100", "v100")),  # no model
        PlacementView(2, (4, 4, 4), 4, gpu_types=("k80", "p100", "v100"), model="my-own-model"),  # not in the table
        PlacementView(2, (4, 4, 4), 4, gpu_types=("h100", "a100", "cpu"), model=RESNET50),  # types not in it
        PlacementView(2, (4, 4, 4), 4, model=RESNET50),  # no types advertised
        PlacementView(6, (4, 4, 4), 4, gpu_types=("k80", "p100", "v100"), model=RESNET50),  # no one type holds it
    ]
    for view in cases:
        assert step(view) == first(view) is not None, view
    assert step(cases[-1]) == [(0, 4), (1, 2)]  # mixed types rather than a wait consolidated would not make


def test_decide_with_throughput_aware_placement_over_typed_workers() -> None:
    """Three one-GPU jobs on k80 / p100 / v100 workers of 4 slots: the ResNet-50 jobs go to the V100 worker and
    the Recommendation job to the P100 one; with consolidated placement every one lands on the K80 worker."""
    jobs = (JobState("r1", 0, False, 0, 1, 1, model=RESNET50), JobState("rec", 1, False, 0, 1, 1,
                                                                         model=RECOMMENDATION),
            JobState("r2", 2, False, 0, 1, 1, model=RESNET50))
    state = ClusterState(0, jobs, WORKERS)
    aware = decide(DecideRequest(state, _fifo, DecideOptions(placement="throughput-aware")))
    assert aware.starts == {"r1": [("c-v100", 1)], "rec": [("b-p100", 1)], "r2": [("c-v100", 1)]}
    plain = decide(DecideRequest(state, _fifo))
    assert {w for s in plain.starts.values() for w, _ in s} == {"a-k80"}
    # a type restriction comes first: a ResNet-50 job that accepts only k80 / p100 gets the P100
    only = (JobState("r", 0, False, 0, 1, 1, model=RESNET50, gpu_types=("k80", "p100")),)
    plan = decide(DecideRequest(ClusterState(0, only, WORKERS), _fifo, DecideOptions(placement="throughput-aware")))
    assert plan.starts == {"r": [("b-p100", 1)]}
