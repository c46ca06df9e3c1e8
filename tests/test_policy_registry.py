"""Conformance of the whole policy registry: every registered policy keeps the policy contract
(``hpcsched.allocator``) and every promise its ``PolicyHints`` make, and the registry itself rejects
duplicates and says why a policy is unavailable. A new policy module is checked here without a new test."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from hpcsched.allocator import DeclaredPolicy, Group, JobView, PolicyHints, Snapshot
from hpcsched.model import ClusterSpec
from hpcsched.policies import REGISTRY, get_policy
from hpcsched.policies.registry import Registry
from hpcsched.sim import simulate

SMALL = ClusterSpec(1, 2, 8, name="n2g8")  # 16 GPUs: trace3's first jobs queue, so order matters


def _views(trace3: list, n: int = 40, seed: int = 5) -> tuple[JobView, ...]:
    """Trace3's first ``n`` jobs as a policy sees them mid-run: some running, some served, some fresh."""
    rng = random.Random(seed)
    out = []
    for j in trace3[:n]:
        it = j.iteration_time or 1.0
        done = rng.choice([0.0, 0.0, rng.uniform(0, 0.9)]) * (j.iterations or 1)
        ran = done > 0
        executed = done * it
        out.append(JobView(
            id=j.id, submit=j.submit, gpus=j.gpus, iterations_total=j.iterations, iterations_done=done,
            iteration_time=it, attained_gpu_s=executed * j.gpus, executed_s=executed,
            remaining_s=((j.iterations or 1) - done) * it, profile=j.profile, running=ran and rng.random() < 0.5,
            first_start=j.submit if ran else None, model=j.model))
    return tuple(out)


def _snapshot(trace3: list, compat: str | None = None) -> Snapshot:
    views = _views(trace3)
    now = max(v.submit for v in views) + 1000.0
    busy = sum(v.gpus for v in views if v.running)
    return Snapshot(now=now, jobs=views, cluster=SMALL, free_gpus=max(0, SMALL.gpus - busy), compat=compat)


def test_registry_rejects_a_name_registered_twice() -> None:
    reg = Registry("hpcsched.policies")
    reg.register("x")(lambda s: [])
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("x")(lambda s: [])


def test_a_policy_whose_package_is_missing_is_unavailable_with_the_reason() -> None:
    reg = Registry("hpcsched.policies")
    reg.register("needs-it", requires=("no_such_module_here",), extra="imaginary")(lambda s: [])
    assert "needs-it" not in reg.names()
    assert "no_such_module_here" in reg.unavailable()["needs-it"]
    with pytest.raises(KeyError, match=r"not available here: it needs no_such_module_here \(pip install"):
        reg.get("needs-it")


def test_every_policy_module_registers_itself() -> None:
    assert {"fifo", "srtf", "srsf", "las", "tiresias", "themis", "muri-s", "muri-l", "muri-s+"} <= set(REGISTRY)
    for name in REGISTRY:
        assert get_policy(name).name == name


@pytest.mark.parametrize("name", REGISTRY.names())
def test_empty_snapshot_gives_no_groups(name: str) -> None:
    assert get_policy(name)(Snapshot(now=0.0, jobs=(), cluster=SMALL, free_gpus=SMALL.gpus)) == []


@pytest.mark.parametrize("compat", [None, "muri"])
@pytest.mark.parametrize("name", REGISTRY.names())
def test_answers_are_pure_disjoint_and_well_formed(name: str, compat: str | None, trace3) -> None:
    policy = get_policy(name)
    snap = _snapshot(trace3, compat)
    before = snap.jobs
    first, second = policy(snap), policy(snap)
    assert first == second, "same snapshot, same answer"
    assert snap.jobs == before, "the snapshot is not changed"
    active = {v.id for v in snap.jobs}
    seen: list[str] = []
    for g in first:
        assert isinstance(g, Group) and g.job_ids
        assert len(g.job_ids) == 1 or g.period_s is not None, f"group {g.job_ids} of several jobs has no period"
        seen += g.job_ids
    assert len(seen) == len(set(seen)), "a job in two groups"
    assert set(seen) <= active, "a job that is not active"


@pytest.mark.parametrize("name", [n for n in REGISTRY.names() if get_policy(n).hints.runs_every_job])
def test_runs_every_job_means_every_job_alone(name: str, trace3) -> None:
    snap = _snapshot(trace3)
    groups = get_policy(name)(snap)
    assert all(len(g.job_ids) == 1 for g in groups)
    assert sorted(g.job_ids[0] for g in groups) == sorted(v.id for v in snap.jobs)


@pytest.mark.parametrize("name", [n for n in REGISTRY.names() if get_policy(n).hints.order_key is not None])
def test_order_key_is_the_answer(name: str, trace3) -> None:
    policy = get_policy(name)
    snap = _snapshot(trace3)
    assert [g.job_ids[0] for g in policy(snap)] == [v.id for v in sorted(snap.jobs, key=policy.hints.order_key)]


@pytest.mark.parametrize("name", [n for n in REGISTRY.names() if get_policy(n).hints.order_key_static])
def test_a_static_order_key_ignores_everything_a_job_changes(name: str, trace3) -> None:
    """``order_key_static``: the key of a job is the same whatever its progress, service, clock or state."""
    key = get_policy(name).hints.order_key
    for v in _snapshot(trace3).jobs[:200]:
        moved = replace(v, iterations_done=(v.iterations_total or 10) / 2, attained_gpu_s=v.attained_gpu_s + 1e6,
                        executed_s=v.executed_s + 1e5, remaining_s=1.0, running=not v.running, first_start=3.0,
                        rank_hint=7)
        assert key(moved) == key(v), name


def _has_shortcuts(name: str) -> bool:
    h = get_policy(name).hints
    return h.runs_every_job or h.order_key is not None or h.vector_keys is not None


@pytest.mark.parametrize("compat", [None, "muri"])
@pytest.mark.parametrize("name", [n for n in REGISTRY.names() if _has_shortcuts(n)])
def test_the_simulator_shortcuts_give_the_policy_answer(name: str, compat: str | None, trace3) -> None:
    """Fast path = slow path: the same policy with its ordering shortcuts off gives the same run to the bit,
    and asked at every event (not ``runs_every_job``) the same run to float rounding."""
    policy = get_policy(name)
    jobs = trace3[:150]
    fast = simulate(jobs, SMALL, policy, compat)
    slow = simulate(jobs, SMALL, DeclaredPolicy(name, policy.fn, policy.hints.without_shortcuts()), compat)
    key = [(r.job_id, r.start, r.end, r.gpu_seconds, r.status) for r in fast.results]
    assert key == [(r.job_id, r.start, r.end, r.gpu_seconds, r.status) for r in slow.results]
    if compat is None and policy.hints.runs_every_job:
        asked = DeclaredPolicy(name, policy.fn, replace(policy.hints.without_shortcuts(), runs_every_job=False))
        every = simulate(jobs, SMALL, asked, compat)
        for a, b in zip(fast.results, every.results, strict=True):
            assert (a.job_id, a.status) == (b.job_id, b.status)
            for x, y in ((a.start, b.start), (a.end, b.end)):
                assert x == y or x == pytest.approx(y, rel=1e-12)  # None (never ran) only where both are


def test_hints_are_consistent() -> None:
    with pytest.raises(ValueError, match="runs_every_job"):
        PolicyHints(order_key=lambda v: v.submit)
    with pytest.raises(ValueError, match="set one"):
        PolicyHints(runs_every_job=True, order_key_static=True)


def test_a_policy_named_after_its_module_loads_alone() -> None:
    """``simulate --policy srsf`` imports srsf's module, not the interleaving policies and rustworkx."""
    import subprocess
    import sys

    code = ("import sys; from hpcsched.policies import get_policy; get_policy('srsf'); "
            "print(sorted(m for m in ('hpcsched.policies.muri', 'hpcsched.policies.themis', 'rustworkx') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
