"""An application's measured profile: step times per placement and batch, and training progress per batch size.

Reads a profile folder (``placements.csv``, ``scalability.csv``, ``validation-<B>.csv``; columns in
``data/pollux/README.md``) and answers what the Pollux OSDI'21 artifact's simulator takes as ground truth
(simulator/applications.py, Apache-2.0; semantics reproduced, code our own):

- the measured step time of a placement: linear in the per-GPU batch between measured batches when that
  placement (up to rotation) was measured, else linear over (nodes <= 16, replicas, batch) across the per-group
  means of the placements plus the large-scale rows (the Delaunay-based interpolation of scipy's
  ``LinearNDInterpolator``, :mod:`hpcsched.goodput.linear_nd`: the same triangulation and arithmetic, so the same
  values to the bit: the baselines' greedy choices compare them);
- gradient statistics and iterations per epoch, linear in the batch between validated batch sizes;
- an epoch's progress threshold: the least progress any validated batch size had made by its end.
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DATA_DIR = Path(__file__).resolve().parent / "data"
POLLUX_DIR = DATA_DIR / "pollux"
GPU_TYPES = {"t4": POLLUX_DIR}
"""GPU type -> folder of per-application profiles. Pollux profiled AWS g4dn.12xlarge (4 x T4) only."""
APPLICATIONS: dict[str, dict[str, int]] = {
    "bert": {"max_epochs": 2},
    "cifar10": {"max_epochs": 100},
    "ncf": {"max_epochs": 10},
    "imagenet": {"max_epochs": 90},
    "deepspeech2": {"max_epochs": 80},
    "yolov3": {"max_epochs": 50, "max_local_bsz": 8},
}
"""The artifact's per-application settings (epochs to completion; yolov3's micro-batch is capped at 8 there)."""
MAX_INTERP_NODES = 16
"""Node counts beyond the profiled 16 are interpolated as 16."""

_PLACEMENT_COLS = ("placement", "local_bsz", "step_time", "sync_time")
_SCALABILITY_COLS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
_VALIDATION_COLS = ("progress", "iteration", "metric", "grad_sqr", "grad_var")


class ProfileError(ValueError):
    """A profile file is missing or malformed; the message names the file (and the line where one is at fault)."""


Columns = dict[str, list[Any]]
"""A profile table as plain columns (ints where every value of a column is an integer literal, as pandas infers)."""


def _read_csv(path: Path, columns: tuple[str, ...]) -> Columns:
    """The ``columns`` of a profile CSV. Python's ``float`` is used, not pandas: importing pandas costs a run more
    CPU than the simulation itself, and on the shipped profiles both parse every value to the same double
    (tests/test_goodput.py checks it)."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ProfileError(f"{path}: cannot read: {e}") from None
    if not rows:
        raise ProfileError(f"{path}: cannot read: empty file")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in columns if c not in header]
    if missing:
        raise ProfileError(f"{path}:1: missing column(s) {', '.join(missing)} (has {', '.join(header)})")
    out: Columns = {}
    for c in columns:
        i = header.index(c)
        texts = [r[i].strip() if i < len(r) else "" for r in rows[1:]]
        try:
            out[c] = [int(t) for t in texts]
            continue
        except ValueError:
            pass
        values: list[float] = []
        for line, t in enumerate(texts, start=2):
            try:
                v = float(t)
            except ValueError:
                v = math.nan
            if math.isnan(v):
                raise ProfileError(f"{path}:{line}: column {c}: not a number: {t!r}")
            values.append(v)
        out[c] = values
    return out


def group_means(table: Columns, keys: list[str], values: list[str]) -> Columns:
    """Per distinct ``keys`` (sorted), the mean of each of ``values``: summed in row order with Kahan
    compensation and divided by the count, as pandas' ``groupby(keys).mean()`` computes it, so the points handed
    to the interpolator are the same doubles."""
    sums: dict[tuple[Any, ...], list[list[float]]] = {}
    for r in range(len(table[keys[0]])):
        acc = sums.setdefault(tuple(table[k][r] for k in keys), [[0.0, 0.0] for _ in values] + [[0, 0]])
        for j, c in enumerate(values):
            s, comp = acc[j]
            y = table[c][r] - comp
            t = s + y
            acc[j] = [t, t - s - y]
        acc[-1][0] += 1
    out: Columns = {c: [] for c in keys + values}
    for key in sorted(sums):
        acc = sums[key]
        n = acc[-1][0]
        for k, v in zip(keys, key, strict=True):
            out[k].append(v)
        for j, c in enumerate(values):
            out[c].append(acc[j][0] / n)
    return out


@dataclass
class ApplicationProfile:
    """One application's profile on one GPU type. Build with :func:`load_profile`."""

    name: str
    gpu_type: str
    placements: Columns  # placement, local_bsz, step_time, sync_time, num_nodes, num_replicas
    scalability: Columns  # num_nodes, num_replicas, local_bsz, step_time, sync_time
    validation: dict[int, Columns]  # global batch size -> one row per epoch, sorted by batch size
    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int
    max_local_bsz: int
    max_epochs: int
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)
    _columns: dict[int, dict[str, list[float]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # Plain lists per validated batch: a simulation reads single values millions of times.
        self._columns = {b: {c: [float(v) for v in cols[c]] for c in _VALIDATION_COLS}
                         for b, cols in self.validation.items()}

    # -- training progress (validation profiles) ----------------------------------------------------------------

    def _bracket(self, batch_size: float) -> tuple[int, int]:
        lower = upper = None
        for b in self.validation:
            if b <= batch_size:
                lower = b
            if b >= batch_size:
                upper = b
                break
        if lower is None or upper is None:
            raise ValueError(f"{self.name}: batch size {batch_size} outside the validated {list(self.validation)}")
        return lower, upper

    def _lerp(self, batch_size: float, column: str, epoch: int) -> float:
        lo, hi = self._bracket(batch_size)
        y_lo = self._columns[lo][column][epoch]
        y_hi = self._columns[hi][column][epoch]
        if lo == hi:
            return y_lo
        return ((batch_size - lo) * y_hi + (hi - batch_size) * y_lo) / (hi - lo)

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) measured during ``epoch`` (0-based) at ``batch_size``, linear between batches."""
        key = ("grad", batch_size, epoch)
        if key not in self._cache:
            self._cache[key] = (self._lerp(batch_size, "grad_sqr", epoch), self._lerp(batch_size, "grad_var", epoch))
        return self._cache[key]

    def iterations(self, batch_size: float, epoch: int) -> float:
        """Iterations done by the end of ``epoch`` at ``batch_size``."""
        key = ("it", batch_size, epoch)
        if key not in self._cache:
            self._cache[key] = self._lerp(batch_size, "iteration", epoch)
        return self._cache[key]

    def progress_at(self, epoch: int) -> float:
        """Progress (B0-equivalent samples) that completes ``epoch`` epochs: the least any batch size needed."""
        if epoch == 0:
            return 0.0
        key = ("progress", epoch)
        if key not in self._cache:
            self._cache[key] = min(c["progress"][epoch - 1] for c in self._columns.values())
        return self._cache[key]

    def completion_epoch(self, batch_size: float | None = None) -> int:
        """The last epoch a job runs (it is complete once past it): ``max_epochs - 1`` (no target metric)."""
        return self.max_epochs - 1

    def best_metric(self, batch_size: float, epoch: int) -> float | None:
        """Best validation metric seen before ``epoch`` at ``batch_size`` (max if the metric rises in training)."""
        if epoch == 0:
            return None
        key = ("metric", batch_size, epoch)
        if key not in self._cache:
            first = next(iter(self.validation.values()))["metric"]
            rising = first[0] < first[-1]
            lo, hi = self._bracket(batch_size)

            def best(b: int) -> float:
                m = self.validation[b]["metric"][:epoch]
                return float(max(m) if rising else min(m))

            v_lo, v_hi = best(lo), best(hi)
            self._cache[key] = v_lo if lo == hi else ((batch_size - lo) * v_hi + (hi - batch_size) * v_lo) / (hi - lo)
        return self._cache[key]

    # -- throughput (placement and scalability profiles) --------------------------------------------------------

    def step_time(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        """Measured (step_time, sync_time) in seconds of one step at per-GPU batch ``local_bsz`` on ``placement``
        (GPUs per node, order irrelevant up to rotation). Needs scipy. ValueError outside the profiled range."""
        key = ("step", placement, local_bsz)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        placement = tuple(g for g in placement if g)
        placement = min(placement[i:] + placement[:i] for i in range(len(placement)))

        measured = self._measured().get(int("".join(map(str, placement))))
        if measured is not None:
            out = _interp_linear(measured, local_bsz, self.name, placement)
        else:
            interp = self._cache.get("nd")
            if interp is None:
                from hpcsched.goodput.linear_nd import LinearND

                interp = self._cache["nd"] = LinearND(*self.interpolation_points())
            ret = interp([min(len(placement), MAX_INTERP_NODES), sum(placement), local_bsz])
            out = (math.nan, math.nan) if ret is None else (ret[0], ret[1])
        if math.isnan(out[0]) or math.isnan(out[1]):
            raise ValueError(f"{self.name}: placement {placement} at per-GPU batch {local_bsz} is outside the "
                             "profiled range")
        self._cache[key] = out
        return out

    def interpolation_points(self) -> tuple[np.ndarray, np.ndarray]:
        """(nodes, GPUs, per-GPU batch) -> (step time, sync time) over which unmeasured placements are
        interpolated: the placements' means, then the large-scale rows (the artifact's table)."""
        xs = ["num_nodes", "num_replicas", "local_bsz"]
        ys = ["step_time", "sync_time"]
        means = group_means(self.placements, xs, ys)
        table = {c: [float(v) for v in means[c] + self.scalability[c]] for c in xs + ys}
        return np.array([table[c] for c in xs]).T, np.array([table[c] for c in ys]).T

    def _measured(self) -> dict[int, tuple[list[float], list[float], list[float]]]:
        """placement id -> (per-GPU batches ascending, step times, sync times) of the measured placements."""
        m = self._cache.get("measured")
        if m is None:
            m = {}
            p = self.placements
            rows: dict[int, list[int]] = {}
            for r, pid in enumerate(p["placement"]):
                rows.setdefault(int(pid), []).append(r)
            for pid, rs in rows.items():
                rs.sort(key=lambda r: p["local_bsz"][r])  # stable, as a mergesort
                m[pid] = ([p["local_bsz"][r] for r in rs], [float(p["step_time"][r]) for r in rs],
                          [float(p["sync_time"][r]) for r in rs])
            self._cache["measured"] = m
        return m

    def observations(self) -> dict[str, np.ndarray]:
        """Every profiled step: num_nodes, num_replicas, local_bsz, step_time, sync_time (placements first)."""
        cols = ["num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"]
        return {c: np.array(self.placements[c] + self.scalability[c], dtype=float) for c in cols}

    def tuned_batch_size(self, num_replicas: int) -> int | None:
        """The validated batch size with the shortest predicted run on a packed ``num_replicas``-GPU placement
        (4 GPUs per node), among those whose per-GPU share fits without accumulation; None if none fits."""
        if num_replicas * self.min_local_bsz > self.max_batch_size:
            return None
        placement = packed_placement(num_replicas)
        best = None
        for b, cols in self.validation.items():
            local = math.ceil(b / num_replicas)
            if local < self.min_local_bsz:
                continue
            if local > self.max_local_bsz:
                break
            jct = cols["iteration"][self.completion_epoch(b)] * self.step_time(placement, local)[0]
            if best is None or jct < best[0]:
                best = (jct, b)
        return None if best is None else best[1]


def _interp_linear(measured: tuple[list[float], list[float], list[float]], x: float, name: str,
                   placement: tuple[int, ...]) -> tuple[float, float]:
    """Piecewise-linear (step, sync) at ``x``, computed as scipy's ``interp1d`` computes it (the segment left of
    ``x`` when ``x`` is a measured point: (x_hi - x_lo) slope from the point below), so values equal it bit for
    bit; outside the measured batches, a ValueError as interp1d raises."""
    xs, steps, syncs = measured
    if not xs[0] <= x <= xs[-1]:
        raise ValueError(f"{name}: placement {placement} measured at per-GPU batches {xs[0]}..{xs[-1]}, not {x}")
    hi = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    lo = hi - 1
    dx = xs[hi] - xs[lo]
    return ((steps[hi] - steps[lo]) / dx * (x - xs[lo]) + steps[lo],
            (syncs[hi] - syncs[lo]) / dx * (x - xs[lo]) + syncs[lo])


def packed_placement(num_replicas: int, gpus_per_node: int = 4) -> tuple[int, ...]:
    """``num_replicas`` GPUs packed onto as few nodes as possible: (4, 4, 2) for 10."""
    out: list[int] = []
    while sum(out) < num_replicas:
        out.append(min(num_replicas - sum(out), gpus_per_node))
    return tuple(out)


def load_profile(name: str, gpu_type: str = "t4", folder: Path | None = None, max_epochs: int | None = None,
                 max_local_bsz: int | None = None) -> ApplicationProfile:
    """Load an application's profile by name (one of :data:`APPLICATIONS`) for ``gpu_type``, or from ``folder``.

    Defaults as in the Pollux artifact: B0 = the smallest validated batch, the largest batch = the largest
    validated one, the micro-batch range = the profiled per-GPU batches, ``max_epochs`` per application (else the
    fewest epochs any validation run has)."""
    if folder is None:
        if gpu_type not in GPU_TYPES:
            raise KeyError(f"no profiles for GPU type {gpu_type!r}; known: {', '.join(GPU_TYPES)}")
        if name not in APPLICATIONS:
            raise KeyError(f"no profile named {name!r}; known: {', '.join(APPLICATIONS)}")
        folder = GPU_TYPES[gpu_type] / name
    folder = Path(folder)
    settings = APPLICATIONS.get(name, {})
    validation: dict[int, Columns] = {}
    for path in sorted(folder.glob("validation-*.csv")):
        try:
            batch = int(path.stem.split("-")[-1])
        except ValueError:
            raise ProfileError(f"{path}: name is not validation-<batch size>.csv") from None
        validation[batch] = _read_csv(path, _VALIDATION_COLS)
    if not validation:
        raise ProfileError(f"{folder}: no validation-<B>.csv profile")
    validation = dict(sorted(validation.items()))
    placements = _read_csv(folder / "placements.csv", _PLACEMENT_COLS)
    placements["num_nodes"] = [len(str(p)) for p in placements["placement"]]
    placements["num_replicas"] = [sum(map(int, str(p))) for p in placements["placement"]]
    scalability = _read_csv(folder / "scalability.csv", _SCALABILITY_COLS)
    init_batch, max_batch = min(validation), max(validation)
    min_local = int(min(placements["local_bsz"]))
    max_local = int(max_local_bsz or settings.get("max_local_bsz") or max(placements["local_bsz"]))
    if max_batch < min_local:
        raise ProfileError(f"{folder}: largest validated batch {max_batch} below the smallest per-GPU batch "
                           f"{min_local}")
    epochs = int(max_epochs or settings.get("max_epochs") or min(len(cols["progress"]) for cols in validation.values()))
    return ApplicationProfile(folder.name if name is None else name, gpu_type, placements, scalability, validation,
                              init_batch, max_batch, min_local, max_local, epochs)
