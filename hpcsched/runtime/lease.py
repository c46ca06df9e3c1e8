"""The lease table: workers' lease renewals in memory shared between the controller and its lease server.

Why: at 10,000 workers most heartbeats say nothing (an idle worker, a task with no news) and only renew the
worker's lease, yet each one went through the controller's thread-pool gRPC server and its one interpreter lock,
where registrations, submissions and scheduling steps also run: a heartbeat whose handler took 0.03 ms waited for a
thread and the GIL, p99 380 ms on a quiet machine. Kubernetes keeps node liveness in Lease objects renewed apart
from node status for the same reason. Here a worker with nothing to report renews at the lease server
(``lease_server``), a process of its own with its own interpreter, which writes the renewal time into this table;
the controller reads the table when it looks for silent workers (``Membership._reap_dead_workers``).

Layout (one ``memfd`` mapping, created by the controller, inherited by the lease server: nothing named to clean up,
gone when both processes are): a header of ``HEADER`` int64 fields, then one ``SLOT_BYTES`` entry per slot:

- renewed: ``time.monotonic_ns()`` of the last renewal (0: never); the controller's clock is the same system-wide
  monotonic clock, so the two processes compare times directly;
- want: non-zero while the controller has orders for the worker (``want``); the lease server's reply then says
  ``heartbeat_now`` and the worker beats the controller, which clears it (``clear_want``);
- digest: SHA-256 of ``worker id, instance, credential`` of the registration holding the slot (zeros: free). A
  renewal must present that credential for that worker and daemon, so a worker cannot renew another's lease, and an
  old daemon of a reused slot renews nothing.

Pushes (``RenewRequest.push``): a worker subscribes its connection to the lease server, and when the controller sets
a slot's ``want`` it also writes the slot number (4 bytes) into a pipe the lease server reads (``wake``: the read end
is passed to the lease server). The lease server then writes an unsolicited reply on that slot's subscribed
connection, so the worker hears of its orders within a round trip without a second connection and stream of its own
(``Orders.Watch``). The pipe is non-blocking: a full one drops the wake-up (counted, ``lease_wakeups_dropped``), and
the worker still learns of its orders from ``want`` at its next renewal, or from its next heartbeat's reply.

Every field is one aligned 8-byte word written whole (``memoryview`` of int64: one store), so a reader never sees a
torn time; a digest read while the controller rewrites it only fails one check, and that worker's next beat goes to
the controller. Slots are assigned at registration and freed when the worker is lost or leaves (controller side
only: ``LeaseTable`` keeps the map); a full table gives a worker no slot, counted, and it beats the controller.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import mmap
import os
import struct
import threading
import time
from typing import Any

log = logging.getLogger("hpcsched.runtime.lease")

MAGIC = 0x6C65617365763032  # "leasev02": the header grew (the push counters)
HEADER = 16  # int64 fields: magic, port, interval (us), renewals, refused, slots, lease server pid, the push counters
SLOT_BYTES = 64  # renewed, want, digest (32 bytes), spare: one cache line
_WORDS = SLOT_BYTES // 8
H_MAGIC, H_PORT, H_INTERVAL_US, H_RENEWALS, H_REFUSED, H_SLOTS, H_PID = range(7)
# written by the lease server only: frames pushed, subscriptions accepted, connections subscribed now, wake-ups for a
# wanted slot with no subscribed connection (that worker learns of its orders at its next renewal or heartbeat)
H_PUSHES, H_SUBSCRIPTIONS, H_SUBSCRIBED, H_PUSH_UNSUBSCRIBED = range(7, 11)
WAKE = struct.Struct("=i")  # one slot number per wake-up, native order: both ends are this machine
_WAKE_CHUNK = 1024  # slots per pipe write: 4,096 bytes, at most PIPE_BUF, so a write is whole or not at all
DEFAULT_SLOTS = 65_536  # 4 MB; beyond this many live registrations the rest beat the controller (counted)


def digest(worker_id: str, instance: str, credential: str) -> bytes:
    """What a slot holds for a registration: only the daemon holding that credential renews it."""
    return hashlib.sha256(f"{worker_id}\0{instance}\0{credential}".encode()).digest()


def table_bytes(slots: int) -> int:
    return HEADER * 8 + slots * SLOT_BYTES


class SharedTable:
    """The mapping, as either process sees it: header fields and slot entries (module docstring)."""

    def __init__(self, fd: int, slots: int) -> None:
        self.fd = fd
        self.slots = slots
        self._map = mmap.mmap(fd, table_bytes(slots))
        self._words = memoryview(self._map).cast("q")
        self._bytes = memoryview(self._map)

    @classmethod
    def create(cls, slots: int = DEFAULT_SLOTS) -> SharedTable:
        """A new zeroed table in an anonymous ``memfd`` (inheritable: the lease server maps the same fd)."""
        fd = os.memfd_create("hpcsched-leases", 0)
        os.ftruncate(fd, table_bytes(slots))
        t = cls(fd, slots)
        t.set(H_SLOTS, slots)
        t.set(H_MAGIC, MAGIC)
        return t

    def get(self, field: int) -> int:
        return self._words[field]

    def set(self, field: int, value: int) -> None:
        self._words[field] = value

    def _base(self, slot: int) -> int:
        return HEADER + slot * _WORDS

    def renewed_ns(self, slot: int) -> int:
        return self._words[self._base(slot)]

    def set_renewed(self, slot: int, ns: int) -> None:
        self._words[self._base(slot)] = ns

    def wanted(self, slot: int) -> bool:
        return self._words[self._base(slot) + 1] != 0

    def set_want(self, slot: int, on: bool) -> None:
        self._words[self._base(slot) + 1] = 1 if on else 0

    def digest_of(self, slot: int) -> bytes:
        at = (self._base(slot) + 2) * 8
        return bytes(self._bytes[at:at + 32])

    def set_digest(self, slot: int, value: bytes) -> None:
        at = (self._base(slot) + 2) * 8
        self._bytes[at:at + 32] = value

    def check(self, slot: int, worker_id: str, instance: str, credential: str) -> bool:
        """A renewal's proof: the slot holds this worker's daemon's registration (constant-time compare)."""
        if not 0 <= slot < self.slots:
            return False
        held = self.digest_of(slot)
        return held != bytes(32) and hmac.compare_digest(held, digest(worker_id, instance, credential))

    def close(self) -> None:
        self._words.release()
        self._bytes.release()
        self._map.close()
        os.close(self.fd)


class LeaseTable:
    """The controller's side: which worker holds which slot, and what the lease server renewed. Thread-safe."""

    def __init__(self, slots: int = DEFAULT_SLOTS) -> None:
        self.shared = SharedTable.create(slots)
        self._lock = threading.Lock()
        self._slot: dict[str, int] = {}  # worker -> its slot
        self._free = list(range(slots - 1, -1, -1))  # lowest first
        self.full = 0  # registrations given no slot: the table was full (they beat the controller)
        self.process: Any = None  # the lease server (``lease_server.LeaseProcess``), set by the controller's server
        # the wake-up pipe (module docstring): the lease server inherits the read end, the controller writes
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.wakeups = 0  # slots written into the pipe
        self.wakeups_dropped = 0  # slots whose wake-up did not fit (a full pipe) or had no reader (no lease server)

    @property
    def port(self) -> int:
        """The lease server's port once it listens (it writes it), else 0."""
        return self.shared.get(H_PORT)

    def assign(self, worker_id: str, instance: str, credential: str, now_ns: int) -> int:
        """A slot for this registration (the worker's own, if it has one: a new daemon or credential replaces the
        old, whose renewals then fail); -1 when the table is full."""
        with self._lock:
            slot = self._slot.get(worker_id)
            if slot is None:
                if not self._free:
                    self.full += 1
                    if self.full == 1:
                        log.warning("the lease table is full (%d slots): workers registering now renew at the "
                                    "controller (counted as lease_table_full)", self.shared.slots)
                    return -1
                slot = self._slot[worker_id] = self._free.pop()
            self.shared.set_digest(slot, bytes(32))  # no renewal matches while it is rewritten
            self.shared.set_renewed(slot, now_ns)
            self.shared.set_want(slot, False)
            self.shared.set_digest(slot, digest(worker_id, instance, credential))
            return slot

    def release(self, worker_id: str) -> None:
        """The worker is lost or gone: its slot renews nothing more, and is free for another."""
        with self._lock:
            slot = self._slot.pop(worker_id, None)
            if slot is None:
                return
            self.shared.set_digest(slot, bytes(32))
            self.shared.set_renewed(slot, 0)
            self.shared.set_want(slot, False)
            self._free.append(slot)

    def renewed_at(self, worker_id: str) -> float | None:
        """When the lease server last renewed this worker's lease (monotonic seconds), None: never or no slot."""
        slot = self._slot.get(worker_id)
        if slot is None:
            return None
        ns = self.shared.renewed_ns(slot)
        return ns / 1e9 if ns else None

    def want(self, workers: list[str] | set[str] | tuple[str, ...], push: bool = False) -> list[str]:
        """The controller has orders for these workers: their next renewal tells them to heartbeat it now, and (with
        ``push``: new orders, not a shed heartbeat's, whose worker comes back after its back-off anyway) the lease
        server pushes it on their subscribed connections. Returns the workers without a slot (they hear of their
        orders some other way: ``Orders.Watch``, or their next heartbeat)."""
        slots: list[int] = []
        unslotted: list[str] = []
        for wid in workers:
            slot = self._slot.get(wid)
            if slot is None:
                unslotted.append(wid)
                continue
            self.shared.set_want(slot, True)  # before the wake-up: the lease server pushes only a wanted slot
            slots.append(slot)
        if push and slots:
            self._wake(slots)
        return unslotted

    def _wake(self, slots: list[int]) -> None:
        """Write the wake-ups; never blocks (module docstring: a full pipe drops them, counted)."""
        for at in range(0, len(slots), _WAKE_CHUNK):
            part = slots[at:at + _WAKE_CHUNK]
            try:
                os.write(self.wake_w, b"".join(WAKE.pack(s) for s in part))
                with self._lock:
                    self.wakeups += len(part)
            except OSError as e:  # EAGAIN: the pipe is full; EPIPE: no lease server reads it
                with self._lock:
                    self.wakeups_dropped += len(part)
                    first = self.wakeups_dropped == len(part)
                if first:
                    log.warning("lease server wake-ups dropped (%s): those workers hear of their orders at their next "
                                "renewal or heartbeat (counted as lease_wakeups_dropped)", e.strerror or e)

    def clear_want(self, worker_id: str) -> None:
        """Called as the controller takes a heartbeat of the worker (its reply carries the orders)."""
        slot = self._slot.get(worker_id)
        if slot is not None and self.shared.wanted(slot):
            self.shared.set_want(slot, False)

    def set_interval(self, seconds: float) -> None:
        """The heartbeat interval renewals' replies tell (the controller's, which grows with the fleet)."""
        self.shared.set(H_INTERVAL_US, int(seconds * 1e6))

    def server_up(self) -> bool:
        """Whether the lease server runs (an exit is said once by ``LeaseProcess.check``); when it does not,
        registrations name no lease port any more, so new workers beat the controller from the start."""
        up = self.process is not None and self.process.check()
        if not up and self.shared.get(H_PORT):
            self.shared.set(H_PORT, 0)
        return up

    def counters(self) -> dict[str, int]:
        sh = self.shared
        return {"lease_renewals": sh.get(H_RENEWALS), "lease_refused": sh.get(H_REFUSED),
                "lease_slots_used": len(self._slot), "lease_table_full": self.full,
                "lease_server_exits": self.process.exits if self.process is not None else 0,
                "lease_pushes": sh.get(H_PUSHES), "lease_subscriptions": sh.get(H_SUBSCRIPTIONS),
                "lease_subscribed": sh.get(H_SUBSCRIBED), "lease_push_unsubscribed": sh.get(H_PUSH_UNSUBSCRIBED),
                "lease_wakeups": self.wakeups, "lease_wakeups_dropped": self.wakeups_dropped}

    def close_wake_reader(self) -> None:
        """The controller's copy of the read end, once the lease server holds its own: with no reader left (the lease
        server gone), writes fail at once (EPIPE, counted) instead of filling the pipe."""
        if self.wake_r >= 0:
            os.close(self.wake_r)
            self.wake_r = -1

    def close(self) -> None:
        self.close_wake_reader()
        os.close(self.wake_w)
        self.shared.close()


def now_ns() -> int:
    """The clock both processes write and read renewals on."""
    return time.monotonic_ns()
