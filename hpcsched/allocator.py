"""The contract between the parts that decide and the parts that execute.

One pipeline decides in simulation and on a real cluster alike:
order (policy) -> group (interleave) -> size (milp, elastic jobs) -> place -> launch.
A policy is a pure function of a ``Snapshot``: it sees only what is in it, keeps no state between
calls, and returns the groups to run, highest priority first. The executor (the simulator's
virtual clock, or the runtime controller) places groups in that order until the cluster is full.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpcsched.model import ClusterSpec, ResourceProfile


@dataclass(frozen=True, slots=True)
class JobView:
    """What a policy may know of one active (arrived, unfinished) job at decision time."""

    id: str
    submit: float
    gpus: int  # GPUs the job asks for
    iterations_total: int | None  # None when the trace gives no iteration count
    iterations_done: float  # progress so far
    iteration_time: float | None  # solo seconds per iteration
    attained_gpu_s: float  # GPU-seconds of service received so far (LAS, Tiresias)
    executed_s: float  # wall seconds it has run so far
    remaining_s: float | None  # solo seconds still to run; None when durations are unknown
    profile: ResourceProfile | None  # per-stage seconds of one iteration (interleaving)
    running: bool  # it holds GPUs right now
    first_start: float | None = None  # when it first ran, None if never
    model: str | None = None  # model name (restart costs and profiles are per model)
    rank_hint: int | None = None  # compat only: the reference's queue-list position (Tiresias); else None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a policy may look at: the clock, the active jobs and the cluster."""

    now: float
    jobs: tuple[JobView, ...]
    cluster: ClusterSpec
    free_gpus: int  # GPUs not held by any job when the snapshot was taken
    compat: str | None = None  # the executor's accounting mode ("muri": the reference's); policies whose
    # decisions depend on the speed model (interleaving periods) follow it, others ignore it


@dataclass(frozen=True, slots=True)
class Group:
    """Jobs that share one set of GPUs, interleaving their stages (a single job is a group of one).

    ``period_s`` is the interleaved iteration period: each member finishes one iteration per period.
    None means the members run alone at their own ``iteration_time``.
    """

    job_ids: tuple[str, ...]
    period_s: float | None = None
    efficiency: float = 1.0


Policy = Callable[[Snapshot], list[Group]]
"""Pure function: active jobs in, groups to run out, highest priority first."""
