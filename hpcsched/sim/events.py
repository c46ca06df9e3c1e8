"""The DL engine's events on the simulators' event core (``hpcsched.primitives.event_core``): arrivals,
predicted completions and service-threshold crossings, and how the engine takes one instant's worth at a time.

Why one heap: every source of events is an entry of the core's heap, ``(time, kind, job, None)``, so
the next instant is one peek, whatever the accounting. Entries are never removed when they go stale (a job
stopped, or re-armed for another time): the owner's ``live`` says whether an entry still holds, and the core
drops a stale one when it reaches the top (lazy deletion), as SimPy's core keeps its one queue.

Within one instant, entries are taken in kind order: completions, then arrivals, then wake-ups (the order
the engine handles them in). A completion predicted a hair after the instant (float round-off, within
``end_tol``) is taken with it once a completion is due at the instant itself.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from hpcsched.primitives.event_core import EventCore

END, ARRIVAL, WAKE = 0, 1, 2

_INF = math.inf


class EventQueue:
    """The engine's view of the core's heap. ``live(time, kind, idx)`` tells whether an entry still holds
    (``idx`` is the job's, or -1)."""

    __slots__ = ("core", "heap", "live")

    def __init__(self, live: Callable[[float, int, int], bool]) -> None:
        self.core = EventCore(live=live)
        self.heap = self.core.heap
        self.live = live

    def schedule(self, t: float, kind: int, idx: int) -> None:
        """An entry at ``t``: taken after the lower kinds at ``t``, then by job. Pushed on the core's heap
        directly, not through ``EventCore.schedule``: the reference accounting re-arms every running job at every
        event, and the extra call cost the runs ~10 %; every time here is a prediction from the clock on."""
        heapq.heappush(self.heap, (t, kind, idx, None))

    def peek(self) -> float:
        """The time of the earliest live entry (inf: none), dropping the stale ones above it."""
        return self.core.peek()

    def due(self, t: float, end_tol: float) -> tuple[list[int], list[int], bool]:
        """Take the live entries due at ``t``: (ending jobs, arriving jobs, whether a wake-up is due). Wake-up
        entries are consumed here; the accounting re-arms what it still needs. Ends are listed once each, in
        (time, job) order."""
        heap, live = self.heap, self.live
        ends: list[int] = []
        arrivals: list[int] = []
        woke = False
        seen: set[int] = set()
        later: list[tuple[float, int, int, None]] = []
        limit = t
        while heap and heap[0][0] <= limit:
            entry = heapq.heappop(heap)
            et, kind, idx, _ = entry
            if not live(et, kind, idx):
                continue
            if et > t:  # only a completion within the tolerance is taken early
                if kind == END:
                    if idx not in seen:
                        seen.add(idx)
                        ends.append(idx)
                else:
                    later.append(entry)
                continue
            if kind == END:
                if idx not in seen:
                    seen.add(idx)
                    ends.append(idx)
                    limit = t + end_tol
            elif kind == ARRIVAL:
                arrivals.append(idx)
            else:
                woke = True
                later.append(entry)  # wake-ups stay: the accounting takes the ones it keeps (``take_wakes``)
        for entry in later:
            heapq.heappush(heap, entry)
        return ends, arrivals, woke

    def take_wakes(self, t: float) -> list[int]:
        """Pop the live wake-up entries of jobs due at or before ``t``, in (time, job) order."""
        heap, live = self.heap, self.live
        out: list[int] = []
        kept: list[tuple[float, int, int, None]] = []
        while heap and heap[0][0] <= t:
            entry = heapq.heappop(heap)
            et, kind, idx, _ = entry
            if kind != WAKE:
                kept.append(entry)
            elif live(et, kind, idx) and idx >= 0:
                out.append(idx)
        for entry in kept:
            heapq.heappush(heap, entry)
        return out
