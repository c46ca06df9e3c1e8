"""The simulator's event core (``hpcsched.sim.events``): one heap, lazy deletion, what is due at an instant."""

from __future__ import annotations

from hpcsched.sim.events import ARRIVAL, END, WAKE, EventQueue


def test_peek_drops_stale_entries_and_due_takes_kinds_in_order() -> None:
    stale = {(1.0, END, 3)}
    q = EventQueue(lambda t, k, i: (t, k, i) not in stale)
    for entry in ((5.0, ARRIVAL, 9), (1.0, END, 3), (2.0, WAKE, 4), (2.0, END, 1), (2.0, ARRIVAL, 2), (2.0, END, 1)):
        q.schedule(*entry)
    assert q.peek() == 2.0  # the stale completion at 1.0 is gone
    ends, arrivals, woke = q.due(2.0, 0.0)
    assert (ends, arrivals, woke) == ([1], [2], True)  # the duplicate completion of job 1 counted once
    assert q.take_wakes(2.0) == [4] and q.take_wakes(2.0) == []
    assert q.peek() == 5.0


def test_a_completion_a_hair_late_is_taken_only_with_one_due_now() -> None:
    q = EventQueue(lambda t, k, i: True)
    q.schedule(10.0, ARRIVAL, 0)
    q.schedule(10.0 + 1e-12, END, 1)
    assert q.due(10.0, 1e-9) == ([], [0], False)  # no completion due at 10 itself: job 1 ends at its own time
    assert q.peek() == 10.0 + 1e-12
    q.schedule(20.0, END, 2)
    q.schedule(20.0 + 1e-12, END, 3)
    q.schedule(20.0 + 1e-12, ARRIVAL, 4)
    ends, arrivals, _ = q.due(20.0, 1e-9)
    assert ends == [1, 2, 3]  # job 1 (due since 10), 2, and 3 a hair after 20, taken with 2
    assert arrivals == [] and q.peek() == 20.0 + 1e-12  # the arrival keeps its own time
