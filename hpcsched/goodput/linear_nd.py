"""Piecewise-linear interpolation over a Delaunay triangulation: scipy's ``LinearNDInterpolator``, value for value.

A profile's step time at an unmeasured placement is interpolated over (nodes, replicas, per-GPU batch). scipy's
``LinearNDInterpolator`` does it, but importing ``scipy.interpolate`` costs a ``--compat pollux`` run more CPU
than its simulation (it pulls in scipy.optimize and more). This uses the same triangulation (Qhull's, stored for
the shipped profiles, :mod:`hpcsched.goodput.delaunay`), locates the point as scipy does, and evaluates as its
compiled loop does:
barycentric coordinates from the simplex's affine transform, ``c_i = sum_j T_ij (x_j - r_j)`` and
``c_n = 1 - sum_i c_i`` in that order, then ``sum_k c_k y_k`` from zero, so each value is the same double
(tests/test_goodput.py compares them over every profile).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hpcsched.goodput.delaunay import Triangulation


class LinearND:
    """``LinearND(points, values)(x)``: the values at ``x`` (a tuple), or None outside the points' convex hull."""

    def __init__(self, points: np.ndarray, values: np.ndarray) -> None:
        self.points = np.ascontiguousarray(points, dtype=float)
        self.values = np.ascontiguousarray(values, dtype=float).tolist()
        self.tri = Triangulation.stored_or_built(self.points)
        self.ndim = self.points.shape[1]

    def __call__(self, x: Sequence[float]) -> tuple[float, ...] | None:
        xs = [float(v) for v in x]
        s = self.tri.find_simplex(xs)
        if s < 0:
            return None
        nd = self.ndim
        t = self.tri.transform[s]
        c = [0.0] * (nd + 1)
        c[nd] = 1.0
        for i in range(nd):
            ci = 0.0
            for j in range(nd):
                ci += t[i][j] * (xs[j] - t[nd][j])
            c[i] = ci
            c[nd] -= ci
        out = [0.0] * len(self.values[0])
        for k, vertex in enumerate(self.tri.simplices[s]):
            row = self.values[vertex]
            for j in range(len(out)):
                out[j] = out[j] + c[k] * row[j]
        return tuple(out)
