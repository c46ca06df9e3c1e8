"""How the DL engine orders jobs for policies that promise their order (``PolicyHints``): an ``order_key``
read from a job's live state, merged lazily over running and waiting jobs (contract item 9 of
``hpcsched.sim.engine``), and ``vector_keys`` over per-job columns (item 10). Each gives exactly the policy's
own answer without building a snapshot of every active job.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcsched.allocator import Group
    from hpcsched.model import ClusterSpec
    from hpcsched.sim.jobrun import EngineJob

COLS = ("submit", "gpus", "iterations_total", "iteration_time", "remaining_s", "iterations_done", "executed_s")
"""The per-job columns a ``vector_keys`` policy reads (contract item 10)."""


class LiveView:
    """A job's ``JobView`` fields read live from its run state, for ``order_key`` policies (contract item 9).

    Why: the engine keys every running job at every event; building a frozen ``JobView`` for each was the
    largest single cost of a congested run. Each field is computed exactly as ``DLEngine.view`` does,
    so a key sees the same numbers; a key must read fields, not keep the view (``ordered_by``'s contract)."""

    __slots__ = ("_j", "_a")

    def __init__(self, j: EngineJob, acct: Any) -> None:
        self._j, self._a = j, acct  # acct: the run's accounting, which settles remaining_s

    id = property(lambda self: self._j.id)
    submit = property(lambda self: self._j.submit)
    gpus = property(lambda self: self._j.gpus)
    iterations_total = property(lambda self: int(round(self._j.total)))
    iterations_done = property(lambda self: self._j.done)
    iteration_time = property(lambda self: self._j.it)
    attained_gpu_s = property(lambda self: self._j.attained)
    executed_s = property(lambda self: self._j.executed)
    remaining_s = property(lambda self: self._a.remaining(self._j))
    profile = property(lambda self: self._j.job.profile)
    running = property(lambda self: self._j.running)
    first_start = property(lambda self: self._j.first_start)
    model = property(lambda self: self._j.model)
    rank_hint = property(lambda self: self._j.hint)


def merge_order(jobs: Sequence[EngineJob], run: list[tuple[Any, int]], wsorted: Mapping[int, list[tuple[Any, int]]],
                dead: set[int]) -> Iterator[Group]:
    """An ``order_key`` policy's answer, lazily: the running jobs keyed now (``run``, sorted), merged with the
    waiting ones (``wsorted``: GPU demand -> sorted (key, idx); their keys cannot have changed since they
    stopped), ties in arrival order. The consumer adds to ``dead`` the GPU demands that can no longer fit (free
    GPUs only shrink while it places): the rest of the waiting jobs of that demand are left out,
    which changes nothing since the consumer would skip each of them."""
    heads: list[tuple[Any, int, int, list[tuple[Any, int]], int]] = [
        (lst[0][0], lst[0][1], g, lst, 0) for g, lst in ((0, run), *wsorted.items()) if lst
    ]  # (key, idx, demand (0: running), source, position); idx is unique, so nothing else compares
    heapq.heapify(heads)
    while heads:
        _k, idx, g, lst, pos = heads[0]
        if g == 0:  # the running jobs: yield them in a run up to the next other head, without heap work
            n = len(lst)
            if len(heads) == 1:
                bound = None
            else:
                other = heads[1] if len(heads) == 2 or heads[1] < heads[2] else heads[2]
                bound = (other[0], other[1])
            while pos < n and (bound is None or lst[pos] < bound):
                yield jobs[lst[pos][1]].solo
                pos += 1
            if pos < n:
                heapq.heapreplace(heads, (lst[pos][0], lst[pos][1], 0, lst, pos))
            else:
                heapq.heappop(heads)
            continue
        yield jobs[idx].solo
        pos += 1
        if pos < len(lst) and g not in dead:
            heapq.heapreplace(heads, (lst[pos][0], lst[pos][1], g, lst, pos))
        else:
            heapq.heappop(heads)


def vector_order(vorder: Callable[..., Any], t: float, cluster: ClusterSpec, mode: str | None, table: Any, vmask: Any,
                 ) -> Callable[[], Iterator[int]]:
    """``vector_keys`` policies: the active jobs' columns (``table``'s rows ``COLS``, the jobs in ``vmask``, arrival
    order) keyed by the policy's own array function ``vorder``; returns a re-iterable source of job indices in
    priority order. Only the head of the order is sorted (placement rarely looks further), the rest when a
    consumer reaches it."""
    import numpy as np

    act = np.flatnonzero(vmask)
    keys = vorder(t, cluster, dict(zip(COLS, table[:, act], strict=True)), mode)
    head_n = 4 * cluster.gpus
    if len(act) <= 2 * head_n:
        full = act[np.lexsort(keys[::-1])].tolist()
        return lambda: iter(full)
    first = keys[0]
    kth = np.partition(first, head_n)[head_n]
    head = np.flatnonzero(first <= kth)  # every job tied with the cut stays in the head: exact order
    top = act[head[np.lexsort([k[head] for k in keys[::-1]])]].tolist()
    rest: list[int] = []

    def order() -> Iterator[int]:
        yield from top
        if not rest:
            tail = np.flatnonzero(first > kth)
            rest.extend(act[tail[np.lexsort([k[tail] for k in keys[::-1]])]].tolist())
        yield from rest

    return order
