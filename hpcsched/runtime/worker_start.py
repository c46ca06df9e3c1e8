"""How a worker daemon starts safely: its token out of its ``/proc/PID/environ``, and a clear one-line refusal
(no traceback) when its node cannot hold tasks (a full disk, an identity the config names that does not exist)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.runtime.task_dirs import CREDENTIAL_ENV, space_problem

TOKEN_FD_FLAG = "--token-fd"


def reexec_without_token(environ: dict[str, str] | os._Environ) -> None:
    """When the token came in ``$HPCSCHED_TOKEN``, run this same command again without it in the environment, the
    token on an inherited pipe (``--token-fd N``): a process's initial environment stays readable in its
    ``/proc/PID/environ`` whatever it later removes from ``os.environ``. Returns only when there is nothing to
    do."""
    token = environ.get("HPCSCHED_TOKEN")
    if not token or any(a.startswith(TOKEN_FD_FLAG) for a in sys.argv):
        return
    r, w = os.pipe()
    os.write(w, token.encode())
    os.close(w)
    os.set_inheritable(r, True)
    env = {k: v for k, v in environ.items() if k not in CREDENTIAL_ENV}
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:], f"{TOKEN_FD_FLAG}={r}"], env)


def read_token_fd(fd: int) -> str:
    """The token a re-executed daemon got on its pipe (and the pipe closed)."""
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode().strip()


def check_node(work_dir: Path, min_free_mb: float) -> None:
    """InputError naming the work dir when it cannot be made or its disk is under the floor."""
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(work_dir, f"cannot create the worker's work dir: {e.strerror or e}") from None
    problem = space_problem([work_dir], min_free_mb)
    if problem:
        raise InputError(work_dir, f"this worker cannot hold tasks: {problem}")


def pilot_worker_argv(python: str, controller: str, slots: int, gpus: int, stop_grace_s: float,
                      orphan_timeout_s: float, token_file: Path | None, worker_config: Path | None) -> list[str]:
    """The command a node source's pilot job runs: one worker for the controller, leaving on its own once the
    controller has been unreachable ``orphan_timeout_s`` (a controller killed and not restarted)."""
    argv = [python, "-m", "hpcsched.runtime", "worker", "--controller", controller, "--slots", str(slots),
            "--gpus", str(gpus), "--stop-grace", str(stop_grace_s), "--orphan-timeout", str(orphan_timeout_s)]
    if token_file is not None:
        argv += ["--token-file", str(token_file)]
    if worker_config is not None:
        argv += ["--config", str(worker_config)]
    return argv
