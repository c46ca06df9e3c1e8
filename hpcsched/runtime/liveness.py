"""Heartbeats that scale: how often a worker beats, and how much one heartbeat may ask of the controller.

Interval: every worker beating once a second sends 10,000 RPCs a second to one Python process at 10,000
workers. The controller budgets ``heartbeat_rate`` heartbeats a second and tells every worker its interval in
each RegisterReply and HeartbeatReply: ``max(heartbeat_interval_s, workers / heartbeat_rate)``, capped at
``worker_timeout_s / 3`` so a dead worker is still noticed within ``worker_timeout_s`` (three missed beats).
Where the cap binds the rate is exceeded; the controller says so once, naming the setting to raise (Slurm
pings slurmd at SlurmdTimeout/3 for the same reason).

Size: a heartbeat lists at most the worker's own tasks. A worker runs at most ``MAX_GROUP`` co-located jobs on
each slot, and keeps an exited task until the controller tells it to forget it, so a report may hold
``MAX_GROUP * slots + EXTRA_TASKS`` task entries and ``MAX_PROGRESS`` progress reports per entry. A larger one is
refused before the controller's lock is taken (150,000 bogus entries held the lock 17 s and a live worker was
declared lost meanwhile): the check reads only the worker's registered slots.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

from hpcsched.interleave.period import MAX_GROUP
from hpcsched.runtime.rpc import pb

EXTRA_TASKS = 32  # exited tasks not yet forgotten, released in-place tasks, beyond the slots' worth
MAX_PROGRESS = 1000  # progress reports per task in one heartbeat (a program reporting every step for an interval)
FULL_EVERY = 10  # a worker sends every task (not only those with news) at least every this many beats


# Heartbeats that may wait for the controller's lock at once (the others are lease-only and never wait). A long
# scheduling step otherwise let them take every server thread (2,400 of 42,020 heartbeats at 10,000 workers, 36 a
# second through a 2 s step), and the lease-only ones then queued behind them; past this many, a heartbeat with
# news renews the lease and is refused RESOURCE_EXHAUSTED at once, and the worker sends its news after a back-off.
LOCK_WAITING_BEATS = 16
# How such a refusal starts: the controller renewed the lease as of the call, and the worker counts it renewed from
# when it sent the heartbeat (``shed_renewed``). Without it a worker shed a few times in a row, its back-off doubling
# to ``BUSY_BACKOFF_S``, let its own lease run out and stopped its tasks while the controller still held it alive.
RENEWED_PREFIX = "lease renewed:"
# Leave, Submit and SubmitMany calls that may wait for (or hold) the lock at once, for the same reason: in a
# registration or submit storm they filled the pool and heartbeats waited up to 6.7 s for a server thread. The next
# one is refused RESOURCE_EXHAUSTED at once with a message starting ``SHED_PREFIX``, and the client (``hpcsched
# submit``) retries a refusal that says so. Registers are bounded apart, as they wait for their group's commit
# (``register_queue.REGISTER_WAITING``), and a shed one is told when to come back.
LOCK_WAITING_CALLS = 16
SHED_PREFIX = "controller busy:"

# A shed call may say when to come back: milliseconds in this trailing metadata key. The controller sets it on a shed
# Register from how many shed workers wait and how fast it registers (``pacing.RegisterPacer``), so a storm is paced
# by the controller instead of each worker guessing with its own back-off (``told_retry_after``).
RETRY_AFTER_HEADER = "x-hpcsched-retry-after-ms"
MAX_RETRY_AFTER_S = 30.0  # the most a worker takes from it (a larger or broken value is clamped)

BUSY_CODES = ("DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED")  # a call failed because the controller is busy
BUSY_BACKOFF_S = 10.0  # the most a worker waits before trying a busy controller again (else: two intervals)


def keeps_registration(method: str, code: str) -> bool:
    """Whether a worker whose ``method`` call failed with ``code`` is still registered. A Heartbeat that timed out or
    was shed by a busy controller (``BUSY_CODES``) changes nothing on the controller's side: it holds the worker until
    ``worker_timeout_s`` of silence and says ``reregister`` if it has dropped it, so the worker beats again after its
    back-off. Registering again instead added a Register to the storm for every late heartbeat (808 of 10,000
    workers in one 10,000-worker run, each after a Heartbeat DEADLINE_EXCEEDED). Any other failure (a refused
    credential, an unreachable controller that may come back as a new process) registers again, as before."""
    return method == "Heartbeat" and code in BUSY_CODES


def shed_renewed(method: str, code: str, details: str | None) -> bool:
    """Whether a failed ``method`` call renewed the worker's lease all the same: a Heartbeat the controller shed
    (``RENEWED_PREFIX``), so the worker's lease runs from when it sent it."""
    return method == "Heartbeat" and code == "RESOURCE_EXHAUSTED" and (details or "").startswith(RENEWED_PREFIX)


def retry_after(backoff: float, code: str, interval: float, rng: random.Random) -> tuple[float, float]:
    """How long a worker waits after a failed call, and its next back-off: "equal jitter" (half to all of the back-off,
    seeded per daemon), doubling up to two intervals, or up to ``BUSY_BACKOFF_S`` when the controller is busy (a
    registration storm: thousands of daemons whose calls timed out together retried within 0.2-2 s of each other
    and timed out again)."""
    cap = max(interval * 2, BUSY_BACKOFF_S) if code in BUSY_CODES else interval * 2
    return backoff * rng.uniform(0.5, 1.0), min(backoff * 2, cap)


def told_retry_after(trailing: Iterable[tuple[str, str | bytes]] | None) -> float | None:
    """The seconds a refusal's trailing metadata told the caller to wait (``RETRY_AFTER_HEADER``), clamped to
    ``0..MAX_RETRY_AFTER_S``; None when it told nothing (or nothing readable)."""
    for key, value in trailing or ():
        if key != RETRY_AFTER_HEADER:
            continue
        try:
            ms = float(value.decode() if isinstance(value, bytes) else value)
        except (ValueError, UnicodeDecodeError):
            return None
        return min(max(ms / 1e3, 0.0), MAX_RETRY_AFTER_S) if math.isfinite(ms) else None
    return None


def interval_s(workers: int, base_s: float, rate: float, timeout_s: float) -> tuple[float, bool]:
    """The heartbeat interval for a fleet of ``workers`` (rules in the module docstring), and whether the
    ``worker_timeout_s / 3`` cap bound it (the rate budget is then exceeded)."""
    fleet, cap = workers / rate, timeout_s / 3
    if fleet <= base_s:
        return base_s, False  # an operator's own heartbeat_interval_s is kept, as before
    if fleet <= cap:
        return fleet, False
    return max(base_s, cap), True


def heartbeat_problem(req: pb.HeartbeatRequest, slots: int) -> str:
    """Why a heartbeat is too large to process ('' when it is not), for a worker registered with ``slots``."""
    most = MAX_GROUP * max(slots, 0) + EXTRA_TASKS
    if len(req.tasks) > most:
        return (f"{len(req.tasks)} task entries, more than a worker of {slots} slots may report "
                f"(at most {most}: its own tasks)")
    for t in req.tasks:
        if len(t.progress) > MAX_PROGRESS:
            return (f"task {t.task_id[:60]!r}: {len(t.progress)} progress reports in one heartbeat "
                    f"(at most {MAX_PROGRESS})")
    return ""
