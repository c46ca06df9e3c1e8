"""Interleaving: group periods against brute force, matching against exhaustive search, grouping rules."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from interleave_cases import cand, exhaustive_best

from hpcsched.interleave.grouping import GroupingRules, Scorer, form_groups
from hpcsched.interleave.matching import MatchSettings, assign, pair_counts
from hpcsched.interleave.period import PeriodModel, muri4_cycles, pipeline_period, pipeline_periods
from hpcsched.primitives.speed import GROUP_FACTOR, SOLO_FACTOR

# -- period ---------------------------------------------------------------------------------------


def brute_force_period(stages: list[tuple[float, float, float]]) -> float:
    """Every ordering, the slot formula written out longhand (no rotation trick, no numpy)."""
    k = len(stages)
    m = max(k, 3)
    padded = [list(s) + [0.0] * (m - 3) for s in stages]
    return min(
        sum(max(padded[order[idx]][(i - idx) % m] for idx in range(k)) for i in range(m))
        for order in itertools.permutations(range(k))
    )


def simulate_slots(stages: list[tuple[float, float, float]], order: tuple[int, ...], cycles: int = 5) -> float:
    """Run the slot schedule for a few cycles, checking no resource is used twice in a slot; period per cycle."""
    k, m = len(order), max(len(order), 3)
    clock = 0.0
    for _ in range(cycles):
        for i in range(m):
            used = [(i - idx) % m for idx in range(k)]
            assert len(set(used)) == k  # each job in a different stage: no resource shared
            clock += max(stages[order[idx]][s] if s < 3 else 0.0 for idx, s in enumerate(used))
    return clock / cycles


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_pipeline_period_matches_brute_force(k: int) -> None:
    rng = np.random.default_rng(1000 + k)
    t = rng.uniform(0.0, 1.0, size=(300, k, 3)) * rng.choice([0.01, 1.0, 10.0], size=(300, k, 3))
    periods, orders = pipeline_periods(t)
    for g in range(len(t)):
        stages = [tuple(row) for row in t[g]]
        assert periods[g] == pytest.approx(brute_force_period(stages), rel=1e-12)
        assert simulate_slots(stages, tuple(orders[g])) == pytest.approx(periods[g], rel=1e-12)


def test_period_bounds_and_hand_cases() -> None:
    rng = np.random.default_rng(7)
    for k in (2, 3, 4):
        t = rng.uniform(0, 5, size=(200, k, 3))
        p, _ = pipeline_periods(t)
        busiest_resource = t.sum(axis=1).max(axis=1)  # each resource serves one job at a time
        longest_job = t.sum(axis=2).max(axis=1)  # a job's stages run one after another
        assert np.all(p >= busiest_resource - 1e-12) and np.all(p >= longest_job - 1e-12)
        assert np.all(p <= t.sum(axis=(1, 2)) + 1e-12)  # never worse than running them one after another
    # three jobs each heavy in a different stage interleave perfectly: period = 1 + 0.1 + 0.1
    p, order = pipeline_period([(1, 0.1, 0.1), (0.1, 1, 0.1), (0.1, 0.1, 1)])
    assert p == pytest.approx(1.2)
    assert pipeline_period([(2, 3, 4)]) == (9.0, (0,))
    with pytest.raises(ValueError):
        pipeline_period([(1, 1, 1)] * 5)


def muri4_longhand(stages: list[tuple[float, float, float]]) -> float:
    """The reference's four-slot recurrence written out for one group (see ``period.muri4_cycles``)."""
    k = len(stages)
    if k == 1:
        return sum(stages[0])
    best = math.inf
    for p in itertools.permutations(stages):
        f = [0.0] * 9
        period = 0.0
        for i in range(8):
            if (i + 1) % 4 < k:
                f[i + 1] = max(f[i + 1], f[i] + p[(i + 1) % 4][2])
            if (i + 2) % 4 < k:
                f[i + 1] = max(f[i + 1], f[i] + p[(i + 2) % 4][1])
            if i > 0 and (i + 3) % 4 < k:
                f[i + 1] = max(f[i + 1], f[i - 1] + p[(i + 3) % 4][0])
            if i >= 4 and math.isclose(f[i + 1] - f[i - 3], f[i] - f[i - 4], rel_tol=1e-3):
                period = f[i + 1] - f[i - 3]
                break
        if not period > 0:
            period = f[8] - f[4]
        best = min(best, period)
    if k == 2:
        a, b = stages
        best = min(best, max(a[0], b[1] + b[2]) + max(b[0], a[1] + a[2]))
    return best


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_muri4_cycles_match_longhand(k: int) -> None:
    rng = np.random.default_rng(2000 + k)
    t = rng.uniform(0.0, 1.0, size=(200, k, 3))
    got = muri4_cycles(t)
    for g in range(len(t)):
        assert got[g] == pytest.approx(muri4_longhand([tuple(r) for r in t[g]]), rel=1e-12)


def test_muri4_on_trace_models() -> None:
    # bert (0.5, 163, 18) ms and resnet18 (723, 113, 73) ms at 4 GPUs: data loading hides behind compute
    bert, resnet = (0.0005, 0.163, 0.018), (0.723, 0.113, 0.073)
    p = muri4_cycles(np.array([[bert, resnet]]))[0]
    assert p == pytest.approx(muri4_longhand([bert, resnet]))
    assert p < sum(bert) + sum(resnet)


# -- matching -------------------------------------------------------------------------------------


ENGINES = {
    "dense": MatchSettings(dense_limit=1000),
    "types": MatchSettings(dense_limit=0, type_limit=1000),
}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_matching_is_optimal_on_small_graphs(engine: str) -> None:
    rng = np.random.default_rng(3)
    for trial in range(60):
        n = int(rng.integers(2, 11))
        u = int(rng.integers(1, n + 1))
        node_type = rng.integers(0, u, size=n).tolist()
        tw = rng.uniform(-0.3, 1.0, size=(u, u))
        tw = np.triu(tw) + np.triu(tw, 1).T
        x, used = pair_counts(node_type, tw, ENGINES[engine])
        assert used == engine
        pairs = assign(node_type, x, tw)
        nodes = [v for p in pairs for v in p]
        assert len(nodes) == len(set(nodes)), f"trial {trial}: a node in two pairs"
        weight = sum(tw[node_type[a], node_type[b]] for a, b in pairs)
        assert all(tw[node_type[a], node_type[b]] > 0 for a, b in pairs)
        assert weight == pytest.approx(exhaustive_best(node_type, tw), abs=1e-5), f"trial {trial}"


def test_assign_gives_high_priority_nodes_their_best_partner() -> None:
    # types: 0 = data-heavy, 1 = compute-heavy; 0-1 pairs are best. Node 0 (highest priority) gets the
    # earliest compute-heavy job, not just any.
    node_type = [0, 0, 1, 1]
    tw = np.array([[0.5, 0.9], [0.9, 0.4]])
    pairs = assign(node_type, np.array([[0, 2], [0, 0]]), tw)
    assert pairs == [(0, 2), (1, 3)]


# -- grouping -------------------------------------------------------------------------------------


DATA, COMPUTE, NET = (1.0, 0.1, 0.1), (0.1, 1.0, 0.1), (0.1, 0.1, 1.0)


def test_no_grouping_while_everything_fits() -> None:
    cands = [cand(i, 4, DATA) for i in range(4)]
    formed = form_groups(cands, 16, Scorer(GroupingRules()))
    assert sorted(f.members for f in formed) == [(0,), (1,), (2,), (3,)]


def test_complementary_jobs_form_groups_up_to_four_and_fit() -> None:
    rng = np.random.default_rng(11)
    for capacity in (8, 16, 32, 64):
        for rules in (GroupingRules(), GroupingRules(model=PeriodModel("muri4")), GroupingRules(mixed_gpus=True)):
            cands = [cand(i, 4, (DATA, COMPUTE, NET)[int(rng.integers(0, 3))]) for i in range(40)]
            formed = form_groups(cands, capacity, Scorer(rules))
            assert sorted(i for f in formed for i in f.members) == list(range(40))
            assert all(1 <= len(f.members) <= 4 for f in formed)
            assert sum(max(cands[i].gpus for i in f.members) for f in formed) <= max(capacity, 40)
            multi = [f for f in formed if len(f.members) > 1]
            assert all(f.raw_period is not None and f.raw_period > 0 for f in multi)
            if capacity >= 40:  # 10 groups of 4 fit 40 GPUs
                assert sum(max(cands[i].gpus for i in f.members) for f in formed) <= capacity


def test_same_gpu_rule_and_mixed_rule() -> None:
    cands = [cand(0, 4, DATA), cand(1, 2, COMPUTE), cand(2, 4, COMPUTE), cand(3, 2, DATA)]
    same = form_groups(cands, 6, Scorer(GroupingRules()))
    for f in same:
        assert len({cands[i].gpus for i in f.members}) == 1
    mixed = form_groups(cands, 8, Scorer(GroupingRules(mixed_gpus=True, weight="gain", merge_order="gain")))
    assert sum(max(cands[i].gpus for i in f.members) for f in mixed) <= 8


def test_gain_rule_refuses_groups_slower_than_taking_turns() -> None:
    # two compute-bound jobs: interleaving cannot beat time-sharing, so the gain rule leaves them apart
    # even though the cluster is oversubscribed; the reference's efficiency rule groups them anyway.
    cands = [cand(0, 4, COMPUTE), cand(1, 4, COMPUTE)]
    gain = form_groups(cands, 4, Scorer(GroupingRules(weight="gain", merge_order="gain")))
    assert sorted(f.members for f in gain) == [(0,), (1,)]
    eff = form_groups(cands, 4, Scorer(GroupingRules()))
    assert [f.members for f in eff] == [(0, 1)]
    # and a complementary pair is grouped by both, with the period the model gives times nothing else
    pair = [cand(0, 4, DATA), cand(1, 4, COMPUTE)]
    (f,) = form_groups(pair, 4, Scorer(GroupingRules(weight="gain")))
    assert f.members == (0, 1) and f.raw_period == pytest.approx(pipeline_period([DATA, COMPUTE])[0])
    assert f.gain > 0 and f.gain == pytest.approx(4 * (1.2 + 1.2) * SOLO_FACTOR / (f.raw_period * GROUP_FACTOR[2]) - 4)


def test_jobs_without_profiles_are_never_grouped() -> None:
    cands = [cand(0, 4, None, 1.0), cand(1, 4, DATA), cand(2, 4, None, 2.0), cand(3, 4, COMPUTE)]
    formed = form_groups(cands, 8, Scorer(GroupingRules()))
    for f in formed:
        if len(f.members) > 1:
            assert all(cands[i].stages is not None for i in f.members)


# -- re-profiling ---------------------------------------------------------------------------------


def test_profile_book_blends_measurements_and_changes_grouping() -> None:
    from hpcsched.allocator import JobView, Snapshot
    from hpcsched.interleave.policies import muri_s_plus
    from hpcsched.interleave.reprofile import ProfileBook
    from hpcsched.model import ClusterSpec, ResourceProfile

    offline = ResourceProfile(0.1, 1.0, 0.1)  # both jobs were profiled compute-bound
    views = tuple(JobView(str(i), 0.0, 4, 100, 0.0, 1.2, 0.0, 0.0, 120.0 + i, offline, False) for i in range(2))
    snap = Snapshot(0.0, views, ClusterSpec(1, 1, 4), 4)
    policy = muri_s_plus()
    assert [g.job_ids for g in policy(snap)] == [("0",), ("1",)]  # no gain in pairing two compute jobs

    book = ProfileBook(alpha=0.5)
    book = book.observe_stages("1", (1.0, 0.1, 0.1), prior=offline)  # job 1 is really data-bound
    assert book.get("1") == ResourceProfile(0.55, 0.55, 0.1)
    for _ in range(6):
        book = book.observe_stages("1", (1.0, 0.1, 0.1))
    assert book.get("1").data_s == pytest.approx(1.0 - 0.45 / 64) and book.samples["1"] == 7
    groups = policy(book.apply(snap))
    assert [g.job_ids for g in groups] == [("0", "1")] and groups[0].period_s < 2.0

    scaled = ProfileBook(alpha=1.0).observe_iteration("0", 2.4, prior=offline)  # twice as slow, same split
    assert scaled.get("0").stages() == pytest.approx((0.2, 2.0, 0.2))
    assert ProfileBook().observe_iteration("x", 1.0) == ProfileBook()  # no split known: nothing learned
    assert ProfileBook().observe_group(1.0, 1.25) == pytest.approx(1.25)
    with pytest.raises(ValueError):
        ProfileBook().observe_stages("0", (1.0, -1.0, 0.0))
    with pytest.raises(ValueError):
        ProfileBook(alpha=0.0)


def test_vectorised_weights_equal_looked_up_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    import hpcsched.interleave.grouping as grouping

    rng = np.random.default_rng(5)
    for rules in (GroupingRules(), GroupingRules(model=PeriodModel("muri4")), GroupingRules(weight="gain")):
        cands = [cand(i, int(rng.choice([1, 2, 4])), tuple(rng.uniform(0.01, 1, 3))) for i in range(90)]
        cands.append(cand(90, 4, None, 1.0))
        scorer = Scorer(rules)
        singles = [(scorer.intern(c.key),) for c in cands]
        kinds = [tuple(sorted(singles[2 * i] + singles[2 * i + 1])) for i in range(30)] + singles[60:]
        fast = scorer._matrix_vectorised(kinds)
        monkeypatch.setattr(grouping, "_VECTOR_FROM", 10**9)
        slow = scorer.matrix(kinds)
        monkeypatch.setattr(grouping, "_VECTOR_FROM", 64)
        assert fast == pytest.approx(slow, abs=1e-12)
        assert np.all(fast[-1] == 0)  # the profile-less job has no edge


def test_many_distinct_jobs_match_within_one_percent_of_exact() -> None:
    from hpcsched.interleave.grouping import _match

    rng = np.random.default_rng(9)
    scorer = Scorer(GroupingRules())
    kinds = []
    for i in range(300):
        s = rng.uniform(0.01, 0.3, 3)
        s[rng.integers(0, 3)] = rng.uniform(0.3, 1.0)
        kinds.append((scorer.intern(cand(i, 4, tuple(s.tolist())).key),))
    ours = _match(kinds, scorer)  # 300 distinct profiles: screened sparse blossom (screening.py)
    assert len({p for i, j, _ in ours for p in (i, j)}) == 2 * len(ours)
    uniq = sorted(set(kinds))
    tw = scorer._matrix_vectorised(uniq)
    nt = [uniq.index(k) for k in kinds]
    x, engine = pair_counts(nt, tw, MatchSettings(dense_limit=10**6))
    assert engine == "dense"
    exact = sum(tw[nt[a], nt[b]] for a, b in assign(nt, x, tw))
    assert sum(w for _, _, w in ours) >= 0.99 * exact
