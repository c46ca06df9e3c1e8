"""The lease server: a process of the controller's own that answers lease renewals (``lease_wire``).

Why a process (``lease`` says why renewals leave the controller's server): its own interpreter, so a renewal never
waits for the controller's GIL or server threads while a registration storm, a submit batch or a scheduling step
runs there. It keeps no state of its own: every renewal is checked against, and written into, the lease table the
controller shares with it (``lease.SharedTable``); the controller alone decides who is alive.

Its life is the controller's: ``LeaseProcess.start`` spawns it with the table's file descriptor, it writes its port
into the table's header once it listens (until then registrations name no lease port, and workers beat the
controller), and ``stop`` ends it. A controller killed with SIGKILL takes it along: the kernel sends it SIGKILL when
the controller goes (``PR_SET_PDEATHSIG``, where the controller's main thread spawned it), and it also exits
within ``_PARENT_POLL_S`` once its parent is gone (a controller whose spawning thread ended). A lease server that
dies on its own is said (``LeaseProcess.check``: logged, counted as lease_server_exits); the workers' renewals then
fail and they beat the controller, which still renews their leases as before.

Pushes: a renewal with ``push`` whose credential checks subscribes its connection to that slot (the newest such
connection per slot; closing it, or the slot's registration changing, unsubscribes). The controller writes the slots it
has orders for into the wake-up pipe (``lease``); this loop reads them (``loop.add_reader``) and, for each slot whose
``want`` is still set and which has a subscribed connection, writes one unsolicited ``RenewReply`` (``pushed``,
``heartbeat_now``). Wake-ups read together make one frame per slot: a worker beats once for them all.

Run as ``python -m hpcsched.runtime.lease_server --fd N --slots S --host H --parent PID [--wake-fd W] [--pdeathsig]
[--tls-cert C --tls-key K]``; only ``LeaseProcess`` starts it.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

from google.protobuf.message import DecodeError

from hpcsched.runtime.config import check_private
from hpcsched.runtime.lease import (
    H_INTERVAL_US,
    H_MAGIC,
    H_PID,
    H_PORT,
    H_PUSH_UNSUBSCRIBED,
    H_PUSHES,
    H_REFUSED,
    H_RENEWALS,
    H_SUBSCRIBED,
    H_SUBSCRIPTIONS,
    MAGIC,
    WAKE,
    SharedTable,
    now_ns,
)
from hpcsched.runtime.lease_wire import LeaseError, frame, frame_length
from hpcsched.runtime.rpc import pb

log = logging.getLogger("hpcsched.runtime.lease")

_PARENT_POLL_S = 0.2
_PR_SET_PDEATHSIG = 1


class LeaseProcess:
    """The controller's handle on its lease server (module docstring)."""

    def __init__(self, fd: int, slots: int, host: str, tls: tuple[Path, Path] | None = None,
                 wake_fd: int = -1) -> None:
        self.fd, self.slots, self.host, self.tls, self.wake_fd = fd, slots, host, tls, wake_fd
        self.proc: subprocess.Popen | None = None
        self.exits = 0  # times it ended without being stopped (said once each)
        self._stopping = False

    def start(self) -> None:
        """Spawn it; returns at once (it says its port through the table when it listens)."""
        argv = [sys.executable, "-m", "hpcsched.runtime.lease_server", "--fd", str(self.fd), "--slots",
                str(self.slots), "--host", self.host, "--parent", str(os.getpid())]
        if threading.current_thread() is threading.main_thread():  # the death signal follows the spawning thread
            argv.append("--pdeathsig")
        if self.tls is not None:
            argv += ["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])]
        if self.wake_fd >= 0:
            argv += ["--wake-fd", str(self.wake_fd)]
        fds = (self.fd,) if self.wake_fd < 0 else (self.fd, self.wake_fd)
        try:  # its own session: a terminal's Ctrl-C stops the controller, which stops it, not both at once
            self.proc = subprocess.Popen(argv, pass_fds=fds, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:  # the controller runs on without it: every heartbeat comes to it, as before
            self.exits += 1
            log.error("cannot start the lease server (%s): workers renew their leases at the controller's heartbeats",
                      e)

    def check(self) -> bool:
        """Whether it runs; an exit not asked for is logged (once) and counted."""
        if self.proc is None:
            return False
        code = self.proc.poll()
        if code is None:
            return True
        if not self._stopping and self.exits == 0:
            self.exits += 1
            log.error("the lease server (pid %d) exited with %s: workers renew their leases at the controller's "
                      "heartbeats instead", self.proc.pid, code)
        return False

    def stop(self) -> None:
        self._stopping = True
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def _die_with(parent: int, pdeathsig: bool) -> None:
    """Ask the kernel for SIGKILL when the parent goes, and poll for it too (module docstring)."""
    if pdeathsig:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # not Linux: the poll below still ends it
            pass
    if os.getppid() != parent:  # it went before the signal was asked for
        os._exit(0)

    def poll() -> None:
        while True:
            time.sleep(_PARENT_POLL_S)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=poll, name="parent-poll", daemon=True).start()


class _Renewals:
    """Renewals checked against and written into the table, and the connections subscribed to pushes (one asyncio
    loop: no locks)."""

    def __init__(self, table: SharedTable) -> None:
        self.table = table
        self.subs: dict[int, tuple[_Connection, bytes]] = {}  # slot -> (its subscribed connection, digest then)
        self._wake_buf = b""

    def answer(self, req: pb.RenewRequest, conn: _Connection) -> pb.RenewReply:
        t = self.table
        if not t.check(req.slot, req.worker_id, req.instance, req.credential):
            t.set(H_REFUSED, t.get(H_REFUSED) + 1)
            return pb.RenewReply(refused="this lease slot does not hold that worker's registration (lost, left or "
                                         "registered anew): heartbeat the controller")
        t.set_renewed(req.slot, now_ns())
        t.set(H_RENEWALS, t.get(H_RENEWALS) + 1)
        if req.push:
            self.subscribe(req.slot, conn)
        return pb.RenewReply(heartbeat_interval_s=t.get(H_INTERVAL_US) / 1e6, heartbeat_now=t.wanted(req.slot),
                             subscribed=req.push)

    def subscribe(self, slot: int, conn: _Connection) -> None:
        """``conn`` gets this slot's pushes from now on (a connection subscribed before for the slot no longer does;
        this connection no longer gets another slot's)."""
        old = self.subs.get(slot)
        if old is not None and old[0] is conn:
            return
        if conn.slot >= 0 and conn.slot != slot:
            self.unsubscribe(conn)
        if old is not None:
            old[0].slot = -1
        else:
            self.table.set(H_SUBSCRIBED, self.table.get(H_SUBSCRIBED) + 1)
        self.subs[slot] = (conn, self.table.digest_of(slot))
        conn.slot = slot
        self.table.set(H_SUBSCRIPTIONS, self.table.get(H_SUBSCRIPTIONS) + 1)

    def unsubscribe(self, conn: _Connection) -> None:
        held = self.subs.get(conn.slot)
        if held is not None and held[0] is conn:
            del self.subs[conn.slot]
            self.table.set(H_SUBSCRIBED, self.table.get(H_SUBSCRIBED) - 1)
        conn.slot = -1

    def woken(self, fd: int) -> None:
        """The controller's wake-ups (``loop.add_reader``): push once to each subscribed slot still wanted."""
        try:
            data = self._wake_buf + os.read(fd, 64 * 1024)
        except BlockingIOError:
            return
        except OSError as e:  # not expected of a pipe; the renewals' ``heartbeat_now`` still carries the orders
            log.error("lease server: the wake-up pipe failed (%s): no more pushes", e)
            asyncio.get_running_loop().remove_reader(fd)
            return
        if not data:  # the controller closed its end: it is stopping
            asyncio.get_running_loop().remove_reader(fd)
            return
        whole = len(data) - len(data) % WAKE.size
        self._wake_buf = data[whole:]
        t = self.table
        for (slot,) in {w for w in WAKE.iter_unpack(data[:whole])}:  # coalesced: one frame per slot
            if not 0 <= slot < t.slots or not t.wanted(slot):
                continue  # a heartbeat already took the orders (it cleared ``want``)
            held = self.subs.get(slot)
            if held is None:
                t.set(H_PUSH_UNSUBSCRIBED, t.get(H_PUSH_UNSUBSCRIBED) + 1)
                continue
            conn, digest = held
            if t.digest_of(slot) != digest:  # the slot holds another registration now: not this connection's orders
                self.unsubscribe(conn)
                t.set(H_PUSH_UNSUBSCRIBED, t.get(H_PUSH_UNSUBSCRIBED) + 1)
                continue
            conn.send(pb.RenewReply(heartbeat_interval_s=t.get(H_INTERVAL_US) / 1e6, heartbeat_now=True,
                                    pushed=True))
            t.set(H_PUSHES, t.get(H_PUSHES) + 1)


class _Connection(asyncio.Protocol):
    """One worker's connection, as a bare protocol: no task, stream or coroutine per connection, so a wave of
    thousands of workers connecting (their first renewals after a registration storm) costs the loop little. Frames
    are answered as they arrive; one that is not a renewal, or a client that does not read its replies, closes it."""

    _MAX_UNREAD = 64 * 1024

    def __init__(self, renewals: _Renewals) -> None:
        self.renewals = renewals
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.slot = -1  # the slot whose pushes it gets (-1: none)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.slot >= 0:
            self.renewals.unsubscribe(self)

    def send(self, reply: pb.RenewReply) -> None:
        """One frame; a client that does not read what it is sent is closed."""
        assert self.transport is not None
        if self.transport.is_closing():
            return
        self.transport.write(frame(reply))
        if self.transport.get_write_buffer_size() > self._MAX_UNREAD:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buf += data
        while len(self.buf) >= 4:
            try:
                n = frame_length(bytes(self.buf[:4]))
                if len(self.buf) < 4 + n:
                    return
                req = pb.RenewRequest.FromString(bytes(self.buf[4:4 + n]))
            except (LeaseError, DecodeError):
                self.transport.close()
                return
            del self.buf[:4 + n]
            self.send(self.renewals.answer(req, self))
            if self.transport.is_closing():
                return


def serve(args: argparse.Namespace) -> None:
    """Answer renewals until SIGTERM (module docstring)."""
    table = SharedTable(args.fd, args.slots)
    if table.get(H_MAGIC) != MAGIC:
        raise SystemExit("lease server: the table it was given is not a lease table")
    tls = None
    if args.tls_cert:
        check_private(Path(args.tls_key), "TLS private key")
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(args.tls_cert, args.tls_key)

    async def run() -> None:
        done = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, done.set)
        renewals = _Renewals(table)
        if args.wake_fd >= 0:
            os.set_blocking(args.wake_fd, False)
            asyncio.get_running_loop().add_reader(args.wake_fd, renewals.woken, args.wake_fd)
        server = await asyncio.get_running_loop().create_server(lambda: _Connection(renewals), args.host.strip("[]"),
                                                                0, ssl=tls, backlog=4096)
        table.set(H_PID, os.getpid())
        table.set(H_PORT, server.sockets[0].getsockname()[1])
        await done.wait()
        table.set(H_PORT, 0)  # new registrations name no lease server
        server.close()

    asyncio.run(run())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="hpcsched.runtime.lease_server")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--slots", type=int, required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--pdeathsig", action="store_true")
    p.add_argument("--wake-fd", type=int, default=-1)
    p.add_argument("--tls-cert", default="")
    p.add_argument("--tls-key", default="")
    args = p.parse_args(argv)
    _die_with(args.parent, args.pdeathsig)
    serve(args)


if __name__ == "__main__":
    main()
