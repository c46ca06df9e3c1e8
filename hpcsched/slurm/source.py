"""The live idle-node source: Slurm's view of its nodes, turned into join/leave events.

The harvestable *pool* is every node harvesting may use now: nodes Slurm reports plain idle, plus
nodes held only by our own jobs (mode (a): our scavenger jobs show as ``allocated``). Each poll
reads ``sinfo`` and ``squeue`` once and diffs the pool against the previous poll into one
``hpcsched.harvest.pool.PoolEvent`` (nodes joined, nodes left): the very event type the idle-node
replayer produces from a log, so the same allocator decides on both. ``reasons`` keeps, for each
node of the last event, the state that made it join or leave (``drained``, ``down* (not
responding)``, ``held by job 12 (batch), allocated``...) for the event log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hpcsched.harvest.pool import PoolEvent
from hpcsched.slurm import commands
from hpcsched.slurm.nodes import NodeState, parse_sinfo


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One running or completing Slurm job as ``squeue`` lists it."""

    id: str
    partition: str
    name: str
    state: str
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SlurmPoll:
    """One poll: node states, live jobs, and the pool derived from them."""

    time: float
    states: dict[str, NodeState]
    jobs: tuple[SlurmJob, ...]
    pool: tuple[str, ...]  # in Slurm's node order
    why_not: dict[str, str] = field(default_factory=dict)  # node -> reason it is not in the pool


def parse_squeue(text: str, expand: Callable[[str], list[str]] = commands.hostnames) -> list[SlurmJob]:
    """``squeue -h -o '%i|%P|%j|%T|%N'`` output -> jobs (pending jobs have no nodes)."""
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5:
            continue
        jid, part, name, state, nodelist = parts
        jobs.append(SlurmJob(jid, part, name, state, tuple(expand(nodelist)) if nodelist else ()))
    return jobs


_HOLDING = "CONFIGURING,RUNNING,COMPLETING,SUSPENDED,SIGNALING,STAGE_OUT,STOPPED,RESIZING"


def derive_pool(states: dict[str, NodeState], jobs: Sequence[SlurmJob], is_ours: Callable[[SlurmJob], bool]
                ) -> tuple[list[str], dict[str, str]]:
    """The harvestable pool (in ``states`` order) and, for every other node, why it is not in it.

    In the pool: plain idle nodes no job holds; nodes held only by our own jobs; and busy nodes no job
    holds any more (a job ended between the sinfo and squeue reads: sinfo lags, the node is free in a
    moment, and dropping it would only shrink a job about to be resized onto it).
    """
    holders: dict[str, list[SlurmJob]] = {}
    for j in jobs:
        for n in j.nodes:
            holders.setdefault(n, []).append(j)
    pool, why = [], {}
    for node, st in states.items():
        held = holders.get(node, [])
        foreign = [j for j in held if not is_ours(j)]
        if foreign:
            why[node] = f"held by job {foreign[0].id} ({foreign[0].partition}), {st.raw}"
        elif st.harvestable or st.busy:
            pool.append(node)
        else:
            why[node] = st.reason or st.raw
    return pool, why


class SlurmIdleSource:
    """Polls a live Slurm; ``poll()`` returns the pool changes since the previous poll.

    ``is_ours(job)`` says which Slurm jobs are harvesting's own (their nodes stay in the pool);
    by default, jobs whose name starts with ``own_prefix``.
    """

    def __init__(self, own_prefix: str = "hpcsched-", clock: Callable[[], float] = time.monotonic) -> None:
        self.own_prefix = own_prefix
        self._clock = clock
        self._t0 = clock()
        self._pool: tuple[str, ...] = ()
        self.last: SlurmPoll | None = None
        self.reasons: dict[str, str] = {}

    def is_ours(self, job: SlurmJob) -> bool:
        return job.name.startswith(self.own_prefix)

    def now(self) -> float:
        return self._clock() - self._t0

    def snapshot(self) -> SlurmPoll:
        states = parse_sinfo(commands.run(["sinfo", "-N", "-h", "-o", "%N %T"]))
        # Every state in which a job holds nodes (CONFIGURING: just allocated, prolog running).
        jobs = parse_squeue(commands.run(["squeue", "-h", "-t", _HOLDING, "-o", "%i|%P|%j|%T|%N"]))
        pool, why = derive_pool(states, jobs, self.is_ours)
        return SlurmPoll(self.now(), states, tuple(jobs), tuple(pool), why)

    def poll(self) -> PoolEvent | None:
        """Read Slurm once; the pool's change since the previous poll, or None if it did not change."""
        snap = self.snapshot()
        before, after = set(self._pool), set(snap.pool)
        left = tuple(n for n in self._pool if n not in after)
        joined = tuple(n for n in snap.pool if n not in before)
        self._pool, self.last = snap.pool, snap
        if not left and not joined:
            return None
        self.reasons = {n: snap.why_not.get(n, "") for n in left} | {n: snap.states[n].raw for n in joined}
        return PoolEvent(snap.time, joined, left)

    @property
    def pool(self) -> tuple[str, ...]:
        return self._pool
