"""The in-place resize of running elastic Horovod jobs: part of the decision core's ``place`` step
(``hpcsched.core.decide``), kept apart because it is its own rule: a job whose first node stays and whose growth
fits in free slots is resized without a restart (``Plan.resizes``)."""

from __future__ import annotations

from hpcsched.primitives.state import JobState, Plan, WorkerState


def resize_in_place(out: Plan, order: list[str], by_id: dict[str, JobState], free: dict[str, int],
                     workers: list[WorkerState]) -> None:
    """Resize in place the in-place-capable running jobs whose size changes (``in_place_placement``).

    A grow takes free slots (before pending jobs are placed: the job already runs, its growth was sized before
    them). Slots a shrink frees are not handed out in this step: the ranks leave only when Horovod re-forms
    (about 1 s).
    """
    for jid in order:  # running jobs admitted at another size, in priority order
        j = by_id[jid]
        if not j.running or jid not in out.sizes or out.sizes[jid] == j.procs or not j.in_place or not j.placement:
            continue
        where = in_place_placement(j, out.sizes[jid], free, workers)
        if where is None:
            continue
        out.resizes[jid] = where
        held = dict(j.placement)
        for wid, k in where:
            free[wid] -= max(0, k - held.get(wid, 0))


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
