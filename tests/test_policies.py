"""Each baseline policy's order on tiny hand-checkable snapshots."""

from __future__ import annotations

import pytest

from hpcsched.allocator import JobView, Snapshot
from hpcsched.model import ClusterSpec
from hpcsched.policies import REGISTRY, get_policy
from hpcsched.policies.themis import finish_time_fairness
from hpcsched.policies.tiresias import queue_of

CLUSTER = ClusterSpec(1, 2, 4, name="n2g4")


def view(jid: str, submit: float, gpus: int = 1, remaining: float = 100.0, attained: float = 0.0,
         running: bool = False, done: float = 0.0) -> JobView:
    return JobView(id=jid, submit=submit, gpus=gpus, iterations_total=int(done + remaining), iterations_done=done,
                   iteration_time=1.0, attained_gpu_s=attained, executed_s=attained / gpus, remaining_s=remaining,
                   profile=None, running=running)


def order(policy: str, *views: JobView, now: float = 1000.0) -> list[str]:
    groups = get_policy(policy)(Snapshot(now=now, jobs=tuple(views), cluster=CLUSTER, free_gpus=8))
    assert all(len(g.job_ids) == 1 for g in groups), "baselines return single-job groups"
    return [g.job_ids[0] for g in groups]


def test_all_baselines_registered() -> None:
    assert {"fifo", "srtf", "srsf", "las", "tiresias", "themis"} <= set(REGISTRY.names())


def test_fifo_orders_by_arrival_whatever_the_size() -> None:
    assert order("fifo", view("b", 5, remaining=1), view("a", 1, remaining=900), view("c", 9)) == ["a", "b", "c"]


def test_srtf_shortest_remaining_time_first_ignores_gpus() -> None:
    jobs = (view("wide-short", 0, gpus=8, remaining=50), view("narrow-long", 1, gpus=1, remaining=100))
    assert order("srtf", *jobs) == ["wide-short", "narrow-long"]


def test_srsf_weights_remaining_time_by_gpus() -> None:
    # 8 GPUs x 50 s = 400 GPU-s > 1 GPU x 100 s: the narrow job goes first under SRSF (not under SRTF)
    jobs = (view("wide-short", 0, gpus=8, remaining=50), view("narrow-long", 1, gpus=1, remaining=100))
    assert order("srsf", *jobs) == ["narrow-long", "wide-short"]


def test_srtf_ties_keep_arrival_order() -> None:
    assert order("srtf", view("first", 0, remaining=10), view("second", 1, remaining=10)) == ["first", "second"]


def test_las_least_attained_service_first() -> None:
    jobs = (view("old", 0, attained=500), view("new", 10, attained=0), view("mid", 5, attained=100))
    assert order("las", *jobs) == ["new", "mid", "old"]


def test_tiresias_queues_at_3250_and_7200_gpu_seconds() -> None:
    assert [queue_of(view("x", 0, attained=a)) for a in (0, 3249.9, 3250, 7199, 7200, 1e9)] == [0, 0, 1, 1, 2, 2]


def test_tiresias_lower_queue_first_then_running_then_fifo() -> None:
    jobs = (
        view("demoted", 0, attained=4000, running=True),  # queue 1
        view("q0-waiting-early", 1, attained=10),
        view("q0-running-late", 2, attained=20, running=True),
        view("q0-new", 3),
    )
    # queue 0 first; inside it the running job keeps its GPUs ahead of earlier waiting jobs
    assert order("tiresias", *jobs) == ["q0-running-late", "q0-waiting-early", "q0-new", "demoted"]


def test_tiresias_declares_its_limits_for_wakeups() -> None:
    assert get_policy("tiresias").hints.service_thresholds == (3250.0, 7200.0)


def test_themis_serves_the_worst_finish_time_fairness_first() -> None:
    now = 1000.0
    starved = view("starved", 0, remaining=100)  # waited 1000 s for a 100-s job
    fresh = view("fresh", 990, remaining=100)  # waited 10 s
    snap = Snapshot(now=now, jobs=(fresh, starved), cluster=CLUSTER, free_gpus=8)
    assert finish_time_fairness(starved, snap) > finish_time_fairness(fresh, snap)
    assert order("themis", fresh, starved, now=now) == ["starved", "fresh"]


def test_themis_accounts_for_the_fair_share_of_wide_jobs() -> None:
    # same wait and length; with 4 jobs on 8 GPUs the fair share is 2 GPUs: an 8-GPU job's isolated
    # time is 4x longer, so its rho is smaller and the 1-GPU job is the less fairly treated one
    jobs = (view("wide", 0, gpus=8), view("narrow", 0, gpus=1), view("c", 500), view("d", 500))
    assert order("themis", *jobs).index("narrow") < order("themis", *jobs).index("wide")


def test_policies_are_pure() -> None:
    jobs = (view("a", 0, remaining=5), view("b", 1, remaining=3, attained=7, running=True))
    snap = Snapshot(now=10.0, jobs=jobs, cluster=CLUSTER, free_gpus=7)
    for name in ("fifo", "srtf", "srsf", "las", "tiresias", "themis"):
        assert get_policy(name)(snap) == get_policy(name)(snap)
    assert snap.jobs == jobs


@pytest.mark.parametrize("name", ["fifo", "srtf", "srsf", "las", "tiresias", "themis"])
def test_empty_snapshot_gives_no_groups(name: str) -> None:
    assert get_policy(name)(Snapshot(now=0.0, jobs=(), cluster=CLUSTER, free_gpus=8)) == []


def test_themis_min_max_allocation_equalises_rho_at_capacity() -> None:
    """Two 1-GPU jobs on 1 GPU, both just arrived (a = 0), r = 10 and 30 s, isolated 10 and 30:
    rho_i = r_i / (x_i iso_i) = 1 / x_i, so the min-max splits the GPU evenly (t = 2, x = 1/2 each)."""
    import numpy as np

    from hpcsched.policies.themis import min_max_allocation

    x = min_max_allocation(np.zeros(2), np.array([10.0, 30.0]), np.array([10.0, 30.0]), np.ones(2), 1.0)
    assert x == pytest.approx([0.5, 0.5])
    # a job that has already waited 20 s gets more of the GPU: 2 + 1/x0 = 1/x1 with x0 + x1 = 1,
    # i.e. x0 = 1/sqrt(2), and both end at the same rho
    a = np.array([20.0, 0.0])
    x = min_max_allocation(a, np.array([10.0, 30.0]), np.array([10.0, 30.0]), np.ones(2), 1.0)
    assert x == pytest.approx([0.5**0.5, 1 - 0.5**0.5])
    rho = (a + np.array([10.0, 30.0]) / x) / np.array([10.0, 30.0])
    assert rho[0] == pytest.approx(rho[1])
    # capacity slack: a lone job gets its whole share, rho = (a + r) / iso
    assert min_max_allocation(np.zeros(1), np.array([5.0]), np.array([5.0]), np.ones(1), 8.0) == pytest.approx([1.0])


def test_themis_compat_serves_never_run_jobs_first_then_by_allocation_per_second() -> None:
    """The reference's order: allocation / seconds already run, never-run jobs (x 1e9) ahead."""
    ran = view("ran", 0, remaining=100, attained=50, running=True)  # executed_s = 50
    new = view("new", 500, remaining=100)
    snap = Snapshot(now=1000.0, jobs=(ran, new), cluster=CLUSTER, free_gpus=7, compat="muri")
    assert [g.job_ids[0] for g in get_policy("themis")(snap)] == ["new", "ran"]
