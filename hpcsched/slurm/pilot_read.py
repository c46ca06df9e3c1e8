"""What the pilot manager reads from Slurm at each poll: two calls, whatever the number of nodes or pilots.

One ``sinfo`` (the node states of the pilots' partition) and one ``squeue`` of every job, array elements one per
line (``-r``), with the fields every reader of this poll needs: the jobs that hold nodes (the harvestable pool),
the manager's own pilots by job name (a restarted controller adopts its predecessor's), and the pending jobs'
expected starts and scheduled nodes (``fit-idle-window``'s backfill plan, ``idle_windows.PENDING_FORMAT``), so
none of them calls Slurm again. A site with 10,000 nodes pays for two process starts and the parsing of two
listings per poll, not for one call per node or per pilot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hpcsched.slurm import commands
from hpcsched.slurm.nodes import NodeState, parse_sinfo
from hpcsched.slurm.source import SlurmJob

SQUEUE_FORMAT = "%i|%P|%j|%T|%N|%S|%Y"  # id (array elements: ARRAYID_TASK), partition, name, state, nodes,
#                                         expected start, nodes backfill scheduled it on
HOLDING = frozenset({"CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "STOPPED",
                     "RESIZING"})


@dataclass(frozen=True, slots=True)
class SlurmRead:
    """One poll of Slurm: node states, the jobs holding nodes, our pilots, and backfill's pending plan."""

    states: dict[str, NodeState]
    holding: tuple[SlurmJob, ...]  # jobs in a state that holds nodes, with their nodes
    pilots: dict[str, tuple[str, str]] = field(default_factory=dict)  # our pilot id -> (state, node or '')
    pending_text: str = ""  # the pending jobs in idle_windows.PENDING_FORMAT


def _nodes(hostlist: str, expand: Callable[[str], list[str]]) -> tuple[str, ...]:
    """A job's nodes; a single plain node name (every pilot's) is not sent through the hostlist parser."""
    if not hostlist or hostlist in ("(null)", "None"):
        return ()
    if "[" not in hostlist and "," not in hostlist:
        return (hostlist,)
    return tuple(expand(hostlist))


def parse_jobs(text: str, pilot_name: str, expand: Callable[[str], list[str]] = commands.hostnames
               ) -> tuple[tuple[SlurmJob, ...], dict[str, tuple[str, str]], str]:
    """``squeue -h -r -o SQUEUE_FORMAT`` output -> (jobs holding nodes, our pilots, pending jobs' plan lines).
    A line not in the format raises ValueError naming it: a guess about Slurm's jobs could claim a busy node."""
    holding, pilots, pending = [], {}, []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|")
        if len(parts) != 7:
            raise ValueError(f"squeue line not in the format {SQUEUE_FORMAT!r}: {line!r}")
        jid, part, name, state, nodelist, start, sched = parts
        if name == pilot_name:
            pilots[jid] = (state, nodelist if state != "PENDING" else "")
        if state in HOLDING:
            holding.append(SlurmJob(jid, part, name, state, _nodes(nodelist, expand)))
        elif state == "PENDING":
            pending.append(f"{jid}|{part}|{name}|{start}|{sched}\n")
    return tuple(holding), pilots, "".join(pending)


def read_raw(run: Callable[[list[str]], str], partition: str | None) -> tuple[str, str]:
    """The two calls of a poll: ``sinfo`` (the partition's nodes, or every node) and ``squeue`` (every job)."""
    part = ["-p", partition] if partition else []
    return run(["sinfo", "-N", "-h", *part, "-o", "%N %T"]), run(["squeue", "-h", "-r", "-o", SQUEUE_FORMAT])


def parse_read(raw: tuple[str, str], pilot_name: str) -> SlurmRead:
    """``read_raw``'s output, parsed (SlurmError naming a line Slurm printed in an unknown format)."""
    try:
        holding, pilots, pending = parse_jobs(raw[1], pilot_name)
    except ValueError as e:
        raise commands.SlurmError(str(e)) from None
    return SlurmRead(parse_sinfo(raw[0]), holding, pilots, pending)

