"""The simulators' event core: tie order, rounds, ``run(until)`` and the strategy's stop."""

from __future__ import annotations

import heapq

import pytest

from hpcsched.primitives.event_core import ROUND, EventCore


class Recorder:
    """A strategy that records what it is handed; rounds every ``period`` until ``last``."""

    def __init__(self, period: float | None = None, last: float = 0.0, stop_after: int | None = None) -> None:
        self.seen: list[tuple[float, object]] = []
        self.period, self.last, self.stop_after = period, last, stop_after

    def handle(self, t: float, event: object) -> None:
        self.seen.append((t, event))

    def next_round(self, t: float) -> float | None:
        assert self.period is not None
        return t + self.period if t + self.period <= self.last else None

    def done(self) -> bool:
        return self.stop_after is not None and len(self.seen) >= self.stop_after


def test_ties_go_by_kind_then_order_then_insertion() -> None:
    core = EventCore()
    core.schedule(5.0, "arrive-b", kind=1)
    core.schedule(5.0, "end-9", kind=0, order=9)
    core.schedule(2.0, "early", kind=2)
    core.schedule(5.0, "arrive-a", kind=1)
    core.schedule(5.0, "end-3", kind=0, order=3)
    s = Recorder()
    assert core.run(s) == 5
    # time first; at 5.0 kind 0 before kind 1; in kind 0 by the given order; in kind 1 by insertion
    assert [e for _, e in s.seen] == ["early", "end-3", "end-9", "arrive-b", "arrive-a"]
    assert core.now == 5.0 and core.handled == 5 and core.peek() == float("inf")


def test_rounds_are_periodic_events_after_other_kinds_at_one_instant() -> None:
    core = EventCore()
    core.start_rounds(0.0)
    core.schedule(20.0, "arrival", kind=0)
    s = Recorder(period=10.0, last=30.0)
    core.run(s)
    assert s.seen == [(0.0, ROUND), (10.0, ROUND), (20.0, "arrival"), (20.0, ROUND), (30.0, ROUND)]


def test_run_until_leaves_later_events_and_resumes() -> None:
    core = EventCore()
    core.start_rounds(0.0)
    s = Recorder(period=0.1, last=1.0)
    core.run(s, until=0.35)
    # 0.1 summed three times is a hair over 0.3: the rounds are the loop's own sums, not multiples
    assert [t for t, _ in s.seen] == [0.0, 0.1, 0.2, 0.30000000000000004]
    assert core.peek() == pytest.approx(0.4)
    core.run(s)
    assert len(s.seen) == 11 and s.seen[-1][0] == 0.9999999999999999  # ten sums of 0.1, not 1.0


def test_done_stops_with_events_left() -> None:
    core = EventCore()
    for t in (1.0, 2.0, 3.0):
        core.schedule(t, t)
    s = Recorder(stop_after=2)
    assert core.run(s) == 2
    assert core.peek() == 3.0


def test_the_clock_never_goes_back() -> None:
    core = EventCore()
    core.schedule(4.0, "x")
    core.run(Recorder())
    with pytest.raises(ValueError, match="before the clock"):
        core.schedule(3.0, "y")
    core.schedule(4.0, "same instant is fine")


def test_no_round_without_a_start() -> None:
    core = EventCore()
    core.start_rounds(None)
    assert core.run(Recorder(period=1.0, last=5.0)) == 0


def test_stale_entries_are_dropped_never_handed_on() -> None:
    armed = {"a": 3.0}  # the one live entry per name: re-arming leaves the old entry on the heap, stale
    core = EventCore(live=lambda t, kind, name: armed.get(name) == t)
    core.schedule(1.0, "a", order="a")
    core.schedule(3.0, "a", order="a")
    core.schedule(2.0, "b", order="b")
    s = Recorder()
    assert core.run(s) == 1
    assert s.seen == [(3.0, "a")]


class Instants:
    """A strategy that takes a whole instant at once (as the DL engine): every entry due at ``t``, then one step."""

    def __init__(self, core: EventCore) -> None:
        self.core = core
        self.steps: list[tuple[float, list[object]]] = []

    def handle(self, t: float, event: object) -> None:
        heap = self.core.heap
        taken = []
        while heap and heap[0][0] == t:
            taken.append(heapq.heappop(heap)[3])
        self.steps.append((t, taken))
        if t == 1.0:
            self.core.schedule(4.0, "scheduled at 1")

    def next_round(self, t: float) -> float | None:
        return None

    def done(self) -> bool:
        return False


def test_by_instant_leaves_the_entry_for_the_strategy_and_skips_stale_ones() -> None:
    core = EventCore(live=lambda t, kind, order: order != 99)
    for t, ev, kind in ((1.0, "end", 0), (1.0, "arrival", 1), (2.0, "stale", 0), (3.0, "late", 0)):
        core.schedule(t, ev, kind, order=99 if ev == "stale" else None)
    s = Instants(core)
    assert core.run(s, until=3.5, by_instant=True) == 2
    assert s.steps == [(1.0, ["end", "arrival"]), (3.0, ["late"])]
    assert core.peek() == 4.0 and core.now == 3.0
