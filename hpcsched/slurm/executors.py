"""Where an elastic job's processes run: (a) Slurm scavenger jobs, (b) our own processes on idle nodes.

Both give the harvester the same four verbs: ``start`` a run on some nodes, ``stop`` it (SIGTERM:
checkpoint and exit), ``kill`` it (no checkpoint), and ``state`` (pending / running / ended, and
for an ended run whether Slurm preempted it).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hpcsched.slurm import commands
from hpcsched.slurm.spec import ElasticSpec

PENDING, RUNNING, ENDED = "pending", "running", "ended"
# Each srun task exports torch.distributed's rank variables from Slurm's, then becomes the program.
_TORCH_RANKS = 'export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=0; exec "$@"'
# squeue states of a job that is not over yet; any other state (COMPLETED, CANCELLED, PREEMPTED, FAILED,
# TIMEOUT, NODE_FAIL, ...) or none at all means the run has ended.
_SLURM_LIVE = {"PENDING": PENDING, "REQUEUED": PENDING, "REQUEUE_HOLD": PENDING, "REQUEUE_FED": PENDING,
               "CONFIGURING": RUNNING, "RUNNING": RUNNING, "COMPLETING": RUNNING, "SUSPENDED": RUNNING,
               "SIGNALING": RUNNING, "STAGE_OUT": RUNNING, "STOPPED": RUNNING, "RESIZING": RUNNING}


@dataclass
class Run:
    """One launch of an elastic job on a fixed node set (a resize ends it and starts another)."""

    spec: ElasticSpec
    nodes: tuple[str, ...]
    handle: str
    started: float  # harvester clock when submitted
    running_since: float | None = None
    ended: float | None = None
    stop_requested: bool = False
    stop_seen: float | None = None  # harvester clock when it first saw the stop in flight
    killed: bool = False
    preempted_by: str = ""  # why Slurm took it, when it did
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


class Executor(Protocol):
    kind: str

    def start(self, spec: ElasticSpec, nodes: tuple[str, ...], seq: int, now: float) -> Run: ...

    def stop(self, run: Run) -> None: ...

    def kill(self, run: Run) -> None: ...

    def state(self, run: Run) -> tuple[str, str]:
        """(PENDING | RUNNING | ENDED, Slurm's final state or exit codes)."""
        ...


class ScavengerExecutor:
    """Mode (a): each run is one ``sbatch`` job in the preemptible partition, one task per node.

    The training runs as a job step (``srun``) because Slurm signals steps, not the batch shell,
    when it preempts: the step gets SIGTERM at once and has GraceTime seconds to checkpoint.
    """

    kind = "scavenger"

    def __init__(self, partition: str, log_dir: Path, name_prefix: str = "hpcsched-") -> None:
        self.partition = partition
        self.log_dir = log_dir
        self.prefix = name_prefix

    def start(self, spec: ElasticSpec, nodes: tuple[str, ...], seq: int, now: float) -> Run:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        spec.ckpt_dir.mkdir(parents=True, exist_ok=True)
        addr = node_addr(nodes[0])
        env = spec.env() | {"MASTER_ADDR": addr, "MASTER_PORT": str(free_port(addr))}
        exports = "; ".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
        step = " ".join(shlex.quote(a) for a in ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1", "bash", "-c",
                                                  _TORCH_RANKS, "hpcsched-task", *spec.argv()])
        out = commands.run([
            "sbatch", "--parsable", "-p", self.partition, "-N", str(len(nodes)), "-w", ",".join(nodes),
            "-J", f"{self.prefix}{spec.id}-{seq}", "-o", str(self.log_dir / f"{spec.id}-%j.out"),
            "--chdir", os.getcwd(), "--wrap", f"{exports}; exec {step}",
        ])
        return Run(spec, nodes, out.strip().split(";")[0], now)

    def stop(self, run: Run) -> None:
        run.stop_requested = True
        try:
            commands.run(["scancel", "-s", "TERM", run.handle])  # steps only: they checkpoint and exit
        except commands.SlurmError:
            pass  # already gone

    def kill(self, run: Run) -> None:
        run.stop_requested = True
        try:
            commands.run(["scancel", run.handle])
        except commands.SlurmError:
            pass

    def state(self, run: Run) -> tuple[str, str]:
        try:
            out = commands.run(["squeue", "-h", "-t", "all", "-j", run.handle, "-o", "%T"]).strip()
        except commands.SlurmError:
            return ENDED, "UNKNOWN"  # purged from slurmctld's memory: long gone
        return _SLURM_LIVE.get(out, ENDED), out or "UNKNOWN"


class LocalExecutor:
    """Mode (b): our own processes, one per node Slurm reports idle; Slurm does not know about them.

    On this loopback cluster every "node" is this machine, so a process "on" nX is a local process
    labelled with ``HPCSCHED_NODE=nX``; on a real cluster this is where the runtime's worker daemons
    (``hpcsched worker``) on each node would launch them. Vacating is SIGTERM, as in mode (a).
    """

    kind = "local"

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir

    def start(self, spec: ElasticSpec, nodes: tuple[str, ...], seq: int, now: float) -> Run:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        spec.ckpt_dir.mkdir(parents=True, exist_ok=True)
        run = Run(spec, nodes, f"{spec.id}-{seq}", now)
        common = os.environ | spec.env() | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port("127.0.0.1"))}
        for rank, node in enumerate(nodes):
            env = common | {"HPCSCHED_RANK": str(rank), "HPCSCHED_WORLD": str(len(nodes)),
                            "HPCSCHED_RUN_ID": run.handle, "HPCSCHED_NODE": node,
                            "RANK": str(rank), "WORLD_SIZE": str(len(nodes)), "LOCAL_RANK": "0"}
            with (self.log_dir / f"{run.handle}-{node}.out").open("wb") as out:
                run.procs.append(subprocess.Popen(spec.argv(), env=env, stdout=out, stderr=subprocess.STDOUT))
        return run

    def stop(self, run: Run) -> None:
        run.stop_requested = True
        self._signal(run, signal.SIGTERM)

    def kill(self, run: Run) -> None:
        run.stop_requested = True
        self._signal(run, signal.SIGKILL)

    def _signal(self, run: Run, sig: int) -> None:
        for p in run.procs:
            if p.poll() is None:
                p.send_signal(sig)

    def state(self, run: Run) -> tuple[str, str]:
        codes = [p.poll() for p in run.procs]
        if any(c is None for c in codes):
            return RUNNING, "RUNNING"
        return ENDED, "exit " + ",".join(str(c) for c in codes)


def node_addr(node: str) -> str:
    """The address Slurm reaches ``node`` at (its NodeAddr): where rank 0 listens for the others."""
    out = commands.run(["scontrol", "show", "node", "-o", node])
    for field_ in out.split():
        if field_.startswith("NodeAddr="):
            return field_.split("=", 1)[1]
    return node


def free_port(host: str) -> int:
    """A port the OS says is free on ``host`` now (bound to port 0, then released)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
