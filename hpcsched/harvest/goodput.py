"""Goodput-valued harvesting: jobs that declare a goodput profile are sized by what their nodes buy in progress
towards the target, not by raw samples per second.

A profiled job trains one of the Pollux applications (``hpcsched.goodput.APPLICATIONS``) with Pollux's adaptive
batch: at every size it runs at the batch size that maximises goodput (throughput x statistical efficiency) for
that allocation, so its progress is counted in base-batch-equivalent samples ("useful samples"), and it is done
once it has made the progress that completes its ``epochs`` (``ApplicationProfile.progress_at``). A harvested node
is ``gpus_per_node`` replicas (Pollux profiled 4 x T4 nodes).

Statistical efficiency falls as training goes on less than it grows with the batch (the gradient noise scale rises
in later epochs), so the curves are re-read at every decision for the epoch the job has reached, as a Pollux agent
refits its statistics: the replay applies them at its decisions, and a job's rate stays fixed between two.

Two valuations of the same progress (``VALUES``) tell what the value function is worth:

- ``goodput``: the MILP sees goodput(n) = max over batch sizes of throughput x efficiency on n nodes;
- ``throughput``: the MILP sees the samples/s of that same configuration (what BFTrainer's scaling curves
  measure), while the job still progresses at its goodput.

Jobs without a profile keep their declared curve and Pmax and are valued by it in both: their replay is the
unprofiled one, bit for bit (the replay never calls the valuation for them).
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcsched.errors import InputError
from hpcsched.model import ElasticJob, ScalingCurve

VALUES = ("goodput", "throughput")
PROFILE_COLUMNS = ("job", "application", "gpus_per_node", "epochs")


@dataclass(frozen=True, slots=True)
class GoodputProfile:
    """A job's declared goodput profile: what it trains, on how many GPUs per harvested node, for how long."""

    application: str
    gpus_per_node: int = 4
    epochs: int | None = None  # epochs to the target (None: the application's own, ``APPLICATIONS``)
    gpu_type: str = "t4"


@dataclass(frozen=True, slots=True)
class PhaseCurves:
    """One application's curves in one epoch over 1..n nodes: goodput (useful samples/s), throughput (samples/s)
    and the goodput-best global batch at each size."""

    goodput: ScalingCurve
    throughput: ScalingCurve
    batch: tuple[int, ...]


def read_goodput_profiles(path: str | Path) -> dict[str, GoodputProfile]:
    """``job,application,gpus_per_node,epochs`` (the last two may be empty: 4 GPUs, the application's epochs).

    Bad rows are an InputError naming the file and line; an application without a shipped profile too."""
    from hpcsched.goodput import APPLICATIONS

    path = Path(path)
    out: dict[str, GoodputProfile] = {}
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(path, f"cannot read: {e}") from None
    if not rows or [c.strip() for c in rows[0][:2]] != ["job", "application"]:
        raise InputError(path, f"expected the header {','.join(PROFILE_COLUMNS)}", 1)
    head = [c.strip() for c in rows[0]]
    for line, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        d = dict(zip(head, (c.strip() for c in row), strict=False))
        job, app = d.get("job", ""), d.get("application", "")
        if not job or app not in APPLICATIONS:
            raise InputError(path, f"need a job id and an application ({', '.join(APPLICATIONS)}), got "
                                   f"{job!r}, {app!r}", line)
        if job in out:
            raise InputError(path, f"job {job} has two profiles", line)
        try:
            gpn = int(d.get("gpus_per_node") or 4)
            epochs = int(d["epochs"]) if d.get("epochs") else None
        except ValueError:
            raise InputError(path, "gpus_per_node and epochs must be whole numbers", line) from None
        limit = APPLICATIONS[app]["max_epochs"]
        if not 1 <= gpn <= 64 or (epochs is not None and not 1 <= epochs <= limit):
            raise InputError(path, f"need 1 <= gpus_per_node <= 64 and 1 <= epochs <= {limit} ({app}'s profiled "
                                   "epochs)", line)
        out[job] = GoodputProfile(app, gpn, epochs)
    return out


class GoodputValuation:
    """The profiled jobs' progress and value curves, by the epoch each has reached (module docstring).

    ``prepare`` turns the replay's jobs into what it runs (a profiled job's curve becomes its goodput at epoch 0
    and its Pmax the useful samples to its target); ``at`` gives a profiled job's (progress job, valued job, key)
    for the progress it has made. Models are fitted once per application and curves computed once per
    (application, GPUs per node, epoch, size range), per instance (about 0.1 s each)."""

    def __init__(self, profiles: dict[str, GoodputProfile], value: str = "goodput") -> None:
        if value not in VALUES:
            raise ValueError(f"value must be one of {VALUES}, got {value!r}")
        self.profiles, self.value = profiles, value
        self._models: dict[tuple[str, str], object] = {}
        self._curves: dict[tuple[GoodputProfile, int, int], PhaseCurves] = {}
        self._targets: dict[str, float] = {}

    def _model(self, p: GoodputProfile):  # noqa: ANN202 (hpcsched.goodput is imported lazily: it needs scipy)
        from hpcsched.goodput import GoodputModel

        key = (p.application, p.gpu_type)
        if key not in self._models:
            self._models[key] = GoodputModel.load(p.application, p.gpu_type)
        return self._models[key]

    def epochs(self, p: GoodputProfile) -> int:
        return p.epochs or self._model(p).profile.max_epochs

    def curves(self, p: GoodputProfile, epoch: int, jmax: int) -> PhaseCurves:
        """Goodput, throughput and best batch on 1..jmax nodes of ``gpus_per_node`` replicas each."""
        key = (p, epoch, jmax)
        got = self._curves.get(key)
        if got is None:
            m = self._model(p).at_epoch(epoch)
            prof = m.profile
            nodes = np.arange(1, jmax + 1)
            reps = nodes * p.gpus_per_node
            g, atomic, accum = m.function.optimize(nodes, reps, prof.max_batch_size,
                                                   (prof.min_local_bsz, prof.max_local_bsz), True)
            t = m.function.throughput(nodes, reps, atomic, accum)
            xs = tuple(float(n) for n in nodes)
            got = PhaseCurves(ScalingCurve(xs, tuple(float(v) for v in g)),
                              ScalingCurve(xs, tuple(float(v) for v in t)),
                              tuple(int(b) for b in reps * atomic * (accum + 1)))
            self._curves[key] = got
        return got

    def target(self, job_id: str) -> float:
        """Useful samples (B0-equivalent) that complete the job's epochs."""
        if job_id not in self._targets:
            p = self.profiles[job_id]
            prof = self._model(p).profile  # its progress is in base-batch iterations (30 cifar10 epochs: 11,719)
            self._targets[job_id] = float(prof.progress_at(self.epochs(p))) * prof.init_batch_size
        return self._targets[job_id]

    def epoch_at(self, job_id: str, samples: float) -> int:
        """The epoch a job is in after ``samples`` useful samples (0-based, at most its last)."""
        p = self.profiles[job_id]
        prof = self._model(p).profile
        last = self.epochs(p) - 1
        e = 0
        while e < last and prof.progress_at(e + 1) * prof.init_batch_size <= samples:
            e += 1
        return e

    def prepare(self, jobs: list[ElasticJob]) -> list[ElasticJob]:
        """The jobs as the replay runs them: profiled ones with their goodput curve and useful-sample target.

        A profile naming no job of the list is an error (a typo would silently leave a job throughput-valued)."""
        ids = {j.id for j in jobs}
        missing = sorted(set(self.profiles) - ids)
        if missing:
            raise ValueError(f"goodput profiles for jobs not in the job list: {', '.join(missing[:5])}"
                             f"{' ...' if len(missing) > 5 else ''}")
        out = []
        for j in jobs:
            if j.id in self.profiles:
                c = self.curves(self.profiles[j.id], 0, j.jmax)
                j = dataclasses.replace(j, curve=c.goodput, total_samples=self.target(j.id))
            out.append(j)
        return out

    def at(self, job: ElasticJob, samples: float) -> tuple[ElasticJob, ElasticJob, int]:
        """A profiled job after ``samples`` useful samples: (the job with its goodput curve for that epoch, the job
        as the MILP values it, the epoch). Unprofiled jobs must not be passed (they are not revalued)."""
        e = self.epoch_at(job.id, samples)
        c = self.curves(self.profiles[job.id], e, job.jmax)
        progress = job if job.curve == c.goodput else dataclasses.replace(job, curve=c.goodput)
        valued = progress if self.value == "goodput" else dataclasses.replace(job, curve=c.throughput)
        return progress, valued, e

    def describe(self) -> dict[str, object]:
        """For meta.json: the valuation and each application's useful-sample target per job."""
        return {"value": self.value, "profiled_jobs": len(self.profiles),
                "applications": sorted({p.application for p in self.profiles.values()}),
                "targets": {j: self.target(j) for j in sorted(self.profiles)}}
