"""The controller's HTTP listener for operators (``metrics_listen: HOST:PORT``): ``/metrics`` in Prometheus' text
format and ``/``, the read-only status page. Off unless configured.

Authentication is the API's: when the controller has tokens, every request needs an ``Authorization: Bearer
<token>`` header with a token of a role that may read (``auth.READ_ROLES``: readonly, user, admin; a worker's token
may not), else 401 (no or an unknown token) or 403 (a worker's). A token in the URL (``?token=``) is not accepted:
URLs end up in proxies' and browsers' logs. Prometheus sends the header from its scrape config's
``authorization: {credentials_file: ...}``. With ``own_jobs_only`` a user's token shows that user's jobs only.
Refusals are logged at most once per interval per reason (``ratelimit.LogThrottle``), as the API's are.

The bound address (port 0 picks a free one) is logged and, with ``metrics_address_file``, written there
(write-then-rename), as the API's ``address_file`` is.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from hpcsched.errors import InputError
from hpcsched.runtime.auth import READ_ROLES, USER
from hpcsched.runtime.config import parse_address
from hpcsched.runtime.hostaddr import is_loopback_host
from hpcsched.runtime.ops_metrics import ControllerCollector
from hpcsched.runtime.ops_snapshot import PoolReader, PoolSnapshot
from hpcsched.runtime.ratelimit import LogThrottle
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.status_page import SAMPLE_S, UtilisationHistory, render

if TYPE_CHECKING:
    from hpcsched.runtime.server import ControllerServer

log = logging.getLogger("hpcsched.runtime.metrics_http")

PAGE_JOBS = 500  # active jobs on the page (the rest: `hpcsched jobs`)


class OpsServer:
    """``/metrics`` and ``/`` of one controller server (module docstring); ``start`` returns the bound address."""

    def __init__(self, server: ControllerServer, listen: str, address_file: Path | None = None,
                 sample_s: float = SAMPLE_S) -> None:
        self.server = server
        self.address_file = address_file
        self.sample_s = sample_s
        self.history = UtilisationHistory()
        self._pool = PoolReader(server)  # the sampler's and the page's (the collector has its own)
        self._pool_lock = threading.Lock()
        self._stop = threading.Event()
        self._started = False
        self.throttle = LogThrottle(log)
        host, port = parse_address(listen, "metrics_listen")
        cfg = server.cfg
        if server.auth is None and not cfg.insecure and not is_loopback_host(host):
            raise InputError("metrics_listen", f"{host} is not a loopback address and no token is set: anyone who can "
                             "reach it could read the pool, the queue and the jobs' names and users. Set token_file "
                             "(and readonly_token_file), listen on 127.0.0.1, or pass --insecure to accept it")
        try:
            self.http = _Http((host, port), _handler(self), ipv6=":" in host)
        except OSError as e:
            raise InputError("metrics_listen", f"cannot bind {listen}: {e.strerror or e}") from None
        self.tls = bool(cfg.tls_cert and cfg.tls_key)
        if self.tls:  # the API's certificate: tokens never cross the network in the clear on one port and not the other
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(cfg.tls_cert), str(cfg.tls_key))
            # the handshake on the request's own thread (its first read), not in the accepting loop: a client that
            # connects and says nothing must not hold up every other scrape
            self.http.socket = ctx.wrap_socket(self.http.socket, server_side=True, do_handshake_on_connect=False)
        self.registry = CollectorRegistry(auto_describe=False)  # after the bind: a failed one leaves nothing open
        self.collector = ControllerCollector(server)
        self.registry.register(self.collector)
        bound = self.http.server_address[1]
        self.address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        self._threads = [threading.Thread(target=self.http.serve_forever, daemon=True, name="metrics-http"),
                         threading.Thread(target=self._sample_loop, daemon=True, name="metrics-sampler")]

    def start(self) -> str:
        self._started = True
        for t in self._threads:
            t.start()
        if self.address_file is not None:
            _write_atomic(self.address_file, self.address + "\n")
        log.info("metrics and status page on %s://%s/ (/metrics; auth %s)", "https" if self.tls else "http",
                 self.address,
                 "on: a readonly, user or admin token in an Authorization: Bearer header"
                 if self.server.auth is not None else "OFF")
        return self.address

    def stop(self) -> None:
        self._stop.set()
        if self._started:  # shutdown() waits for serve_forever, which only a started server runs
            self.http.shutdown()
            for t in self._threads:
                t.join(timeout=5)
        self.http.server_close()
        self.collector.close()

    def _sample_loop(self) -> None:
        """A sample of the pool for the page's plot at start, then every ``sample_s``."""
        while True:
            t0 = time.thread_time()
            try:
                self.history.add(self.read_pool(False))
            except Exception as e:  # a failed sample leaves a gap in the plot, never stops the controller
                self.throttle.warn("sample", "utilisation sample failed: %s", e)
            self.collector.cost.add("sample", time.thread_time() - t0)
            if self._stop.wait(self.sample_s):
                return

    def read_pool(self, lines: bool) -> PoolSnapshot:
        with self._pool_lock:
            return self._pool.read(lines)

    def page(self, owner: str | None) -> str:
        """The status page; ``owner``: only that user's jobs (own_jobs_only), None for all."""
        pool = self.read_pool(True)
        totals = self.collector.tally.read(time.time())
        filters = pb.ListJobsRequest(states=["running", "stopping", "pending"])
        jobs, more = self.server.ctl.jobs_page(PAGE_JOBS, "", owner=owner, filters=filters)
        title = f"hpcsched controller {self.server.address}"
        return render(pool, totals, jobs, bool(more), self.history.samples(), title)

    def metrics(self) -> bytes:
        return generate_latest(self.registry)

    def who(self, header: str | None) -> tuple[int, str | None, str]:
        """(HTTP status, the owner filter, why refused) for a request's Authorization header."""
        auth = self.server.auth
        if auth is None:
            return 200, None, ""
        found = auth.identify(_bearer(header or ""))
        if found is None:
            return 401, None, ("missing or wrong token (send Authorization: Bearer <token>, or Basic with the token "
                               "as the password)")
        role, name = found
        if role not in READ_ROLES:
            return 403, None, f"this token's role ({role}) may not read the status page or metrics"
        own = self.server.cfg.own_jobs_only and role == USER
        return 200, name if own else None, ""


def _bearer(header: str) -> str:
    """The header as the API's ``Bearer <token>``. ``Basic`` (any user name, the token as the password) is taken too:
    it is what a browser asks for and sends by itself, in a header like the bearer token, never in the URL."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return header
    try:
        _, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return ""
    return f"Bearer {password}" if password else ""


def _write_atomic(path: Path, text: str) -> None:
    """Write-then-rename: a reader never sees half an address."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class _Http(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler], ipv6: bool) -> None:
        self.address_family = socket.AF_INET6 if ipv6 else socket.AF_INET
        super().__init__(addr, handler)


def _handler(ops: OpsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "hpcsched"
        sys_version = ""

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            t0 = time.thread_time()
            path = self.path.split("?", 1)[0]
            reply = self._answer(path)
            # every request's CPU, refused ones too (a flood of bad tokens costs the controller as well), counted
            # before the reply goes out: a client that reads /metrics next sees this request in it
            ops.collector.cost.add("page" if path == "/" else "metrics", time.thread_time() - t0)
            self._send(*reply)

        def _answer(self, path: str) -> tuple[int, bytes, str, dict[str, str]]:
            """(status, body, content type, headers) for a GET of ``path``."""
            text = "text/plain; charset=utf-8"
            if path not in ("/", "/metrics"):
                return 404, b"not found: / (status page) and /metrics only\n", text, {}
            status, owner, why = ops.who(self.headers.get("Authorization"))
            if status != 200:
                ops.throttle.warn(f"http {status}", "refused %s from %s: %s", path, self.client_address[0], why)
                return status, (why + "\n").encode(), text, \
                    {"WWW-Authenticate": 'Basic realm="hpcsched", Bearer realm="hpcsched"'} if status == 401 else {}
            try:
                if path == "/metrics":
                    return 200, ops.metrics(), CONTENT_TYPE_LATEST, {}
                return 200, ops.page(owner).encode(), "text/html; charset=utf-8", {}
            except Exception as e:  # one failed request is answered 500 and logged, the listener goes on
                ops.throttle.error(f"http 500 {path}", "%s failed: %s", path, e)
                return 500, f"{path} failed: {type(e).__name__}\n".encode(), text, {}

        def _send(self, status: int, body: bytes, ctype: str, headers: dict[str, str]) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            # the path without its query (never a credential in a log), at DEBUG: every scrape at INFO fills the log
            log.debug("http %s %s %s from %s", self.command, self.path.split("?", 1)[0][:200], code,
                      self.client_address[0])

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
            log.debug("http: %s", (format % args)[:200])

    return Handler
