"""The typed records every part of hpcsched shares.

Readers produce them, the simulator, replayer and runtime consume them. They are frozen so a record
read once can be handed to any policy without fear that it changes underneath; per-run mutable state
(progress, current allocation) lives in the simulator or controller, never here.
All times are seconds, sizes are nodes and GPUs: readers convert and say how.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class JobStatus(StrEnum):
    """Final or current state of a job, normalised across batch-scheduler vocabularies."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    PREEMPTED = "preempted"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ResourceProfile:
    """Seconds one training iteration spends in each stage, in the order the stages run.

    Interleaving needs these: jobs whose heavy stage differs can share GPUs almost for free.
    """

    data_s: float  # data loading and preprocessing: CPU and storage IO
    compute_s: float  # forward and backward pass: GPU
    network_s: float  # gradient synchronisation: network

    def __post_init__(self) -> None:
        for name in ("data_s", "compute_s", "network_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"ResourceProfile.{name} must be a finite number >= 0, got {v!r}")

    def stages(self) -> tuple[float, float, float]:
        return (self.data_s, self.compute_s, self.network_s)

    @property
    def total_s(self) -> float:
        return self.data_s + self.compute_s + self.network_s

    def scaled_to(self, total_s: float) -> ResourceProfile:
        """The same stage proportions at another pace (e.g. a trace's GPU profile at a CPU workload's speed)."""
        f = total_s / self.total_s
        return ResourceProfile(self.data_s * f, self.compute_s * f, self.network_s * f)


@dataclass(frozen=True, slots=True)
class ScalingCurve:
    """Throughput (samples/s) as a function of node count, piecewise linear between breakpoints.

    Real curves are not concave (a job may speed up super-linearly when its model fits in the
    aggregate memory), so nothing here assumes concavity; the MILP models them exactly.
    """

    nodes: tuple[float, ...]
    rates: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.nodes) != len(self.rates):
            raise ValueError(f"ScalingCurve: {len(self.nodes)} breakpoints but {len(self.rates)} rates")
        if len(self.nodes) < 1:
            raise ValueError("ScalingCurve needs at least one breakpoint")
        if any(b <= a for a, b in zip(self.nodes, self.nodes[1:], strict=False)):
            raise ValueError(f"ScalingCurve breakpoints must be strictly increasing, got {list(self.nodes)}")
        if self.nodes[0] < 0:
            raise ValueError(f"ScalingCurve breakpoints must be >= 0, got {self.nodes[0]}")
        if any(not (r >= 0 and math.isfinite(r)) for r in self.rates):
            raise ValueError(f"ScalingCurve rates must be finite and >= 0, got {list(self.rates)}")

    def rate(self, n: float) -> float:
        """Samples/s on ``n`` nodes; 0 below the first breakpoint's domain when it starts at 0."""
        xs, ys = self.nodes, self.rates
        if n <= xs[0]:
            return ys[0] if n == xs[0] else (0.0 if xs[0] > 0 else ys[0])
        if n >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, n)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (n - x0) / (x1 - x0)


DEFAULT_ITERATION_S = 1.0
"""Iteration length given to a job whose trace has only a duration (Philly): iterations = duration / 1 s. One
rule for the simulator and for converting such traces to the simulator's CSV."""


@dataclass(frozen=True, slots=True)
class Job:
    """One job as a trace or a user describes it.

    Batch logs fill ``duration`` (run time) and sizes; DL traces also fill ``iterations``,
    ``iteration_time`` and ``profile``. Unknown values are None, never -1.
    """

    id: str
    submit: float
    nodes: int = 0
    gpus: int = 0
    procs: int = 0
    duration: float | None = None  # seconds it ran (or would run alone)
    requested: float | None = None  # requested wall time, seconds
    start: float | None = None  # as recorded in a batch log
    end: float | None = None
    iterations: int | None = None
    iteration_time: float | None = None  # seconds per iteration when running alone
    profile: ResourceProfile | None = None
    model: str | None = None
    status: JobStatus = JobStatus.UNKNOWN
    user: str | None = None
    queue: str | None = None
    extra: Mapping[str, object] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True, slots=True)
class ElasticJob:
    """A job that can run on any node count in [jmin, jmax] and be resized (BFTrainer's model)."""

    id: str
    submit: float
    jmin: int
    jmax: int
    curve: ScalingCurve
    total_samples: float  # Pmax: done when this many samples are processed
    scale_up_s: float  # Tup: seconds of progress lost when the job grows
    scale_down_s: float  # Tdw: seconds of progress lost when the job shrinks

    def __post_init__(self) -> None:
        if self.jmin < 1 or self.jmax < self.jmin:
            raise ValueError(f"job {self.id}: need 1 <= Jmin <= Jmax, got Jmin={self.jmin} Jmax={self.jmax}")
        if self.total_samples <= 0:
            raise ValueError(f"job {self.id}: Pmax must be > 0, got {self.total_samples}")
        if self.scale_up_s < 0 or self.scale_down_s < 0:
            raise ValueError(f"job {self.id}: rescale costs must be >= 0")


@dataclass(frozen=True, slots=True)
class IdleInterval:
    """A node the batch scheduler leaves idle from ``start`` to ``end`` (None: still idle at trace end)."""

    node: str
    start: float
    end: float | None


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A homogeneous cluster: switches x nodes per switch x GPUs per node (Muri's layout)."""

    switches: int
    nodes_per_switch: int
    gpus_per_node: int
    cpus_per_node: int = 0
    mem_per_node_gb: float = 0.0
    name: str = "cluster"

    def __post_init__(self) -> None:
        if self.switches < 1 or self.nodes_per_switch < 1 or self.gpus_per_node < 0:
            raise ValueError(
                f"ClusterSpec {self.name}: need >= 1 switch and node per switch and >= 0 GPUs per node"
            )

    @property
    def nodes(self) -> int:
        return self.switches * self.nodes_per_switch

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_names(self) -> list[str]:
        return [f"s{s}n{n}" for s in range(self.switches) for n in range(self.nodes_per_switch)]


@dataclass(frozen=True, slots=True)
class Allocation:
    """Where a job runs: nodes and, per node, how many GPUs; ``group`` names its interleaving group."""

    job_id: str
    nodes: tuple[str, ...]
    gpus_per_node: tuple[int, ...] = ()
    group: str | None = None

    def __post_init__(self) -> None:
        if self.gpus_per_node and len(self.gpus_per_node) != len(self.nodes):
            raise ValueError(f"Allocation {self.job_id}: one GPU count per node is required")

    @property
    def gpus(self) -> int:
        return sum(self.gpus_per_node)

