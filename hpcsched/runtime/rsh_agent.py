"""Open MPI's rsh agent without ssh: ``python -m hpcsched.runtime.rsh_agent HOST COMMAND...``.

``mpirun`` starts its daemon on every other node of a job as ``AGENT HOST orted ...`` (``plm_rsh_agent``). This
agent asks HOST's hpcsched worker to run the command (its ``WorkerAgent.Exec`` RPC, ``worker_agent.py``) and
relays stdin, stdout, stderr and the exit code, as ssh would. The worker runs it only for a job that holds a
live task there, so the agent says which job and attempt it acts for.

Everything it needs comes from the environment the worker gave the launcher's task:

- ``HPCSCHED_AGENTS``: JSON ``{host: "ADDR:PORT"}``, the agent service of each node of the job (from the
  controller, ``LaunchTask.agents``), updated by the file ``HPCSCHED_AGENTS_FILE`` names, when set (an elastic
  Horovod job's node-0 worker rewrites it when the job grows in place onto another host);
- ``HPCSCHED_AGENT_KEY``: this job attempt's key (``worker_agent.job_key``), when auth is on;
- ``HPCSCHED_JOB_ID``, ``HPCSCHED_GENERATION``: the job and attempt.

ssh-style options before HOST (``-x``, ``-o Opt=v``, ``-p PORT``, ...) are accepted and ignored, so the agent
can stand in for ``ssh`` in tools that call it by that name. Exit codes: the command's (128 + N when killed by
signal N); 255 when the agent cannot reach or use HOST's worker, with the reason on stderr (ssh's convention).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

AGENTS_ENV = "HPCSCHED_AGENTS"
FILE_ENV = "HPCSCHED_AGENTS_FILE"  # a JSON file of the same map, read on every call: an elastic job's hosts change
KEY_ENV = "HPCSCHED_AGENT_KEY"
_SSH_OPTS_WITH_ARG = set("bcDEeFIiJLlmOopQRSWw")  # ssh(1) options that take a value
_AFTER_HOST = ("-p", "-i", "-o", "-x", "-T", "-q", "-n")
_CANNOT = 255


def split_argv(argv: list[str]) -> tuple[str, str]:
    """(HOST, command line) from ``[ssh options] HOST COMMAND...``: the words are joined with spaces, as ssh
    joins them for the remote shell (Open MPI quotes its arguments for that shell)."""
    k = 0
    while k < len(argv) and argv[k].startswith("-") and len(argv[k]) > 1:
        opt = argv[k]
        k += 2 if opt[-1] in _SSH_OPTS_WITH_ARG and len(opt) == 2 else 1
    if k >= len(argv) - 1:
        raise ValueError(f"usage: rsh_agent [ssh options] HOST COMMAND..., got {argv!r}")
    host = argv[k].rpartition("@")[2]  # user@host: the user is the worker's
    k += 1
    while k < len(argv) - 1 and argv[k] in _AFTER_HOST:  # ssh also takes options after the host (Horovod: -p)
        k += 2 if argv[k] in ("-p", "-i", "-o") else 1
    return host, " ".join(argv[k:])


def write_ssh_shim(directory: Path, python: str) -> Path:
    """A directory holding ``ssh`` (and ``rsh``) that run this agent: put first on a launcher's PATH, it serves
    tools that run ``ssh HOST COMMAND`` themselves (horovodrun). Returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("ssh", "rsh"):
        tmp = directory / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(f'#!/bin/sh\nexec {shlex.quote(python)} -m hpcsched.runtime.rsh_agent "$@"\n')
        tmp.chmod(0o755)
        os.replace(tmp, directory / name)
    return directory


def endpoint(host: str, agents: dict[str, str]) -> str:
    if host in agents:
        return agents[host]
    known = ", ".join(sorted(agents)) or "none"
    raise LookupError(f"no hpcsched worker agent known for host {host!r} (known: {known}; ${AGENTS_ENV})")


def agents_map(env: dict[str, str] | os._Environ) -> dict[str, str]:
    """Host -> agent ``ADDR:PORT`` from ``$HPCSCHED_AGENTS``, updated by ``$HPCSCHED_AGENTS_FILE`` when that names a
    file: an elastic Horovod job resized in place onto a new host learns its agent there (the worker rewrites it)."""
    agents = json.loads(env.get(AGENTS_ENV) or "{}")
    path = env.get(FILE_ENV)
    if path:
        try:
            agents |= json.loads(Path(path).read_text())
        except FileNotFoundError:
            pass
        except ValueError as e:
            raise ValueError(f"${FILE_ENV} ({path}): not a JSON map: {e}") from None
    return agents


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        host, command = split_argv(argv)
        target = endpoint(host, agents_map(os.environ))
        job, generation = os.environ["HPCSCHED_JOB_ID"], int(os.environ["HPCSCHED_GENERATION"])
        key = os.environ.get(KEY_ENV) or None
    except (ValueError, LookupError, OSError, KeyError) as e:
        what = f"${e.args[0]} is not set" if isinstance(e, KeyError) else str(e)
        print(f"hpcsched rsh agent: {what}", file=sys.stderr)
        return _CANNOT
    return relay(target, key, job, generation, command)


def relay(target: str, key: str | None, job: str, generation: int, command: str) -> int:
    """Run ``command`` through the worker at ``target`` and relay its stdio; its exit code."""
    import grpc

    from hpcsched.runtime.auth import metadata, open_channel
    from hpcsched.runtime.rpc import pb, pb_grpc

    channel = open_channel(target)
    stub = pb_grpc.WorkerAgentStub(channel)

    def requests() -> Iterator[pb.ExecInput]:
        yield pb.ExecInput(start=pb.ExecStart(job_id=job, generation=generation, command=command))
        fd = sys.stdin.fileno() if sys.stdin is not None else -1
        while fd >= 0:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            yield pb.ExecInput(stdin=chunk)
        yield pb.ExecInput(stdin_closed=True)
        done.wait()  # keep the stream open until the command has ended (a closed stream ends the call)

    done = threading.Event()
    call = stub.Exec(requests(), metadata=metadata(key))
    # mpirun stops its agents with SIGTERM or SIGINT at the end or on an abort: the call is cancelled and the
    # worker kills the command's session.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: call.cancel())
    code = _CANNOT
    try:
        for out in call:
            if out.stdout:
                os.write(1, out.stdout)
            if out.stderr:
                os.write(2, out.stderr)
            if out.exited:
                code = out.exit_code
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.CANCELLED:
            print(f"hpcsched rsh agent: worker at {target}: {e.code().name}: {e.details()}", file=sys.stderr)
        code = _CANNOT if code == _CANNOT else code
    finally:
        done.set()
        channel.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
