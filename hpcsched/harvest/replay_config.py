"""What a replay is asked to do and what it gives back: its options, its result and its events' columns."""


from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from hpcsched.milp import Objective
from hpcsched.model import ElasticJob
from hpcsched.results import JobResult


class Valuation(Protocol):
    """Revalues some jobs as they progress (``hpcsched.harvest.goodput.GoodputValuation``): ``at`` gives a job in
    ``profiles`` after ``samples`` as (the job to progress at, the job as the MILP values it, its phase)."""

    @property
    def profiles(self) -> Mapping[str, object]: ...

    def at(self, job: ElasticJob, samples: float) -> tuple[ElasticJob, ElasticJob, int]: ...


ACCOUNTING = ("reference", "restart")
NONOPTIMAL = ("time_limit", "fallback", "heuristic")  # Allocation.status values that are not proven optimal
EVENT_COLUMNS = (
    "time", "dt", "pool", "joined", "left", "used", "active", "done", "preempted_jobs", "preempt_loss",
    "rescales", "rescale_loss", "rate", "tfwd", "solve_s", "status",
)
EVENT_KINDS = "ddiiiiiiididddds"  # each column's type (``harvest.event_rows``): float, int, str


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    tfwd: float = 10.0
    solver: str = "highs"
    objective: Objective = Objective.REFERENCE
    accounting: str = "reference"
    max_jobs: int = 10  # the reference's maxJ: jobs admitted at once
    time_limit: float = 10.0  # per decision, seconds
    predict_tfwd: bool = False
    history: int = 1000  # idle stretches the predictor remembers
    exact_events: bool = False  # also decide when a job completes or is submitted, not only on pool changes
    # Never pause an admitted job, as the runtime controller decides (core.decide): jobs are admitted at their
    # minimum first come first served while the pool fits them, a job the allocator would pause (0 nodes) is held at
    # its minimum and the others are sized again over the rest. BFTrainer's model may pause any job.
    no_pause: bool = False

    def __post_init__(self) -> None:
        if self.accounting not in ACCOUNTING:
            raise ValueError(f"accounting must be one of {ACCOUNTING}, got {self.accounting!r}")
        if self.max_jobs < 1:
            raise ValueError("max_jobs must be >= 1")



@dataclass(slots=True)
class ReplayResult:
    summary: dict[str, object]
    events: Sequence[tuple[object, ...]]  # ``harvest.event_rows.EventRows``: one tuple a row, kept as columns
    jobs: list[JobResult]
    per_job: list[dict[str, object]] = field(default_factory=list)
    nonoptimal_by_status: dict[str, int] = field(default_factory=dict)  # time_limit / fallback / heuristic counts

