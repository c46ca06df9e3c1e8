"""The simulator's ``order_key`` shortcut (engine contract item 9) must give exactly the policy's answer.

Each baseline that declares an ``order_key`` hint is run on the bundled trace3 twice: as registered (the
engine keeps waiting jobs sorted and never calls it) and declared without its shortcuts (the engine calls it
at every event). Every job's start, end and GPU-seconds must be bit-identical.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcsched.allocator import DeclaredPolicy, Group, Snapshot
from hpcsched.cluster_spec import read_cluster_spec
from hpcsched.model import ClusterSpec
from hpcsched.policies import get_policy
from hpcsched.sim.engine import simulate
from hpcsched.traces import read_jobs

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "trace-data/muri/trace3.csv"


@pytest.fixture(scope="module")
def setup():
    if not TRACE.exists():
        pytest.skip("bundled trace3 missing")
    return read_jobs(TRACE), read_cluster_spec(ROOT / "cluster_spec/n8g8.csv")


@pytest.mark.parametrize("compat", [None, "muri"])
@pytest.mark.parametrize("name", ["fifo", "srtf", "srsf", "las", "tiresias"])
def test_order_key_shortcut_is_exact(setup, name: str, compat: str | None) -> None:
    """In compat mode Tiresias' shortcut keeps the reference's queue lists as (queue, seq) keys; called,
    the policy orders by ``rank_hint`` from the engine's list positions: both must agree to the bit."""
    jobs, cluster = setup
    policy = get_policy(name)
    assert policy.hints.order_key is not None
    # the same policy called at every event: the same wake-ups and compat rules, no shortcut
    called = DeclaredPolicy(name, policy.fn, policy.hints.without_shortcuts())
    fast = simulate(jobs, cluster, policy, compat)
    slow = simulate(jobs, cluster, called, compat)
    assert fast.events == slow.events
    key = [(r.job_id, r.start, r.end, r.gpu_seconds, r.status) for r in fast.results]
    assert key == [(r.job_id, r.start, r.end, r.gpu_seconds, r.status) for r in slow.results]
    assert all(r.status == "completed" for r in fast.results)


@pytest.mark.parametrize("compat", [None, "muri"])
def test_themis_vector_keys_path_is_the_policy(setup, compat: str | None) -> None:
    """The engine feeds ``vector_keys`` columns it keeps up to date (contract item 10); calling the
    policy on full snapshots at every event (full sort) must give the same run (the engine sorts only
    the head of the order on trace3's deep queues)."""
    from hpcsched.policies.themis import themis

    jobs, cluster = setup
    called = DeclaredPolicy("themis", themis.fn, themis.hints.without_shortcuts())

    small = ClusterSpec(1, 2, 8, name="n2g8")  # 16 GPUs: hundreds of jobs wait, past the sorted head
    for spec in (cluster, small):
        fast, slow = simulate(jobs, spec, themis, compat), simulate(jobs, spec, called, compat)
        assert fast.events == slow.events
        key = [(r.job_id, r.start, r.end, r.gpu_seconds) for r in fast.results]
        assert key == [(r.job_id, r.start, r.end, r.gpu_seconds) for r in slow.results]


def test_themis_matches_its_definition(setup) -> None:
    """themis computes rho as arrays for speed; ranking by the definition, job by job, must agree."""
    from hpcsched.allocator import PolicyHints
    from hpcsched.policies.ordering import solo
    from hpcsched.policies.themis import finish_time_fairness, themis

    jobs, cluster = setup

    def by_definition(snapshot: Snapshot) -> list[Group]:
        ranked = sorted(snapshot.jobs, key=lambda v: -finish_time_fairness(v, snapshot))
        return [solo(v.id) for v in ranked]

    slow_policy = DeclaredPolicy("themis", by_definition, PolicyHints(runs_every_job=True))
    fast, slow = simulate(jobs, cluster, themis), simulate(jobs, cluster, slow_policy)
    key = [(r.job_id, r.start, r.end, r.gpu_seconds) for r in fast.results]
    assert key == [(r.job_id, r.start, r.end, r.gpu_seconds) for r in slow.results]
