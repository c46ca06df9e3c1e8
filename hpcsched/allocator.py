"""The contract between the parts that decide and the parts that execute.

One pipeline decides in simulation and on a real cluster alike:
order (policy) -> group (interleave) -> size (milp, elastic jobs) -> place -> launch.
A policy is a pure function of a ``Snapshot``: it sees only what is in it, keeps no state between
calls, and returns the groups to run, highest priority first. The executor (the simulator's
virtual clock, or the runtime controller) places groups in that order until the cluster is full.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

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


@dataclass(frozen=True, slots=True)
class PolicyHints:
    """What a policy promises about its own answers, so an executor may skip work or wake up on time.

    Every default promises nothing: a policy without hints is simply asked at every event. Each promise is
    checked for every registered policy by the conformance test (tests/test_policy_registry.py): an executor
    that uses a shortcut must get exactly the answer it would get by calling the policy.
    """

    # returns every active job as a group of its own, only ordering them: while every active job fits beside
    # the running ones, the executor need not ask (any order runs them all)
    runs_every_job: bool = False
    # the answer is exactly every active job alone, sorted by this key of its view (ties in arrival order),
    # and a WAITING job's key depends only on its own view: the executor may keep waiting jobs sorted itself.
    # Implies ``runs_every_job``.
    order_key: Callable[[JobView], Any] | None = None
    # the ``order_key`` of ANY job (running too) never changes while it is active (it reads only what a job
    # never changes: id, submit, gpus, model): the executor may keep the running jobs sorted as they start and
    # stop instead of keying them all at every event
    order_key_static: bool = False
    # ``vector_keys(now, cluster, columns, compat) -> [key arrays]``: the answer is every job alone in the
    # order of these keys over per-job columns (most significant first, lowest first, ties in arrival order)
    vector_keys: Callable[..., Any] | None = None
    # attained GPU-seconds at which a running job's priority changes: the executor wakes up when one is crossed
    service_thresholds: tuple[float, ...] = ()
    # under a compat mode, the answer is the jobs sorted by ``JobView.rank_hint`` (the reference's own lists,
    # which the executor keeps)
    compat_rank_order: bool = False
    # per compat mode ("muri"), how the reference's loop ran this policy; opaque to the core, read by the
    # compat accounting (``hpcsched.compat``)
    compat: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.order_key is not None and not self.runs_every_job:
            raise ValueError("a policy with an order_key runs every job: set runs_every_job too")
        if self.order_key_static and self.order_key is None:
            raise ValueError("order_key_static promises something about an order_key: set one")

    def without_shortcuts(self) -> PolicyHints:
        """The same semantics (wake-ups, compat loop rules) with the ordering shortcuts off: the executor
        calls the policy itself whenever it needs an order. ``runs_every_job`` stays: it only decides when the
        policy is asked, and skipping an ask settles progress at other moments (equal to float rounding)."""
        return replace(self, order_key=None, order_key_static=False, vector_keys=None, compat_rank_order=False)


@dataclass(frozen=True, slots=True)
class DeclaredPolicy:
    """A policy with its name and its hints: what the registry holds and what executors are given."""

    name: str
    fn: Policy
    hints: PolicyHints = PolicyHints()

    def __call__(self, snapshot: Snapshot) -> list[Group]:
        return self.fn(snapshot)


def hints_of(policy: Policy) -> PolicyHints:
    """A declared policy's hints; a plain function promises nothing."""
    return policy.hints if isinstance(policy, DeclaredPolicy) else PolicyHints()


def policy_name(policy: Policy) -> str:
    return policy.name if isinstance(policy, DeclaredPolicy) else getattr(policy, "__name__", "custom")
