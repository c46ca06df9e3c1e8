"""A worker's link to its controller beyond the heartbeat's content: sending it (to the controller, or as a lease
renewal to its lease server), the lease it fences its tasks by, finding a controller that moved, and saying why a
controller stays unreachable or refuses it (``ControllerLink``, mixed into ``worker.Worker``).

Lease renewals: a worker that runs no task and owes no full report has nothing to tell the controller, so when its
registration named a lease server (``RegisterReply.lease_port``, ``hpcsched.runtime.lease``) it renews its lease
there instead, away from the controller's threads and interpreter. A worker with tasks keeps beating the controller
(its reply may carry a stop, a resize or a launch decided on time alone), and so does every ``FULL_EVERY``-th beat,
which also brings the controller a fresh spare port. Renewals go over the worker's one lease connection
(``lease_link``), opened and subscribed to pushes right after registering: a pushed frame, like a renewal's reply
saying ``heartbeat_now`` (the controller has orders for it), is followed by a heartbeat to the controller at once, so
such a worker opens no ``Orders.Watch`` stream (one without a lease server does, ``worker_watch``). A beat woken by a
push goes to the controller, and so does the retry of a heartbeat to the controller that failed (shed, late). A
renewal that fails (the connection is down and reconnecting, or the lease server no longer holds this registration
because the worker was lost, or did not answer) is counted (``lease_fallbacks``), logged once per failure streak, and
the same beat goes to the controller, which says what to do (``reregister``); after a refusal or no answer the lease
server is tried again ``_LEASE_RETRY_S`` later, or at once after a new registration."""

from __future__ import annotations

import dataclasses
import logging
import socket
import time

import grpc

from hpcsched.runtime.auth import open_channel
from hpcsched.runtime.lease_link import LeaseLink
from hpcsched.runtime.lease_wire import LeaseError
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.worker_config import WorkerConfig
from hpcsched.runtime.worker_watch import OrdersWatch

log = logging.getLogger("hpcsched.runtime.worker")

_WAIT_POLL_S = 0.1  # a call in flight: the lease is checked this often
_HEARTBEAT_TIMEOUT_S = 10.0
RENEW_TIMEOUT_S = 5.0  # a lease server that does not answer: the beat goes to the controller after this
_LEASE_RETRY_S = 60.0  # after a failed renewal, beats go to the controller this long


class ControllerLink:
    """Heartbeats and renewals (``_beat``), the lease (``_fence``), rediscovery and refusals (the ``Worker`` sets
    these attributes and ``kill``)."""

    cfg: WorkerConfig
    lease_s: float | None
    _fenced: bool
    _tls_hinted: bool
    _refused_logged: str
    link: LeaseLink  # the lease connection (renewals and pushes)
    watch: OrdersWatch
    md: tuple
    _watch_port = 0  # the registration's Orders service, watched when the lease server does not push
    _lease: tuple[int, str] | None = None  # (slot, credential) at its lease server, None: no lease server
    _lease_retry_at = 0.0
    _lease_failing = False
    _beat_owed = False  # a heartbeat to the controller failed (shed, late): the next beat goes to it, not a renewal
    _in_flight: float | None = None  # when the heartbeat now waiting for the controller was sent (None: none waits)
    _checked_at: float | None = None  # when the lease was last checked (``_fence``)
    lease_renewals = 0  # renewals answered by the lease server
    lease_fallbacks = 0  # renewals that failed, sent to the controller instead

    def _beat(self, renewed: float, req: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        """One heartbeat, or a renewal at the lease server when there is nothing to report (module docstring); while
        it is in flight (a hung or cut-off controller holds it up to its 10 s timeout) the lease is still watched, so
        the tasks are stopped when it runs out, not when the call gives up."""
        if self._lease is not None and req.partial and not self.tasks and not self._beat_owed \
                and time.monotonic() >= self._lease_retry_at:
            reply = self._renew(renewed)
            if reply is not None:
                return reply
        self._beat_owed = True  # until the controller answers: a retry after a shed or late beat goes there too
        self._in_flight = time.monotonic()
        try:
            reply = self._answer(self.stub.Heartbeat.future(req, timeout=_HEARTBEAT_TIMEOUT_S, metadata=self.md),
                                 renewed)
        finally:
            self._in_flight = None
        self._beat_owed = False
        return reply

    def _answer(self, call: grpc.Future, renewed: float) -> pb.HeartbeatReply:
        while True:
            try:
                return call.result(timeout=_WAIT_POLL_S)
            except grpc.FutureTimeoutError:
                self._fence(time.monotonic() - renewed)

    def _renew(self, renewed: float) -> pb.HeartbeatReply | None:
        """Renew the lease at the lease server: the reply as a heartbeat's, or None when the beat must go to the
        controller (it has orders for this worker, or the renewal failed). It runs only while the worker has no task,
        so there is nothing to fence while it waits (at most ``RENEW_TIMEOUT_S``)."""
        assert self._lease is not None
        slot, credential = self._lease
        req = pb.RenewRequest(worker_id=self.cfg.name, instance=self.instance, slot=slot, credential=credential)
        try:
            r = self.link.renew(req)
        except LeaseError as e:
            self.lease_fallbacks += 1
            down = e.code == "UNAVAILABLE"  # the link reconnects on its own: renew there again once it is up
            if not down:
                self._lease_retry_at = time.monotonic() + _LEASE_RETRY_S
            if not self._lease_failing:
                log.warning("lease renewal failed (%s: %s): heartbeats go to the controller %s (%d such failures so "
                            "far)", e.code, e.details, "until the lease connection is back" if down
                            else f"for {_LEASE_RETRY_S:g} s", self.lease_fallbacks)
                self._lease_failing = True
            return None
        self._lease_failing = False
        self.lease_renewals += 1
        if r.heartbeat_now:
            return None
        return pb.HeartbeatReply(heartbeat_interval_s=r.heartbeat_interval_s)

    def _watch_instead(self) -> None:
        """The lease server does not push (a controller from before pushes): watch ``Orders`` as without one."""
        self.watch.update(self.cfg.controller, self._watch_port, self.md)

    def _lease_to(self, reply: pb.RegisterReply) -> bool:
        """After a registration: connect to the lease server it named and subscribe to pushes (at once, not at the
        first renewal: the pushes are this worker's only prompt news of orders). False: it named none, every beat
        goes to the controller and orders are heard on ``Orders.Watch``."""
        self._lease, self._watch_port = None, reply.watch_port
        if reply.lease_port > 0 and reply.credential:
            host = self.cfg.controller.rpartition(":")[0]
            self._lease = (reply.lease_slot, reply.credential)
            self._lease_retry_at, self._lease_failing = 0.0, False
            self.link.update(host, reply.lease_port, pb.RenewRequest(
                worker_id=self.cfg.name, instance=self.instance, slot=reply.lease_slot, credential=reply.credential))
            return True
        self.link.update("", 0, None)
        return False

    def _fence(self, silent: float) -> None:
        """The lease (module docstring): past it, stop every task, SIGTERM then SIGKILL after ``stop_grace_s``; at
        once by SIGKILL when the worker wakes past the lease and the grace both (SIGSTOP: its jobs run elsewhere)."""
        now = time.monotonic()
        checked, self._checked_at = self._checked_at, now
        if not self.lease_s or silent <= self.lease_s:
            self._fenced = False
            return
        live = [tid for tid, t in self.tasks.items() if t.exit_code is None]
        if not live:
            return
        grace = self.cfg.stop_grace_s
        hard = silent > self.lease_s + grace
        if not self._fenced:
            log.error("no heartbeat answered for %.1f s (%s), past this worker's lease (worker_timeout_s %g s): the "
                      "controller counts it lost, so it stops its %d task(s) itself (%s)", silent,
                      self._silence(now, checked), self.lease_s, len(live),
                      "SIGKILL" if hard else f"SIGTERM, SIGKILL after {grace:g} s")
            self._fenced = True
        for tid in live:
            self.kill(tid, checkpoint=not hard, grace_s=grace)

    def _silence(self, now: float, checked: float | None) -> str:
        """Where a lease's silence was, said with the fence: a heartbeat still waiting for its answer points at the
        controller (or the network), a lease last checked long before at this worker itself (its loop was stopped,
        starved or held up, or waited out a back-off after failed calls, which its log says just before)."""
        waiting = (f"the heartbeat sent {now - self._in_flight:.1f} s ago is still unanswered"
                   if self._in_flight is not None else "no heartbeat waits for an answer")
        last = f"the lease was last checked {now - checked:.1f} s before" if checked is not None else "first check"
        return f"{waiting}; {last}"

    def _controller_down(self) -> bool:
        """The controller's port refuses connections: it is not running (a partition or a hung host times out)."""
        host, _, port = self.cfg.controller.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return False
        except ConnectionRefusedError:
            return True
        except (OSError, ValueError):
            return False

    def _rediscover(self) -> None:
        """With an address file: when the controller is unreachable, read it again and reconnect if the address
        changed (the controller restarted on another port: ``listen: HOST:0``)."""
        if self.cfg.address_file is None:
            return
        try:
            address = self.cfg.address_file.read_text().split()[0]
        except (OSError, IndexError):
            return  # not written yet: the controller is starting
        if address != self.cfg.controller:
            log.info("controller moved: %s -> %s (from %s)", self.cfg.controller, address, self.cfg.address_file)
            self.cfg = dataclasses.replace(self.cfg, controller=address)
            self.channel.close()
            self.channel = open_channel(address, self.cfg.tls_ca)
            self.stub = pb_grpc.ControllerStub(self.channel)

    def _hint_tls(self) -> None:
        """Say once why a controller that accepts connections stays unreachable when this worker has no CA: a
        TLS controller closes a plaintext connection, and a worker without ``--tls-ca`` would retry forever with no
        hint."""
        if self.cfg.tls_ca is not None or self._tls_hinted:
            return
        host, _, port = self.cfg.controller.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                pass
        except (OSError, ValueError):
            return  # not listening at all: the controller is down or restarting, nothing to hint
        self._tls_hinted = True
        log.error("the controller at %s accepts connections but not this worker's calls: if it talks TLS, start the "
                  "worker with --tls-ca CA.pem (tls_ca: in its YAML)", self.cfg.controller)

    def _refused(self, e: grpc.RpcError) -> None:
        """The controller refused this daemon its name (another live daemon holds it): say so once per reason,
        and stop the tasks it still runs, which the controller counts as the holder's or as lost."""
        why = e.details() or ""
        if why != self._refused_logged:
            log.error("refused by the controller: %s", why)
            self._refused_logged = why
        for tid in list(self.tasks):
            self.kill(tid, checkpoint=False)
