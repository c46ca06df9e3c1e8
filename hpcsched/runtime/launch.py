"""A task's launch order, built from a plan's placement: the LaunchTask messages of one attempt, the rewrite an
in-place resize makes, and the co-location accounting read back from stored LaunchTasks.

Pure functions over their arguments (no store, no lock, no clock), so the controller's launch rules can be read
and tested without a controller: it picks the port (a worker's last reported free one) and writes the rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from hpcsched.runtime import horovod_elastic
from hpcsched.runtime.config import JobSpec
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.store import AllocRow

# The job's uid (unique across states) in its launch env: the node-rank-0 worker binds the checkpoint folder to it,
# so a job of a new state that reuses an id (j0001 after state.db was lost) never resumes another job's checkpoint.
JOB_UID_ENV = "HPCSCHED_JOB_UID"


def in_place_capable(spec: JobSpec) -> bool:
    """Elastic Horovod: launched with a discovery script, so a new host list resizes it without a restart."""
    return spec.launcher == "horovodrun" and spec.min_procs < spec.max_procs


def task_id(job_id: str, generation: int, node_rank: int) -> str:
    """A task's name: unique per job, attempt and node, and readable in messages (``j0003.g1.n0``)."""
    return f"{job_id}.g{generation}.n{node_rank}"


def launch_env(job_id: str, generation: int, spec: JobSpec, checkpoint_dir: Path) -> dict[str, str]:
    """What every task of an attempt is told beyond the job file's env: who it is, where to checkpoint, how many
    steps to run, and for an elastic Horovod job its size range (the worker starts it in elastic mode)."""
    env = dict(spec.env) | {"HPCSCHED_JOB_ID": job_id, "HPCSCHED_GENERATION": str(generation),
                            "HPCSCHED_CHECKPOINT_DIR": str(checkpoint_dir)}
    if spec.steps:
        env["HPCSCHED_STEPS"] = str(spec.steps)
    if in_place_capable(spec):  # Horovod's elastic mode: the worker resizes it without a restart
        env |= {horovod_elastic.MIN_ENV: str(spec.min_procs), horovod_elastic.MAX_ENV: str(spec.max_procs)}
    return env


def launch_tasks(job_id: str, generation: int, spec: JobSpec, placement: list[tuple[str, int]],
                 hosts: dict[str, str], port: int, checkpoint_dir: Path, group: str,
                 agents: dict[str, str] | None = None) -> list[tuple[str, pb.LaunchTask]]:
    """One attempt's tasks, one per (worker, procs) of ``placement`` in node-rank order, each with its worker:
    node 0's host and ``port`` are the rendezvous, ``hosts`` maps a worker to its host name, ``group`` is the
    co-location key (the job's id when it runs alone), ``agents`` maps a worker to its agent service's
    ``HOST:PORT`` (how node 0's mpirun starts daemons on the other hosts; workers without one are left out)."""
    size = sum(k for _, k in placement)
    host_list = [f"{hosts[w]}:{k}" for w, k in placement]
    agent_of = {hosts[w]: agents[w] for w, _ in placement if agents and w in agents}
    env = launch_env(job_id, generation, spec, checkpoint_dir)
    out = []
    offset = 0
    for rank, (wid, k) in enumerate(placement):
        msg = pb.LaunchTask(
            task_id=task_id(job_id, generation, rank), job_id=job_id, generation=generation, launcher=spec.launcher,
            command=list(spec.command), env=env | {"HPCSCHED_WORKDIR": spec.workdir}, node_rank=rank,
            nnodes=len(placement), nprocs=k, world_size=size, master_addr=hosts[placement[0][0]], master_port=port,
            checkpoint_dir=str(checkpoint_dir), hosts=host_list, rank_offset=offset, group=group, agents=agent_of,
        )
        offset += k
        out.append((wid, msg))
    return out


def resized_launch(launch: bytes, host: str, procs: int) -> bytes:
    """A running task's LaunchTask after an in-place resize to ``procs`` on ``host``: the new size and host list;
    the rest (its id, generation, port, co-location key) stays, so the worker sees the same task resized."""
    msg = pb.LaunchTask.FromString(launch)
    msg.nprocs = msg.world_size = procs
    del msg.hosts[:]
    msg.hosts.append(f"{host}:{procs}")
    return msg.SerializeToString()


def group_key(launch: bytes, job_id: str) -> str:
    """A task's co-location key, as its LaunchTask carries it (the job's own id for one written without)."""
    return pb.LaunchTask.FromString(launch).group or job_id


def slot_use(allocations: Iterable[AllocRow], known: dict[str, str]
             ) -> tuple[dict[str, int], dict[str, str], dict[str, list[tuple[str, int]]], dict[str, str]]:
    """Slots held per worker (a co-located group counts once: its largest member), each job's co-location key,
    its placement (node-rank order), and the task -> key cache to keep for the next call (live tasks only:
    ``known`` is the previous one, so each LaunchTask is parsed once; a key never changes, an in-place resize
    keeps it)."""
    peak: dict[tuple[str, str], int] = {}
    groups: dict[str, str] = {}
    where: dict[str, list[tuple[int, str, int]]] = {}
    cache: dict[str, str] = {}
    for a in allocations:
        key = known.get(a.task_id)
        if key is None:
            key = group_key(a.launch, a.job_id)
        cache[a.task_id] = key
        groups[a.job_id] = key
        peak[a.worker_id, key] = max(peak.get((a.worker_id, key), 0), a.nprocs)
        where.setdefault(a.job_id, []).append((a.node_rank, a.worker_id, a.nprocs))
    used: dict[str, int] = {}
    for (wid, _), k in peak.items():
        used[wid] = used.get(wid, 0) + k
    return used, groups, {j: [(w, k) for _, w, k in sorted(v)] for j, v in where.items()}, cache
