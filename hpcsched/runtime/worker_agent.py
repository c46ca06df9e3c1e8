"""The worker's ``WorkerAgent`` service: start a command on this node for a job's launcher on another node.

Open MPI's ``mpirun`` on a job's first node starts one daemon (``orted``) on every other node through its rsh
agent, ssh on a classic cluster. hpcsched's agent (``rsh_agent.py``) asks the target node's worker instead, over
gRPC: no ssh keys, no ssh daemon, and the daemon runs under the worker like any task (its session, the
parent-death signal, killed with the job's task).

What it refuses: a call without the job's key, and a command for a job that holds no live task of that attempt
here: the caller must be the launcher of a job the controller placed on this worker. The key is
``job_key(worker token, job, attempt)``, an HMAC the node-0 worker gives its launcher and every worker can
check: a job's programs never see the worker token itself (no credentials in task environments), and
the key lets them do only what their own launcher may, for that attempt, on the nodes it holds.

The controller sends an attempt's tasks to its workers on their own heartbeats, so node 0's launcher may call
before this worker has its task: a call waits up to ``HOLD_WAIT_S`` for it.

The command runs as ``/bin/sh -c COMMAND`` (what ssh does with its command line) with the environment and working
directory the job's task here was given. Its stdout and stderr are streamed back; the last reply is its exit code.
It is killed (its whole tree) when the caller goes away. It runs under the same rules as the job's task here (the
worker's ``Sandbox``): a task guard, the task's user, the task's cgroup leaf.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from hpcsched.runtime.auth import HEADER
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.sandbox import Identity, Sandbox

log = logging.getLogger("hpcsched.runtime.worker_agent")

_CHUNK = 65536
HOLD_WAIT_S = 30.0  # a few heartbeat intervals, with room for a loaded node


@dataclass(slots=True)
class Holder:
    """What a command started for a job runs with: the environment and directory of the job's task on this
    node, and the list its processes are added to (so killing the task kills them)."""

    env: dict[str, str]
    cwd: str | None
    procs: list[subprocess.Popen] = field(default_factory=list)
    user: Identity | None = None  # whom the task runs as: its commands too
    leaf: str = ""  # the task's cgroup leaf (by name): its commands join it


class AgentService(pb_grpc.WorkerAgentServicer):
    """``token``: this worker's token (None: no auth, as a controller without one); ``find(job_id, generation)``
    returns the live task's Holder or None; ``sandbox`` starts and kills the commands (the worker's)."""

    def __init__(self, worker: str, token: str | None, find: Callable[[str, int], Holder | None],
                 sandbox: Sandbox | None = None, hold_wait_s: float = HOLD_WAIT_S) -> None:
        self.worker, self.token, self.find, self.hold_wait_s = worker, token, find, hold_wait_s
        self.sandbox = sandbox or Sandbox.plain()

    def _wait_for_holder(self, job_id: str, generation: int, context: grpc.ServicerContext) -> Holder | None:
        deadline = time.monotonic() + self.hold_wait_s
        while (holder := self.find(job_id, generation)) is None and time.monotonic() < deadline \
                and context.is_active():
            time.sleep(0.05)
        return holder

    def Exec(self, request_iterator: Iterator[pb.ExecInput], context: grpc.ServicerContext) -> Iterator[pb.ExecOutput]:
        first = next(request_iterator, None)
        if first is None or not first.HasField("start") or not first.start.command:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must carry start with a command")
        st = first.start
        if self.token is not None:
            got = dict(context.invocation_metadata() or ()).get(HEADER, "")
            want = f"Bearer {job_key(self.token, st.job_id, st.generation)}"
            if not hmac.compare_digest(got.encode(), want.encode()):
                log.warning("refused a command for job %s attempt %d from %s: missing or wrong key", st.job_id,
                            st.generation, context.peer())
                context.abort(grpc.StatusCode.UNAUTHENTICATED, f"missing or wrong key for job {st.job_id!r}")
        holder = self._wait_for_holder(st.job_id, st.generation, context)
        if holder is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"worker {self.worker} holds no live task of job {st.job_id!r} attempt {st.generation} "
                          f"(waited {self.hold_wait_s:.0f} s)")
        try:
            proc = self.sandbox.spawn(["/bin/sh", "-c", st.command], holder.env, cwd=holder.cwd,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      leaf=holder.leaf or None, user=holder.user)
        except OSError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"worker {self.worker} cannot start the command: {e}")
        holder.procs.append(proc)
        log.info("job %s attempt %d: started %s for a remote launcher (pid %d)", st.job_id, st.generation,
                 st.command[:200], proc.pid)
        context.add_callback(lambda: self.sandbox.kill_tree(proc))  # the caller went away
        out: queue.Queue[tuple[str, bytes]] = queue.Queue()

        def pump(stream, key: str) -> None:
            fd = stream.fileno()
            while chunk := os.read(fd, _CHUNK):
                out.put((key, chunk))
            stream.close()
            out.put((key, b""))

        def feed() -> None:
            stdin = proc.stdin
            assert stdin is not None
            with contextlib.suppress(grpc.RpcError, OSError, ValueError):
                for req in request_iterator:
                    if req.stdin:
                        stdin.write(req.stdin)
                        stdin.flush()
                    if req.stdin_closed:
                        break
            with contextlib.suppress(OSError):
                stdin.close()

        for target, args in ((pump, (proc.stdout, "stdout")), (pump, (proc.stderr, "stderr")), (feed, ())):
            threading.Thread(target=target, args=args, daemon=True, name=f"agent-{proc.pid}").start()
        open_streams = 2
        while open_streams:
            key, chunk = out.get()
            if not chunk:
                open_streams -= 1
            else:
                yield pb.ExecOutput(**{key: chunk})
        code = proc.wait()
        with contextlib.suppress(ValueError):
            holder.procs.remove(proc)
        self.sandbox.release(proc)
        log.info("job %s attempt %d: remote launcher's command (pid %d) exited with %d", st.job_id, st.generation,
                 proc.pid, code)
        yield pb.ExecOutput(exited=True, exit_code=code if code >= 0 else 128 - code)


def job_key(token: str, job_id: str, generation: int) -> str:
    """The credential of one job attempt's launcher at the other workers' agent services (module docstring)."""
    return hmac.new(token.encode(), f"hpcsched-agent:{job_id}:{generation}".encode(), hashlib.sha256).hexdigest()


def serve(host: str, service: AgentService, threads: int = 16) -> tuple[grpc.Server, int]:
    """Listen on ``host`` at a port the kernel picks; the port goes to the controller in every heartbeat."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
    pb_grpc.add_WorkerAgentServicer_to_server(service, server)
    target = f"[{host}]:0" if ":" in host else f"{host}:0"
    port = server.add_insecure_port(target)
    if not port:
        raise OSError(f"the worker agent cannot listen on {target}")
    server.start()
    return server, port
