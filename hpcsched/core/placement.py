"""An alias kept so that existing imports work: these live in ``hpcsched.primitives.placement``, the ground floor
under the decision pipeline; new code imports them from there."""

from hpcsched.primitives.placement import (  # noqa: F401
    Placement,
    apply,
    first_slots,
    place_consolidated,
)

__all__ = ["Placement", "apply", "first_slots", "place_consolidated"]
