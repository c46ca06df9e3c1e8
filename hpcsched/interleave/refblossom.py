"""The Muri reference's own maximum-weight matching, tie-breaking included (``--compat muri`` only).

Why a second blossom: when several matchings have the same total weight (jobs of one model are
interchangeable for the weight, not for their remaining or attained service), *which* one a matcher
returns decides who runs. The reference (Rivendile/Muri ``simulator/matching.py``) runs the classic
O(n^3) primal-dual weighted blossom on float weights, and its published Muri-L number depends on the
matching that algorithm happens to pick. rustworkx's blossom, or our pair-count engines, pick another
optimum. This module is our implementation of the same primal-dual method with the same visiting order,
so ties resolve as in the reference:

* nodes 1..n, blossoms n+1.. (a freed blossom index is reused, lowest first); every vertex label starts
  at the heaviest weight; an edge is tight when ``lab[u] + lab[v] - 2 w <= 0``;
* each phase seeds a FIFO queue with the free vertices in index order (a blossom contributes its
  atomic members breadth-first), scans a dequeued vertex's neighbours in index order and augments on
  the first tight path found; one augmentation per phase, phases until none is found;
* the dual step takes the least slack, stops when a free vertex's label would reach zero (relative
  tolerance 1e-5, as the reference's ``math.isclose``), then re-examines slack edges in index order and
  expands zero-label odd blossoms.

Slow (pure Python, O(n^3); ~2x the CPU of a compat trace3 run), and opt-in even under compat:
``MatchSettings(reference_ties=True)``. Measured on trace3 (bench_interleave.py --only ablation) it
moves compat Muri-L from +0.55% to +0.82% of the published figure (p99 +0.81% to +2.54%; Muri-L's gap
was the missing autopack pass, ``policies.autopack``) and Muri-S's p99 from +0.9% to -1.9%, so the
pair-count engines of ``matching`` stay the default. ``grouping`` memoises its answer per sequence of node kinds.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

_REL = 1e-5  # the reference's tolerance on label comparisons


def _not_above(x: float, y: float) -> bool:
    """x <= y up to the relative tolerance (the reference's ``my_cmp(x, y) == 0``)."""
    return x <= y or math.isclose(x, y, rel_tol=_REL)


class _Solver:
    """State of one matching: per-(row, column) edge records (u, v, w) over vertices and blossoms."""

    def __init__(self, w: Sequence[Sequence[float]]) -> None:
        n = self.n = len(w)
        size = 2 * n + 2  # vertices 1..n, blossoms n+1..2n at most at once
        self.nx = n
        self.eu = [[0] * size for _ in range(size)]
        self.ev = [[0] * size for _ in range(size)]
        self.ew = [[0.0] * size for _ in range(size)]
        for u in range(n + 1):
            ru, rv, rw = self.eu[u], self.ev[u], self.ew[u]
            for v in range(n + 1):
                ru[v], rv[v] = u, v
                if u and v and u != v and w[u - 1][v - 1] > 0:
                    rw[v] = float(w[u - 1][v - 1])
        w_max = max((max(row) for row in self.ew), default=0.0)
        self.lab = [w_max] * (n + 1) + [0.0] * (size - n - 1)
        self.match = [0] * size
        self.st = list(range(n + 1)) + [0] * (size - n - 1)
        self.pa = [0] * size
        self.slack = [0] * size
        self.S = [-1] * size
        self.vis = [0] * size
        self.stamp = 0
        self.flower: list[list[int]] = [[] for _ in range(size)]
        self.ffrom = [[0] * size for _ in range(size)]
        for u in range(1, n + 1):
            self.ffrom[u][u] = u
        self.q: deque[int] = deque()

    # -- helpers -------------------------------------------------------------------------------
    def dist(self, r: int, c: int) -> float:
        return self.lab[self.eu[r][c]] + self.lab[self.ev[r][c]] - self.ew[r][c] * 2.0

    def update_slack(self, u: int, x: int) -> None:
        s = self.slack[x]
        if s == 0 or self.dist(u, x) < self.dist(s, x):
            self.slack[x] = u

    def set_slack(self, x: int) -> None:
        self.slack[x] = 0
        st, S = self.st, self.S
        for u in range(1, self.n + 1):
            if self.ew[u][x] > 0 and st[u] != x and S[st[u]] == 0:
                self.update_slack(u, x)

    def q_push(self, x: int) -> None:
        """Enqueue x, or a blossom's atomic members breadth-first."""
        todo = deque([x])
        while todo:
            y = todo.popleft()
            if y <= self.n:
                self.q.append(y)
            else:
                todo.extend(self.flower[y])

    def set_st(self, x: int, b: int) -> None:
        self.st[x] = b
        if x <= self.n:
            return
        for i in self.flower[x]:
            self.set_st(i, b)

    def get_pr(self, b: int, xr: int) -> int:
        """Position of xr in blossom b, walking the cycle in the direction that makes it even."""
        f = self.flower[b]
        pr = f.index(xr)
        if pr % 2 == 1:
            self.flower[b] = [f[0], *reversed(f[1:])]
            return len(f) - pr
        return pr

    def set_match(self, u: int, v: int) -> None:
        self.match[u] = self.ev[u][v]
        if u <= self.n:
            return
        xr = self.ffrom[u][self.eu[u][v]]
        pr = self.get_pr(u, xr)
        f = self.flower[u]
        for i in range(pr):
            self.set_match(f[i], f[i ^ 1])
        self.set_match(xr, v)
        self.flower[u] = f[pr:] + f[:pr]

    def augment(self, u: int, v: int) -> None:
        st = self.st
        while True:
            xnv = st[self.match[u]]
            self.set_match(u, v)
            if xnv == 0:
                return
            self.set_match(xnv, st[self.pa[xnv]])
            u, v = st[self.pa[xnv]], xnv

    def get_lca(self, u: int, v: int) -> int:
        self.stamp += 1
        st = self.st
        while u or v:
            if u:
                if self.vis[u] == self.stamp:
                    return u
                self.vis[u] = self.stamp
                u = st[self.match[u]]
                if u:
                    u = st[self.pa[u]]
            u, v = v, u
        return 0

    # -- blossoms ------------------------------------------------------------------------------
    def add_blossom(self, u: int, lca: int, v: int) -> None:
        n, st = self.n, self.st
        b = n + 1
        while b <= self.nx and st[b] != 0:
            b += 1
        if b > self.nx:  # a fresh index: its records are still the blank ones it was allocated with
            self.nx = b
        self.lab[b], self.S[b] = 0.0, 0
        self.match[b] = self.match[lca]
        f = [lca]
        x = u
        while x != lca:
            y = st[self.match[x]]
            f += (x, y)
            self.q_push(y)
            x = st[self.pa[y]]
        f = [f[0], *reversed(f[1:])]
        x = v
        while x != lca:
            y = st[self.match[x]]
            f += (x, y)
            self.q_push(y)
            x = st[self.pa[y]]
        self.flower[b] = f
        self.set_st(b, b)
        eu, ev, ew = self.eu, self.ev, self.ew
        nx = self.nx
        for x in range(1, nx + 1):
            ew[b][x] = 0.0
            ew[x][b] = 0.0
        fb = self.ffrom[b]
        for x in range(1, n + 1):
            fb[x] = 0
        for xs in f:
            for x in range(1, nx + 1):
                if ew[b][x] <= 0 or self.dist(xs, x) < self.dist(b, x):
                    eu[b][x], ev[b][x], ew[b][x] = eu[xs][x], ev[xs][x], ew[xs][x]
                    eu[x][b], ev[x][b], ew[x][b] = eu[x][xs], ev[x][xs], ew[x][xs]
            fx = self.ffrom[xs]
            for x in range(1, n + 1):
                if fx[x] != 0:
                    fb[x] = xs
        self.set_slack(b)

    def expand_blossom(self, b: int) -> None:
        for i in self.flower[b]:
            self.set_st(i, i)
        xr = self.ffrom[b][self.eu[b][self.pa[b]]]
        pr = self.get_pr(b, xr)
        f = self.flower[b]
        for i in range(0, pr, 2):
            xs, xns = f[i], f[i + 1]
            self.pa[xs] = self.eu[xns][xs]
            self.S[xs], self.S[xns] = 1, 0
            self.slack[xs] = 0
            self.set_slack(xns)
            self.q_push(xns)
        self.S[xr], self.pa[xr] = 1, self.pa[b]
        for i in range(pr + 1, len(f)):
            self.S[f[i]] = -1
            self.set_slack(f[i])
        self.st[b] = 0

    def on_found_edge(self, r: int, c: int) -> bool:
        eu_ = self.eu[r][c]
        st = self.st
        u, v = st[eu_], st[self.ev[r][c]]
        if self.S[v] == -1:
            self.pa[v] = eu_
            self.S[v] = 1
            nu = st[self.match[v]]
            self.slack[v] = self.slack[nu] = 0
            self.S[nu] = 0
            self.q_push(nu)
        elif self.S[v] == 0:
            lca = self.get_lca(u, v)
            if lca == 0:
                self.augment(u, v)
                self.augment(v, u)
                return True
            self.add_blossom(u, lca, v)
        return False

    # -- one phase -----------------------------------------------------------------------------
    def phase(self) -> bool:
        """Search for one augmenting path (tight edges, then dual steps); False when none is left."""
        n, st, S, lab = self.n, self.st, self.S, self.lab
        for x in range(len(S)):
            S[x] = -1
            self.slack[x] = 0
        self.q.clear()
        for x in range(1, self.nx + 1):
            if st[x] == x and self.match[x] <= 0:
                self.pa[x] = 0
                S[x] = 0
                self.q_push(x)
        if not self.q:
            return False
        ew = self.ew
        while True:
            while self.q:
                u = self.q.popleft()
                if S[st[u]] == 1:
                    continue
                row = ew[u]
                for v in range(1, n + 1):
                    if row[v] > 0 and st[u] != st[v]:
                        if self.dist(u, v) <= 0:
                            if self.on_found_edge(u, v):
                                return True
                        else:
                            self.update_slack(u, st[v])
            d = math.inf
            nx = self.nx
            for b in range(n + 1, nx + 1):
                if st[b] == b and S[b] == 1:
                    d = min(d, lab[b] / 2.0)
            for x in range(1, nx + 1):
                s = self.slack[x]
                if st[x] == x and s != 0:
                    if S[x] == -1:
                        d = min(d, self.dist(s, x))
                    elif S[x] == 0:
                        d = min(d, self.dist(s, x) / 2.0)
            for u in range(1, n + 1):
                su = S[st[u]]
                if su == 0:
                    if _not_above(lab[u], d):
                        return False
                    lab[u] -= d
                elif su == 1:
                    lab[u] += d
            for b in range(n + 1, nx + 1):
                if st[b] == b:
                    if S[b] == 0:
                        lab[b] += d * 2
                    elif S[b] == 1:
                        lab[b] -= d * 2
            self.q.clear()
            for x in range(1, nx + 1):
                s = self.slack[x]
                if st[x] == x and s != 0 and st[s] != x and self.dist(s, x) <= 0:
                    if self.on_found_edge(s, x):
                        return True
            for b in range(n + 1, nx + 1):
                if st[b] == b and S[b] == 1 and lab[b] <= 0:
                    self.expand_blossom(b)


def reference_matching(w: Sequence[Sequence[float]]) -> list[tuple[int, int]]:
    """Pairs (i, j), i < j, that the reference's blossom returns for the symmetric weights ``w``
    (w[i][j] <= 0: no edge), listed in order of j as the reference reads them out."""
    n = len(w)
    if n < 2 or not any(w[i][j] > 0 for i in range(n) for j in range(n) if i != j):
        return []
    s = _Solver(w)
    while s.phase():
        pass
    out = []
    for u in range(1, n + 1):
        v = s.match[u]
        if 0 < v < u and s.match[v] == u:
            out.append((v - 1, u - 1))
    return out
