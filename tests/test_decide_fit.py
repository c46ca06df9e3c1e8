"""Two rules of the decision core's admission and placement that held runnable jobs back with slots free.

- A backlog of jobs of a GPU type few workers have was admitted against the slots of every type: FIFO gave it the
  whole admission budget, placement then fitted only a few of them, and the untyped jobs behind it waited.
- An elastic job grown to a size that fits nowhere in one place (2 slots wanted, 1 free on each of two workers)
  waited, though it could start smaller; the runtime controller now starts it at the largest size that fits
  (``DecideOptions.shrink_to_fit``), the simulator keeps its rule (its published figures are unchanged).
"""

from __future__ import annotations

from hpcsched.core.decide import DecideOptions, DecideRequest, decide
from hpcsched.runtime import scheduler
from hpcsched.runtime.scheduler import ClusterState, JobState, WorkerState


def _job(jid: str, submit: float, lo: int, hi: int, gpu_types: tuple[str, ...] = ()) -> JobState:
    return JobState(id=jid, submit=submit, running=False, procs=0, min_procs=lo, max_procs=hi, launcher="direct",
                    gpu_types=gpu_types)


def test_a_typed_backlog_takes_only_its_types_slots() -> None:
    workers = tuple(WorkerState(f"t{i}", 4, ("direct",), gpu_type="h100") for i in range(2)) + \
        tuple(WorkerState(f"u{i}", 4, ("direct",)) for i in range(8))
    backlog = [_job(f"b{i:02d}", float(i), 4, 4, ("h100",)) for i in range(20)]
    runnable = [_job(f"r{i}", 100.0 + i, 4, 4) for i in range(5)]
    plan = scheduler.plan(ClusterState(now=1000.0, jobs=tuple(backlog + runnable), workers=workers), "fifo")
    # the two h100 workers take the first two typed jobs, the untyped ones start on the others
    assert set(plan.starts) == {"b00", "b01", *(j.id for j in runnable)}, plan.starts
    assert {w for j in ("b00", "b01") for w, _ in plan.starts[j]} == {"t0", "t1"}
    assert plan.waiting["b02"] == "needs 4 slots of GPU type h100, 0 left after higher-priority jobs"


def test_an_untyped_queue_is_admitted_as_before() -> None:
    """No job names a type: the admission budget is every slot, as it always was (what the simulator decides on)."""
    workers = tuple(WorkerState(f"w{i}", 4, ("direct",)) for i in range(2))
    jobs = tuple(_job(f"j{i}", float(i), 3, 3) for i in range(3))
    plan = scheduler.plan(ClusterState(now=10.0, jobs=jobs, workers=workers), "fifo")
    assert set(plan.starts) == {"j0", "j1"} and plan.waiting["j2"] == "needs 3 slots, 2 left after higher-priority jobs"


def _two_half_full() -> ClusterState:
    workers = (WorkerState("w0", 4, ("direct",)), WorkerState("w1", 4, ("direct",)))
    busy = tuple(JobState(id=f"run{k}", submit=0.0, running=True, procs=3, min_procs=3, max_procs=3,
                          launcher="direct", placement=((w, 3),)) for k, w in enumerate(("w0", "w1")))
    return ClusterState(now=10.0, jobs=(*busy, _job("e", 5.0, 1, 2)), workers=workers, used={"w0": 3, "w1": 3})


def test_an_elastic_job_starts_smaller_where_its_grown_size_does_not_fit() -> None:
    plan = scheduler.plan(_two_half_full(), "fifo")  # the runtime controller's options
    assert plan.starts["e"] == [("w0", 1)] and plan.sizes["e"] == 1
    assert not plan.stops


def test_the_simulator_keeps_its_rule() -> None:
    """``shrink_to_fit`` off (the simulator's default): the job waits at the size it was grown to, as before."""
    plan = decide(DecideRequest(_two_half_full(), scheduler.resolve_policy("fifo"), DecideOptions()))
    assert "e" not in plan.starts and "do not fit" in plan.waiting["e"]
