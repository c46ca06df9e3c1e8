"""The in-place resize of running elastic Horovod jobs: part of the decision core's ``place`` step
(``hpcsched.core.decide``), kept apart because it is its own rule: a job whose first node stays and whose growth
fits in free slots is resized without a restart (``Plan.resizes``).

A grow that fits only once *departing* slots are free waits for them at the job's current size
(``Plan.grow_waits``) instead of a stop and relaunch. Departing slots are those ``ClusterState.used`` counts for
jobs the decision does not plan any more: a cancelled or preempted job's tasks still hold their slots until they
have checkpointed and exited, yet admission (which counts every live worker's slots) already sized the elastic job
into them. A relaunch then stopped the job (a checkpoint, a restart, the steps since its last checkpoint redone) to
start it again on the same slots once they came free; waiting keeps it running, and the step that follows their
release (a freed slot makes the controller plan) grows it in place. Only jobs resizable in place wait, which the
simulator never plans (``JobState.in_place`` is the runtime's): its decisions are unchanged."""

from __future__ import annotations

from hpcsched.primitives.state import JobState, Plan, WorkerState


def resize_in_place(out: Plan, order: list[str], by_id: dict[str, JobState], free: dict[str, int],
                     workers: list[WorkerState], used: dict[str, int] | None = None) -> None:
    """Resize in place the in-place-capable running jobs whose size changes (``in_place_placement``); a grow that
    fits only with the departing slots of ``used`` (module docstring) keeps the job's size and is noted in
    ``out.grow_waits``.

    A grow takes free slots (before pending jobs are placed: the job already runs, its growth was sized before
    them). Slots a shrink frees are not handed out in this step: the ranks leave only when Horovod re-forms
    (about 1 s).
    """
    departing: dict[str, int] | None = None  # made at the first grow that does not fit: most steps have none
    for jid in order:  # running jobs admitted at another size, in priority order
        j = by_id[jid]
        if not j.running or jid not in out.sizes or out.sizes[jid] == j.procs or not j.in_place or not j.placement:
            continue
        held = dict(j.placement)
        where = in_place_placement(j, out.sizes[jid], free, workers)
        if where is None and out.sizes[jid] > j.procs and used:
            if departing is None:
                departing = departing_slots(used, by_id)
            soon = in_place_placement(j, out.sizes[jid], {w: k + departing.get(w, 0) for w, k in free.items()},
                                      workers)
            if soon is not None:  # it fits once they are free: keep its size until then. Its free slots are not
                # reserved: admission gave pending jobs their minimum first, and the departing slots it counted are
                # what this grow waits for, so a pending job placed on free slots now takes only its own share
                out.grow_waits[jid] = out.sizes[jid]
                out.sizes[jid] = j.procs
                continue
        if where is None:
            continue
        out.resizes[jid] = where
        for wid, k in where:
            free[wid] -= max(0, k - held.get(wid, 0))


def departing_slots(used: dict[str, int], by_id: dict[str, JobState]) -> dict[str, int]:
    """Slots per worker that ``used`` counts beyond the running jobs' placements: held by jobs this decision does
    not plan (stopping ones), free once their tasks have exited. Running jobs co-located in a group share their
    slots, so a group counts once per worker (its largest member), as ``used`` counts it."""
    peak: dict[tuple[str, str], int] = {}
    for j in by_id.values():
        if j.running:
            for wid, k in j.placement:
                key = (wid, j.group or j.id)
                peak[key] = max(peak.get(key, 0), k)
    planned: dict[str, int] = {}
    for (wid, _), k in peak.items():
        planned[wid] = planned.get(wid, 0) + k
    return {w: k - planned.get(w, 0) for w, k in used.items() if k > planned.get(w, 0)}


def in_place_placement(j: JobState, size: int, free: dict[str, int], workers: list[WorkerState]
                        ) -> list[tuple[str, int]] | None:
    """Where a running elastic Horovod job goes at ``size`` without a restart, or None. Its first node stays
    (it runs ``horovodrun``, whose discovery file is the host list); a shrink gives up slots from its last nodes
    first; a grow tops up the nodes it runs on, then adds workers that have its launcher and a GPU type it
    accepts, in id order (the worker's agent starts the new ranks there: no ssh). None when its first node is
    no longer among ``workers`` or the growth does not fit in free slots."""
    live = {w.id for w in workers}
    if j.placement[0][0] not in live:
        return None
    cur = [(wid, k) for wid, k in j.placement if wid in live]
    have = sum(k for _, k in cur)
    if size <= have:
        out, left = [], size
        for wid, k in cur:
            if left > 0:
                out.append((wid, min(k, left)))
                left -= min(k, left)
        return out
    add = size - have
    out = []
    for wid, k in cur:
        more = min(add, max(0, free.get(wid, 0)))
        out.append((wid, k + more))
        add -= more
    for w in workers:
        if add == 0:
            break
        if w.id in dict(cur) or j.launcher not in w.launchers or (j.gpu_types and w.gpu_type not in j.gpu_types):
            continue
        more = min(add, max(0, free.get(w.id, 0)))
        if more:
            out.append((w.id, more))
            add -= more
    return out if add == 0 else None
