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

Run as ``python -m hpcsched.runtime.lease_server --fd N --slots S --host H --parent PID [--pdeathsig]
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
    H_REFUSED,
    H_RENEWALS,
    MAGIC,
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

    def __init__(self, fd: int, slots: int, host: str, tls: tuple[Path, Path] | None = None) -> None:
        self.fd, self.slots, self.host, self.tls = fd, slots, host, tls
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
        try:  # its own session: a terminal's Ctrl-C stops the controller, which stops it, not both at once
            self.proc = subprocess.Popen(argv, pass_fds=(self.fd,), stdin=subprocess.DEVNULL, start_new_session=True)
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
    """Renewals checked against and written into the table (one asyncio loop: no locks)."""

    def __init__(self, table: SharedTable) -> None:
        self.table = table

    def answer(self, req: pb.RenewRequest) -> pb.RenewReply:
        t = self.table
        if not t.check(req.slot, req.worker_id, req.instance, req.credential):
            t.set(H_REFUSED, t.get(H_REFUSED) + 1)
            return pb.RenewReply(refused="this lease slot does not hold that worker's registration (lost, left or "
                                         "registered anew): heartbeat the controller")
        t.set_renewed(req.slot, now_ns())
        t.set(H_RENEWALS, t.get(H_RENEWALS) + 1)
        return pb.RenewReply(heartbeat_interval_s=t.get(H_INTERVAL_US) / 1e6, heartbeat_now=t.wanted(req.slot))


class _Connection(asyncio.Protocol):
    """One worker's connection, as a bare protocol: no task, stream or coroutine per connection, so a wave of
    thousands of workers connecting (their first renewals after a registration storm) costs the loop little. Frames
    are answered as they arrive; one that is not a renewal, or a client that does not read its replies, closes it."""

    _MAX_UNREAD = 64 * 1024

    def __init__(self, renewals: _Renewals) -> None:
        self.renewals = renewals
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

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
            self.transport.write(frame(self.renewals.answer(req)))
            if self.transport.get_write_buffer_size() > self._MAX_UNREAD:
                self.transport.close()
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
    p.add_argument("--tls-cert", default="")
    p.add_argument("--tls-key", default="")
    args = p.parse_args(argv)
    _die_with(args.parent, args.pdeathsig)
    serve(args)


if __name__ == "__main__":
    main()
