"""The job state machine (``hpcsched.runtime.lifecycle``) as tables: every (state, event) pair and its outcome,
and the rules that turn a task's exit and an attempt's end into an event. Pure: no store, no controller."""

from __future__ import annotations

import pytest

from hpcsched.runtime.lifecycle import TABLE, Action, Event, State, attempt_end, exit_event, next_state

P, R, S = State.PENDING, State.RUNNING, State.STOPPING
C, F, X = State.COMPLETED, State.FAILED, State.CANCELLED
E = Event
A = Action

# Every pair, written out: (state, event) -> (next state, action).
EXPECTED: dict[tuple[State, Event], tuple[State, Action]] = {
    (P, E.START): (R, A.LAUNCH),
    (P, E.STOP): (P, A.IGNORE),
    (P, E.CANCEL): (X, A.DROP),
    (P, E.TASK_EXIT_OK): (P, A.IGNORE),  # a task of an earlier attempt reporting late
    (P, E.TASK_FAILED): (P, A.IGNORE),
    (P, E.WORKER_LOST): (P, A.IGNORE),
    (P, E.ATTEMPT_DONE): (P, A.IGNORE),
    (P, E.ATTEMPT_FAILED): (P, A.IGNORE),
    (P, E.RETRY_EXHAUSTED): (P, A.IGNORE),
    (P, E.ATTEMPT_CANCELLED): (P, A.IGNORE),
    (P, E.ATTEMPT_STOPPED): (P, A.IGNORE),

    (R, E.START): (R, A.IGNORE),
    (R, E.STOP): (S, A.STOP),
    (R, E.CANCEL): (S, A.STOP),  # cancel of a running job goes through stopping
    (R, E.TASK_EXIT_OK): (R, A.WAIT),
    (R, E.TASK_FAILED): (S, A.STOP_FAILED),
    (R, E.WORKER_LOST): (S, A.STOP_FAILED),
    (R, E.ATTEMPT_DONE): (C, A.COMPLETE),
    (R, E.ATTEMPT_FAILED): (P, A.RETRY),
    (R, E.RETRY_EXHAUSTED): (F, A.GIVE_UP),
    (R, E.ATTEMPT_CANCELLED): (X, A.END_CANCELLED),
    (R, E.ATTEMPT_STOPPED): (P, A.REQUEUE),

    (S, E.START): (S, A.IGNORE),
    (S, E.STOP): (S, A.IGNORE),
    (S, E.CANCEL): (S, A.RETARGET),  # a cancel overrides a preempt or resize already under way
    (S, E.TASK_EXIT_OK): (S, A.WAIT),
    (S, E.TASK_FAILED): (S, A.WAIT),  # a task stopped by SIGTERM may exit non-zero
    (S, E.WORKER_LOST): (S, A.WAIT),
    (S, E.ATTEMPT_DONE): (C, A.COMPLETE),
    (S, E.ATTEMPT_FAILED): (P, A.RETRY),
    (S, E.RETRY_EXHAUSTED): (F, A.GIVE_UP),
    (S, E.ATTEMPT_CANCELLED): (X, A.END_CANCELLED),
    (S, E.ATTEMPT_STOPPED): (P, A.REQUEUE),
}
for _final in (C, F, X):
    for _e in Event:
        EXPECTED[_final, _e] = (_final, A.REFUSE if _e is E.CANCEL else A.IGNORE)


def test_the_table_lists_every_pair() -> None:
    """No (state, event) pair is left to a default the reader cannot see."""
    assert set(EXPECTED) == {(s, e) for s in State for e in Event} == set(TABLE)


@pytest.mark.parametrize(("state", "event"), sorted(EXPECTED))
def test_next_state(state: State, event: Event) -> None:
    """Each pair's outcome, also reached from the plain string the store holds."""
    assert next_state(state, event) == EXPECTED[state, event]
    assert next_state(str(state.value), event) == EXPECTED[state, event]


@pytest.mark.parametrize(("code", "lost", "event"), [
    (0, False, E.TASK_EXIT_OK),
    (1, False, E.TASK_FAILED),
    (137, False, E.TASK_FAILED),  # killed by a signal, as a shell reports it
    (127, False, E.TASK_FAILED),  # could not start
    (-9, False, E.TASK_FAILED),
    (-9, True, E.WORKER_LOST),
    (-1, True, E.WORKER_LOST),
])
def test_exit_event(code: int, lost: bool, event: Event) -> None:
    """Any non-zero exit fails the attempt; a lost task says so."""
    assert exit_event(code, lost) is event


# (state, stop_reason, codes, done, steps, steps_done, restarts) -> (event, short); max_restarts is 2
ENDS = [
    # every task exited 0 on its own
    (R, None, [0, 0], False, None, 0, 0, E.ATTEMPT_DONE, False),
    (R, None, [0], False, 10, 10, 0, E.ATTEMPT_DONE, False),
    (R, None, [0], True, 10, 3, 0, E.ATTEMPT_DONE, False),  # the program said it was done
    # a job that declares steps and exits 0 short of them fails, and is retried by the policy
    (R, None, [0], False, 10, 0, 0, E.ATTEMPT_FAILED, True),
    (R, None, [0], False, 10, 9, 1, E.ATTEMPT_FAILED, True),
    (R, None, [0], False, 10, 9, 2, E.RETRY_EXHAUSTED, True),
    # a failed attempt: retried while restarts + 1 <= max_restarts
    (S, "failed", [1, -9], False, 10, 3, 0, E.ATTEMPT_FAILED, False),
    (S, "failed", [1], False, None, 0, 1, E.ATTEMPT_FAILED, False),
    (S, "failed", [1], False, None, 0, 2, E.RETRY_EXHAUSTED, False),
    # done before a preempt / resize stop landed: complete even though SIGTERM made the launcher exit 1
    (S, "preempt", [1], True, 10, 10, 0, E.ATTEMPT_DONE, False),
    (S, "resize", [1], True, 10, 10, 0, E.ATTEMPT_DONE, False),
    (S, "failed", [0], True, 10, 10, 0, E.ATTEMPT_DONE, False),  # every task exited 0 and it was done
    (S, "failed", [1], True, 10, 10, 0, E.ATTEMPT_FAILED, False),
    # stopped on purpose
    (S, "preempt", [0], False, 10, 3, 0, E.ATTEMPT_STOPPED, False),
    (S, "resize", [143], False, 10, 3, 5, E.ATTEMPT_STOPPED, False),  # no restart counted
    (S, "cancel", [0], False, 10, 3, 0, E.ATTEMPT_CANCELLED, False),
    (S, "cancel", [1], True, 10, 10, 0, E.ATTEMPT_CANCELLED, False),
    (S, "preempt", [-1], False, None, 0, 0, E.ATTEMPT_STOPPED, False),  # never started
    # an elastic job whose in-place resize did not report yet ends like any running attempt
    (R, "in-place", [0], False, 10, 10, 0, E.ATTEMPT_DONE, False),
    (R, "in-place", [0], False, 10, 4, 0, E.ATTEMPT_FAILED, True),
]


@pytest.mark.parametrize(("state", "reason", "codes", "done", "steps", "steps_done", "restarts", "event", "short"),
                         ENDS)
def test_attempt_end(state: State, reason: str | None, codes: list[int], done: bool, steps: int | None,
                     steps_done: int, restarts: int, event: Event, short: bool) -> None:
    """How an attempt whose tasks have all exited ended."""
    assert attempt_end(state, reason, codes, done, steps, steps_done, restarts, max_restarts=2) == (event, short)
