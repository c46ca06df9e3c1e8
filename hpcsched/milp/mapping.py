"""Counts to node ids: jobs keep the nodes they hold, shrink from their newest, grow from free nodes.

Keeping nodes avoids migrations (a job only grows or only shrinks). A job never gets back a node
the batch scheduler took from it at this event (``JobState.lost``), even if that node is listed as
idle again: the job's workers there were just killed. Jobs with such exclusions pick first, so the
others absorb the nodes they may not take; if a job still cannot get its count, it gets what it can
(0 if that is below its Jmin) and the caller sees the corrected count.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcsched.milp.problem import JobState


def map_nodes(jobs: Sequence[JobState], pool: Sequence[str], counts: Sequence[int]) -> dict[str, tuple[str, ...]]:
    held = {n for s in jobs for n in s.nodes}
    free = [n for n in pool if n not in held]
    released: list[str] = []
    out: dict[str, tuple[str, ...]] = {}
    growing: list[tuple[JobState, int]] = []
    for s, want in zip(jobs, counts, strict=True):
        if want <= s.count:
            out[s.job.id] = s.nodes[:want]
            released.extend(s.nodes[want:])
        else:
            out[s.job.id] = s.nodes
            growing.append((s, want))
    free.extend(released)  # truly idle nodes first; nodes just released by a shrinking job after
    growing.sort(key=lambda sw: not sw[0].lost)  # stable: jobs with exclusions choose first
    taken: set[str] = set()
    for s, want in growing:
        extra = [n for n in free if n not in taken and n not in s.lost][: want - s.count]
        if s.count + len(extra) < s.job.jmin:  # cannot run at all: give everything back
            released_here = list(s.nodes)
            out[s.job.id] = ()
            free.extend(released_here)
            continue
        taken.update(extra)
        out[s.job.id] = s.nodes + tuple(extra)
    return out
