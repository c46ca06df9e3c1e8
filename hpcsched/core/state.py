"""An alias kept so that existing imports work: these live in ``hpcsched.primitives.state``, the ground floor
under the decision pipeline; new code imports them from there."""

from hpcsched.primitives.state import (  # noqa: F401
    ClusterState,
    DecideOptions,
    DecideRequest,
    JobState,
    Plan,
    WorkerState,
)

__all__ = ["ClusterState", "DecideOptions", "DecideRequest", "JobState", "Plan", "WorkerState"]
