"""Maximum-weight matching of interleaving candidates, fast enough to run at every scheduling event.

Nodes carry a *type* (jobs with the same stage profile, GPU count and solo speed are interchangeable),
and the weight of an edge depends only on the two types. Real traces have few types (Muri's have at
most 48: 8 models x 6 GPU counts), random or re-profiled jobs may all differ. Two exact engines, picked
by size, both returning how many pairs to form between each two types:

* ``dense`` (n <= ``dense_limit``, or too many types for the next): Edmonds blossom (rustworkx, Rust)
  on the complete graph. rustworkx rather than networkx: same answer, ~80x faster (0.02 s vs 1.6 s at
  200 nodes); still O(n^3), so ``grouping`` never hands it thousands of distinct nodes: those go to
  ``screening`` (a sparse graph of each node's few best partners), see ``grouping._match``.
* ``types`` (few types, many nodes): an integer program over pair counts x[a, b]
  (sum_b x[a, b] + 2 x[a, a] <= n_a), solved by HiGHS. Its size depends on the number of types, not of
  jobs: 2,000 jobs of 48 types is 1,176 integer variables, solved in milliseconds.

Then ``assign`` turns pair counts into concrete node pairs, walking nodes in priority order so the
highest-priority jobs of each type pair are paired first (any such assignment has the same weight).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import rustworkx as rx

log = logging.getLogger(__name__)
_SCALE = 1_000_000  # rustworkx wants integer weights; 1e-6 resolution on efficiencies ~0.3..1.0


@dataclass(frozen=True, slots=True)
class MatchSettings:
    """Which engine handles which size; defaults chosen with bench/bench_interleave.py."""

    dense_limit: int = 96  # at most this many nodes -> blossom on the complete graph
    type_limit: int = 48  # at most this many distinct types -> exact integer program
    keep: int = 4  # many distinct nodes (grouping -> screening): a single job keeps its 4 heaviest edges,
    keep_merged: int = 12  # a group its 12 heaviest ...
    screen: int = 24  # ... of its 24 best by the period bound,
    spread: int = 12  # ... and every node 12 random partners (hubs)
    lock_from: int = 1500  # from this many single jobs on, mutual best partners are paired before blossom
    chunk: int = 1000  # at most this many nodes per blossom; more are dealt into parts (grouping, screening)
    hub_chunk: int = 700  # ... at most this many where a few nodes are everybody's best partner (screening)
    chunk_edges: int = 12  # models without the bound: each node's 12 heaviest edges of the complete graph
    reference_ties: bool = False  # compat: the reference's own blossom, so equal-weight ties go its way


def _blossom(n: int, i: np.ndarray, j: np.ndarray, w: np.ndarray) -> list[tuple[int, int]]:
    keep = w > 0
    i, j, w = i[keep], j[keep], w[keep]
    if len(w) == 0:
        return []
    g = rx.PyGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(list(zip(i.tolist(), j.tolist(), np.rint(w * _SCALE).astype(np.int64).tolist(), strict=True)))
    return sorted((min(a, b), max(a, b)) for a, b in rx.max_weight_matching(g, weight_fn=int))


def _counts_from_pairs(pairs: list[tuple[int, int]], node_type: np.ndarray, u: int) -> np.ndarray:
    x = np.zeros((u, u), dtype=np.int64)
    for a, b in pairs:
        ta, tb = int(node_type[a]), int(node_type[b])
        x[min(ta, tb), max(ta, tb)] += 1
    return x


@cache
def _upper(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(n, 1)


def _dense_counts(node_type: np.ndarray, tw: np.ndarray, keep: int = 0) -> np.ndarray:
    """Blossom on the complete graph, or with ``keep`` > 0 on each node's ``keep`` heaviest edges (union)."""
    n = len(node_type)
    if keep and n > 2 * keep:
        w_full = tw[node_type][:, node_type]
        np.fill_diagonal(w_full, -np.inf)
        top = np.argpartition(-w_full, keep, axis=1)[:, :keep]
        rows = np.repeat(np.arange(n), keep)
        a, b = np.minimum(rows, top.ravel()), np.maximum(rows, top.ravel())
        code = np.unique(a * n + b)
        i, j = code // n, code % n
    else:
        i, j = _upper(n)
    w = tw[node_type[i], node_type[j]]
    return _counts_from_pairs(_blossom(n, i, j, w), node_type, tw.shape[0])


def _type_counts(counts: np.ndarray, tw: np.ndarray) -> np.ndarray:
    """Exact matching over interchangeable nodes as an integer program on pair counts (HiGHS)."""
    import highspy

    from hpcsched.solvers.highs import SolverError, new_highs, run

    u = len(counts)
    cols = [(a, b) for a in range(u) for b in range(a, u) if tw[a, b] > 0 and (counts[a] >= 2 if a == b else True)]
    x = np.zeros((u, u), dtype=np.int64)
    if not cols:
        return x
    h = new_highs()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(cols), u
    lp.col_cost_ = np.array([-tw[a, b] for a, b in cols])
    lp.col_lower_ = np.zeros(len(cols))
    lp.col_upper_ = np.array([counts[a] // 2 if a == b else min(counts[a], counts[b]) for a, b in cols], float)
    lp.row_lower_ = np.full(u, -highspy.kHighsInf)
    lp.row_upper_ = counts.astype(float)
    start, index, value = [0], [], []
    for a, b in cols:
        index.extend([a] if a == b else [a, b])
        value.extend([2.0] if a == b else [1.0, 1.0])
        start.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.array(start, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * len(cols)
    h.passModel(lp)
    h.setOptionValue("mip_rel_gap", 0.0)
    status = run(h)
    if status != highspy.HighsModelStatus.kOptimal:
        raise SolverError(f"the pair-count program ended {status}, not optimal")
    sol = np.rint(np.asarray(h.getSolution().col_value)).astype(np.int64)
    for (a, b), v in zip(cols, sol, strict=True):
        x[a, b] = v
    return x


def pair_counts(
    node_type: Sequence[int] | np.ndarray, type_weight: np.ndarray, settings: MatchSettings = MatchSettings()
) -> tuple[np.ndarray, str]:
    """Upper-triangular x[a, b]: how many pairs of types (a, b) a maximum-weight matching forms; and the engine.

    ``type_weight[a, b]`` is the gain of pairing a node of type a with one of type b; <= 0 means never.
    """
    nt = np.asarray(node_type, dtype=np.intp)
    tw = np.asarray(type_weight, dtype=float)
    u = tw.shape[0]
    counts = np.bincount(nt, minlength=u)
    if len(nt) <= settings.dense_limit:
        return _dense_counts(nt, tw), "dense"
    if int((counts > 0).sum()) <= settings.type_limit:
        from hpcsched.solvers.highs import SolverError

        try:
            return _type_counts(counts, tw), "types"
        except SolverError as e:  # the blossom gives the same optimum, only slower: say so and use it
            log.warning("interleave matching: %s; exact blossom on the complete graph (%d nodes) instead", e, len(nt))
            return _dense_counts(nt, tw), "dense (types failed)"
    if settings.chunk_edges:
        return _dense_counts(nt, tw, settings.chunk_edges), "sparse"
    return _dense_counts(nt, tw), "dense"


def assign(node_type: Sequence[int], x: np.ndarray, type_weight: np.ndarray | None = None) -> list[tuple[int, int]]:
    """Concrete pairs realising the counts ``x``; nodes are given in priority order (index 0 first).

    Walking nodes in priority order, each unpaired node takes the highest-priority node left of the
    heaviest partner type it still has pairs with (ties: the earliest such node). High-priority jobs
    thus get their best partners, as in a primal-dual blossom that scans nodes in index order (the
    reference's); any assignment of the counts has the same total weight.
    """
    xs = np.asarray(x, dtype=np.int64)
    sym = xs + np.triu(xs, 1).T
    rows, cols = np.nonzero(sym)
    if len(rows) == 0:
        return []
    tw = np.zeros(sym.shape) if type_weight is None else np.asarray(type_weight, dtype=float)
    weights = tw[rows, cols].tolist()
    left: dict[int, dict[int, int]] = {}  # left[a][b]: pairs still to form between types a and b
    partners: dict[int, list[tuple[float, int]]] = {}  # heaviest partner types first
    for a, b, c, w in zip(rows.tolist(), cols.tolist(), sym[rows, cols].tolist(), weights, strict=True):
        left.setdefault(a, {})[b] = c
        partners.setdefault(a, []).append((-w, b))
    for lst in partners.values():
        lst.sort()
    queues: dict[int, deque[int]] = {}
    for i, t in enumerate(node_type):
        queues.setdefault(int(t), deque()).append(i)
    taken = [False] * len(node_type)
    pairs: list[tuple[int, int]] = []
    for i, t in enumerate(node_type):
        if taken[i]:
            continue
        a = int(t)
        taken[i] = True
        queues[a].popleft()  # nodes of a type are always taken from the front, so i is there
        row = left.get(a)
        if row is None:
            continue
        best_b, best_w, best_head = -1, 0.0, 0
        for neg_w, b in partners[a]:
            if row[b] <= 0:
                continue
            q = queues[b]
            if not q:
                continue
            if best_b >= 0:
                if -neg_w < best_w:
                    break  # sorted by weight: nothing heavier follows
                if q[0] > best_head:
                    continue
            best_b, best_w, best_head = b, -neg_w, q[0]
        if best_b < 0:
            continue
        j = queues[best_b].popleft()
        taken[j] = True
        row[best_b] -= 1
        if best_b != a:
            left[best_b][a] -= 1
        pairs.append((i, j))
    return pairs


def matching_weight(pairs: Sequence[tuple[int, int]], node_type: Sequence[int], type_weight: np.ndarray) -> float:
    return float(sum(type_weight[node_type[a], node_type[b]] for a, b in pairs))
