"""Which pending jobs a scheduling step shows the planner: a bounded head of the queue, in the policy's order.

Why: at 100,000 queued jobs a step that planned over every one of them cost seconds, though only the first
few can start (the free slots bound how many). ``PendingQueue`` keeps the pending jobs sorted by the policy's
own order key (``PolicyHints.order_key``), updated as jobs enter and leave the queue (a submit, a requeue, a
start, a cancel: O(log n) each), and ``head`` returns the first ones, enough to fill the free slots twice
over (room for backfill: a later job that fits where an earlier one does not), never fewer than
``HEAD_MIN`` (a preemptive policy's top waiting jobs must meet the running ones even with no slot free) and
never more than ``HEAD_MAX``.

It is still the policy's decision: a policy with an order key promises (the registry's conformance test
checks it) that its answer is exactly the jobs sorted by that key and that a waiting job's key depends only
on its own view. So the planner, given the running jobs plus this head, orders them exactly as it would
order the whole queue, and every job left out ranks below every job in the head: it could only have started
by backfilling past more than twice the free slots' worth of better-placed jobs, and it is shown at a later
step once those start. Jobs that no live worker set can hold (``waiting``: their class has a note) are passed over:
the planner could not place them whatever their rank, and at 20,000 of them at the front of a FIFO queue a head
of the first jobs held none that could start. The queue is kept per class, and the head merges the classes that
can run. A policy without an order key (themis, muri: their order depends on the whole set) is
given every pending job, in submit order, as before; ``bounded`` says which case applies.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Container, Hashable, Iterable
from heapq import merge
from typing import Any

from hpcsched.allocator import JobView, Policy, hints_of
from hpcsched.primitives.state import JobState

HEAD_MIN = 256  # pending jobs shown even when no slot is free (a preemptive policy's candidates)
HEAD_MAX = 1024  # at most this many pending jobs per step, however many slots are free (placing each costs O(workers))


def waiting_view(j: JobState) -> JobView:
    """The policy's view of a pending job, as the planner builds it (``hpcsched.core.decide``): its minimum size,
    its progress so far, its remaining solo time where its steps and iteration time are known."""
    remaining = None
    if j.steps_total is not None and j.iteration_s is not None:
        remaining = max(0, j.steps_total - j.steps_done) * j.iteration_s
    return JobView(id=j.id, submit=j.submit, gpus=j.min_procs, iterations_total=j.steps_total,
                   iterations_done=j.steps_done, iteration_time=j.iteration_s, attained_gpu_s=j.attained_s,
                   executed_s=j.executed_s, remaining_s=remaining, profile=j.profile, running=False,
                   first_start=j.first_start)


class PendingQueue:
    """The pending jobs in the policy's order (rules in the module docstring)."""

    def __init__(self, policy: Policy) -> None:
        self._key: Callable[[JobView], Any] | None = hints_of(policy).order_key
        self._sorted: dict[Hashable, list[tuple[Any, int, str]]] = {}  # class -> (policy key, submit number, id)
        self._entry: dict[str, tuple[Hashable, tuple[Any, int, str]]] = {}
        self._states: dict[str, JobState] = {}

    @property
    def bounded(self) -> bool:
        """True when the policy has an order key: steps see a bounded head, not the whole queue."""
        return self._key is not None

    def __len__(self) -> int:
        return len(self._states)

    def update(self, leaving: Iterable[str], entering: Iterable[tuple[int, JobState, Hashable]]) -> None:
        """Jobs that left the queue (or changed while in it: they enter again) and jobs (submit number, view, class)
        in it; the class is what decides whether live workers can hold the job (``waiting.JobClass``)."""
        for jid in leaving:
            self._states.pop(jid, None)
            got = self._entry.pop(jid, None)
            if got is not None:
                cls, e = got
                entries = self._sorted[cls]
                del entries[bisect_left(entries, e)]
                if not entries:
                    del self._sorted[cls]
        for seq, js, cls in entering:
            if js.id in self._entry:
                self.update((js.id,), ())
            key = self._key(waiting_view(js)) if self._key is not None else 0
            e = (key, seq, js.id)
            insort(self._sorted.setdefault(cls, []), e)
            self._entry[js.id] = (cls, e)
            self._states[js.id] = js

    def head(self, free_slots: int, blocked: Container[Hashable] = ()) -> list[JobState]:
        """The first pending jobs in the policy's order, passing over the ``blocked`` classes: enough to fill
        ``free_slots`` twice, at least ``HEAD_MIN``, at most ``HEAD_MAX`` (every one when the policy has no order
        key)."""
        ordered = merge(*(v for cls, v in self._sorted.items() if cls not in blocked))
        if self._key is None:
            return [self._states[jid] for _, _, jid in ordered]
        out: list[JobState] = []
        need = 2 * max(0, free_slots)
        for _, _, jid in ordered:
            if len(out) >= HEAD_MAX or (len(out) >= HEAD_MIN and need <= 0):
                break
            js = self._states[jid]
            out.append(js)
            need -= js.min_procs
        return out
