"""The worker's end of ``Orders.Watch`` (``hpcsched.runtime.watch``): hear at once that the controller has orders.

Only for a worker whose registration named no lease server (or one from before pushes): with one, orders are pushed
on the lease connection (``lease_link``) and no Watch stream is opened. A thread keeps one Watch stream open to the
port the registration named (``RegisterReply.watch_port``, on the controller's host) with the worker's credential,
and sets ``nudged`` on every event; the worker's loop then heartbeats at once and the reply carries the orders.
Nothing else depends on it: a controller without the service (port 0), a refused or broken stream, only means the
orders come with the next regular heartbeat, as before. A broken stream is opened again after a back-off (1 s
doubling to 10 s), and at once after a new registration (a new credential: the controller restarted).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import grpc

from hpcsched.runtime.auth import open_channel
from hpcsched.runtime.rpc import pb, pb_grpc

log = logging.getLogger("hpcsched.runtime.worker")

_BACKOFF_S = (1.0, 10.0)


def watch_address(controller: str, port: int) -> str:
    """The Orders service's address: the controller's host (as this worker reaches it) with ``port``."""
    host = controller.rpartition(":")[0]
    return f"{host}:{port}"


class OrdersWatch:
    """The watch thread (module docstring). ``update`` after each registration; ``stop`` ends it."""

    def __init__(self, worker_id: str, instance: str, tls_ca: Path | None) -> None:
        self.worker_id, self.instance, self.tls_ca = worker_id, instance, tls_ca
        self.nudged = threading.Event()  # set by an event; the worker's loop clears it when it heartbeats
        self.events = 0
        self._cond = threading.Condition()
        self._target: tuple[str, tuple] | None = None  # (address, metadata) to watch with, None: nothing to watch
        self._version = 0  # bumped by update: a stream opened with older values is replaced
        self._stopped = False
        self._call = None
        self._thread = threading.Thread(target=self._run, name="orders-watch", daemon=True)
        self._thread.start()

    def update(self, controller: str, port: int, md: tuple) -> None:
        """After a registration: watch ``port`` on the controller's host with these call metadata (0: do not)."""
        with self._cond:
            self._target = (watch_address(controller, port), md) if port > 0 else None
            self._version += 1
            call = self._call
            self._cond.notify_all()
        if call is not None:
            call.cancel()  # reopened with the new credential

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            call = self._call
            self._cond.notify_all()
        if call is not None:
            call.cancel()
        self._thread.join(timeout=5)

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
                (address, md), version = self._target, self._version
            channel = open_channel(address, self.tls_ca)
            try:
                call = pb_grpc.OrdersStub(channel).Watch(
                    pb.WatchRequest(worker_id=self.worker_id, instance=self.instance), metadata=md)
                with self._cond:
                    self._call = call
                    if self._stopped or version != self._version:
                        call.cancel()
                for _ in call:
                    self.events += 1
                    self.nudged.set()
                    backoff = _BACKOFF_S[0]
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.CANCELLED and f"{e.code().name}" != logged:
                    logged = e.code().name  # once per kind of failure, not at every retry
                    log.info("orders watch on %s: %s (%s); orders come with heartbeats meanwhile", address,
                             e.code().name, e.details())
            finally:
                with self._cond:
                    self._call = None
                channel.close()
            with self._cond:
                if self._stopped:
                    return
                if version == self._version:  # broken, not replaced: wait before trying again
                    self._cond.wait(backoff)
                    backoff = min(backoff * 2, _BACKOFF_S[1])
