"""An alias kept so that existing imports work: these live in ``hpcsched.primitives.hetero_cluster``, the ground floor
under the decision pipeline; new code imports them from there."""

from hpcsched.primitives.hetero_cluster import (  # noqa: F401
    HeteroCluster,
    looks_hetero,
    parse_hetero_cluster,
)

__all__ = ["HeteroCluster", "looks_hetero", "parse_hetero_cluster"]
