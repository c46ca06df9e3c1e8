"""When a shed registration should come back (``RegisterPacer``): a registration storm paced by the controller.

Why: when thousands of pilots start together, at most ``register_queue.REGISTER_WAITING`` Registers wait for their
group's commit and the others are shed (RESOURCE_EXHAUSTED). Each shed worker used to guess its own wait: an
exponential back-off from 0.1 s up to ``liveness.BUSY_BACKOFF_S``. Early on that is thousands of retries a second,
each a whole RPC for the server to take and refuse (16,841 Registers ended CANCELLED and 8,784 were shed at 10,000
workers), and late it is workers asleep for up to 10 s while the controller has room: 10,000 workers took 50 s to
register on a quiet machine, against the goal of 30 s.

The controller knows what a worker cannot: how many shed workers still wait (the backlog: shed and not registered
since, forgotten after ``FORGET_S``) and how fast it registers now (registrations in the last ``WINDOW_S``; a prior
of ``PRIOR_RATE`` until it has seen ``MIN_SEEN``). A shed worker is told to come back at a uniformly random moment
of the backlog's drain time (``liveness.RETRY_AFTER_HEADER``), at least ``MIN_RETRY_S``, at most
``liveness.BUSY_BACKOFF_S``: the backlog comes back spread at about the rate the controller takes it.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable

from hpcsched.runtime.liveness import BUSY_BACKOFF_S

WINDOW_S = 2.0
MIN_SEEN = 32  # registrations in the window before the measured rate replaces the prior
PRIOR_RATE = 300.0  # registrations a second (10,000 in ~35 s on the 2-core machine, shed ones included)
MIN_RETRY_S = 0.5
FORGET_S = 60.0  # a shed worker not heard again within this has gone (or will be told anew when it comes back)


class RegisterPacer:
    """The backlog of shed workers and the registration rate (module docstring); thread-safe."""

    def __init__(self, rng: random.Random, clock: Callable[[], float] = time.monotonic) -> None:
        self._rng, self._clock = rng, clock
        self._lock = threading.Lock()
        self._done: deque[float] = deque()  # when each registration of the last WINDOW_S happened
        self._waiting: dict[str, float] = {}  # shed worker -> when it was last shed (oldest first)
        self.told = 0  # retry-afters told

    def registered(self, worker_id: str) -> None:
        """A registration went through: it counts toward the rate, and the worker leaves the backlog."""
        with self._lock:
            now = self._clock()
            self._done.append(now)
            self._prune(now)
            self._waiting.pop(worker_id, None)

    def registered_many(self, worker_ids: list[str]) -> None:
        """A group of registrations went through (``register_queue``): ``registered`` for each, one lock hold."""
        with self._lock:
            now = self._clock()
            for wid in worker_ids:
                self._done.append(now)
                self._waiting.pop(wid, None)
            self._prune(now)

    def retry_after(self, worker_id: str) -> float:
        """Seconds the shed ``worker_id`` should wait before registering again (module docstring)."""
        with self._lock:
            now = self._clock()
            self._waiting.pop(worker_id, None)  # to the end: the dict stays in order of last shed
            self._waiting[worker_id] = now
            self._prune(now)
            rate = len(self._done) / WINDOW_S if len(self._done) >= MIN_SEEN else PRIOR_RATE
            drain = len(self._waiting) / rate
            self.told += 1
            return min(MIN_RETRY_S + self._rng.uniform(0.0, drain), BUSY_BACKOFF_S)

    def backlog(self) -> int:
        """Shed workers waiting to come back now."""
        with self._lock:
            self._prune(self._clock())
            return len(self._waiting)

    def _prune(self, now: float) -> None:
        while self._done and now - self._done[0] > WINDOW_S:
            self._done.popleft()
        while self._waiting:
            wid, at = next(iter(self._waiting.items()))
            if now - at <= FORGET_S:
                break
            del self._waiting[wid]
