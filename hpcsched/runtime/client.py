"""A small client for ``hpcsched submit / jobs / cancel / workers``: where the controller is, with which token.

The address comes from ``--controller HOST:PORT``, else ``$HPCSCHED_CONTROLLER``, else the first line of
an address file (what a controller with ``address_file`` writes); the token from ``--token-file`` or
``$HPCSCHED_TOKEN``. RPC failures become one-line errors, never tracebacks.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from hpcsched.errors import InputError
from hpcsched.runtime.auth import metadata, open_channel
from hpcsched.runtime.config import read_token
from hpcsched.runtime.rpc import pb, pb_grpc


class ClientError(Exception):
    """The controller refused or could not be reached; the message says which and why."""


def resolve_address(controller: str | None, address_file: Path | None) -> str:
    if controller:
        return controller
    if os.environ.get("HPCSCHED_CONTROLLER"):
        return os.environ["HPCSCHED_CONTROLLER"]
    if address_file is not None:
        try:
            return address_file.read_text().split()[0]
        except (OSError, IndexError):
            raise InputError(address_file, "no controller address in this file (is the controller running?)") from None
    raise InputError(None, "where is the controller? pass --controller HOST:PORT or set HPCSCHED_CONTROLLER")


def resolve_token(token_file: Path | None) -> str | None:
    if token_file is not None:
        return read_token(None, token_file, str(token_file))
    return os.environ.get("HPCSCHED_TOKEN") or None


class Client:
    def __init__(self, address: str, token: str | None, tls_ca: Path | None = None, timeout: float = 10.0) -> None:
        self.address = address
        self.channel = open_channel(address, tls_ca)
        self.stub = pb_grpc.ControllerStub(self.channel)
        self.md = metadata(token)
        self.timeout = timeout

    def _call(self, method: str, request):
        try:
            return getattr(self.stub, method)(request, timeout=self.timeout, metadata=self.md)
        except grpc.RpcError as e:
            raise ClientError(f"controller {self.address}: {e.code().name}: {e.details()}") from None

    def submit(self, spec_yaml: str, source: str) -> str:
        return self._call("Submit", pb.SubmitRequest(spec_yaml=spec_yaml, source=source)).job_id

    def jobs(self) -> list[pb.JobInfo]:
        return list(self._call("ListJobs", pb.ListJobsRequest()).jobs)

    def cancel(self, job_id: str) -> pb.CancelReply:
        return self._call("Cancel", pb.CancelRequest(job_id=job_id))

    def workers(self) -> list[pb.WorkerInfo]:
        return list(self._call("ListWorkers", pb.ListWorkersRequest()).workers)

    def close(self) -> None:
        self.channel.close()
