"""Registrations committed in groups (``GroupCommit``): a registration storm pays one lock hold and one store
transaction per group of Registers, not per Register.

Why: every Register used to take the controller's lock and write its own transaction, one at a time. In a storm of
10,000 pilots the handlers queued for that lock (each hand-over wakes every waiter, and on a 2-core machine the
holder waits for the GIL behind them), at most ``liveness.LOCK_WAITING_CALLS`` waited and the rest were shed: the
storm went at ~300 registrations a second while a handler's own work took 0.37 ms (34.7 s for 10,000 on a quiet
machine, against a goal of 30 s).

How: a Register is checked outside the lock, then queued, and its handler thread waits for its outcome. One of the
waiting handlers at a time is the leader: it takes up to ``max_batch`` queued registrations (oldest first), runs
``commit`` on them (the controller's one lock hold and one transaction, events in it), hands each its outcome, and
then passes the lead to the oldest registration still queued, so a waiting handler is woken exactly once: with its
outcome or with the lead. Nothing is answered before its group's transaction committed, so a ``kill -9`` of the
controller loses no acknowledged registration. No thread of its own: a lone Register leads itself at once.

Bound: each queued Register holds a server thread while it waits (the thread-pool server has no other way to
wait), so at most ``bound`` wait (queued or being committed); the next is refused at once (``submit`` returns
None) and the controller tells it when to come back (``pacing.RegisterPacer``), as before, but now for a queue
that is truly full.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Req = TypeVar("Req")
Reply = TypeVar("Reply")

# Registers that may wait at once (each holds one of the server's 48 threads), and the most one group commits. The
# rest of the pool stays for heartbeats, submits and queries (each bounded on its own: liveness, server.QUERY_SLOTS).
REGISTER_WAITING = 24
MAX_BATCH = 256


class _Entry(Generic[Req, Reply]):
    __slots__ = ("req", "reply", "error", "woken", "leads")

    def __init__(self, req: Req) -> None:
        self.req = req
        self.reply: Reply | None = None
        self.error: BaseException | None = None
        self.woken = threading.Event()
        self.leads = False  # woken to lead, not with an outcome


class GroupCommit(Generic[Req, Reply]):
    """Queued requests committed ``max_batch`` at a time by one of their own handlers (module docstring); thread-safe.

    ``commit(reqs)`` returns one outcome per request, in order: its reply, or the exception that request is answered
    with (a refusal of that one alone). An exception ``commit`` raises is every request's of that group."""

    def __init__(self, commit: Callable[[Sequence[Req]], list[Reply | BaseException]],
                 bound: int = REGISTER_WAITING, max_batch: int = MAX_BATCH) -> None:
        self._commit = commit
        self.bound, self.max_batch = bound, max_batch
        self._mu = threading.Lock()
        self._queue: deque[_Entry[Req, Reply]] = deque()
        self._leading = False  # a handler leads now (drains the queue)
        self._inflight = 0  # queued, or in the group being committed: each holds a server thread
        self.groups = 0  # groups committed (one lock hold and one transaction each)
        self.committed = 0  # requests in them
        self.largest = 0  # the largest group
        self.refused = 0  # requests refused because ``bound`` already waited

    def waiting(self) -> int:
        """Requests waiting now: queued, or in the group being committed."""
        with self._mu:
            return self._inflight

    def submit(self, req: Req) -> Reply | None:
        """Commit ``req`` in a group and return its reply (or raise its exception), once its group has committed;
        None at once, counted in ``refused``, when ``bound`` requests already wait."""
        entry: _Entry[Req, Reply] = _Entry(req)
        with self._mu:
            if self._inflight >= self.bound:
                self.refused += 1
                return None
            self._inflight += 1
            self._queue.append(entry)
            lead = not self._leading
            self._leading = True
        if not lead:
            entry.woken.wait()
            lead = entry.leads
        while lead:
            self._lead_once()
            if entry.woken.is_set() and not entry.leads:
                break  # committed in a group this thread led; the lead was passed on
            entry.woken.wait()  # this thread's request is still queued: it gets its outcome or the lead again
            lead = entry.leads
        if entry.error is not None:
            raise entry.error
        return entry.reply

    def _lead_once(self) -> None:
        """Commit one group from the head of the queue, give each its outcome, and pass the lead on."""
        with self._mu:
            group = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
        try:
            outcomes: list = self._commit([e.req for e in group])
            if len(outcomes) != len(group):
                raise RuntimeError(f"commit returned {len(outcomes)} outcomes for {len(group)} requests")
        except BaseException as e:  # noqa: BLE001 (the group's answer, raised in each of its handlers)
            outcomes = [e] * len(group)
        with self._mu:
            self.groups += 1
            self.committed += len(group)
            self.largest = max(self.largest, len(group))
            self._inflight -= len(group)
            for entry, outcome in zip(group, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    entry.error = outcome
                else:
                    entry.reply = outcome
                entry.leads = False
                entry.woken.set()
            if self._queue:  # the oldest waiter leads next: it is woken once, to commit its own group
                nxt = self._queue[0]
                nxt.leads = True
                nxt.woken.set()
            else:
                self._leading = False
