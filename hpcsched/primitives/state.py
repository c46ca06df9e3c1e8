"""What the decision core decides over and what it answers: plain records, no behaviour.

Kept apart from the steps (``hpcsched.core.decide``) so that every mode of the core (``regroup``: the
controller's rule and re-planning, ``hpcsched.core.regroup``) and every executor share one vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcsched.allocator import Policy
from hpcsched.model import ResourceProfile, ScalingCurve


@dataclass(frozen=True, slots=True)
class JobState:
    """What the scheduler sees of one pending or running job."""

    id: str
    submit: float
    running: bool
    procs: int  # current size when running, else 0
    min_procs: int
    max_procs: int
    launcher: str = "torchrun"
    steps_total: int | None = None
    steps_done: int = 0
    iteration_s: float | None = None
    profile: ResourceProfile | None = None
    attained_s: float = 0.0
    executed_s: float = 0.0
    first_start: float | None = None
    group: str | None = None  # running: the co-location key of its tasks (jobs sharing slots share it)
    placement: tuple[tuple[str, int], ...] = ()  # running: (worker, procs) per node, node-rank order
    attempt_start: float | None = None  # running: when its current attempt was placed
    curve: ScalingCurve | None = None  # declared throughput by size: the MILP sizes the job
    resize_s: float = 10.0  # progress a resize costs it (MILP Tup = Tdw)
    in_place: bool = False  # running elastic Horovod: resizable in place on the node(s) it runs on
    cpus_per_proc: float = 0.0  # what each of its processes needs beside its slot (resource-aware placement)
    mem_per_proc_gb: float = 0.0
    # the GPU types it accepts (lower case, as workers advertise them); empty: any. Its units go only to workers
    # of these types, so a job tuned for (or only correct on) one type never lands on another
    gpu_types: tuple[str, ...] = ()
    model: str | None = None  # its model as Gavel's throughput table names it (throughput-aware placement)


@dataclass(frozen=True, slots=True)
class WorkerState:
    id: str
    slots: int
    launchers: tuple[str, ...] = ("torchrun",)
    cpus: float | None = None  # what it has beside its slots, where known (resource-aware placement)
    mem_gb: float | None = None
    gpu_type: str = ""  # what it advertises (lower case: "v100", "cpu", ...); "": not advertised (accepts no typed job)


@dataclass(frozen=True, slots=True)
class ClusterState:
    """``used`` counts the slots held by running and stopping jobs on each live worker."""

    now: float
    jobs: tuple[JobState, ...]
    workers: tuple[WorkerState, ...]
    used: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Plan:
    """``starts``: job -> [(worker, procs)]; ``stops``: job -> reason ('preempt' or 'resize'); ``resizes``:
    running job -> its new placement, applied without stopping it."""

    starts: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    stops: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # every admitted job's size this round
    waiting: dict[str, str] = field(default_factory=dict)  # job -> why it did not start
    groups: dict[str, str] = field(default_factory=dict)  # started job -> co-location key of its tasks
    resizes: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # job -> new placement, in place
    # the MILP's status for the jobs it sized this round ("optimal", "time_limit", "fallback", ...); anything
    # but "optimal" is a decision the controller must report (it counts and logs it, `hpcsched jobs` shows it)
    sizing: dict[str, str] = field(default_factory=dict)
    # running elastic job -> the size it grows to in place once slots that stopping jobs still hold are free; it keeps
    # its size meanwhile instead of a stop and relaunch (``hpcsched.core.in_place``)
    grow_waits: dict[str, int] = field(default_factory=dict)
    # started job -> the larger size it was given, where no placement fitted that and it starts smaller
    # (``DecideOptions.shrink_to_fit``): the controller counts and logs each
    shrunk_to_fit: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DecideOptions:
    """Where executors differ, by name (the defaults are the runtime controller's)."""

    min_runtime_s: float = 0.0  # hysteresis: a unit with an attempt younger than this keeps its slots and size
    tfwd_s: float = 60.0  # the MILP's look-ahead when sizing elastic jobs (BFTrainer's Tfwd), seconds
    admission: str = "accept-all"  # which new jobs the policy sees at all (``hpcsched.admission``)
    load_threshold: float = 1.0  # load-based admission: admitted demand up to this x the live slots
    placement: str = "consolidated"  # where a new unit's slots go (``hpcsched.placements``)
    # how the policy's groups become runnable: "keep" (the controller's: a running job is never moved to form a
    # group) or "replan" (the policy as designed: groups chosen on an empty cluster, running ones kept where
    # their GPUs are free, the rest moved; ``hpcsched.core.replan``, the simulator's default mode)
    regroup: str = "keep"
    solver: str = "highs"  # sizes elastic jobs (one of ``hpcsched.milp.SOLVERS``); the exact DP if it is unavailable
    # an elastic job that does not fit at the size it was given starts at the largest smaller size that fits (down to
    # its minimum) instead of waiting: the runtime controller sets it (``runtime.scheduler.plan``); off by default so
    # the simulator's decisions (and its published figures, ``--as-controller``) stay as they were
    shrink_to_fit: bool = False


@dataclass(frozen=True, slots=True)
class DecideRequest:
    state: ClusterState  # the jobs, the workers and the slots they hold, now
    policy: Policy  # orders (and groups) the jobs
    options: DecideOptions = DecideOptions()
