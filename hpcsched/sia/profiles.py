"""One application's measured behaviour on one GPU type, as the Sia artifact's simulator models it.

Per application directory (the artifact's ``traces/<app>/`` layout, read as it is):

- ``placements-<type>.csv`` (``local_bsz,step_time,sync_time,placement``): step and all-reduce time per
  iteration for a placement written as digits of GPUs per node (``13``: 1 GPU on one node, 3 on another);
- ``scalability-<type>.csv`` (``local_bsz,step_time,sync_time,num_nodes,num_replicas``): larger runs;
- ``validation-<B>.csv`` (``progress,iteration,metric,grad_sqr,grad_var``): one row per epoch at global batch
  size B, the gradient statistics that give statistical efficiency.

The true step time of a placement is interpolated as the artifact does (the semantics must match to
reproduce its figures): linearly in the per-GPU batch when that placement (up to rotation) was measured,
else linearly over (nodes <= 16, GPUs, per-GPU batch) on the placements' per-group means followed by the
scalability rows, in that order (the triangulation depends on the points' order).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcsched.errors import InputError

if TYPE_CHECKING:
    import numpy as np

MAX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
"""Epochs to completion per application (the artifact's table; no target metric, so always this many)."""

RESCALE_S = {"cifar10": 50, "deepspeech2": 25, "bert": 120, "yolov3": 80, "imagenet": 250, "ncf": 15}
"""Seconds a job holds its GPUs without progress after each (re)start: checkpoint + restore, measured."""
DEFAULT_RESCALE_S = 30

SLOWDOWNS = {"cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2, "deepspeech2": 1.2, "ncf": 1.5}
"""The artifact's calibration: simulated goodput is divided by this (real runs were slower than profiles)."""

LOCAL_BSZ_CAPS = {("deepspeech2", "rtx"): 57}
"""Per-GPU batch caps the artifact hard-codes over the profiles' maximum (memory on the 2080Ti)."""


@dataclass
class AppProfile:
    """Application ``name`` on GPU type ``gpu_type``: throughput, efficiency and epoch progress.

    ``placements`` and ``scalability`` are dicts of numpy columns; ``validation`` maps each measured global
    batch size (ascending) to its per-epoch columns.
    """

    name: str
    gpu_type: str
    placements: dict[str, np.ndarray]
    scalability: dict[str, np.ndarray]
    validation: dict[int, dict[str, np.ndarray]]
    max_epochs: int
    rescale_time: int
    init_batch_size: int = 0
    max_batch_size: int = 0
    min_local_bsz: int = 0
    max_local_bsz: int = 0
    _linear: Any = field(default=None, init=False, repr=False)
    _memo: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        bszs = sorted(self.validation)
        self.init_batch_size = bszs[0]
        self.max_batch_size = bszs[-1]
        self.min_local_bsz = int(self.placements["local_bsz"].min())
        self.max_local_bsz = LOCAL_BSZ_CAPS.get((self.name, self.gpu_type), int(self.placements["local_bsz"].max()))
        self._progress_rows = [v["progress"] for v in self.validation.values()]

    # ---- statistical efficiency and epochs -------------------------------------------------------------
    def _bounds(self, batch_size: float) -> tuple[int, int]:
        lower = upper = None
        for bsz in self.validation:
            if bsz <= batch_size:
                lower = bsz
            if bsz >= batch_size:
                upper = bsz
                break
        if lower is None or upper is None:
            raise ValueError(f"{self.name}: batch size {batch_size} outside the validated {list(self.validation)}")
        return lower, upper

    def progress_at(self, epoch: int) -> float:
        """Progress (in base-batch samples) that completes ``epoch`` epochs: the least over batch sizes."""
        if epoch == 0:
            return 0.0
        return float(min(p[epoch - 1] for p in self._progress_rows))

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during ``epoch`` at ``batch_size``, linear between validated batch sizes."""
        key = ("g", batch_size, epoch)
        got = self._memo.get(key)
        if got is None:
            lo, hi = self._bounds(batch_size)
            ls, lv = self.validation[lo]["grad_sqr"][epoch], self.validation[lo]["grad_var"][epoch]
            if lo == hi:
                got = (float(ls), float(lv))
            else:
                us, uv = self.validation[hi]["grad_sqr"][epoch], self.validation[hi]["grad_var"][epoch]
                got = (float(((batch_size - lo) * us + (hi - batch_size) * ls) / (hi - lo)),
                       float(((batch_size - lo) * uv + (hi - batch_size) * lv) / (hi - lo)))
            self._memo[key] = got
        return got

    def iteration(self, batch_size: float, epoch: int) -> float:
        """Iterations done after completing ``epoch`` at ``batch_size`` (linear between validated sizes)."""
        lo, hi = self._bounds(batch_size)
        li = self.validation[lo]["iteration"][epoch]
        if lo == hi:
            return float(li)
        ui = self.validation[hi]["iteration"][epoch]
        return float(((batch_size - lo) * ui + (hi - batch_size) * li) / (hi - lo))

    def current_iteration(self, batch_size: float, epoch: int, progress: float) -> int:
        """The iteration a job at (epoch, progress) has reached, interpolated within the epoch (Gavel's
        remaining-steps estimate)."""
        prev_iter = self.iteration(batch_size, epoch - 1) if epoch > 0 else 0
        next_iter = self.iteration(batch_size, epoch)
        prev_p, next_p = self.progress_at(epoch), self.progress_at(epoch + 1)
        return round(prev_iter + (progress - prev_p) / (next_p - prev_p) * (next_iter - prev_iter))

    # ---- throughput --------------------------------------------------------------------------------------
    @staticmethod
    def normalise(placement: tuple[int, ...]) -> tuple[int, ...]:
        """Drop empty nodes, rotate to the lexicographically smallest rotation (how placements are keyed)."""
        p = tuple(x for x in placement if x)
        return min(p[i:] + p[:i] for i in range(len(p)))

    def step_time(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        """(step_time, sync_time) per iteration; (-1, -1) outside the measured batch range (the artifact's
        sentinel, which its callers then use as it is)."""
        key = (tuple(placement), local_bsz)
        got = self._memo.get(key)
        if got is None:
            got = self._step_time(self.normalise(placement), local_bsz)
            self._memo[key] = got
        return got

    def _step_time(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        import numpy as np

        pid = int("".join(map(str, placement)))
        rows = self.placements["placement"] == pid
        if rows.any():
            from scipy.interpolate import interp1d

            xs = self.placements["local_bsz"][rows]
            ys = np.stack([self.placements["step_time"][rows], self.placements["sync_time"][rows]], axis=1)
            try:
                ret = interp1d(xs, ys, axis=0)(local_bsz)
            except ValueError:
                return -1.0, -1.0
        else:
            nodes = min(len(placement), 16)
            ret = self._linear_nd()([nodes, sum(placement), local_bsz])[0]
        if not (ret[0] == ret[0] and ret[1] == ret[1]):
            raise ValueError(f"{self.name} on {self.gpu_type}: no step time for placement {placement} at "
                             f"per-GPU batch {local_bsz} (outside the profiles)")
        return float(ret[0]), float(ret[1])

    def _linear_nd(self) -> Any:
        if self._linear is None:
            import numpy as np
            from scipy.interpolate import LinearNDInterpolator

            p = self.placements
            keys = np.stack([p["num_nodes"], p["num_replicas"], p["local_bsz"]], axis=1).astype(float)
            uniq, inverse = np.unique(keys, axis=0, return_inverse=True)  # sorted like a groupby's keys
            inverse = inverse.ravel()
            counts = np.bincount(inverse, minlength=len(uniq)).astype(float)
            means = np.stack([np.bincount(inverse, weights=p[c], minlength=len(uniq)) / counts
                              for c in ("step_time", "sync_time")], axis=1)
            s = self.scalability
            pts = np.concatenate([uniq, np.stack([s["num_nodes"], s["num_replicas"], s["local_bsz"]], axis=1)])
            vals = np.concatenate([means, np.stack([s["step_time"], s["sync_time"]], axis=1)])
            self._linear = LinearNDInterpolator(pts.astype(float), vals.astype(float))
        return self._linear

    def max_local_bsz_for(self, placement: tuple[int, ...]) -> int:
        """The largest per-GPU batch measured for this placement (or, unmeasured, for any larger run)."""
        p = self.normalise(placement)
        pid = int("".join(map(str, p)))
        rows = self.placements["placement"] == pid
        if rows.any():
            return int(self.placements["local_bsz"][rows].max())
        s = self.scalability
        sel = (s["num_nodes"] >= len(p)) & (s["num_replicas"] >= sum(p))
        return int(s["local_bsz"][sel].max())

    def throughput_with_accum(self, placement: tuple[int, ...], batch_size: int) -> float:
        """Samples/s at a fixed global batch (gradient accumulation where it exceeds the per-GPU maximum)."""
        reps = sum(placement)
        local = math.ceil(batch_size / reps - 1e-8)
        accum = math.ceil(local / self.max_local_bsz_for(placement) - 1e-8) - 1
        if reps == 1 and batch_size > self.init_batch_size:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, int(self.max_batch_size / (reps * (accum + 1))))
        st, sync = self.step_time(tuple(x for x in placement if x), atomic)
        return batch_size / (st + (st - sync) * accum)

    def one_gpu_rate(self) -> float:
        """Largest measured 1-GPU batch over its step time: the artifact's per-type speed for projections."""
        rows = self.placements["num_replicas"] == 1
        return float(self.placements["local_bsz"][rows].max() / self.placements["step_time"][rows].max())

    def replicas_measured(self, num_replicas: int) -> int | None:
        """The largest per-GPU batch measured at ``num_replicas`` GPUs in any placement, or None."""
        rows = self.placements["num_replicas"] == num_replicas
        return int(self.placements["local_bsz"][rows].max()) if rows.any() else None


def _read_csv(path: Path, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    import numpy as np
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise InputError(path, "no such profile file") from None
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
        raise InputError(path, f"not a CSV profile ({e})") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InputError(path, line=1, message=f"missing column(s) {', '.join(missing)}")
    out = {}
    for c in columns:
        col = pd.to_numeric(df[c], errors="coerce")
        bad = col.isna().to_numpy().nonzero()[0]
        if len(bad):
            raise InputError(path, line=int(bad[0]) + 2, message=f"{c} is not a number")
        out[c] = col.to_numpy(dtype=np.int64 if c in ("placement", "num_nodes", "num_replicas") else float)
    return out


def load_app(app_dir: Path, gpu_type: str) -> AppProfile:
    """Read one application's profiles for ``gpu_type`` from an artifact-layout directory."""
    import numpy as np

    name = app_dir.name
    validation = {}
    for path in sorted(app_dir.glob("validation-*.csv")):
        try:
            bsz = int(path.stem.split("-")[-1])
        except ValueError:
            raise InputError(path, "the name must be validation-<global batch size>.csv") from None
        validation[bsz] = _read_csv(path, ("progress", "iteration", "grad_sqr", "grad_var"))
    if not validation:
        raise InputError(app_dir, "no validation-<batch>.csv files")
    validation = dict(sorted(validation.items()))
    placements = _read_csv(app_dir / f"placements-{gpu_type}.csv", ("local_bsz", "step_time", "sync_time",
                                                                    "placement"))
    digits = [str(int(p)) for p in placements["placement"]]
    placements["num_nodes"] = np.array([len(d) for d in digits], dtype=np.int64)
    placements["num_replicas"] = np.array([sum(map(int, d)) for d in digits], dtype=np.int64)
    scalability = _read_csv(app_dir / f"scalability-{gpu_type}.csv", ("local_bsz", "step_time", "sync_time",
                                                                      "num_nodes", "num_replicas"))
    max_epochs = MAX_EPOCHS.get(name, min(len(v["progress"]) for v in validation.values()))
    return AppProfile(name=name, gpu_type=gpu_type, placements=placements, scalability=scalability,
                      validation=validation, max_epochs=max_epochs,
                      rescale_time=RESCALE_S.get(name, DEFAULT_RESCALE_S))


@functools.lru_cache(maxsize=8)
def load_profiles(root: str, gpu_types: tuple[str, ...], apps: tuple[str, ...]) -> dict[str, dict[str, AppProfile]]:
    """{application: {GPU type: profile}} for the named applications, read from ``root/<app>/``."""
    base = Path(root)
    if not base.is_dir():
        raise InputError(root, "no such profiles directory (the Sia artifact's sia-simulator/traces layout)")
    out: dict[str, dict[str, AppProfile]] = {}
    for app in apps:
        if not (base / app).is_dir():
            raise InputError(base / app, f"no profiles for application {app!r}")
        out[app] = {t: load_app(base / app, t) for t in gpu_types}
    return out
