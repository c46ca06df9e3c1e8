"""The controller's lock, on which the scheduling step goes first, and the bound on RPC handlers waiting for it.

``StepFirstLock`` is a reentrant lock with one rule more than ``threading.RLock``: while a thread waits in
``acquire(first=True)`` (the scheduling step), a thread calling plain ``acquire`` waits until every such waiter has
had the lock, even if the lock is free for a moment. In a submit or registration storm the step otherwise
competed with dozens of SubmitMany / Register / Leave handlers for each hand-over and waited for a third of its time
(decision p99 2-4 s at 10,000 workers and 100,000 queued jobs), while each of those handlers held it only briefly.
A thread that already holds the lock re-enters at once, whichever way it asks.

``WaitBound`` admits at most ``n`` callers at once to wait for (and hold) the lock; the next is refused at once
(``try_enter`` is False) instead of taking a server thread for the whole wait: the pool's threads stay free for the
heartbeats that need no lock.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType


class StepFirstLock:
    """A reentrant lock on which ``acquire(first=True)`` waiters are served before plain ones (module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._first_waiting = 0  # threads in acquire(first=True) that do not hold the lock yet
        self.first_wait_s = 0.0  # seconds acquire(first=True) waited for the lock in all (the step's share of waiting)

    def acquire(self, blocking: bool = True, timeout: float = -1, first: bool = False) -> bool:
        """Take the lock (``threading.RLock.acquire``'s ``blocking`` and ``timeout``); ``first``: before any plain
        waiter, including those that came earlier. Returns whether it was taken."""
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            if first:
                self._first_waiting += 1
            try:
                if not blocking:
                    if not self._free(first):
                        return False
                elif not self._free(first):
                    t0 = time.perf_counter()
                    got = self._cond.wait_for(lambda: self._free(first), None if timeout < 0 else timeout)
                    if first:
                        self.first_wait_s += time.perf_counter() - t0
                    if not got:
                        return False
                self._owner, self._depth = me, 1
                return True
            finally:
                if first:
                    self._first_waiting -= 1
                    if not self._first_waiting:
                        self._cond.notify_all()  # plain waiters held back only by this one may go now

    def held(self) -> bool:
        """Whether the calling thread holds the lock."""
        with self._cond:
            return self._owner == threading.get_ident()

    def _free(self, first: bool) -> bool:
        return self._owner is None and (first or not self._first_waiting)

    def release(self) -> None:
        """Release one level; the last one frees the lock. RuntimeError from a thread that does not hold it."""
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of a StepFirstLock this thread does not hold")
            self._depth -= 1
            if not self._depth:
                self._owner = None
                self._cond.notify_all()

    def first(self) -> _First:
        """``with lock.first():`` the lock taken before every plain waiter (the scheduling step)."""
        return _First(self)

    def __enter__(self) -> StepFirstLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


class _First:
    def __init__(self, lock: StepFirstLock) -> None:
        self.lock = lock

    def __enter__(self) -> StepFirstLock:
        self.lock.acquire(first=True)
        return self.lock

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.lock.release()


class WaitBound:
    """At most ``n`` callers at once past ``try_enter``; the others are refused and counted (``refused``)."""

    def __init__(self, n: int) -> None:
        self._slots = threading.BoundedSemaphore(n)
        self._count = threading.Lock()
        self.n = n
        self.refused = 0
        self.inside = 0  # admitted now

    def try_enter(self) -> bool:
        """True: admitted (call ``leave`` after); False: ``n`` are in already, counted in ``refused``."""
        admitted = self._slots.acquire(blocking=False)
        with self._count:
            if admitted:
                self.inside += 1
            else:
                self.refused += 1
        return admitted

    def refuse_if_full(self) -> bool:
        """True (counted in ``refused``) when ``n`` are in now: a caller skips costly work it would do before
        ``try_enter``. A hint: a slot may free at once, and ``try_enter`` may still refuse."""
        with self._count:
            if self.inside < self.n:
                return False
            self.refused += 1
            return True

    def leave(self) -> None:
        with self._count:
            self.inside -= 1
        self._slots.release()
