"""An alias kept so that existing imports work: these live in ``hpcsched.primitives.speed``, the ground floor
under the decision pipeline; new code imports them from there."""

from hpcsched.primitives.speed import (  # noqa: F401
    DEFAULT_RESTART_S,
    GROUP_FACTOR,
    SOLO_FACTOR,
    group_factor,
    restart_cost,
)

__all__ = ["DEFAULT_RESTART_S", "GROUP_FACTOR", "SOLO_FACTOR", "group_factor", "restart_cost"]
