"""The pilot manager's records: a pilot as it knows it, its events, and the line a node's pilot shows.

Kept apart from the manager (``hpcsched.slurm.pilots``) so that what a listing or the status file says about a
pilot is defined in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcsched.slurm.pilot_windows import clock_time


@dataclass(slots=True)
class Pilot:
    """One pilot job as the manager knows it."""

    job_id: str  # Slurm's id: ARRAYID_TASK for the elements of a job array
    node: str  # the node it asked for (fit-idle-window) or runs on; '' while an array element is pending
    state: str = "PENDING"
    seen: float = 0.0  # when first seen (monotonic)
    running_since: float | None = None
    idle_since: float | None = None  # its worker alive with nothing to run, since
    dead_since: float | None = None  # its worker gone from the controller while the job still runs, since
    ended: str = ""  # why the manager ended it, when it did
    leave_by: float | None = None  # fit-idle-window: unix time its worker leaves at (before the node's claim)
    deadline: float | None = None  # fit-idle-window: ... at the latest, whenever it starts (script's $1)
    run_s: int = 0  # fit-idle-window: ... and at the latest this long after its start (script's $2)
    claim: str = ""  # fit-idle-window: what needs the node next ('reservation maint1 at 06:29:05'), if known

    @property
    def worker(self) -> str:
        return f"pilot-{self.job_id}"


@dataclass(slots=True)
class PilotEvent:
    time: float
    kind: str  # submit, running, registered, cancel, gone, adopt
    job_id: str
    detail: str = ""


def node_use(p: Pilot, workers: dict[str, tuple[bool, int, int]]) -> str:
    """What a pilot's node does for the controller: ``pilot 12_0 (running, worker alive; leaves by ...)``."""
    w = workers.get(p.worker)
    serving = "worker alive" if w and w[0] else "worker gone" if w else "no worker yet"
    leaves = f"; leaves by {clock_time(p.leave_by)}{', before ' + p.claim if p.claim else ''}" \
        if p.leave_by is not None else ""
    return f"pilot {p.job_id} ({p.state.lower()}, {serving}{leaves}{'; ' + p.ended if p.ended else ''})"
