"""The lease server's wire protocol: one frame each way per renewal, and a blocking client (renewals only; a
worker's own end, with pushes, is ``lease_link``).

Why not gRPC: a renewal is ~20 us of work (a hash and two stores into the lease table), and gRPC Python's server
spent ~0.4 ms of CPU and several thread hand-offs on each (measured on this 2-core machine: the lease server at
13.5% of a core for ~32,000 renewals in a 10,000-worker run, and its renewals' tail no better than the controller's
heartbeats' under load). Here a frame is a 4-byte big-endian length and a serialized ``RenewRequest`` (``RenewReply``
back), over one TCP connection a worker keeps open (TLS when the controller has TLS), read by one asyncio loop.
The messages are the protocol's (``hpcsched_runtime.proto``); frames above ``MAX_FRAME`` bytes close the connection.
"""

from __future__ import annotations

import socket
import ssl
import struct
from pathlib import Path

from hpcsched.runtime.rpc import pb

MAX_FRAME = 4096  # a request is ~150 bytes (ids of at most 128 and 64 characters, a 43-character credential)
_LEN = struct.Struct(">I")


class LeaseError(Exception):
    """A renewal that did not happen: the lease server is unreachable, slow or broke the protocol (``code`` says
    which: UNAVAILABLE, DEADLINE_EXCEEDED, PROTOCOL) or refused it (REFUSED, with its reason)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code, self.details = code, details


def frame(message: pb.RenewRequest | pb.RenewReply) -> bytes:
    data = message.SerializeToString()
    return _LEN.pack(len(data)) + data


def frame_length(header: bytes) -> int:
    """The payload length a 4-byte header announces (LeaseError past ``MAX_FRAME``)."""
    (n,) = _LEN.unpack(header)
    if n > MAX_FRAME:
        raise LeaseError("PROTOCOL", f"a frame of {n} bytes (at most {MAX_FRAME})")
    return n


def read_exact(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock`` (LeaseError when the lease server closed the connection first)."""
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise LeaseError("UNAVAILABLE", "the lease server closed the connection")
        buf += chunk
    return buf


class LeaseClient:
    """A connection to a lease server for renewals only (blocking, one caller at a time), opened on first use and
    again after any failure: the tests' client, and the simplest worker's."""

    def __init__(self, host: str, port: int, tls_ca: Path | None = None, timeout_s: float = 5.0) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._tls = ssl.create_default_context(cafile=str(tls_ca)) if tls_ca is not None else None
        self._sock: socket.socket | None = None

    def renew(self, req: pb.RenewRequest) -> pb.RenewReply:
        """One renewal; LeaseError when it did not happen (the connection is then closed)."""
        try:
            sock = self._connect()
            sock.sendall(frame(req))
            reply = pb.RenewReply.FromString(read_exact(sock, frame_length(read_exact(sock, _LEN.size))))
        except LeaseError:
            self.close()
            raise
        except TimeoutError as e:
            self.close()
            raise LeaseError("DEADLINE_EXCEEDED", f"no answer within {self.timeout_s:g} s") from e
        except (OSError, ValueError) as e:  # refused, reset, a TLS failure; a message that does not parse
            self.close()
            raise LeaseError("UNAVAILABLE", str(e) or type(e).__name__) from e
        if reply.refused:
            raise LeaseError("REFUSED", reply.refused)
        return reply

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.create_connection((self.host.strip("[]"), self.port), timeout=self.timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host.strip("[]"))
            self._sock = sock
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
