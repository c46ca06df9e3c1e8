"""The controller's lock: the scheduling step goes first, reentrancy, and the bound on waiting handlers."""

from __future__ import annotations

import threading

import pytest

from hpcsched.runtime.steplock import StepFirstLock, WaitBound

WAIT_S = 30.0  # a generous bound for threads to reach their waits at load 8; nothing here sleeps for it


def test_first_waiter_goes_before_earlier_plain_waiters() -> None:
    lock = StepFirstLock()
    order: list[str] = []
    plain_waiting = threading.Barrier(4)  # three plain threads + this one
    lock.acquire()

    def plain(k: int) -> None:
        plain_waiting.wait(WAIT_S)
        with lock:
            order.append(f"plain{k}")

    def step() -> None:
        with lock.first():
            order.append("step")

    plains = [threading.Thread(target=plain, args=(k,)) for k in range(3)]
    for t in plains:
        t.start()
    plain_waiting.wait(WAIT_S)  # the plain threads are about to wait: they came first
    stepper = threading.Thread(target=step)
    stepper.start()
    with lock._cond:  # until the step thread waits too
        assert lock._cond.wait_for(lambda: lock._first_waiting == 1, WAIT_S)
    lock.release()
    for t in [*plains, stepper]:
        t.join(WAIT_S)
        assert not t.is_alive()
    assert order[0] == "step", order  # whoever of the plain ones reached the lock first, the step was before them
    assert sorted(order[1:]) == ["plain0", "plain1", "plain2"]


def test_plain_waiter_not_held_once_the_step_is_done() -> None:
    lock = StepFirstLock()
    with lock.first():
        with lock:  # reentrant, whichever way it is asked
            with lock.first():
                pass
    assert lock.acquire(blocking=False)
    lock.release()
    done = threading.Event()
    t = threading.Thread(target=lambda: (lock.acquire(), done.set(), lock.release()))
    t.start()
    assert done.wait(WAIT_S)
    t.join(WAIT_S)


def test_timeout_and_foreign_release() -> None:
    lock = StepFirstLock()
    lock.acquire()
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(lock.acquire(timeout=0.01)))
    t.start()
    t.join(WAIT_S)
    assert got == [False]
    t = threading.Thread(target=lambda: got.append(lock.acquire(blocking=False, first=True)))
    t.start()
    t.join(WAIT_S)
    assert got == [False, False] and lock._first_waiting == 0  # a failed first acquire leaves no one waiting
    errors: list[BaseException] = []

    def foreign() -> None:
        try:
            lock.release()
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=foreign)
    t.start()
    t.join(WAIT_S)
    assert len(errors) == 1
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()


def test_wait_bound_refuses_and_counts() -> None:
    bound = WaitBound(2)
    assert bound.try_enter() and bound.try_enter()
    assert not bound.try_enter() and not bound.try_enter()
    assert bound.refused == 2
    bound.leave()
    assert bound.try_enter()
    assert bound.refused == 2


def test_refuse_if_full_counts_only_when_full() -> None:
    bound = WaitBound(1)
    assert not bound.refuse_if_full()
    assert bound.try_enter()
    assert bound.refuse_if_full() and bound.refused == 1
    bound.leave()
    assert not bound.refuse_if_full() and bound.refused == 1 and bound.inside == 0
