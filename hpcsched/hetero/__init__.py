"""Heterogeneous GPU clusters: Gavel's throughput table, cluster strings and workload generator.

Gavel (OSDI'20) schedules across GPU types using measured throughputs per type and per co-located pair;
these modules read its public data and reproduce its seeded workloads, so that its figures can be checked.
"""
