"""A Delaunay triangulation as stored arrays, and point location in it as ``scipy.spatial.Delaunay.find_simplex``
walks it.

Importing ``scipy.spatial`` costs a ``--compat pollux`` Tiresias or Optimus run about a third of its CPU, for
the handful of step times it interpolates at unmeasured placements. The shipped profiles' triangulations are
therefore stored (``data/pollux/delaunay/<key>.npz``, ~0.5 MB for the six, written by :func:`write_stored` from
Qhull through scipy, the options ``LinearNDInterpolator`` uses) and located without scipy. Which simplex a
point on a shared face lands in decides the interpolated value's last bits, so the location follows scipy's
algorithm step for step (scipy, BSD-3-Clause: walk the lifted paraboloid's facets until one sees the point,
then a directed walk by barycentric coordinates with a 100-ulp tolerance, brute force when that fails) over the
same doubles; tests/test_goodput.py holds it to scipy's simplex and value on every profile. Points whose
triangulation is not stored are triangulated by scipy at first use (the same result, only the import's cost).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

STORE = Path(__file__).resolve().parent / "data" / "pollux" / "delaunay"
EPS = 100 * float(np.finfo(float).eps)
"""scipy's default tolerance of the inside test (``find_simplex(tol=None)``)."""
EPS_BROAD = math.sqrt(EPS)


def points_key(points: np.ndarray) -> str:
    """A stored triangulation's name: the digest of its points' doubles (any change to a profile misses)."""
    p = np.ascontiguousarray(points, dtype=float)
    return hashlib.sha256(repr(p.shape).encode() + p.tobytes()).hexdigest()[:20]


@dataclass(frozen=True)
class Triangulation:
    """Qhull's Delaunay triangulation (the fields ``scipy.spatial.Delaunay`` exposes), as plain lists."""

    ndim: int
    simplices: list[list[int]]
    neighbors: list[list[int]]
    equations: list[list[float]]  # per simplex: the lifted facet's normal (ndim + 1) and offset
    transform: list[list[list[float]]]  # per simplex: inverse of T (ndim rows), then the vertex r
    paraboloid_scale: float
    paraboloid_shift: float
    min_bound: list[float]
    max_bound: list[float]

    @classmethod
    def of_points(cls, points: np.ndarray) -> Triangulation:
        """Triangulate with scipy (Qhull, ``LinearNDInterpolator``'s default options)."""
        from scipy.spatial import Delaunay

        tri = Delaunay(np.ascontiguousarray(points, dtype=float))
        return cls(int(tri.ndim), tri.simplices.tolist(), tri.neighbors.tolist(), tri.equations.tolist(),
                   tri.transform.tolist(), float(tri.paraboloid_scale), float(tri.paraboloid_shift),
                   tri.min_bound.tolist(), tri.max_bound.tolist())

    @classmethod
    def stored_or_built(cls, points: np.ndarray) -> Triangulation:
        """The stored triangulation of ``points`` if there is one, else :meth:`of_points`."""
        path = STORE / f"{points_key(points)}.npz"
        if not path.is_file():
            return cls.of_points(points)
        with np.load(path) as z:
            return cls(int(z["ndim"]), z["simplices"].tolist(), z["neighbors"].tolist(), z["equations"].tolist(),
                       z["transform"].tolist(), float(z["paraboloid"][0]), float(z["paraboloid"][1]),
                       z["min_bound"].tolist(), z["max_bound"].tolist())

    def _lifted_distance(self, simplex: int, z: list[float]) -> float:
        eq = self.equations[simplex]
        dist = eq[self.ndim + 1]
        for k in range(self.ndim + 1):
            dist += eq[k] * z[k]
        return dist

    def _coordinate(self, simplex: int, x: list[float], c: list[float], k: int) -> None:
        """Barycentric coordinate ``k`` (the last from the earlier ones), accumulated in scipy's order."""
        nd = self.ndim
        if k == nd:
            c[nd] = 1.0
            for j in range(nd):
                c[nd] -= c[j]
            return
        t = self.transform[simplex]
        ck = 0.0
        for j in range(nd):
            ck += t[k][j] * (x[j] - t[nd][j])
        c[k] = ck

    def _brute_force(self, x: list[float]) -> int:
        nd = self.ndim
        c = [0.0] * (nd + 1)
        for s in range(len(self.simplices)):
            if self.transform[s][0][0] == self.transform[s][0][0]:  # a valid (non-NaN) transform
                if self._inside(s, x, c, EPS, EPS, -1):
                    return s
                continue
            # a degenerate simplex: test its valid neighbours, with more leeway towards it
            for n in self.neighbors[s]:
                if n == -1 or self.transform[n][0][0] != self.transform[n][0][0]:
                    continue
                if self._inside(n, x, c, EPS, EPS_BROAD, s):
                    return n
        return -1

    def _inside(self, s: int, x: list[float], c: list[float], eps: float, eps_towards: float,
                towards: int) -> bool:
        nd = self.ndim
        c[nd] = 1.0
        for i in range(nd):
            self._coordinate(s, x, c, i)
            c[nd] -= c[i]
            if towards < 0 and not (-eps <= c[i] <= 1 + eps):
                return False
        for m in range(nd + 1):
            low = eps_towards if towards >= 0 and self.neighbors[s][m] == towards else eps
            if not (-low <= c[m] <= 1 + eps):
                return False
        return True

    def find_simplex(self, x: list[float]) -> int:
        """The simplex ``scipy.spatial.Delaunay.find_simplex`` returns for one point (a fresh call), -1 outside."""
        nd = self.ndim
        if any(x[i] < self.min_bound[i] - EPS or x[i] > self.max_bound[i] + EPS for i in range(nd)):
            return -1
        nsimplex = len(self.simplices)
        if nsimplex == 0:
            return -1
        z = [0.0] * (nd + 1)
        for i in range(nd):
            z[i] = x[i]
            z[nd] += x[i] ** 2
        z[nd] *= self.paraboloid_scale
        z[nd] += self.paraboloid_shift
        s = 0
        best = self._lifted_distance(s, z)
        changed = True
        while changed and not best > 0:
            changed = False
            for k in range(nd + 1):  # moving on from the next k after a hop, as scipy's loop does
                n = self.neighbors[s][k]
                if n == -1:
                    continue
                dist = self._lifted_distance(n, z)
                if dist > best + EPS * (1 + abs(best)):
                    s, best, changed = n, dist, True
        return self._directed(x, s)

    def _directed(self, x: list[float], s: int) -> int:
        nd = self.ndim
        c = [0.0] * (nd + 1)
        for _ in range(1 + len(self.simplices) // 4):
            if s == -1:
                return -1
            state = 1  # 1: inside, -1: hopped to a neighbour, 0: degenerate on the way
            for k in range(nd + 1):
                self._coordinate(s, x, c, k)
                if c[k] < -EPS:
                    n = self.neighbors[s][k]
                    if n == -1:
                        return -1  # outside the (convex) triangulation
                    s, state = n, -1
                    break
                if not c[k] <= 1 + EPS:
                    state = 0
            if state == -1:
                continue
            return s if state == 1 else self._brute_force(x)
        return self._brute_force(x)


def write_stored(points: np.ndarray) -> Path:
    """Store the triangulation of ``points`` (for the shipped profiles: tests/test_goodput.py checks they are
    current)."""
    STORE.mkdir(parents=True, exist_ok=True)
    t = Triangulation.of_points(points)
    path = STORE / f"{points_key(points)}.npz"
    np.savez_compressed(path, ndim=np.int32(t.ndim), simplices=np.array(t.simplices, dtype=np.int32),
                        neighbors=np.array(t.neighbors, dtype=np.int32), equations=np.array(t.equations),
                        transform=np.array(t.transform), paraboloid=np.array([t.paraboloid_scale,
                                                                               t.paraboloid_shift]),
                        min_bound=np.array(t.min_bound), max_bound=np.array(t.max_bound))
    return path
