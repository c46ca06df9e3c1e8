"""Sparse matching for many distinct nodes: screen partners by a cheap bound, match the few best exactly.

Why: with thousands of *distinct* stage profiles (random jobs, re-profiled jobs) neither of the exact
engines in ``matching`` is fast enough: the complete graph has n^2/2 edges whose weights alone (one
group period each) cost about a second at n = 2,000, and blossom on it takes minutes. But a job has
only a handful of partners worth considering: most pairs interleave poorly. So:

1. **Bound.** In the pipeline model no two jobs hold one resource at once, and each job runs its
   stages one after another, so a merged group's period is at least
   ``max(max_s sum_j t[j][s], max_j sum_s t[j][s])``. That lower bound on the period gives an upper
   bound on either edge weight (efficiency, or GPU-time gain) for all pairs in a few array operations.
   Single jobs need no bound: the two-job period has a closed form, exact for all n^2 pairs.
2. **Screen.** Each node keeps its few partners of highest weight (or bound, then weighed exactly),
   plus a few at random among those not ruled out: when everybody's favourite is the same handful of
   nodes (hubs), the favourites alone cannot pair the rest.
3. **Match** that sparse graph exactly (Edmonds' blossom, rustworkx), in parts of bounded size.

bench/bench_interleave.py measures the result against exact blossom on the complete graph (0.996-0.9998
of the optimum on random and re-profiled trace jobs). Only the pipeline model has the bound; other
models (compat's ``muri4``) stay on the complete graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hpcsched.interleave import matching
from hpcsched.interleave.matching import MatchSettings
from hpcsched.interleave.period import STAGES
from hpcsched.primitives.speed import group_factor

_HUB_SHARE = 0.3  # fewer distinct best partners than this share of the nodes: a hub graph (random: ~0.63,
# re-profiled trace jobs: 0.01-0.1)


def _node_arrays(scorer, node_kinds: Sequence[tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Per-node aggregates the bound needs: stage loads, longest member, busy time, GPUs, work, size."""
    stages, profiled, gpus, solo = scorer._arrays()
    kinds = sorted(set(node_kinds))
    ix = {k: i for i, k in enumerate(kinds)}
    width = max(len(k) for k in kinds)
    members = np.full((len(kinds), width), -1, dtype=np.intp)
    for i, k in enumerate(kinds):
        members[i, : len(k)] = k
    real = members >= 0
    safe = np.where(real, members, 0)
    t = np.where(real[:, :, None], stages[safe], 0.0)  # (K, width, STAGES)
    multi = [k for k in kinds if len(k) > 1]  # a single job gains nothing by itself
    gains = dict(zip(multi, (s.gain for s in scorer.scores(multi)), strict=True))
    part_gain = np.array([gains.get(k, 0.0) for k in kinds])
    per_kind = {
        "load": t.sum(axis=1),
        "longest": t.sum(axis=2).max(axis=1),
        "busy": t.sum(axis=(1, 2)),
        "gpus": np.where(real, gpus[safe], 0.0).max(axis=1),
        "work": np.where(real, gpus[safe] * solo[safe], 0.0).sum(axis=1),
        "size": real.sum(axis=1),
        "ok": np.where(real, profiled[safe], True).all(axis=1),
        "part_gain": part_gain,
    }
    node = np.array([ix[k] for k in node_kinds], dtype=np.intp)
    out = {name: a[node] for name, a in per_kind.items()}
    out["members"] = members[node]
    return out


def _bound(a: dict[str, np.ndarray], rows: np.ndarray, cols: np.ndarray, scorer) -> np.ndarray:
    """Upper bound on the edge weight from each node in ``rows`` to each in ``cols`` (both ascending,
    rows among cols; -inf: no edge)."""
    rules = scorer.rules
    size, load = a["size"], a["load"]
    k = size[rows, None] + size[None, cols]
    t_lb = np.maximum(a["longest"][rows, None], a["longest"][None, cols])
    tmp = np.empty_like(t_lb)
    for s in range(STAGES):
        np.maximum(t_lb, np.add(load[rows, s][:, None], load[cols, s][None, :], out=tmp), out=t_lb)
    gf = np.array([group_factor(x) for x in range(2 * rules.max_group + 1)])
    t_lb *= gf[k]
    np.maximum(t_lb, 1e-300, out=t_lb)
    if rules.weight == "efficiency":
        t_lb *= rules.model.resources
        ub = np.add(a["busy"][rows, None], a["busy"][None, cols], out=tmp)
        ub /= t_lb
    else:
        ub = np.add(a["work"][rows, None], a["work"][None, cols], out=tmp)
        ub /= t_lb
        ub -= np.maximum(a["gpus"][rows, None], a["gpus"][None, cols], out=t_lb)
        ub -= a["part_gain"][rows, None]
        ub -= a["part_gain"][None, cols]
    bad = k > rules.max_group
    ok = a["ok"]
    if not ok.all():
        bad |= ~(ok[rows, None] & ok[None, cols])
    ub[bad] = -np.inf
    ub[np.arange(len(rows)), np.searchsorted(cols, rows)] = -np.inf  # no edge to itself
    return ub


def _pair_weights(a: dict[str, np.ndarray], rows: np.ndarray, cols: np.ndarray, scorer) -> np.ndarray:
    """Exact weights from single jobs ``rows`` to single jobs ``cols`` (both ascending, rows among cols):
    the two-job pipeline period in closed form, x first: max(x0, y2) + max(x1, y0) + max(x2, y1), or y
    first; no per-pair gather, and in place (this is the hot loop of a big event)."""
    rules = scorer.rules
    load = a["load"]
    x = [load[rows, s][:, None] for s in range(STAGES)]
    y = [load[cols, s][None, :] for s in range(STAGES)]
    xy = np.maximum(x[0], y[2])
    tmp = np.empty_like(xy)
    xy += np.maximum(x[1], y[0], out=tmp)
    xy += np.maximum(x[2], y[1], out=tmp)
    yx = np.maximum(y[0], x[2])
    yx += np.maximum(y[1], x[0], out=tmp)
    yx += np.maximum(y[2], x[1], out=tmp)
    period = np.minimum(xy, yx, out=xy)
    period *= group_factor(2)
    np.maximum(period, 1e-300, out=period)
    if rules.weight == "efficiency":
        period *= rules.model.resources
        w = np.add(a["busy"][rows, None], a["busy"][None, cols], out=yx)
        w /= period
    else:
        w = np.add(a["work"][rows, None], a["work"][None, cols], out=yx)
        w /= period
        w -= np.maximum(a["gpus"][rows, None], a["gpus"][None, cols], out=tmp)
    ok = a["ok"]
    if not ok.all():
        w[~(ok[rows, None] & ok[None, cols])] = -np.inf
    w[np.arange(len(rows)), np.searchsorted(cols, rows)] = -np.inf  # no edge to itself
    return w


def _exact(a: dict[str, np.ndarray], i: np.ndarray, j: np.ndarray, scorer) -> np.ndarray:
    """Exact edge weights of the node pairs (i, j), grouped by member counts for vectorised periods."""
    stages, profiled, gpus, solo = scorer._arrays()
    size, members = a["size"], a["members"]
    w = np.zeros(len(i))
    for la in np.unique(size[i]):
        for lb in np.unique(size[j]):
            sel = np.nonzero((size[i] == la) & (size[j] == lb))[0]
            if len(sel) == 0:
                continue
            grp = np.concatenate([members[i[sel], :la], members[j[sel], :lb]], axis=1)
            ws, ok = scorer._weights_of(grp, stages, profiled, gpus, solo)
            if scorer.rules.weight == "gain":
                ws = ws - a["part_gain"][i[sel]] - a["part_gain"][j[sel]]
            w[sel] = np.where(ok, ws, 0.0)
    return w


def _ranked(i: np.ndarray, j: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both ends of every edge, sorted by end then heaviest first: (end, edge id, rank at that end)."""
    ends = np.concatenate([i, j])
    ww = np.concatenate([w, w])
    edge_id = np.concatenate([np.arange(len(w)), np.arange(len(w))])
    order = np.lexsort((-ww, ends))
    sorted_ends = ends[order]
    rank = np.arange(len(order)) - np.searchsorted(sorted_ends, sorted_ends, side="left")
    return sorted_ends, edge_id[order], rank


def _candidates(
    a: dict[str, np.ndarray], nodes: np.ndarray, width: int, spread: int, singles: bool, scorer, block: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Edges (i, j, exact weight > 0, random?), i < j, among ``nodes``: each node's ``width`` best partners
    by exact weight (singles, closed form) or by the bound (then weighed exactly), and ``spread`` partners
    drawn at random among those the weight or bound does not rule out (seeded by the graph's size)."""
    m = len(nodes)
    width, spread = min(width, m - 1), min(spread, m - 1)
    if width < 1:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp), np.zeros(0), np.zeros(0, dtype=bool)
    rng = np.random.default_rng(m)
    ci, cj, cw, cr = [], [], [], []
    for lo in range(0, m, block):  # row blocks bound the memory of the weights or bounds
        rows = nodes[lo : lo + block]
        sc = _pair_weights(a, rows, nodes, scorer) if singles else _bound(a, rows, nodes, scorer)
        picks = [(sc.argmax(axis=1)[:, None] if width == 1 else np.argpartition(-sc, width - 1, axis=1)[:, :width],
                  False)]  # fmt: skip
        if spread > 0:
            key = rng.random(sc.shape)
            key[sc <= 0] = -1.0
            picks.append((np.argpartition(-key, spread - 1, axis=1)[:, :spread], True))
        for top, rand in picks:
            val = np.take_along_axis(sc, top, axis=1).ravel()
            good = val > 0
            ci.append(np.repeat(rows, top.shape[1])[good])
            cj.append(nodes[top.ravel()[good]])
            cw.append(val[good])
            cr.append(np.full(int(good.sum()), rand))
    i_, j_, w_, r_ = np.concatenate(ci), np.concatenate(cj), np.concatenate(cw), np.concatenate(cr)
    n = len(a["size"])
    order = np.argsort(r_, kind="stable")  # best-partner copies first, so a duplicate keeps that label
    code, first = np.unique((np.minimum(i_, j_) * n + np.maximum(i_, j_))[order], return_index=True)
    first = order[first]
    i, j = code // n, code % n
    w = w_[first] if singles else _exact(a, i, j, scorer)
    pos = w > 0
    return i[pos], j[pos], w[pos], r_[first][pos]


def _mutual_best(
    n: int, i: np.ndarray, j: np.ndarray, w: np.ndarray
) -> tuple[list[tuple[int, int, float]], np.ndarray]:
    """Pairs of nodes each other's heaviest edge, and every node's heaviest partner (-1: none)."""
    ends, eid, rank = _ranked(i, j, w)
    top_end, top_edge = ends[rank == 0], eid[rank == 0]
    best = np.full(n, -1)
    best[top_end] = np.where(i[top_edge] == top_end, j[top_edge], i[top_edge])
    return [
        (x, y, float(w[e]))
        for end, x, y, e in zip(
            top_end.tolist(), i[top_edge].tolist(), j[top_edge].tolist(), top_edge.tolist(), strict=True
        )
        if end == x and best[x] == y and best[y] == x  # listed once, from its lower end (i < j)
    ], best


def sparse_pairs(
    node_kinds: Sequence[tuple[int, ...]], scorer, settings: MatchSettings, block: int = 512
) -> list[tuple[int, int, float]]:
    """Maximum-weight pairs (i, j, weight), i < j, on the screened sparse graph (module docstring).

    Per ``settings``: single jobs keep their ``keep`` heaviest edges, nodes that are already groups
    ``keep_merged`` (their best partners crowd onto the same few nodes: 4 lost 13% of the weight on a
    test graph, 12 lost 0.5%), and every node ``spread`` random ones (when everybody's heaviest edges go
    to the same few nodes, e.g. the few compute-bound jobs among data-bound ones, those alone cannot
    pair most nodes: 0.52 of the optimum on 1,000 re-profiled trace jobs without, 0.997 with 12). From
    ``lock_from`` single jobs on, mutual best partners are paired first (~half the jobs of a random
    graph; not exact: such a pair can block two heavier ones, ~0.1% of the weight). Blossom's time
    grows ~cubically, so what is left is dealt by stride into parts of at most ``chunk`` nodes (each a
    cross-section of priorities and profiles), each matched alone, and the leftovers once more; parts
    of ``hub_chunk`` in a hub graph, where partners are near-interchangeable (on random graphs, where
    they are not, parts of 500 cost 0.7-2% of the weight; on re-profiled trace jobs nothing measurable).
    """
    n = len(node_kinds)
    a = _node_arrays(scorer, node_kinds)
    singles = bool((a["size"] == 1).all())
    nodes = np.arange(n)
    out: list[tuple[int, int, float]] = []
    chunk = settings.chunk
    if n > settings.hub_chunk:
        mutual, best = _mutual_best(n, *_candidates(a, nodes, 1, 0, singles, scorer, block)[:3])
        known = best[best >= 0]
        if len(known) and len(np.unique(known)) < _HUB_SHARE * len(known):
            chunk = settings.hub_chunk  # hubs: partners are near-interchangeable, small parts lose little
        if singles and n >= settings.lock_from:
            out = mutual
            taken = np.zeros(n, dtype=bool)
            for x, y, _ in out:
                taken[x] = taken[y] = True
            nodes = np.nonzero(~taken)[0]
    parts = -(-len(nodes) // chunk)
    for c in range(parts):
        out += _sparse_blossom(a, nodes[c::parts], singles, scorer, settings, block)
    if parts > 1:
        taken = np.zeros(n, dtype=bool)
        for x, y, _ in out:
            taken[x] = taken[y] = True
        rest = nodes[~taken[nodes]]
        if len(rest) >= 2:
            out += _sparse_blossom(a, rest, singles, scorer, settings, block)
    return sorted(out)


def _sparse_blossom(
    a: dict[str, np.ndarray], nodes: np.ndarray, singles: bool, scorer, settings: MatchSettings, block: int
) -> list[tuple[int, int, float]]:
    """Blossom on ``nodes`` with each node's best and random partners among them."""
    keep = settings.keep if singles else settings.keep_merged
    width = settings.keep if singles else settings.screen
    i, j, w, rand = _candidates(a, nodes, width, settings.spread, singles, scorer, block)
    if len(w) == 0:
        return []
    _, eid, rank = _ranked(i[~rand], j[~rand], w[~rand])
    best = np.nonzero(~rand)[0][np.unique(eid[rank < keep])]
    kept = np.concatenate([best, np.nonzero(rand)[0]])
    return _blossom(i[kept], j[kept], w[kept])


def _blossom(i: np.ndarray, j: np.ndarray, w: np.ndarray) -> list[tuple[int, int, float]]:
    """Exact maximum-weight matching of the sparse graph, as (i, j, weight), i < j; only the nodes with an edge
    enter the graph (blossom's stages scan every vertex)."""
    used, local = np.unique(np.concatenate([i, j]), return_inverse=True)
    wmap = {(x, y): z for x, y, z in zip(i.tolist(), j.tolist(), w.tolist(), strict=True)}
    out = []
    for x, y in matching._blossom(len(used), local[: len(i)], local[len(i) :], w):
        a, b = int(used[x]), int(used[y])
        lo, hi = min(a, b), max(a, b)
        out.append((lo, hi, wmap[(lo, hi)]))
    return out
