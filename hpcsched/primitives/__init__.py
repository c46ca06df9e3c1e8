"""The ground floor: records and primitives that every floor above shares and that import nothing of theirs.

- ``state``: what the decision core decides over and answers (jobs, workers, the cluster, a plan);
- ``placement``: consolidated placement over free GPUs per node;
- ``speed``: how fast jobs run in simulation (solo factor, group factors, restart costs);
- ``hetero_cluster``: heterogeneous cluster strings (GPU types, servers, prices).

The decision pipeline (``hpcsched.core``), its plug-ins (``admission``, ``placements``), interleaving and the
compat rules all build on these; ``tests/test_architecture.py`` holds the layer table that keeps it so.
"""
