"""Keep stage profiles honest: update them from the iteration times the runtime measures.

A trace's profile is measured once, offline, on one GPU count; real iterations drift (input pipeline
warm-up, other tenants on the node, a different GPU count). The runtime reports measured iteration
times, per stage when the job is instrumented (``workloads/`` report data, compute and sync time) and
as a whole otherwise. ``ProfileBook`` blends them into the profiles with an exponential moving
average, so one noisy sample cannot flip a grouping decision but a persistent change wins within a few
reports; ``apply`` then hands policies a snapshot with the current profiles. The book is an immutable
value: every update returns a new book, so the runtime owns the only mutable reference.

What a measurement means:

* per-stage times of a job running alone: the new stage estimates directly;
* a whole solo iteration time: the stages are scaled together to match it (the split is kept);
* a group's measured period cannot be split back into its members' stages (many splits give the same
  period), so it does not re-profile anyone; ``observe_group`` returns measured / predicted so the
  caller can spot a mix the model gets wrong.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpcsched.allocator import JobView, Snapshot
from hpcsched.model import ResourceProfile


def _finite_nonneg(values: Sequence[float], what: str) -> None:
    for v in values:
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{what} must be finite and >= 0, got {list(values)}")


@dataclass(frozen=True, slots=True)
class ProfileBook:
    """Current stage profiles by job id, blended from measurements with weight ``alpha`` per report."""

    alpha: float = 0.3
    profiles: Mapping[str, ResourceProfile] = field(default_factory=dict)
    samples: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")

    def get(self, job_id: str, default: ResourceProfile | None = None) -> ResourceProfile | None:
        return self.profiles.get(job_id, default)

    def _with(self, job_id: str, profile: ResourceProfile) -> ProfileBook:
        profiles = dict(self.profiles)
        profiles[job_id] = profile
        samples = dict(self.samples)
        samples[job_id] = samples.get(job_id, 0) + 1
        return dataclasses.replace(self, profiles=profiles, samples=samples)

    def observe_stages(self, job_id: str, stages: Sequence[float], prior: ResourceProfile | None = None) -> ProfileBook:
        """Blend measured (data, compute, network) seconds of one solo iteration into the job's profile.

        The first measurement of a job with no ``prior`` (and none in the book) is taken as is.
        """
        if len(stages) != 3:
            raise ValueError(f"need 3 stage times (data, compute, network), got {len(stages)}")
        _finite_nonneg(stages, "stage times")
        old = self.profiles.get(job_id, prior)
        if old is None:
            return self._with(job_id, ResourceProfile(*map(float, stages)))
        a = self.alpha
        new = [(1 - a) * o + a * float(m) for o, m in zip(old.stages(), stages, strict=True)]
        return self._with(job_id, ResourceProfile(*new))

    def observe_iteration(self, job_id: str, seconds: float, prior: ResourceProfile | None = None) -> ProfileBook:
        """Blend a measured whole solo iteration time: stages scale together, their split is kept."""
        _finite_nonneg([seconds], "iteration time")
        old = self.profiles.get(job_id, prior)
        if old is None or old.total_s <= 0:
            return self  # nothing to scale: a whole time says nothing about the split
        scale = seconds / old.total_s
        return self.observe_stages(job_id, [s * scale for s in old.stages()], prior=old)

    def observe_group(self, predicted_period: float, measured_period: float) -> float:
        """Measured / predicted period of a group: > 1 means the model is optimistic for this mix."""
        _finite_nonneg([predicted_period, measured_period], "periods")
        if predicted_period <= 0:
            raise ValueError("predicted period must be > 0")
        return measured_period / predicted_period

    def apply(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot with every job's profile replaced by the book's current one, where it has one."""
        if not self.profiles:
            return snapshot
        jobs: list[JobView] = []
        for v in snapshot.jobs:
            p = self.profiles.get(v.id)
            jobs.append(v if p is None or p == v.profile else dataclasses.replace(v, profile=p))
        return dataclasses.replace(snapshot, jobs=tuple(jobs))
