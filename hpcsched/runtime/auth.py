"""Shared-token authentication and optional TLS for every controller RPC.

Workers and clients send ``authorization: Bearer <token>`` metadata; the server interceptor refuses a
call without the right token with UNAUTHENTICATED and logs the peer, before any handler runs. The token
is compared in constant time. TLS (server certificate + key; clients trust a CA file) protects the
token on the wire when the controller listens beyond loopback.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path

import grpc

log = logging.getLogger("hpcsched.runtime.auth")

HEADER = "authorization"


class TokenInterceptor(grpc.ServerInterceptor):
    """Rejects calls whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        def deny(request, context: grpc.ServicerContext):
            log.warning("refused unauthenticated call from %s", context.peer())
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")

        self._deny = deny

    def intercept_service(self, continuation, handler_call_details):
        got = dict(handler_call_details.invocation_metadata or ()).get(HEADER, "")
        if hmac.compare_digest(got.encode(), self._expected):
            return continuation(handler_call_details)
        log.warning("refused %s: missing or wrong token", handler_call_details.method)
        return grpc.unary_unary_rpc_method_handler(self._deny)


def server_credentials(cert: Path, key: Path) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])


# gRPC's default reconnect backoff grows to minutes; a worker must find a restarted controller within
# one heartbeat timeout, so retries stay between 0.2 and 2 s.
CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                   ("grpc.max_reconnect_backoff_ms", 2000))


def open_channel(address: str, tls_ca: Path | None = None) -> grpc.Channel:
    """A channel to the controller; TLS when a CA file is given."""
    if tls_ca is not None:
        creds = grpc.ssl_channel_credentials(root_certificates=tls_ca.read_bytes())
        return grpc.secure_channel(address, creds, options=CHANNEL_OPTIONS)
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return ((HEADER, f"Bearer {token}"),) if token else ()
