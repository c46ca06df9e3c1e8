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
task exits with the failing rank's code; the ranks die with the supervisor (parent-death signal through
``setpriv``, as the worker starts its tasks). What it leaves out: restarts in place (the controller
restarts a failed attempt from its checkpoint anyway) and elastic membership changes (a resize here is a
stop and a relaunch at the new size).

    python ranks.py --nprocs 2 --rank-offset 0 [--grace 10] -- PROGRAM ARGS...
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time


def rank_env(base: dict[str, str], local_rank: int, nprocs: int, rank_offset: int) -> dict[str, str]:
    """One rank's environment: the launch's (MASTER_ADDR/PORT, WORLD_SIZE, ...) plus its ranks."""
    node_rank = base.get("HPCSCHED_NODE_RANK", "0")
    return base | {"RANK": str(rank_offset + local_rank), "LOCAL_RANK": str(local_rank),
                   "LOCAL_WORLD_SIZE": str(nprocs), "GROUP_RANK": node_rank, "ROLE_RANK": str(rank_offset + local_rank),
                   "ROLE_NAME": "default"}


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell reports it


def supervise(argv: list[str], nprocs: int, rank_offset: int, grace_s: float) -> int:
    prefix = [exe, "--pdeathsig", "KILL", "--"] if (exe := shutil.which("setpriv")) else []
    procs: list[subprocess.Popen] = []
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for local in range(nprocs):
        procs.append(subprocess.Popen([*prefix, *argv], env=rank_env(dict(os.environ), local, nprocs, rank_offset)))
    failed = 0
    kill_at: float | None = None
    while any(p.poll() is None for p in procs):
        for p in procs:
            code = p.poll()
            if code not in (None, 0) and not failed:
                failed = _exit_code(code)
                if not stopping:  # one rank failed: the others cannot finish their collectives
                    print(f"ranks: a rank exited with {code}; stopping the others", file=sys.stderr, flush=True)
                    forward(signal.SIGTERM, None)
                kill_at = time.monotonic() + grace_s
        if kill_at is not None and time.monotonic() > kill_at:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nprocs", type=int, required=True, help="ranks on this node")
    ap.add_argument("--rank-offset", type=int, default=0, help="global rank of this node's first rank")
    ap.add_argument("--grace", type=float, default=10.0, help="seconds a failed rank's peers get before SIGKILL")
    ap.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS...")
    args = ap.parse_args()
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program or args.nprocs < 1:
        ap.error("need --nprocs >= 1 and a program after --")
    return supervise(program, args.nprocs, args.rank_offset, args.grace)


if __name__ == "__main__":
    sys.exit(main())
