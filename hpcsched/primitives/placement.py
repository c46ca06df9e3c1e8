"""Consolidated placement: where a job (or an interleaving group) of ``gpus`` GPUs goes.

Pure functions over a list of free GPUs per node, so the simulator and the runtime controller make
the same decision from the same state. The rule (Muri's and Tiresias' "YARN-like" placement):

- a job of at most GPUs-per-node GPUs goes on ONE node: the first node (in node order) with enough
  free GPUs — first fit, which keeps later nodes whole for large jobs;
- a larger job takes ``gpus // gpus_per_node`` wholly idle nodes (the first ones) plus, for the
  remainder, the first other node with enough free GPUs;
- all of a job's GPUs come from one switch (the first switch, in order, that can hold it), because
  cross-switch gradient traffic is what makes spread placements slow.

Per-node CPU and memory are not checked: on the bundled specs (92 CPUs, 520 GB per 8-GPU node) the
reference's per-GPU demands (6 CPUs, ~6 GB) can never bind before the GPUs do.
"""

from __future__ import annotations

from collections.abc import Sequence

Placement = list[tuple[int, int]]
"""(node index, GPUs on that node) pairs; node indices are global (switch-major)."""


def place_consolidated(
    free: Sequence[int], gpus: int, gpus_per_node: int, nodes_per_switch: int | None = None
) -> Placement | None:
    """Where ``gpus`` GPUs go under consolidated placement, or None if they do not fit now.

    ``free[i]`` is node i's free GPUs. ``nodes_per_switch`` (None: one switch) confines a job to
    one switch. The caller applies the result (subtracts the counts from ``free``).
    """
    if gpus <= 0:
        raise ValueError(f"a placement needs >= 1 GPU, got {gpus}")
    if gpus <= gpus_per_node:  # one node, which lies in one switch: the first node with room, whatever
        for i, f in enumerate(free):  # the switches (the simulator's hottest call: kept to one loop)
            if f >= gpus:
                return [(i, gpus)]
        return None
    n = len(free)
    if n == 0:  # no candidate node at all (a GPU type no worker has): it does not fit, not a zero-step range
        return None
    per_switch = nodes_per_switch or n
    for lo in range(0, n, per_switch):
        got = _place_in(free, lo, min(lo + per_switch, n), gpus, gpus_per_node)
        if got is not None:
            return got
    return None


def _place_in(free: Sequence[int], lo: int, hi: int, gpus: int, gpn: int) -> Placement | None:
    """A job wider than a node, within nodes [lo, hi): whole idle nodes plus one for the remainder."""
    whole, rest = divmod(gpus, gpn)
    full = [i for i in range(lo, hi) if free[i] == gpn][:whole]
    if len(full) < whole:
        return None
    out = [(i, gpn) for i in full]
    if rest:
        taken = set(full)
        last = next((i for i in range(lo, hi) if i not in taken and free[i] >= rest), None)
        if last is None:
            return None
        out.append((last, rest))
    return out


def apply(free: list[int], placement: Placement, sign: int = -1) -> None:
    """Take (sign=-1) or give back (sign=+1) a placement's GPUs in ``free``."""
    for node, k in placement:
        free[node] += sign * k


def first_slots(where: list[tuple[str, int]], procs: int) -> list[tuple[str, int]]:
    """The first ``procs`` slots of a group's placement, in node-rank order: a member smaller than its group
    runs on part of the group's slots."""
    out = []
    for wid, k in where:
        if procs <= 0:
            break
        out.append((wid, min(k, procs)))
        procs -= k
    return out
