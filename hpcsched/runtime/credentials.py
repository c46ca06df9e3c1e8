"""Per-worker credentials: the join token admits a worker, its own secret speaks for it afterwards.

The worker token is a join token, as a kubelet's bootstrap token is: it lets a daemon ``Register``, and nothing
else. The reply carries a fresh random credential (``RegisterReply.credential``) bound to that worker id and that
daemon's ``instance``; the daemon's later ``Heartbeat`` and ``Leave`` calls carry it in the ``CREDENTIAL_HEADER``
metadata, and it speaks for that worker only (Kubernetes' NodeRestriction: a node writes its own status only).
A job that reads the join token (it ran beside its worker) can therefore no longer report another worker's tasks
done, nor make a worker leave: without the credential of that worker's daemon its calls are refused.

The controller keeps only a SHA-256 of each credential, in memory; the worker keeps the credential in its memory
only (no file, no environment variable a task could inherit or read through ``/proc``). A restarted controller
knows no credential: a heartbeat whose worker it issued nothing to is answered ``reregister`` (the worker
registers again with the join token, keeping its tasks, and the next heartbeat reports them), and a ``Leave`` is
refused with UNAUTHENTICATED, after which a worker registers again and repeats it. A credential that does not
match what was issued for the worker is refused with UNAUTHENTICATED and counted (``refused``), logged once per
worker per ``ratelimit.LOG_EVERY_S``.

This check runs with or without tokens (a controller without tokens on loopback still gives each worker its own
credential), after the token interceptor: an unauthenticated call never reaches it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
from collections.abc import Callable

import grpc

from hpcsched.runtime.ratelimit import LogThrottle
from hpcsched.runtime.rpc import pb

log = logging.getLogger("hpcsched.runtime.credentials")

CREDENTIAL_HEADER = "x-hpcsched-credential"
_CHECKED = ("Heartbeat", "Leave")


def credential_metadata(credential: str) -> tuple[tuple[str, str], ...]:
    """The metadata a worker adds to its Heartbeat and Leave calls (none before it has a credential)."""
    return ((CREDENTIAL_HEADER, credential),) if credential else ()


def _digest(credential: str) -> bytes:
    return hashlib.sha256(credential.encode()).digest()


class WorkerCredentials(grpc.ServerInterceptor):
    """Issues a credential with every successful Register, and checks it on Heartbeat and Leave (module docstring).
    ``refused``: calls refused for a wrong or missing credential; ``unknown``: calls for a worker that holds no
    credential from this controller (answered ``reregister`` or refused, so that it registers again)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._issued: dict[str, tuple[str, bytes]] = {}  # worker id -> (daemon instance, SHA-256 of its credential)
        self._throttle = LogThrottle(log)
        self.refused = 0
        self.unknown = 0
        # (worker id, instance, credential, reply) after each issue, and (worker id) after each forget: the lease
        # table (``lease``) binds a registration's slot to the credential and names it in the reply
        self.on_issue: Callable[[str, str, str, pb.RegisterReply], None] | None = None
        self.on_forget: Callable[[str], None] | None = None

    def issue(self, worker_id: str, instance: str) -> str:
        """A new credential for this worker's daemon ``instance`` (replacing any earlier one of the worker)."""
        credential = secrets.token_urlsafe(32)
        with self._lock:
            self._issued[worker_id] = (instance, _digest(credential))
        return credential

    def forget(self, worker_id: str) -> None:
        """The worker left for good: its credential speaks for nothing any more."""
        with self._lock:
            self._issued.pop(worker_id, None)
        if self.on_forget is not None:
            self.on_forget(worker_id)

    def check(self, worker_id: str, instance: str, credential: str) -> bool | None:
        """True: ``credential`` is the one issued to this worker's daemon ``instance``; False: it is not; None: this
        controller issued nothing to the worker (it restarted, or the worker never registered)."""
        with self._lock:
            issued = self._issued.get(worker_id)
        if issued is None:
            return None
        want_instance, want = issued
        same = hmac.compare_digest(_digest(credential), want)  # constant time whatever the instance says
        return same and hmac.compare_digest(instance.encode(), want_instance.encode())

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        method = handler_call_details.method.rsplit("/", 1)[-1]
        handler = continuation(handler_call_details)
        if method not in ("Register", *_CHECKED) or handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary
        got = dict(handler_call_details.invocation_metadata or ()).get(CREDENTIAL_HEADER, "")
        got = got if isinstance(got, str) else ""

        if method == "Register":
            def behavior(request, context: grpc.ServicerContext):
                reply = inner(request, context)  # a refused registration raises: nothing is issued
                reply.credential = self.issue(request.worker_id, request.instance)
                if self.on_issue is not None:
                    self.on_issue(request.worker_id, request.instance, reply.credential, reply)
                return reply
        else:
            def behavior(request, context: grpc.ServicerContext):
                verdict = self.check(request.worker_id, request.instance, got)
                if verdict is None:
                    self.unknown += 1
                    if method == "Heartbeat":
                        return pb.HeartbeatReply(reregister=True)
                    context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                  "this controller holds no credential for this worker (it restarted?): register "
                                  "again, then repeat the call")
                if not verdict:
                    self.refused += 1
                    self._throttle.warn(f"credential {request.worker_id}", "refused %s for worker %s from %s: its "
                                        "credential is missing or not the one issued to that worker's daemon "
                                        "(%d refused so far)", method, _safe(request.worker_id), _safe(context.peer()),
                                        self.refused)
                    context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                  f"{method} for worker {request.worker_id[:128]!r} needs the credential issued to "
                                  "that worker's daemon at registration; a join token alone cannot act for a worker")
                reply = inner(request, context)
                if method == "Leave" and request.final:
                    self.forget(request.worker_id)
                return reply

        return grpc.unary_unary_rpc_method_handler(behavior, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)


def _safe(text: str) -> str:
    """A peer or worker name as one printable, bounded log field (no forged lines)."""
    return "".join(c if c.isprintable() else "?" for c in text)[:200]
