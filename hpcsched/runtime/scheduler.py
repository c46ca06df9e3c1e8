"""The runtime controller's scheduling step: the shared decision core (``hpcsched.core.decide``, where the
rules are written) with the controller's options, and the configured policy resolved by name."""

from __future__ import annotations

from hpcsched.allocator import Group, Policy, Snapshot
from hpcsched.core.decide import ClusterState, DecideOptions, DecideRequest, JobState, Plan, WorkerState, decide
from hpcsched.policies import get_policy

__all__ = ["ClusterState", "JobState", "Plan", "WorkerState", "plan", "resolve_policy"]


def _fifo(snapshot: Snapshot) -> list[Group]:
    return [Group((j.id,)) for j in sorted(snapshot.jobs, key=lambda j: (j.submit, j.id))]


def resolve_policy(name: str) -> Policy:
    """The registered policy; plain FIFO only while no policy named 'fifo' is registered."""
    try:
        return get_policy(name)
    except KeyError:
        if name == "fifo":
            return _fifo
        raise


def plan(state: ClusterState, policy_name: str | Policy = "fifo", min_runtime_s: float = 0.0,
         tfwd_s: float = 60.0, *, admission: str = "accept-all", load_threshold: float = 1.0,
         placement: str = "consolidated", regroup: str = "keep") -> Plan:
    """Decide which jobs run, at which size, and where new ones go (``policy_name``: registered name, or the
    policy itself; ``min_runtime_s``: the hysteresis rule of ``hpcsched.core.decide``; ``admission`` and
    ``placement``: its plug-in steps by name; ``regroup``: keep running jobs where they are, or replan)."""
    if not state.jobs:
        return Plan()
    policy = resolve_policy(policy_name) if isinstance(policy_name, str) else policy_name
    options = DecideOptions(min_runtime_s=min_runtime_s, tfwd_s=tfwd_s, admission=admission,
                            load_threshold=load_threshold, placement=placement, regroup=regroup, shrink_to_fit=True)
    return decide(DecideRequest(state, policy, options))
