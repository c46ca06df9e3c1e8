"""The simulators' event core: one heap of timed events, a stable order among those due at one instant, and
``run(until)`` handing each to the mechanism's strategy.

Why one core: every simulator here (Gavel's, Blox's, Pollux's and Sia's rounds, the DL engine, the BFTrainer
replayer) is a clock that jumps from one instant to the next and a mechanism that decides at each. Kept apart,
each grew its own loop, with its own stop test and its own idea of what comes first at a tie. Here the clock,
the heap and the tie order are written once; a mechanism is a ``Strategy`` (what it does at an event, when its
next round is, whether it is done), so its figures come from its rules alone.

Tie order: entries are ``(time, kind, order, event)``. ``kind`` orders the events due at one instant (the
mechanism numbers its kinds: e.g. completions before arrivals before rounds); ``order`` breaks the ties left
(the insertion sequence unless the caller gives one, such as a job index, so that two runs that schedule the
same events in another order still take them in one order). Nothing is random; a tie never falls through to
comparing two events unless the caller gave two equal ``order``s for one kind at one time.

Rounds: a round-based mechanism is a periodic event. ``start_rounds(t)`` puts the first round event on the heap;
after each round event is handled the core asks the strategy's ``next_round(t)`` for the next one (a fixed
period for Blox, Pollux and Sia; the slowest micro-task's end or the next arrival for Gavel; None: no more), so a
round's length may depend on what the round decided.

Stale events: a mechanism that re-arms an event (a job's completion, predicted again after every decision)
need not find and remove the old entry. Given ``live(time, kind, order)``, the core drops an entry that no
longer holds when it reaches the top (lazy deletion, as SimPy's core keeps its one queue), never handing it on.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any, Protocol

ROUND = "round"
"""The event a round-based mechanism receives at each round (``start_rounds``, ``next_round``)."""
ROUND_KIND = 1 << 30
"""The kind of round events: after every kind a mechanism numbers below it at the same instant."""

_INF = math.inf


class Strategy(Protocol):
    """What a mechanism implements to run on the core."""

    def handle(self, t: float, event: Any) -> None:
        """Act on ``event`` due at ``t`` (the core's clock reads ``t``); may schedule later events."""

    def next_round(self, t: float) -> float | None:
        """After the round event at ``t``: when the next round is due (>= ``t``), or None for no more rounds."""

    def done(self) -> bool:
        """Whether the run is over (checked after every event: the rest of the heap is left unhandled)."""


class EventCore:
    """One heap of ``(time, kind, order, event)`` entries and the clock ``now`` (the last event's time);
    ``live(time, kind, order)``, if given, says whether an entry still holds (a stale one is dropped)."""

    __slots__ = ("heap", "now", "handled", "live", "_seq")

    def __init__(self, start: float = 0.0, live: Callable[[float, int, Any], bool] | None = None) -> None:
        self.heap: list[tuple[float, int, Any, Any]] = []
        self.now = start
        self.live = live
        self.handled = 0  # events handed to the strategy so far
        self._seq = 0

    def schedule(self, t: float, event: Any, kind: int = 0, order: Any = None) -> None:
        """Put ``event`` on the heap at ``t`` (never before ``now``: a clock does not go back), taken after the
        lower kinds due at ``t``, then by ``order`` (default: the insertion sequence)."""
        if t < self.now:
            raise ValueError(f"event {event!r} scheduled at {t}, before the clock ({self.now})")
        if order is None:
            order = self._seq
            self._seq += 1
        heapq.heappush(self.heap, (t, kind, order, event))

    def start_rounds(self, t: float | None) -> None:
        """The first round event, at ``t`` (None: the mechanism has no round to run)."""
        if t is not None:
            self.schedule(t, ROUND, ROUND_KIND)

    def peek(self) -> float:
        """The time of the next live event (inf: none), dropping the stale ones above it."""
        heap, live = self.heap, self.live
        while heap:
            t, kind, order, _ = heap[0]
            if live is None or live(t, kind, order):
                return t
            heapq.heappop(heap)
        return _INF

    def run(self, strategy: Strategy, until: float = _INF, by_instant: bool = False) -> int:
        """Hand every event due at or before ``until`` to ``strategy``, in (time, kind, order), until the heap
        empties or the strategy is done; returns the number of events handled by this call.

        ``by_instant``: for a mechanism that takes a whole instant at once (the DL engine: every completion,
        arrival and crossing due at ``t``, then one decision). The core finds the next live entry, moves the clock
        to it and calls ``handle(t, event)`` leaving the entry on the heap: the strategy takes it, with whatever
        else it handles at ``t``, or makes it stale (an entry left live is handed over again, at the same ``t``)."""
        if by_instant:
            n = self._run_instants(strategy, until)
            self.handled += n
            return n
        heap, live, pop = self.heap, self.live, heapq.heappop
        handle, done = strategy.handle, strategy.done
        n = 0
        while heap and heap[0][0] <= until:
            t, kind, order, event = pop(heap)
            if live is not None and not live(t, kind, order):
                continue
            self.now = t
            handle(t, event)
            n += 1
            if kind == ROUND_KIND and event is ROUND:
                nt = strategy.next_round(t)
                if nt is not None:
                    self.schedule(nt, ROUND, ROUND_KIND)
            if done():
                break
        self.handled += n
        return n

    def _run_instants(self, strategy: Strategy, until: float) -> int:
        """``run`` by instant: the entry found stays on the heap for the strategy. Its own loop: where most
        entries go stale (the DL engine re-predicts every running job's completion at every decision) the
        stale ones are dropped here at the cost of one ``live`` call each."""
        heap, live, pop = self.heap, self.live, heapq.heappop
        handle, done = strategy.handle, strategy.done
        n = 0
        while heap:
            t, kind, order, event = heap[0]
            if live is not None and not live(t, kind, order):
                pop(heap)
                continue
            if t > until:
                break
            self.now = t
            handle(t, event)
            n += 1
            if kind == ROUND_KIND and event is ROUND:
                nt = strategy.next_round(t)
                if nt is not None:
                    self.schedule(nt, ROUND, ROUND_KIND)
            if done():
                break
        return n
