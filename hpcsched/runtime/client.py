"""A small client for ``hpcsched submit / jobs / cancel / workers``: where the controller is, with which token.

The address comes from ``--controller HOST:PORT``, else ``$HPCSCHED_CONTROLLER``, else the first line of
an address file (what a controller with ``address_file`` writes); the token from ``--token-file`` or
``$HPCSCHED_TOKEN``. RPC failures become one-line errors, never tracebacks.

Listings are fetched page by page (the controller bounds every reply). A submit carries a request id made here
and is retried with the same id when the controller could not be reached or did not answer in time, so the
retry returns the job the first attempt made instead of a second one. A query the controller refuses as busy
(RESOURCE_EXHAUSTED: many listings at once) is retried after a random pause for up to ``BUSY_RETRY_S``: the
controller answered, it is only serving other queries first (40 concurrent listings of 10,000 jobs each take
seconds in all on a 2-core node, and such a call waited rather than failing). A submit the controller sheds because
enough calls already wait for its lock (RESOURCE_EXHAUSTED, ``liveness.SHED_PREFIX``) is retried the same way; a
refusal by the pending-jobs quota (also RESOURCE_EXHAUSTED) is not.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from pathlib import Path

import grpc

from hpcsched.errors import InputError
from hpcsched.runtime.auth import metadata, open_channel
from hpcsched.runtime.config import read_token
from hpcsched.runtime.liveness import SHED_PREFIX
from hpcsched.runtime.rpc import pb, pb_grpc


class ClientError(Exception):
    """The controller refused or could not be reached; the message says which and why, ``code`` the gRPC status
    name ('' when there was none)."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


# One SubmitMany call: at most this many files, jobs (array instances) and bytes of job files. A reply then comes
# in well under a second on a busy node (a lost one is resent whole: the request ids make that safe), the request
# stays a quarter of gRPC's 4 MiB default, and the default controller cap (max_submit_batch 10,000) is never hit
# except by one array larger than it.
BATCH_FILES = 500
BATCH_JOBS = 2000
BATCH_BYTES = 1 << 20


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


_RETRY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
BUSY_RETRY_S = 60.0


class Client:
    def __init__(self, address: str, token: str | None, tls_ca: Path | None = None, timeout: float = 10.0) -> None:
        """``timeout``: seconds for one call, retries of a busy query or of a submit included."""
        self.address = address
        self.channel = open_channel(address, tls_ca)
        self.stub = pb_grpc.ControllerStub(self.channel)
        self.md = metadata(token)
        self.timeout = timeout
        self.stopped = ""  # why no more submits are sent (set by submit_many: the controller is not there for them)

    def _call(self, method: str, request, retry: tuple[grpc.StatusCode, ...] = (grpc.StatusCode.RESOURCE_EXHAUSTED,),
              attempt_s: float | None = None):
        """One RPC, retried on the codes in ``retry`` until ``self.timeout``; each attempt gets ``attempt_s`` (all
        the time left when None)."""
        start = time.monotonic()
        deadline = start + self.timeout
        pause = 0.05
        while True:
            left = max(0.1, deadline - time.monotonic())
            try:
                return getattr(self.stub, method)(request, timeout=min(left, attempt_s or left), metadata=self.md)
            except grpc.RpcError as e:
                code = e.code()
                # a call shed because others wait for the controller's lock (not a quota): retried like a busy query
                shed = code == grpc.StatusCode.RESOURCE_EXHAUSTED and (e.details() or "").startswith(SHED_PREFIX)
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED and (code in retry or shed):  # busy: a longer budget,
                    deadline = max(deadline, start + max(self.timeout, BUSY_RETRY_S))  # a full timeout for the next
                if (code not in retry and not shed) or time.monotonic() + pause >= deadline:
                    raise ClientError(f"controller {self.address}: {code.name}: {e.details()}", code.name) from None
            time.sleep(pause * random.uniform(0.5, 1.5))  # spread out the retries of many clients
            pause = min(pause * 2, 1.0)

    def submit(self, job: str | pb.JobRecord, source: str, request_id: str | None = None) -> str:
        """The job's id; ``job``: the job file's text, or its record as read here (``jobrecord.to_record``: the
        controller then reads no YAML). Retried with the same ``request_id`` (a fresh one unless given) when the
        controller is unreachable or slow: the controller stores one job per request id."""
        req = _request(job, source, request_id or uuid.uuid4().hex)
        return self._call("Submit", req, retry=_RETRY, attempt_s=max(2.0, self.timeout / 3)).job_id

    def submit_many(self, items: list[tuple[str | pb.JobRecord, str, int]]) -> list[pb.SubmitResult]:
        """Submit job files (text or record as ``submit``, source, jobs it makes: an array's N) in batches of at
        most BATCH_FILES files, BATCH_JOBS jobs and BATCH_BYTES bytes, one SubmitMany call each; a result per item,
        in order. Each item has its own request id, and a batch whose reply is lost is resent with the same ids (no
        job is made twice). A batch over the controller's own cap (its max_submit_batch may be lower than BATCH_JOBS)
        is split in halves and sent again; one it refuses otherwise gives each of its items that error; once it
        cannot be reached, the items not sent (in this call and later ones: ``stopped``) say so. Safe to call from
        another thread than the one preparing the next items (``hpcsched submit`` overlaps the two)."""
        out: list[pb.SubmitResult] = []
        for batch in _batches(items):
            out += self._send([_request(job, src, uuid.uuid4().hex) for job, src, _ in batch])
        return out

    def _send(self, batch: list[pb.SubmitRequest]) -> list[pb.SubmitResult]:
        if self.stopped:
            return [pb.SubmitResult(error=self.stopped) for _ in batch]
        try:
            return list(self._call("SubmitMany", pb.SubmitManyRequest(jobs=batch), retry=_RETRY,
                                   attempt_s=max(5.0, self.timeout / 2)).results)
        except ClientError as e:
            if e.code == "INVALID_ARGUMENT" and "(max_submit_batch)" in str(e) and len(batch) > 1:
                half = len(batch) // 2
                return self._send(batch[:half]) + self._send(batch[half:])
            if e.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "UNAUTHENTICATED", "PERMISSION_DENIED"):
                self.stopped = f"not sent: {e}"
            # No answer in time: this batch may be stored (its reply lost), the later ones are not sent.
            maybe = f"not confirmed (see `hpcsched jobs` before resubmitting): {e}"
            return [pb.SubmitResult(error=maybe if e.code == "DEADLINE_EXCEEDED" else self.stopped or str(e))
                    for _ in batch]

    def jobs(self, page_size: int = 0, states: tuple[str, ...] = (), owner: str = "", name: str = ""
             ) -> list[pb.JobInfo]:
        """Every job, page by page (``page_size`` 0: the controller's default page); only those in ``states``, of
        ``owner``, named ``name`` (a glob with * or ?) when given: the controller filters."""
        out: list[pb.JobInfo] = []
        token = ""
        while True:
            reply = self._call("ListJobs", pb.ListJobsRequest(page_size=page_size, page_token=token, states=states,
                                                              owner=owner, name=name))
            out += reply.jobs
            token = reply.next_page_token
            if not token:
                return out

    def cancel(self, job_id: str) -> pb.CancelReply:
        return self._call("Cancel", pb.CancelRequest(job_id=job_id))

    def workers(self) -> list[pb.WorkerInfo]:
        out: list[pb.WorkerInfo] = []
        token = ""
        while True:
            reply = self._call("ListWorkers", pb.ListWorkersRequest(page_token=token))
            out += reply.workers
            token = reply.next_page_token
            if not token:
                return out

    def nodes(self) -> pb.ListWorkersReply:
        """The controller's node source and, for ``slurm``, each node of the pilots' partition with what it does
        for the controller or why it is not used (``node_source``, ``nodes``, ``nodes_time``; one small page)."""
        return self._call("ListWorkers", pb.ListWorkersRequest(page_size=1, with_nodes=True))

    def close(self) -> None:
        self.channel.close()


def _request(job: str | pb.JobRecord, source: str, request_id: str) -> pb.SubmitRequest:
    if isinstance(job, str):
        return pb.SubmitRequest(spec_yaml=job, source=source, request_id=request_id)
    return pb.SubmitRequest(job=job, source=source, request_id=request_id)


_Item = tuple[str | pb.JobRecord, str, int]


def _batches(items: list[_Item]) -> list[list[_Item]]:
    """Consecutive runs of ``items`` within the batch bounds (an item over them alone is a batch of its own)."""
    out: list[list[_Item]] = []
    cur: list[_Item] = []
    jobs = size = 0
    for it in items:
        job = it[0]
        n, b = it[2], (len(job) if isinstance(job, str) else job.ByteSize()) + len(it[1]) + 48
        if cur and (len(cur) >= BATCH_FILES or jobs + n > BATCH_JOBS or size + b > BATCH_BYTES):
            out.append(cur)
            cur, jobs, size = [], 0, 0
        cur.append(it)
        jobs += n
        size += b
    if cur:
        out.append(cur)
    return out
