"""What one poll of PBS Pro says, parsed from its JSON (``pbsnodes -a -F json``, ``qstat -f -F json``): the free
nodes no job holds, this controller's pilots (by job name) and the nodes other users' queued jobs wait for.

The formats are PBS Pro's: ``pbsnodes`` prints ``{"nodes": {NAME: {"state": "free", "jobs": [...],
"resources_available": {"ncpus": N, ...}, "resv": ...}}}`` (``state`` a comma list such as
``job-exclusive`` or ``down,offline``), ``qstat`` prints ``{"Jobs": {"ID.SERVER": {"Job_Name": ..., "job_state":
"Q"|"R"|"E"|"H"|..., "exec_host": "NODE/0*2+...", "Resource_List": {"nodect": N, ...}}}}`` (no ``Jobs`` key when
there are none). Anything else is a ``PbsError`` naming the command, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hpcsched.pbs.commands import PbsError

NODES_ARGV = ["pbsnodes", "-a", "-F", "json"]
JOBS_ARGV = ["qstat", "-f", "-F", "json"]
# qstat's one-letter states, as the pilots' listings show them (Slurm's words: one vocabulary in the views)
STATES = {"Q": "PENDING", "H": "PENDING", "W": "PENDING", "T": "PENDING", "R": "RUNNING", "B": "RUNNING",
          "E": "EXITING", "X": "EXITING", "F": "EXITING", "S": "SUSPENDED", "U": "SUSPENDED", "M": "MOVED"}


@dataclass(frozen=True, slots=True)
class PbsJob:
    id: str
    name: str
    state: str  # STATES' word
    nodes: tuple[str, ...]  # from exec_host, in order; () while queued
    nodect: int  # nodes it asked for (Resource_List.nodect; 1 when not said)


@dataclass(frozen=True, slots=True)
class PbsRead:
    free: tuple[str, ...]  # free nodes no job holds and no reservation covers
    why_not: dict[str, str] = field(default_factory=dict)  # every other node -> its state
    pilots: dict[str, PbsJob] = field(default_factory=dict)  # job id -> this controller's pilot
    queued: tuple[PbsJob, ...] = ()  # other users' jobs waiting to start


def _json(text: str, argv: list[str]) -> dict[str, Any]:
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise PbsError(f"{' '.join(argv)}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise PbsError(f"{' '.join(argv)}: expected a JSON object, got {type(data).__name__}")
    return data


def parse_nodes(text: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """Free nodes (state ``free``, no job, no reservation) and why each other node is not."""
    nodes = _json(text, NODES_ARGV).get("nodes") or {}
    free, why = [], {}
    for name, n in sorted(nodes.items()):
        state = str(n.get("state", "unknown"))
        if state == "free" and not n.get("jobs") and not n.get("resv"):
            free.append(name)
        else:
            why[name] = state if state != "free" else "free, but " + ("running a job" if n.get("jobs")
                                                                       else "in a reservation")
    return tuple(free), why


def parse_jobs(text: str) -> list[PbsJob]:
    out = []
    for jid, j in (_json(text, JOBS_ARGV).get("Jobs") or {}).items():
        hosts = [h.split("/")[0] for h in str(j.get("exec_host") or "").split("+") if h]
        nodect = (j.get("Resource_List") or {}).get("nodect", 1)
        out.append(PbsJob(jid, str(j.get("Job_Name", "")), STATES.get(str(j.get("job_state", "")), "UNKNOWN"),
                          tuple(dict.fromkeys(hosts)), int(nodect) if str(nodect).isdigit() else 1))
    return out


def read_pbs(run: Callable[[list[str]], str], pilot_name: str) -> PbsRead:
    """One poll: one ``pbsnodes`` and one ``qstat``, whatever the node and job counts."""
    free, why = parse_nodes(run(list(NODES_ARGV)))
    jobs = parse_jobs(run(list(JOBS_ARGV)))
    pilots = {j.id: j for j in jobs if j.name == pilot_name}
    queued = tuple(j for j in jobs if j.name != pilot_name and j.state == "PENDING")
    return PbsRead(free, why, pilots, queued)
