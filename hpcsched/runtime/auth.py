"""Token authentication with roles, and optional TLS, for every controller RPC.

Workers and clients send ``authorization: Bearer <token>`` metadata; the server interceptor finds which role's
token it is (compared in constant time against each) and refuses, with UNAUTHENTICATED and before any handler
runs, a call without a known token, and with PERMISSION_DENIED a call its role may not make:

- ``user``: Submit, ListJobs, Cancel, ListWorkers;
- ``worker``: Register, Heartbeat, Leave (a user's token cannot act as a worker: otherwise a user's heartbeat
  could mark a running job ``completed 1000/1000`` and make workers leave);
- ``admin``: every RPC, including any not listed here (an RPC added later is admin-only until it is given a role);
- ``readonly``: ListJobs, ListWorkers, and the status page and ``/metrics`` (``metrics_http``): what a dashboard or
  a Prometheus server holds, which can change nothing.

Each token is also a name (``user``, ``worker``, ``admin``, or a ``user_tokens`` name): the jobs a user submits are
theirs, and with ``own_jobs_only`` a user lists and cancels only those (``identify``; the service asks it).

With one token configured (``token_file`` alone) that token holds every role, as before roles existed; the
controller says so in its log at every start. Refusals are logged at most once per ``LOG_EVERY_S`` per peer and
reason, with how many were suppressed (each refused call logged 233 bytes, with no limit). TLS (server
certificate + key; clients trust a CA file) protects the tokens on the wire beyond loopback.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path

import grpc

from hpcsched.runtime.config import check_private
from hpcsched.runtime.ratelimit import LogThrottle

log = logging.getLogger("hpcsched.runtime.auth")

HEADER = "authorization"
USER, WORKER, ADMIN, READONLY = "user", "worker", "admin", "readonly"
ROLE_RPCS: dict[str, frozenset[str]] = {
    USER: frozenset({"Submit", "SubmitMany", "ListJobs", "Cancel", "ListWorkers"}),
    WORKER: frozenset({"Register", "Heartbeat", "Leave"}),
    READONLY: frozenset({"ListJobs", "ListWorkers"}),
}
READ_ROLES = frozenset({READONLY, USER, ADMIN})  # may read the status page and /metrics (a worker's token may not)


def allowed(role: str, method: str) -> bool:
    """May ``role`` call ``method`` (the RPC's short name)? Admin may call anything; others what ROLE_RPCS lists."""
    return role == ADMIN or method in ROLE_RPCS.get(role, ())


class TokenInterceptor(grpc.ServerInterceptor):
    """Authenticates every call by its ``authorization`` metadata and authorises it by role (module docstring).
    ``tokens``: role -> token (named as the role); ``users``: more user tokens, name -> token. One token may hold
    several roles only through the single-token set-up."""

    def __init__(self, token: str | None = None, tokens: dict[str, str] | None = None,
                 users: dict[str, str] | None = None) -> None:
        if tokens is None:
            tokens = {ADMIN: token} if token else {}
        self._tokens = [(role, role, f"Bearer {t}".encode()) for role, t in tokens.items() if t]
        self._tokens += [(USER, name, f"Bearer {t}".encode()) for name, t in (users or {}).items() if t]
        self._throttle = LogThrottle(log)

        def deny_unauthenticated(request, context: grpc.ServicerContext):
            self._throttle.warn(f"auth {context.peer()}", "refused unauthenticated call from %s", _safe(context.peer()))
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")

        self._deny = deny_unauthenticated

    def identify(self, got: str) -> tuple[str, str] | None:
        """(role, name) of the token ``got`` is (every token compared, in constant time), or None."""
        found = None
        for role, name, expected in self._tokens:
            if hmac.compare_digest(got.encode(), expected) and found is None:
                found = (role, name)
        return found

    def role(self, got: str) -> str | None:
        """The role whose token ``got`` is, or None."""
        found = self.identify(got)
        return found[0] if found else None

    def caller(self, invocation_metadata) -> tuple[str, str] | None:
        """(role, name) of a call's ``authorization`` metadata (what the service asks, after this interceptor
        let the call through)."""
        got = dict(invocation_metadata or ()).get(HEADER, "")
        return self.identify(got if isinstance(got, str) else "")

    def intercept_service(self, continuation, handler_call_details):
        got = dict(handler_call_details.invocation_metadata or ()).get(HEADER, "")
        role = self.role(got if isinstance(got, str) else "")
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if role is None:
            self._throttle.warn(f"auth {method}", "refused %s: missing or wrong token", _safe(method))
            return grpc.unary_unary_rpc_method_handler(self._deny)
        if allowed(role, method):
            return continuation(handler_call_details)
        self._throttle.warn(f"role {role} {method}", "refused %s: the %s role may not call it", _safe(method), role)

        def deny_role(request, context: grpc.ServicerContext):
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"this token's role ({role}) may not call {method}; "
                          f"{'workers' if method in ROLE_RPCS[WORKER] else 'admins'} hold the credential for it")

        return grpc.unary_unary_rpc_method_handler(deny_role)


def _safe(text: str) -> str:
    """A peer or method name as one printable, bounded log field (no forged lines, no terminal codes)."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text[:200]


def server_credentials(cert: Path, key: Path) -> grpc.ServerCredentials:
    """The controller's TLS identity; a private key others can read is refused, as a token file of that mode is."""
    check_private(key, "TLS private key")
    return grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])


# gRPC's default reconnect backoff grows to minutes; a worker must find a restarted controller within
# one heartbeat timeout, so retries stay between 0.2 and 2 s. grpc.min_reconnect_backoff_ms is left at gRPC's
# default (20 s): gRPC also takes it as the least time a connection attempt may take, and at 200 ms a controller
# busy with thousands of registering workers, not answering the handshake within 200 ms, had each attempt fail and
# be retried (2,000 simulated workers: 2,916 Register UNAVAILABLE and 72 re-registrations, against none with it
# left at 20 s; bench/RESULTS.md, fleet harness).
CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 2000))


def open_channel(address: str, tls_ca: Path | None = None) -> grpc.Channel:
    """A channel to the controller; TLS when a CA file is given."""
    if tls_ca is not None:
        creds = grpc.ssl_channel_credentials(root_certificates=tls_ca.read_bytes())
        return grpc.secure_channel(address, creds, options=CHANNEL_OPTIONS)
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return ((HEADER, f"Bearer {token}"),) if token else ()
