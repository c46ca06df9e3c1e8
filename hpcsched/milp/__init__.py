"""Idle-node harvesting allocator (BFTrainer's MILP, solved for counts): see ``allocate``.

Usage::

    from hpcsched.milp import MilpJob, Problem, allocate
    d = allocate(Problem(jobs=(MilpJob(job, nodes=held, lost=taken),), pool=idle_nodes, tfwd=10.0))
    d.counts[job.id], d.nodes[job.id], d.objective, d.status
"""

from hpcsched.milp.allocate import SOLVERS, MilpAllocation, SolverUnavailable, allocate, solve_counts
from hpcsched.milp.problem import JobValue, MilpJob, Objective, Problem, check_job, job_values, objective_value

__all__ = [
    "SOLVERS",
    "MilpAllocation",
    "MilpJob",
    "JobValue",
    "Objective",
    "Problem",
    "SolverUnavailable",
    "allocate",
    "check_job",
    "job_values",
    "objective_value",
    "solve_counts",
]
