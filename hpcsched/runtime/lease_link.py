"""The worker's lease connection (``LeaseLink``): its renewals, and the orders the lease server pushes on it.

Why one connection for both: every worker already keeps a connection to its controller's lease server for its
renewals (``lease_wire``), and a second one to the controller's ``Orders.Watch`` service only to hear "you have
orders" cost the controller ~1 ms of CPU per stream opened and doubled a 10,000-worker registration storm. So right
after registering the worker opens its lease connection and subscribes it (a renewal with ``push``); the lease server
then writes an unsolicited ``RenewReply`` (``pushed``) on it when the controller has orders for this worker, and the
worker heartbeats at once (``on_push``). Nothing depends on it: orders ride every heartbeat reply, and ``want`` makes
a renewal answer ``heartbeat_now``; a push that is lost only means the orders come with the next heartbeat.

One thread owns the socket (a TLS connection must not be read and written from two threads at once): it reads every
frame, hands a renewal's answer to ``renew`` (the worker's loop, one renewal at a time) and calls ``on_push`` for a
pushed one, and writes the renewals ``renew`` queues for it (woken through a pipe). A broken connection is opened and
subscribed again after a back-off (1 s doubling to 10 s), and at once after a new registration (``update``); a
subscription refused (the registration is gone: the controller will say ``reregister``) waits for the next one. A
lease server from before pushes answers the subscription without ``subscribed``: the connection then only renews,
and ``on_no_push`` is called once per registration (the worker watches ``Orders`` instead).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hpcsched.runtime.lease_wire import LeaseError, frame, frame_length, read_exact
from hpcsched.runtime.rpc import pb

log = logging.getLogger("hpcsched.runtime.worker")

_BACKOFF_S = (1.0, 10.0)


class LeaseLink:
    """The connection and its thread (module docstring). ``update`` after each registration, ``renew`` from the
    worker's loop, ``stop`` at the end."""

    def __init__(self, on_push: Callable[[], None], tls_ca: Path | None = None, timeout_s: float = 5.0,
                 on_no_push: Callable[[], None] | None = None) -> None:
        self.on_push, self.timeout_s, self.on_no_push = on_push, timeout_s, on_no_push
        self._no_push_said = 0  # the version (registration) for which on_no_push was called
        self._tls = ssl.create_default_context(cafile=str(tls_ca)) if tls_ca is not None else None
        self.pushes = 0  # pushed frames received (each: heartbeat now)
        self.subscriptions = 0  # connections opened and subscribed
        self.refusals = 0  # subscriptions the lease server refused (the registration was gone)
        self._cond = threading.Condition()
        self._target: tuple[str, int, pb.RenewRequest] | None = None  # (host, port, subscribing renewal)
        self._version = 0  # bumped by update: a connection for older values is replaced
        self._stopped = False
        self._up = 0  # the version whose connection is subscribed now (0: none)
        self._link = 0  # bumped whenever a connection ends: a renewal waiting on it fails at once
        self._out: bytes | None = None  # a renewal for the thread to send
        self._answer: pb.RenewReply | None = None
        self._drop = False  # a renewal went unanswered: the thread closes that connection
        self._sock: socket.socket | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="lease-link", daemon=True)
        self._thread.start()

    @property
    def connected(self) -> bool:
        """Subscribed now, for the current registration."""
        return self._up != 0 and self._up == self._version

    def update(self, host: str, port: int, req: pb.RenewRequest | None) -> None:
        """After a registration: connect to ``host:port`` and subscribe with this renewal (None: no lease server)."""
        with self._cond:
            self._target = (host.strip("[]"), port, req) if req is not None and port > 0 else None
            self._version += 1
            self._cond.notify_all()
        self._poke()

    def renew(self, req: pb.RenewRequest) -> pb.RenewReply:
        """One renewal on the subscribed connection; LeaseError when it did not happen (not connected, no answer
        within ``timeout_s``: that connection is then dropped and opened again, refused: its reason)."""
        req.push = True  # every renewal keeps the subscription
        with self._cond:
            if not self.connected:
                raise LeaseError("UNAVAILABLE", "not connected to the lease server (reconnecting)")
            link = self._link
            self._answer, self._out = None, frame(req)
        self._poke()
        deadline = time.monotonic() + self.timeout_s
        late = False
        with self._cond:
            while self._answer is None and self._link == link and not self._stopped:
                left = deadline - time.monotonic()
                if left <= 0:
                    late = self._drop = True
                    self._out = None
                    break
                self._cond.wait(left)
            reply, self._answer = self._answer, None
        if reply is None:
            if late:
                self._poke()
                raise LeaseError("DEADLINE_EXCEEDED", f"no answer within {self.timeout_s:g} s")
            raise LeaseError("UNAVAILABLE", "the lease connection broke")
        if reply.refused:
            raise LeaseError("REFUSED", reply.refused)
        return reply

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            sock = self._sock if self._up else None
            self._cond.notify_all()
        self._poke()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # closed meanwhile
                pass
        # bounded: a worker's stop frees its node (a pilot's, for a batch job waiting on it); a thread still in a
        # connect to an unanswering host ends within its timeout, a daemon thread
        self._thread.join(timeout=1.0)
        if not self._thread.is_alive():  # else it may still poll them
            os.close(self._wake_r)
            os.close(self._wake_w)

    # ------------------------------------------------------------------------------------------ the thread
    def _poke(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):  # full: the thread is being woken anyway; closed: stopping
            pass

    def _run(self) -> None:
        backoff = _BACKOFF_S[0]
        logged = ""
        while True:
            with self._cond:
                while not self._stopped and self._target is None:
                    self._cond.wait()
                if self._stopped:
                    return
                assert self._target is not None
                (host, port, req), version = self._target, self._version
            refused = False
            sock: socket.socket | None = None
            try:
                sock = self._subscribe(host, port, req, version)
                if sock is not None:
                    backoff, logged = _BACKOFF_S[0], ""
                    self._serve(sock, version)
            except LeaseError as e:
                refused = e.code == "REFUSED"
                self.refusals += refused
                if e.code != logged:  # once per kind of failure, not at every retry
                    logged = e.code
                    log.info("lease connection to %s:%d: %s (%s); orders come with heartbeats meanwhile", host, port,
                             e.code, e.details)
            finally:
                with self._cond:
                    self._up, self._drop, self._out, self._sock = 0, False, None, None
                    self._link += 1
                    self._cond.notify_all()
                if sock is not None:
                    sock.close()
            with self._cond:
                if self._stopped:
                    return
                if version == self._version:  # broken or refused, not replaced by a new registration
                    if refused:  # its registration is gone: wait for the next one
                        while not self._stopped and version == self._version:
                            self._cond.wait()
                    else:
                        self._cond.wait(backoff)
                        backoff = min(backoff * 2, _BACKOFF_S[1])

    def _subscribe(self, host: str, port: int, req: pb.RenewRequest, version: int) -> socket.socket | None:
        """Connect and subscribe; the socket, or None when a newer registration replaced this one meanwhile."""
        sub = pb.RenewRequest()
        sub.CopyFrom(req)
        sub.push = True
        try:
            sock = socket.create_connection((host, port), timeout=self.timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=host)
        except TimeoutError as e:
            raise LeaseError("DEADLINE_EXCEEDED", f"no connection within {self.timeout_s:g} s") from e
        except (OSError, ValueError) as e:
            raise LeaseError("UNAVAILABLE", str(e) or type(e).__name__) from e
        try:
            sock.sendall(frame(sub))
            reply = self._read_frame(sock)
            while reply.pushed:  # a push can come before the answer: it means the same as heartbeat_now
                self._pushed()
                reply = self._read_frame(sock)
        except BaseException:
            sock.close()
            raise
        if reply.refused:
            sock.close()
            raise LeaseError("REFUSED", reply.refused)
        with self._cond:
            if version != self._version or self._stopped:
                sock.close()
                return None
            self._up, self._sock = version, sock
            self.subscriptions += reply.subscribed
            no_push = not reply.subscribed and self._no_push_said != version
            self._no_push_said = version if no_push else self._no_push_said
        if reply.subscribed:
            log.info("lease connection to %s:%d subscribed: orders are pushed on it (%d subscriptions so far)", host,
                     port, self.subscriptions)
        elif no_push:
            log.info("the lease server at %s:%d does not push orders (a controller from before pushes): renewals only, "
                     "orders watched on Orders.Watch", host, port)
            if self.on_no_push is not None:
                self.on_no_push()
        if reply.heartbeat_now:  # orders came before it subscribed
            self._pushed()
        return sock

    def _serve(self, sock: socket.socket, version: int) -> None:
        """Read frames and send queued renewals until the connection breaks, is dropped, or is replaced."""
        poll = select.poll()
        poll.register(sock, select.POLLIN)
        poll.register(self._wake_r, select.POLLIN)
        while True:
            with self._cond:
                if self._stopped or self._drop or version != self._version:
                    return
                out, self._out = self._out, None
            if out is not None:
                try:
                    sock.sendall(out)
                except OSError as e:
                    raise LeaseError("UNAVAILABLE", str(e) or type(e).__name__) from e
            readable = isinstance(sock, ssl.SSLSocket) and sock.pending() > 0  # decrypted already, not in the socket
            if not readable:
                for fd, _ in poll.poll():
                    if fd == self._wake_r:
                        os.read(self._wake_r, 4096)
                    else:
                        readable = True
            if not readable:
                continue
            reply = self._read_frame(sock)
            if reply.pushed:
                self._pushed()
                continue
            with self._cond:
                self._answer = reply
                self._cond.notify_all()

    def _pushed(self) -> None:
        self.pushes += 1
        self.on_push()

    def _read_frame(self, sock: socket.socket) -> pb.RenewReply:
        try:
            return pb.RenewReply.FromString(read_exact(sock, frame_length(read_exact(sock, 4))))
        except TimeoutError as e:  # a frame begun is finished within a round trip
            raise LeaseError("DEADLINE_EXCEEDED", f"a frame not finished within {self.timeout_s:g} s") from e
        except LeaseError:
            raise
        except (OSError, ValueError) as e:  # reset, a TLS failure, a message that does not parse
            raise LeaseError("UNAVAILABLE", str(e) or type(e).__name__) from e

