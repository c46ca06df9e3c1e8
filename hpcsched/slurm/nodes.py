"""Which Slurm node states may be harvested: one table, so every caller agrees.

``sinfo -N -h -o '%N %T'`` prints a base state (idle, allocated, mixed, completing, drained,
draining, down, planned, ...), possibly with ``+FLAG`` parts (``idle+drain``) and a one-character
suffix: ``*`` not responding, ``~`` powered off, ``#`` powering up, ``%`` powering down, ``!``
power-down pending, ``@`` reboot pending, ``^`` rebooting, ``$`` maintenance reservation, ``-``
planned by backfill. A node may be harvested only when Slurm would start a job there right now and
has no plans for it: plain ``idle``. Everything else is out, for a reason worth logging:

- allocated / mixed / completing: a job holds it (our own scavenger jobs are accounted separately);
- planned (or suffix ``-``): backfill has reserved it for a pending job, which will start soon;
- drained / draining / drain flag / down / fail / maint / reboot / power states: the admin or Slurm
  took it out of service;
- a ``*`` suffix: slurmd stopped answering (a killed slurmd shows ``idle*`` before ``down*``).
"""

from __future__ import annotations

from dataclasses import dataclass

_SUFFIXES = "*~#%!@^$-"
_SUFFIX_MEANING = {
    "*": "not responding",
    "~": "powered off",
    "#": "powering up",
    "%": "powering down",
    "!": "power down pending",
    "@": "reboot pending",
    "^": "rebooting",
    "$": "maintenance reservation",
    "-": "planned by backfill",
}
_BUSY = {"allocated", "alloc", "mixed", "mix", "completing", "comp"}


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node's state as Slurm reported it, split into base, flags and suffix."""

    node: str
    raw: str
    base: str
    flags: frozenset[str]
    suffix: str

    @property
    def harvestable(self) -> bool:
        return self.base == "idle" and not self.flags and not self.suffix

    @property
    def busy(self) -> bool:
        """A job holds (part of) the node and Slurm reports nothing else wrong with it."""
        return self.base in _BUSY and not self.flags and not self.suffix

    @property
    def reason(self) -> str:
        """Why the node is not harvestable ('' if it is), for the event log."""
        if self.harvestable:
            return ""
        if self.suffix:
            return f"{self.raw} ({_SUFFIX_MEANING[self.suffix]})"
        return self.raw


def parse_state(node: str, raw: str) -> NodeState:
    """Split ``idle+drain*`` into base ``idle``, flags ``{drain}``, suffix ``*``; lower-case throughout."""
    s = raw.strip().lower()
    suffix = ""
    if s and s[-1] in _SUFFIXES:
        suffix, s = s[-1], s[:-1]
    base, *flags = s.split("+")
    return NodeState(node=node, raw=raw.strip(), base=base, flags=frozenset(flags), suffix=suffix)


def parse_sinfo(text: str) -> dict[str, NodeState]:
    """``sinfo -N -h -o '%N %T'`` output -> state per node.

    A node in several partitions is listed once per partition with the same state; a node whose
    lines disagree (a state change between lines) keeps the less harvestable reading.
    """
    out: dict[str, NodeState] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        st = parse_state(parts[0], parts[1])
        prev = out.get(st.node)
        if prev is None or (prev.harvestable and not st.harvestable):
            out[st.node] = st
    return out
