"""A machine's size and its nodes' cores from the node lists of its log (Slurm NodeList).

Without a stated size, a replay took the machine as the log's peak sum of node counts; 1-node jobs
that shared a node then each got a node of their own, and the machine came out larger than the nodes
the log names (112 where NodeList names 105). The distinct node names are the machine as the log saw
it, and the most CPUs per node any job held (NCPUS / NNodes) is a node's core count: jobs smaller than
that share nodes by cores in a replay, so a node running a small job is partly idle.
"""

from __future__ import annotations

import math

from hpcsched.model import Job
from hpcsched.traces.base import TraceReport


class NodeListMachine:
    """Collects the distinct nodes and the largest CPUs-per-node of the jobs read."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.cpn = 0

    def add(self, job: Job) -> None:
        names = job.extra.get("nodelist") if job.extra else None
        if isinstance(names, tuple):
            self.names.update(names)
        if job.nodes > 0 and job.procs > 0:
            per = math.ceil(job.procs / job.nodes)
            if per > self.cpn:
                self.cpn = per

    def finish(self, report: TraceReport) -> None:
        """State the size and cores per node in ``report.meta`` unless an option or header already did."""
        meta = report.meta
        if self.names and not report.options.get("machine_nodes") and "machine_nodes" not in meta:
            meta.update(machine_nodes=len(self.names), machine_nodes_source=f"the {len(self.names):,} distinct "
                        "nodes its NodeList names (a node no job used is not seen; --nodes sets the size)")
            report.convert(f"machine size: the {len(self.names):,} distinct nodes named in NodeList")
        if self.cpn > 1 and not meta.get("cores_per_node"):
            meta["cores_per_node"] = self.cpn
            report.convert(f"cores per node = {self.cpn}: the most CPUs per node any job held (NCPUS / NNodes); "
                           "a replay lets smaller jobs share nodes by cores")
