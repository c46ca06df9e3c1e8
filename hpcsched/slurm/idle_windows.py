"""How long each idle node stays idle: the time until Slurm next needs it (its *idle window*).

A site without a scavenger partition can still lend its idle nodes, provided a borrower leaves before the node
is needed. Slurm says when that is in two places, both read here:

- reservations (``scontrol -o show reservation``): a node in a reservation is needed from its ``StartTime`` (an
  ``ACTIVE`` one now: ``sinfo`` still prints such a node ``idle``, yet a job outside the reservation cannot
  start there);
- the backfill scheduler's plan (``squeue -h -t PD -o '%i|%P|%j|%S|%Y'``): a pending job with an expected start
  (``%S``) and scheduled nodes (``%Y``, SchedNodes) will start there then; ``sinfo`` shows such nodes ``planned``
  while they wait idle for it.

The window of a node is the time from now to the earliest of these claims; a node nobody has claimed has an
unbounded window (the caller caps it). A pending job with an expected start but no scheduled nodes (Slurm has
not placed it yet) claims no node in particular: it is counted in ``Windows.unplaced`` and said by the caller,
never silently dropped. Times are Slurm's local time (``2026-11-27T06:26:01``), read in this process's time zone,
as ``squeue`` and ``scontrol`` print them for the same machine.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hpcsched.slurm import commands

PENDING_FORMAT = "%i|%P|%j|%S|%Y"  # job id, partition, name, expected start, scheduled nodes


@dataclass(frozen=True, slots=True)
class Reservation:
    """One reservation as ``scontrol show reservation`` prints it."""

    name: str
    start: float  # unix time
    end: float
    nodes: tuple[str, ...]
    state: str  # ACTIVE or INACTIVE
    flags: str


@dataclass(frozen=True, slots=True)
class PlannedJob:
    """One pending job as ``squeue`` prints it with its expected start and the nodes backfill chose for it."""

    id: str
    partition: str
    name: str
    start: float | None  # None: Slurm gives no expected start (N/A)
    nodes: tuple[str, ...]  # empty: not placed yet


@dataclass(frozen=True, slots=True)
class Claim:
    """The next time Slurm needs a node, and what for (said to the operator)."""

    at: float  # unix time
    what: str  # 'reservation maint1', 'job 60 (batch)'


@dataclass(frozen=True, slots=True)
class Windows:
    """Each node's next claim (absent: none known), and the pending jobs with a start but no nodes yet."""

    now: float
    claims: dict[str, Claim] = field(default_factory=dict)
    unplaced: tuple[str, ...] = ()  # ids of pending jobs with an expected start and no scheduled nodes

    def seconds(self, node: str, cap: float) -> float:
        """The node's idle window from ``now``, at most ``cap`` (no known claim: ``cap``); 0 once claimed."""
        c = self.claims.get(node)
        return cap if c is None else max(0.0, min(cap, c.at - self.now))


def slurm_time(text: str) -> float | None:
    """``2026-11-27T06:26:01`` (local time) -> unix time; None for Slurm's N/A, Unknown, None and (null)."""
    s = text.strip()
    if not s or s in ("N/A", "Unknown", "None", "(null)"):
        return None
    try:
        return dt.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        raise ValueError(f"not a Slurm time: {text!r}") from None


def _hms(t: float) -> str:
    return "no end" if t == float("inf") else dt.datetime.fromtimestamp(t).strftime("%H:%M:%S")


def _nodes(hostlist: str, expand: Callable[[str], list[str]]) -> tuple[str, ...]:
    return tuple(expand(hostlist)) if hostlist and hostlist not in ("(null)", "None", "N/A") else ()


def parse_reservations(text: str, expand: Callable[[str], list[str]] = commands.hostnames) -> list[Reservation]:
    """``scontrol -o show reservation`` (one line each) or its multi-line form -> reservations.

    A record starts at each ``ReservationName=``; ``No reservations in the system`` gives none. A record without a
    start time raises ValueError naming it (Slurm always prints one: a change of format must not pass unseen)."""
    records: list[dict[str, str]] = []
    for word in text.split():
        key, eq, value = word.partition("=")
        if not eq:
            continue
        if key == "ReservationName":
            records.append({})
        if records:
            records[-1][key] = value
    out = []
    for r in records:
        start, end = slurm_time(r.get("StartTime", "")), slurm_time(r.get("EndTime", ""))
        if start is None:
            raise ValueError(f"reservation {r.get('ReservationName')!r} has no StartTime: {r}")
        out.append(Reservation(r["ReservationName"], start, end if end is not None else float("inf"),
                               _nodes(r.get("Nodes", ""), expand), r.get("State", ""), r.get("Flags", "")))
    return out


def parse_planned(text: str, expand: Callable[[str], list[str]] = commands.hostnames) -> list[PlannedJob]:
    """``squeue -h -t PD -o '%i|%P|%j|%S|%Y'`` -> pending jobs (a line of another shape raises ValueError)."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|")
        if len(parts) != 5:
            raise ValueError(f"squeue line not in the format {PENDING_FORMAT!r}: {line!r}")
        jid, part, name, start, nodes = parts
        jobs.append(PlannedJob(jid, part, name, slurm_time(start), _nodes(nodes, expand)))
    return jobs


def estimate(now: float, reservations: Iterable[Reservation], pending: Iterable[PlannedJob],
             is_ours: Callable[[PlannedJob], bool] = lambda j: False) -> Windows:
    """Each node's earliest claim at or after ``now``: an active reservation claims its nodes now, a coming one at
    its start, a pending job (not ours: our own pilots waiting claim nothing) at its expected start on its
    scheduled nodes. Reservations that have ended claim nothing."""
    claims: dict[str, Claim] = {}

    def claim(node: str, c: Claim) -> None:
        if node not in claims or c.at < claims[node].at:
            claims[node] = c

    for r in reservations:
        if r.end <= now:
            continue
        what = f"reservation {r.name}" if r.start > now else f"in reservation {r.name} (until {_hms(r.end)})"
        for n in r.nodes:
            claim(n, Claim(max(now, r.start), what))
    unplaced = []
    for j in pending:
        if is_ours(j) or j.start is None:
            continue
        if not j.nodes:
            unplaced.append(j.id)
            continue
        for n in j.nodes:
            claim(n, Claim(max(now, j.start), f"job {j.id} ({j.partition})"))
    return Windows(now, claims, tuple(unplaced))


def read_windows(now: float, is_ours: Callable[[PlannedJob], bool],
                 run: Callable[[list[str]], str] = lambda argv: commands.run(argv)) -> Windows:
    """The live Slurm's windows: one ``scontrol`` and one ``squeue`` call."""
    reservations = parse_reservations(run(["scontrol", "-o", "show", "reservation"]))
    pending = parse_planned(run(["squeue", "-h", "-t", "PD", "-o", PENDING_FORMAT]))
    return estimate(now, reservations, pending, is_ours)
