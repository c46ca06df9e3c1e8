"""A job's life as an explicit transition table: which state an event leads to and what the controller must do.

Kept apart from the controller so that the rules can be read (and tested) in one place, without a store, a
lock or a worker: ``next_state(state, event)`` is a lookup in ``TABLE``, and the two facts that need more
than the state (what a task's exit means, what an attempt's end means) are classified first by
``exit_event`` and ``attempt_end``. The controller does the writes (store, events, log lines) an ``Action``
names.

States: ``pending`` (queued, or back in the queue to resume from its checkpoint), ``running`` (an attempt's
tasks are placed), ``stopping`` (its tasks were told to stop; the attempt ends when all have exited), and
the final ``completed``, ``failed``, ``cancelled``. A job's ``stop_reason`` while stopping says why
(``preempt``, ``resize``, ``failed``, ``cancel``); a running elastic Horovod job whose in-place resize has
not been seen at its new size yet carries ``IN_PLACE``.
"""

from __future__ import annotations

from enum import StrEnum

IN_PLACE = "in-place"  # stop_reason of a running job whose in-place resize has not reported its new size yet
IN_PLACE_TIMEOUT_S = 60.0  # an in-place resize not seen at its new size by then falls back to stop/relaunch


class State(StrEnum):
    """A job's ``state`` column; equal to the strings the store holds."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE = (State.PENDING, State.RUNNING, State.STOPPING)
FINAL = (State.COMPLETED, State.FAILED, State.CANCELLED)


class Event(StrEnum):
    """What can happen to a job."""

    START = "start"  # the scheduler placed it
    STOP = "stop"  # stop requested: preempt, resize, its worker leaving, an in-place resize timing out
    CANCEL = "cancel"  # the user cancelled it
    TASK_EXIT_OK = "task_exit_ok"  # one task of the attempt exited 0
    TASK_FAILED = "task_failed"  # one task exited non-zero, was killed by a signal, or could not start
    WORKER_LOST = "worker_lost"  # one task was lost with its worker (silent, left, or restarted without it)
    ATTEMPT_DONE = "attempt_done"  # every task has exited and the job finished (see attempt_end)
    ATTEMPT_FAILED = "attempt_failed"  # every task has exited, the attempt failed, the retry policy allows more
    RETRY_EXHAUSTED = "retry_exhausted"  # the attempt failed and no retries are left
    ATTEMPT_CANCELLED = "attempt_cancelled"  # every task has exited after a cancel
    ATTEMPT_STOPPED = "attempt_stopped"  # every task has exited after a preempt or resize: back to the queue


class Action(StrEnum):
    """What the controller does for a transition."""

    IGNORE = "ignore"  # nothing: the event does not apply to this state (a stale report, a repeated request)
    REFUSE = "refuse"  # tell the caller no (cancel of a finished job)
    LAUNCH = "launch"  # write the attempt's tasks (a new generation)
    STOP = "stop"  # tell the tasks to stop with a checkpoint (stop_reason: the request's)
    STOP_FAILED = "stop_failed"  # the attempt failed: stop the other tasks (no checkpoint), record why
    RETARGET = "retarget"  # already stopping: only the stop reason changes (a cancel overrides a preempt)
    DROP = "drop"  # a queued job ends without ever stopping anything
    WAIT = "wait"  # other tasks of the attempt are still running: the attempt ends with the last one
    COMPLETE = "complete"  # the job is done
    RETRY = "retry"  # back to the queue, one restart counted; it resumes from its checkpoint
    GIVE_UP = "give_up"  # failed for good
    END_CANCELLED = "end_cancelled"  # the cancelled attempt has stopped
    REQUEUE = "requeue"  # back to the queue, no restart counted (preempt or resize)


_ATTEMPT_ENDS = {
    Event.ATTEMPT_DONE: (State.COMPLETED, Action.COMPLETE),
    Event.ATTEMPT_FAILED: (State.PENDING, Action.RETRY),
    Event.RETRY_EXHAUSTED: (State.FAILED, Action.GIVE_UP),
    Event.ATTEMPT_CANCELLED: (State.CANCELLED, Action.END_CANCELLED),
    Event.ATTEMPT_STOPPED: (State.PENDING, Action.REQUEUE),
}


def _table() -> dict[tuple[State, Event], tuple[State, Action]]:
    """Every (state, event) pair; a pair not written out below leaves the state as it is and does nothing."""
    t = {(s, e): (s, Action.IGNORE) for s in State for e in Event}
    t[State.PENDING, Event.START] = (State.RUNNING, Action.LAUNCH)
    t[State.PENDING, Event.CANCEL] = (State.CANCELLED, Action.DROP)
    for s in (State.RUNNING, State.STOPPING):
        t[s, Event.TASK_EXIT_OK] = (s, Action.WAIT)
        for e, outcome in _ATTEMPT_ENDS.items():
            t[s, e] = outcome
    t[State.RUNNING, Event.STOP] = (State.STOPPING, Action.STOP)
    t[State.RUNNING, Event.CANCEL] = (State.STOPPING, Action.STOP)  # a running job is cancelled via stopping
    t[State.RUNNING, Event.TASK_FAILED] = (State.STOPPING, Action.STOP_FAILED)
    t[State.RUNNING, Event.WORKER_LOST] = (State.STOPPING, Action.STOP_FAILED)
    t[State.STOPPING, Event.CANCEL] = (State.STOPPING, Action.RETARGET)
    t[State.STOPPING, Event.TASK_FAILED] = (State.STOPPING, Action.WAIT)  # a task stopped by SIGTERM may exit != 0
    t[State.STOPPING, Event.WORKER_LOST] = (State.STOPPING, Action.WAIT)
    for s in FINAL:
        t[s, Event.CANCEL] = (s, Action.REFUSE)
    return t


TABLE: dict[tuple[State, Event], tuple[State, Action]] = _table()


def next_state(state: str, event: Event) -> tuple[State, Action]:
    """The state ``event`` leads a job in ``state`` to, and what the controller must do for it."""
    return TABLE[State(state), event]


def exit_event(code: int, lost: bool = False) -> Event:
    """What one task's exit is to its job: a lost task and any non-zero code fail the attempt."""
    if lost:
        return Event.WORKER_LOST
    return Event.TASK_EXIT_OK if code == 0 else Event.TASK_FAILED


def short_of_steps(state: str, steps: int | None, steps_done: int, done: bool) -> bool:
    """A running job that declares steps and whose tasks all ended before the last one, without the program
    reporting itself done, did not finish: a rank that died before its first step exited 0 under a launcher
    that lost its code, and the job was "completed at step 0"."""
    return state == State.RUNNING and bool(steps) and not done and steps_done < (steps or 0)


def attempt_end(state: str, stop_reason: str | None, codes: list[int | None], done: bool, steps: int | None,
                steps_done: int, restarts: int, max_restarts: int) -> tuple[Event, bool]:
    """What the end of an attempt (every task of its generation exited with ``codes``) is, and whether it
    ended short of the declared steps (the job's message then says so).

    Done = every task exited 0 on its own (and not short), or the program reported its last step
    (checkpointed) before a preempt / resize stop landed: a launcher stopped by SIGTERM exits non-zero even
    then. Otherwise the stop reason decides: ``cancel`` ends it, ``failed`` (or short) retries while
    ``restarts + 1 <= max_restarts``, anything else (preempt, resize) puts it back in the queue."""
    short = short_of_steps(state, steps, steps_done, done)
    if (all(c == 0 for c in codes) and (state == State.RUNNING or done) and not short) or \
            (done and state == State.STOPPING and stop_reason in ("preempt", "resize")):
        return Event.ATTEMPT_DONE, False
    reason = "failed" if short else stop_reason
    if reason == "cancel":
        return Event.ATTEMPT_CANCELLED, short
    if reason == "failed":
        return (Event.RETRY_EXHAUSTED if restarts + 1 > max_restarts else Event.ATTEMPT_FAILED), short
    return Event.ATTEMPT_STOPPED, short


def retry_delay(retry: int, base_s: float, cap_s: float) -> float:
    """Seconds the ``retry``-th retry of a failed job waits (1: the first). The first is at once (a lost node, a
    transient error: resumed as before), then ``base_s`` doubling up to ``cap_s``: a job failing on a full disk
    burnt all its attempts in 20 s, and each attempt took the disk's last space from the others."""
    if retry <= 1 or base_s <= 0:
        return 0.0
    return min(cap_s, base_s * 2.0 ** min(retry - 2, 60))
