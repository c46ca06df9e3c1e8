"""The two newer matchers: the screened sparse one (big events) and the reference's blossom (compat ablation)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rustworkx as rx
from interleave_cases import cand, exhaustive_best

from hpcsched.interleave.grouping import GroupingRules, Scorer, _match
from hpcsched.interleave.matching import MatchSettings
from hpcsched.interleave.refblossom import reference_matching
from hpcsched.interleave.screening import _bound, _node_arrays, _pair_weights, sparse_pairs
from hpcsched.traces import read_jobs

ROOT = Path(__file__).resolve().parents[1]


def random_kinds(scorer: Scorer, n: int, seed: int) -> list[tuple[int, ...]]:
    """Distinct profiles, each job heavy in one stage (as in bench/bench_interleave.py)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        s = rng.uniform(0.01, 0.3, 3)
        s[rng.integers(0, 3)] = rng.uniform(0.3, 1.0)
        out.append((scorer.intern(cand(i, 4, tuple(s.tolist())).key),))
    return out


def exact_weight(w: np.ndarray) -> float:
    """Maximum matching weight of a complete weighted graph: rustworkx blossom, integer weights."""
    n = len(w)
    g = rx.PyGraph()
    g.add_nodes_from(range(n))
    i, j = np.triu_indices(n, 1)
    keep = w[i, j] > 0
    weights = np.rint(w[i, j][keep] * 1e9).astype(int).tolist()
    g.add_edges_from(list(zip(i[keep].tolist(), j[keep].tolist(), weights, strict=True)))
    return float(sum(w[a, b] for a, b in rx.max_weight_matching(g, weight_fn=int)))


# -- screening ------------------------------------------------------------------------------------


@pytest.mark.parametrize("weight", ["efficiency", "gain"])
def test_closed_form_pair_weights_equal_the_period_model(weight: str) -> None:
    scorer = Scorer(GroupingRules(weight=weight))
    kinds = random_kinds(scorer, 120, seed=1)
    a = _node_arrays(scorer, kinds)
    nodes = np.arange(len(kinds))
    fast = _pair_weights(a, nodes, nodes, scorer)
    slow = scorer._matrix_vectorised(kinds)  # generic path: every ordering of the slot pipeline
    off = ~np.eye(len(kinds), dtype=bool)
    assert fast[off] == pytest.approx(slow[off], abs=1e-12)
    assert np.all(np.isneginf(np.diag(fast)))


@pytest.mark.parametrize("weight", ["efficiency", "gain"])
def test_bound_is_never_below_the_exact_weight(weight: str) -> None:
    # nodes of one and two jobs, as in the second matching round (merges into groups of 2, 3 and 4)
    scorer = Scorer(GroupingRules(weight=weight))
    singles = random_kinds(scorer, 160, seed=2)
    kinds = [tuple(sorted(singles[2 * i] + singles[2 * i + 1])) for i in range(40)] + singles[80:]
    a = _node_arrays(scorer, kinds)
    nodes = np.arange(len(kinds))
    ub = _bound(a, nodes, nodes, scorer)
    exact = scorer._matrix_vectorised(kinds)
    valid = np.isfinite(ub)
    assert valid.sum() > len(kinds) ** 2 // 2
    assert np.all(ub[valid] >= exact[valid] - 1e-9)
    off = ~np.eye(len(kinds), dtype=bool)  # a node is never its own partner
    assert np.all(exact[~valid & off] <= 0)  # where the bound says "no edge" there is none
    tight = np.isclose(ub[valid], exact[valid], rtol=1e-9).mean()
    assert 0.05 < tight < 1.0  # the bound is sometimes exact, not always (else it would be the formula)


@pytest.mark.parametrize("lock_from", [10**9, 100])
def test_sparse_matching_within_one_percent_of_exact(lock_from: int) -> None:
    scorer = Scorer(GroupingRules(match=MatchSettings(lock_from=lock_from)))
    kinds = random_kinds(scorer, 300, seed=4)
    pairs = _match(kinds, scorer)
    ends = [p for i, j, _ in pairs for p in (i, j)]
    assert len(ends) == len(set(ends)) and all(i < j for i, j, _ in pairs)
    w = scorer._matrix_vectorised(kinds)
    assert all(wt == pytest.approx(w[i, j]) and wt > 0 for i, j, wt in pairs)
    ours, best = sum(wt for *_, wt in pairs), exact_weight(w)
    assert 0.99 * best <= ours <= best + 1e-9


@pytest.mark.parametrize("weight", ["efficiency", "gain"])
def test_sparse_matching_on_merged_nodes_respects_the_group_size(weight: str) -> None:
    scorer = Scorer(GroupingRules(weight=weight))
    singles = random_kinds(scorer, 240, seed=6)
    quads = [tuple(sorted(sum(singles[4 * i : 4 * i + 4], ()))) for i in range(20)]
    pairs = [tuple(sorted(singles[2 * i] + singles[2 * i + 1])) for i in range(40, 100)]
    kinds = quads + pairs + singles[200:]
    out = sparse_pairs(kinds, scorer, MatchSettings(lock_from=50))
    assert out, "pairs of pairs interleave: something must match"
    assert all(len(kinds[i]) + len(kinds[j]) <= 4 for i, j, _ in out)  # a full group takes no partner
    w = scorer._matrix_vectorised(kinds)
    assert sum(wt for *_, wt in out) >= 0.99 * exact_weight(w)


# -- the reference's blossom ----------------------------------------------------------------------


def test_reference_blossom_is_a_maximum_weight_matching() -> None:
    rng = np.random.default_rng(8)
    for trial in range(150):
        n = int(rng.integers(2, 11))
        u = int(rng.integers(1, 4))  # few kinds: many equal weights, as on real traces
        node_type = rng.integers(0, u, size=n).tolist()
        tw = np.round(rng.uniform(-0.2, 1.0, size=(u, u)), 2)
        tw = np.triu(tw) + np.triu(tw, 1).T
        w = [[tw[node_type[a], node_type[b]] if a != b else 0.0 for b in range(n)] for a in range(n)]
        pairs = reference_matching(w)
        ends = [p for q in pairs for p in q]
        assert len(ends) == len(set(ends)), f"trial {trial}"
        assert all(a < b and w[a][b] > 0 for a, b in pairs)
        assert [b for _, b in pairs] == sorted(b for _, b in pairs)  # read out in order of the higher node
        got = sum(w[a][b] for a, b in pairs)
        assert got == pytest.approx(exhaustive_best(node_type, tw), abs=1e-9), f"trial {trial}"


def test_reference_blossom_breaks_ties_in_scan_order() -> None:
    # four interchangeable nodes: the first free node scans its neighbours in index order, so 0 takes 1
    assert reference_matching([[0 if a == b else 0.5 for b in range(4)] for a in range(4)]) == [(0, 1), (2, 3)]
    # a heavier edge wins over the scan order
    w = [[0, 0.5, 0.5, 0.5], [0.5, 0, 0.9, 0.5], [0.5, 0.9, 0, 0.5], [0.5, 0.5, 0.5, 0]]
    assert reference_matching(w) == [(1, 2), (0, 3)]
    assert reference_matching([[0, 0], [0, 0]]) == []


def reprofiled_trace_kinds(scorer: Scorer, n: int, seed: int) -> list[tuple[int, ...]]:
    """Jobs of the bundled trace2 with their stage profile re-measured (+-5% noise): all distinct, and
    mostly data-bound, so the few compute-bound ones are everybody's best partner (hubs)."""
    jobs = [j for j in read_jobs(ROOT / "trace-data/muri/trace2.csv") if j.profile is not None]
    rng = np.random.default_rng(seed)
    out = []
    for k, idx in enumerate(rng.choice(len(jobs), size=n)):
        s = np.array(jobs[idx].profile.stages()) * rng.uniform(0.95, 1.05, 3)
        out.append((scorer.intern(cand(k, 4, tuple(s.tolist())).key),))
    return out


@pytest.mark.parametrize(("weight", "chunk"), [("efficiency", 800), ("gain", 800), ("efficiency", 100)])
def test_sparse_matching_survives_hubs_and_parts(weight: str, chunk: int) -> None:
    scorer = Scorer(GroupingRules(weight=weight, match=MatchSettings(chunk=chunk)))
    kinds = reprofiled_trace_kinds(scorer, 300, seed=11)
    pairs = _match(kinds, scorer)
    ends = [p for i, j, _ in pairs for p in (i, j)]
    assert len(ends) == len(set(ends))
    ours, best = sum(wt for *_, wt in pairs), exact_weight(scorer._matrix_vectorised(kinds))
    assert (0.99 if chunk >= 300 else 0.98) * best <= ours <= best + 1e-9


def test_reference_ties_setting_routes_buckets_to_the_reference_blossom() -> None:
    from hpcsched.interleave.period import PeriodModel

    scorer = Scorer(GroupingRules(model=PeriodModel("muri4"), match=MatchSettings(reference_ties=True)))
    a, b = (scorer.intern(cand(i, 4, s).key) for i, s in enumerate([(0.7, 0.06, 0.02), (0.01, 0.4, 0.02)]))
    kinds = [(a,), (a,), (b,), (a,), (b,), (b,)]
    got = _match(kinds, scorer)
    w = scorer._matrix_vectorised(kinds)
    np.fill_diagonal(w, 0.0)
    assert [(i, j) for i, j, _ in got] == reference_matching(w.tolist())
    assert sum(wt for *_, wt in got) == pytest.approx(exhaustive_best(list(range(6)), w))
