"""The controller process: gRPC service over ``Controller``, the scheduling thread, the address file.

The service only translates messages; a bad job file becomes INVALID_ARGUMENT with the file and line.
The bound address is written to ``address_file`` (write-then-rename, so a reader never sees half a
line) because with ``listen: 127.0.0.1:0`` nobody knows the port until the server has bound it.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent import futures
from pathlib import Path

import grpc

from hpcsched.errors import InputError
from hpcsched.runtime.auth import TokenInterceptor, server_credentials
from hpcsched.runtime.config import ControllerConfig, parse_address
from hpcsched.runtime.controller import Controller
from hpcsched.runtime.rpc import pb, pb_grpc

log = logging.getLogger("hpcsched.runtime.server")


class _Service(pb_grpc.ControllerServicer):
    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    def Register(self, request, context):
        return self.ctl.register(request)

    def Heartbeat(self, request, context):
        return self.ctl.heartbeat(request)

    def Submit(self, request, context):
        try:
            return pb.SubmitReply(job_id=self.ctl.submit(request.spec_yaml, request.source))
        except InputError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def ListJobs(self, request, context):
        return pb.ListJobsReply(jobs=self.ctl.list_jobs())

    def Cancel(self, request, context):
        ok, msg = self.ctl.cancel(request.job_id)
        return pb.CancelReply(cancelled=ok, message=msg)

    def ListWorkers(self, request, context):
        return pb.ListWorkersReply(workers=self.ctl.list_workers())

    def Leave(self, request, context):
        return self.ctl.leave(request)


class ControllerServer:
    """A running controller; ``start`` returns once it listens, ``stop`` ends it."""

    def __init__(self, cfg: ControllerConfig, max_workers: int = 32) -> None:
        self.cfg = cfg
        self.ctl = Controller(cfg)
        interceptors = [TokenInterceptor(cfg.token)] if cfg.token else []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), interceptors=interceptors)
        pb_grpc.add_ControllerServicer_to_server(_Service(self.ctl), self.server)
        host, port = parse_address(cfg.listen, "listen")
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if cfg.tls_cert and cfg.tls_key:
            bound = self.server.add_secure_port(target, server_credentials(cfg.tls_cert, cfg.tls_key))
        else:
            bound = self.server.add_insecure_port(target)
        if not bound:
            raise InputError("listen", f"cannot bind {cfg.listen}")
        self.address = f"{host}:{bound}"
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self.ctl.run_forever, args=(self._stop,), daemon=True, name="scheduler")

    def start(self) -> str:
        self.server.start()
        self.ctl.started()
        self._loop.start()
        if self.cfg.address_file:
            _write_atomic(self.cfg.address_file, self.address + "\n")
        log.info("controller listening on %s (auth %s, TLS %s, policy %s, state %s)", self.address,
                 "on" if self.cfg.token else "OFF", "on" if self.cfg.tls_cert else "off", self.cfg.policy,
                 self.cfg.state)
        return self.address

    def wait(self) -> None:
        self.server.wait_for_termination()

    def stop(self) -> None:
        self._stop.set()
        self.ctl.wakeup.set()
        self.server.stop(grace=1).wait()
        self._loop.join(timeout=5)
        self.ctl.store.close()


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
