"""``--compat muri``: the loop rules of the reference simulator (Rivendile/Muri ``simulator/run_sim.py``).

The speed model (solo factor, group slowdowns, restart table) is shared with the default mode and lives in
``hpcsched.primitives.speed``; what differs per policy is how the reference's loop for it chose, placed and
charged jobs, declared by each policy as ``PolicyHints(compat={"muri": <rules>})``.
"""

from __future__ import annotations

from dataclasses import dataclass

MODE = "muri"


@dataclass(frozen=True, slots=True)
class CompatRules:
    """How the reference's loop for one policy differs from its SRTF loop.

    - ``progress``: "iterations" (remaining iterations at the slowed-down period) or "wall"
      (Tiresias' loop: a job is done after ``duration`` seconds of running, end times truncated to
      whole seconds, no restart cost in its completion).
    - ``placement``: "consolidated" or "count" (Tiresias' loop only counts free GPUs).
    - ``two_pass``: choose groups in priority order, then place the chosen ones largest-first
      (Themis' and Muri's loops); a chosen group that no longer fits is preempted.
    - ``new_remaining``: remaining time a never-run job shows its policy: "iterations"
      (iterations x slowed period) or "duration" (the trace's duration: Muri's loop).
    - ``group_restart``: a group member's per-event charge is the SUM of its group's restart costs.
    """

    progress: str = "iterations"
    placement: str = "consolidated"
    two_pass: bool = False
    new_remaining: str = "iterations"
    group_restart: bool = True


SRTF_LOOP = CompatRules()
"""The reference's SRTF loop, which FIFO, SRTF, SRSF and LAS also ran in."""
TIRESIAS_LOOP = CompatRules(placement="count")
THEMIS_LOOP = CompatRules(two_pass=True)
MURI_LOOP = CompatRules(two_pass=True, new_remaining="duration")
