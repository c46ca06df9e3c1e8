"""Sparse matching for many distinct nodes: screen partners by a cheap bound, match the few best exactly.

Why: with thousands of *distinct* stage profiles (random jobs, re-profiled jobs) neither of the exact
engines in ``matching`` is fast enough: the complete graph has n^2/2 edges whose weights alone (one
group period each) cost about a second at n = 2,000, and blossom on it takes minutes. But a job has
only a handful of partners worth considering: most pairs interleave poorly. So:

1. **Bound.** In the pipeline model no two jobs hold one resource at once, and each job runs its
   stages one after another, so a merged group's period is at least
   ``max(max_s sum_j t[j][s], max_j sum_s t[j][s])``. That lower bound on the period gives an upper
   bound on either edge weight (efficiency, or GPU-time gain), for all n^2 pairs in a few vectorised
   array operations.
2. **Screen.** Each node keeps its ``screen`` partners of highest bound; only those pairs get their
   exact period (and weight).
3. **Keep.** Each node keeps its ``keep`` heaviest exact edges; the union of these is the graph.
4. **Match** it exactly (Edmonds' blossom, rustworkx).

bench/bench_interleave.py measures the result against exact blossom on the complete graph: on 2,000
random profiles, ``keep`` = 4 already reaches 0.9993 of the optimum (12: 0.99997), because an optimal
partner of a node is almost always among its few heaviest edges. Only the pipeline model has the bound;
other models (compat's ``muri4``) stay on the complete graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import rustworkx as rx

from hpcsched.interleave.period import STAGES
from hpcsched.sim.semantics import group_factor

_SCALE = 1_000_000  # rustworkx wants integer weights


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
    a: dict[str, np.ndarray], nodes: np.ndarray, width: int, singles: bool, scorer, block: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges (i, j, exact weight > 0), i < j, among ``nodes``: each node's ``width`` best partners by exact
    weight (singles, closed form) or by the bound (then weighed exactly)."""
    width = min(width, len(nodes) - 1)
    if width < 1:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp), np.zeros(0)
    ci, cj, cw = [], [], []
    for lo in range(0, len(nodes), block):  # row blocks bound the memory of the weights or bounds
        rows = nodes[lo : lo + block]
        sc = _pair_weights(a, rows, nodes, scorer) if singles else _bound(a, rows, nodes, scorer)
        top = sc.argmax(axis=1)[:, None] if width == 1 else np.argpartition(-sc, width - 1, axis=1)[:, :width]
        val = np.take_along_axis(sc, top, axis=1).ravel()
        good = val > 0
        ci.append(np.repeat(rows, width)[good])
        cj.append(nodes[top.ravel()[good]])
        cw.append(val[good])
    i_, j_, w_ = np.concatenate(ci), np.concatenate(cj), np.concatenate(cw)
    n = len(a["size"])
    code, first = np.unique(np.minimum(i_, j_) * n + np.maximum(i_, j_), return_index=True)
    i, j = code // n, code % n
    w = w_[first] if singles else _exact(a, i, j, scorer)
    pos = w > 0
    return i[pos], j[pos], w[pos]


def _ranked(i: np.ndarray, j: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both ends of every edge, sorted by end then heaviest first: (end, edge id, rank at that end)."""
    ends = np.concatenate([i, j])
    ww = np.concatenate([w, w])
    edge_id = np.concatenate([np.arange(len(w)), np.arange(len(w))])
    order = np.lexsort((-ww, ends))
    sorted_ends = ends[order]
    rank = np.arange(len(order)) - np.searchsorted(sorted_ends, sorted_ends, side="left")
    return sorted_ends, edge_id[order], rank


def _mutual_best(n: int, i: np.ndarray, j: np.ndarray, w: np.ndarray) -> list[tuple[int, int, float]]:
    """Pairs of nodes each other's heaviest edge."""
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
    ]


def sparse_pairs(
    node_kinds: Sequence[tuple[int, ...]],
    scorer,
    keep: int,
    screen: int,
    lock_from: int,
    keep_merged: int,
    block: int = 512,
) -> list[tuple[int, int, float]]:
    """Maximum-weight pairs (i, j, weight), i < j, on the screened sparse graph (module docstring).

    Single jobs keep their ``keep`` heaviest edges; nodes that are already groups keep ``keep_merged``
    (more: their best partners crowd onto the same few nodes, so a short list leaves many nodes with
    no free partner; 4 lost 13% of the weight on a test graph, 12 lost 0.5%). From ``lock_from``
    single jobs on, pairs of mutual best partners are matched first and only the rest go to blossom,
    whose time grows ~cubically, and about half the jobs are such pairs. (Not exact: a mutual best
    pair can block two heavier pairs; ~0.1% of the weight on 2,000 random jobs.)
    """
    n = len(node_kinds)
    a = _node_arrays(scorer, node_kinds)
    singles = bool((a["size"] == 1).all())
    width = keep if singles else screen
    if not singles:
        keep = keep_merged
    nodes = np.arange(n)
    out: list[tuple[int, int, float]] = []
    if singles and n >= lock_from:
        out = _mutual_best(n, *_candidates(a, nodes, 1 if singles else screen, singles, scorer, block))
        taken = np.zeros(n, dtype=bool)
        for x, y, _ in out:
            taken[x] = taken[y] = True
        nodes = np.nonzero(~taken)[0]
    i, j, w = _candidates(a, nodes, width, singles, scorer, block)
    if len(w):
        # each node keeps its `keep` heaviest exact edges (an edge stays if either end keeps it)
        _, eid, rank = _ranked(i, j, w)
        kept = np.unique(eid[rank < keep])
        i, j, w = i[kept], j[kept], w[kept]
        g = rx.PyGraph()
        g.add_nodes_from(range(n))
        weights = np.rint(w * _SCALE).astype(np.int64).tolist()
        g.add_edges_from(list(zip(i.tolist(), j.tolist(), weights, strict=True)))
        wmap = {(x, y): z for x, y, z in zip(i.tolist(), j.tolist(), w.tolist(), strict=True)}
        for x, y in rx.max_weight_matching(g, weight_fn=int):
            lo, hi = min(x, y), max(x, y)
            out.append((lo, hi, wmap[(lo, hi)]))
    return sorted(out)
