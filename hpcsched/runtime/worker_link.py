"""A worker's link to its controller beyond the heartbeat itself: the lease it fences its tasks by, finding a
controller that moved, and saying why a controller stays unreachable or refuses it (``ControllerLink``, mixed into
``worker.Worker``)."""

from __future__ import annotations

import dataclasses
import logging
import socket

import grpc

from hpcsched.runtime.auth import open_channel
from hpcsched.runtime.rpc import pb_grpc
from hpcsched.runtime.worker_config import WorkerConfig

log = logging.getLogger("hpcsched.runtime.worker")


class ControllerLink:
    """The lease (``_fence``), rediscovery and refusals (the ``Worker`` sets these attributes and ``kill``)."""

    cfg: WorkerConfig
    lease_s: float | None
    _fenced: bool
    _tls_hinted: bool
    _refused_logged: str

    def _fence(self, silent: float) -> None:
        """The lease (module docstring): past it, stop every task, SIGTERM then SIGKILL after ``stop_grace_s``; at
        once by SIGKILL when the worker wakes past the lease and the grace both (SIGSTOP: its jobs run elsewhere)."""
        if not self.lease_s or silent <= self.lease_s:
            self._fenced = False
            return
        live = [tid for tid, t in self.tasks.items() if t.exit_code is None]
        if not live:
            return
        grace = self.cfg.stop_grace_s
        hard = silent > self.lease_s + grace
        if not self._fenced:
            log.error("no heartbeat answered for %.1f s, past this worker's lease (worker_timeout_s %g s): the "
                      "controller counts it lost, so it stops its %d task(s) itself (%s)", silent, self.lease_s,
                      len(live), "SIGKILL" if hard else f"SIGTERM, SIGKILL after {grace:g} s")
            self._fenced = True
        for tid in live:
            self.kill(tid, checkpoint=not hard, grace_s=grace)

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
