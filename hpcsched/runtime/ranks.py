"""The ``direct`` launcher's per-node supervisor: starts a node's ranks itself, with the environment
``torch.distributed`` (``init_process_group`` with ``env://``) and torchrun-style programs expect.

Why not torchrun: its agent is a second Python process that imports torch (2-3 s of CPU) before it starts
the trainers, which import torch again; on a 2-core node a resize paid both, one after the other
(relaunch to first report 13.7-14.9 s). This supervisor imports only the standard library (it is run as
a file, ``python ranks.py``, so not even the ``hpcsched`` package is imported) and starts the ranks at
once. The rendezvous is static: rank 0 hosts the store at MASTER_ADDR:MASTER_PORT (a port the master
node reported free), every rank knows RANK and WORLD_SIZE from the launch.

What it keeps of torchrun's agent: SIGTERM (the runtime's checkpoint-and-stop) is forwarded to every
rank; one rank failing tears the others down (SIGTERM, then SIGKILL after ``--grace``), and the node's
task exits with the failing rank's code (128 + N for a rank killed by signal N, 127 for one that cannot start;
0 only when every rank exited 0); the ranks die with the supervisor (parent-death signal through
``setpriv``, as the worker starts its tasks). What it leaves out: restarts in place (the controller
restarts a failed attempt from its checkpoint anyway) and elastic membership changes (a resize here is a
stop and a relaunch at the new size).

    python ranks.py --nprocs 2 --rank-offset 0 [--grace 10] -- PROGRAM ARGS...

Warm start (``--warm --preload torch,torch.distributed,torch._dynamo --ready FILE``): the worker keeps one supervisor
started ahead of need, with the listed modules imported (then it writes its pid to FILE: the worker hands
launches only to a ready one), blocked on a line of JSON on stdin (the launch:
these arguments, the environment, the working directory, the log). A Python program is then FORKED from
it and run with ``runpy``: the ranks of a relaunch skip the imports (4.6 s of CPU each here: torch, then
torch._dynamo, which the first optimizer pulls in), nearly all of a resize. Fork is safe only in a
single-threaded process: those imports (no CUDA call) start no thread, and this is checked before every
fork; any other program, or a process that has grown a thread, gets the exec'd start above.
Run it with ``python -P``: its own directory on sys.path would shadow the standard library's ``profile``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable


def rank_env(base: dict[str, str], local_rank: int, nprocs: int, rank_offset: int) -> dict[str, str]:
    """One rank's environment: the launch's (MASTER_ADDR/PORT, WORLD_SIZE, ...) plus its ranks."""
    node_rank = base.get("HPCSCHED_NODE_RANK", "0")
    return base | {"RANK": str(rank_offset + local_rank), "LOCAL_RANK": str(local_rank),
                   "LOCAL_WORLD_SIZE": str(nprocs), "GROUP_RANK": node_rank, "ROLE_RANK": str(rank_offset + local_rank),
                   "ROLE_NAME": "default"}


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell reports it


def describe(code: int) -> str:
    """A rank's end in words, for the task log (the worker passes the log's last lines on as the reason)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with {code}"


CANNOT_START = 127  # as a shell reports a command it cannot run


class Forked:
    """A rank forked from this process, with the calls ``supervise`` makes on a Popen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def single_threaded() -> bool:
    return len(os.listdir("/proc/self/task")) == 1


def fork_rank(program: str, args: list[str], env: dict[str, str]) -> Forked:
    """Run a Python file as ``__main__`` in a forked child, as ``python program args`` would."""
    pid = os.fork()
    if pid:
        return Forked(pid)
    code = 1
    try:
        with contextlib.suppress(OSError, AttributeError):  # die with the supervisor, like the exec'd ranks
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)  # the program installs its own
        os.environ.clear()
        os.environ.update(env)
        path = os.path.abspath(program)
        sys.argv = [path, *args]
        sys.path.insert(0, os.path.dirname(path))  # as the interpreter does for a script
        runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def supervise(argv: list[str], nprocs: int, rank_offset: int, grace_s: float,
              forkable: Callable[[], bool] | None = None) -> int:
    """Start ``nprocs`` ranks of ``argv`` and supervise them (module docstring). ``forkable``: the ranks of a
    Python program are forked from this process while it returns True (warm start)."""
    prefix = [exe, "--pdeathsig", "KILL", "--"] if (exe := shutil.which("setpriv")) else []
    procs: list[subprocess.Popen | Forked] = []
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    python_file = len(argv) >= 2 and argv[1].endswith(".py") and \
        os.path.realpath(shutil.which(argv[0]) or argv[0]) == os.path.realpath(sys.executable)
    failed = 0
    kill_at: float | None = None
    for local in range(nprocs):
        try:
            env = rank_env(dict(os.environ), local, nprocs, rank_offset)
            if python_file and forkable is not None and forkable():
                procs.append(fork_rank(argv[1], argv[2:], env))
            else:
                procs.append(subprocess.Popen([*prefix, *argv], env=env))
        except (OSError, ValueError) as e:  # no such program, bad environment, out of processes: the task fails
            print(f"ranks: cannot start rank {rank_offset + local}: {e} (stopping the others)", file=sys.stderr,
                  flush=True)
            failed = CANNOT_START
            forward(signal.SIGTERM, None)
            kill_at = time.monotonic() + grace_s
            break
    # Every exit code is read in the same pass that decides whether all ranks are gone: deciding that from a
    # second poll let a rank that ended between the two (a lone rank, always) leave the loop unread, and the
    # task exited 0 whatever the rank's code.
    while True:
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0) and not failed:
                failed = _exit_code(code)
                if not stopping:  # one rank failed: the others cannot finish their collectives
                    print(f"ranks: rank {rank_offset + rank} {describe(code)} (stopping the others)", file=sys.stderr,
                          flush=True)
                    forward(signal.SIGTERM, None)
                kill_at = time.monotonic() + grace_s
        if all(c is not None for c in codes):
            return failed
        if kill_at is not None and time.monotonic() > kill_at:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nprocs", type=int, help="ranks on this node")
    ap.add_argument("--rank-offset", type=int, default=0, help="global rank of this node's first rank")
    ap.add_argument("--grace", type=float, default=10.0, help="seconds a failed rank's peers get before SIGKILL")
    ap.add_argument("--warm", action="store_true", help="preload, then wait for the launch as JSON on stdin")
    ap.add_argument("--preload", default="", help="modules a warm supervisor imports ahead (comma-separated)")
    ap.add_argument("--ready", default="", help="a warm supervisor writes its pid here once its modules are imported")
    ap.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS...")
    return ap


def _run(ap: argparse.ArgumentParser, argv: list[str], forkable: Callable[[], bool] | None = None) -> int:
    args = ap.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program or not args.nprocs or args.nprocs < 1:
        ap.error("need --nprocs >= 1 and a program after --")
    return supervise(program, args.nprocs, args.rank_offset, args.grace, forkable)


def warm(ap: argparse.ArgumentParser, preload: list[str], ready: str = "") -> int:
    """Import ``preload``, say so in ``ready`` (the worker hands a launch only to a supervisor that is ready: one
    still importing held a launch for the rest of its imports, 2-13 s at load, where a cold start of a program
    without torch takes 0.1 s), then run the launch the worker writes to stdin: {"args": [ranks.py arguments],
    "env": {...}, "cwd": str | null, "log": path}."""
    for name in preload:
        importlib.import_module(name)
    if ready:
        tmp = f"{ready}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(tmp, ready)  # the worker never reads half a pid
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the worker stopped without using this supervisor
    launch = json.loads(line)
    fd = os.open(launch["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # no rank inherits the worker's pipe
    os.close(null)
    try:
        if launch.get("cwd"):
            os.chdir(launch["cwd"])
        os.environ.clear()
        os.environ.update(launch["env"])
    except (OSError, ValueError) as e:  # no such directory, a variable the OS refuses: the task fails, told why
        print(f"ranks: cannot start: {e}", file=sys.stderr, flush=True)
        return CANNOT_START
    return _run(ap, launch["args"], forkable=single_threaded)


def main() -> int:
    ap = _parser()
    args, _ = ap.parse_known_args()
    if args.warm:
        return warm(ap, [m for m in args.preload.split(",") if m], args.ready)
    return _run(ap, sys.argv[1:])


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # a warm supervisor has torch loaded: the interpreter's teardown of it takes seconds
