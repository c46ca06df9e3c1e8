"""A task's launch order, built from a plan's placement: the LaunchTask messages of one attempt, the rewrites an
in-place resize makes (one node, or an attempt across several: ``in_place_change``), and the co-location
accounting read back from stored LaunchTasks.

Pure functions over their arguments (no store, no lock, no clock), so the controller's launch rules can be read
and tested without a controller: it picks the port (a worker's last reported free one) and writes the rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcsched.runtime import horovod_elastic, launchers
from hpcsched.runtime.jobfile import JobSpec
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.store_rows import AllocRow

# The job's uid (unique across states) in its launch env: the node-rank-0 worker binds the checkpoint folder to it,
# so a job of a new state that reuses an id (j0001 after state.db was lost) never resumes another job's checkpoint.
JOB_UID_ENV = "HPCSCHED_JOB_UID"


def in_place_capable(spec: JobSpec) -> bool:
    """An elastic job whose launcher resizes it in place (Horovod's elastic mode: launched with a discovery script,
    so a new host list resizes it without a restart)."""
    return launchers.get(spec.launcher).elastic_in_place and spec.min_procs < spec.max_procs


def task_id(job_id: str, generation: int, node_rank: int) -> str:
    """A task's name: unique per job, attempt and node, and readable in messages (``j0003.g1.n0``)."""
    return f"{job_id}.g{generation}.n{node_rank}"


def launch_env(job_id: str, generation: int, spec: JobSpec, checkpoint_dir: Path) -> dict[str, str]:
    """What every task of an attempt is told beyond the job file's env: who it is, where to checkpoint, how many
    steps to run, and for an elastic Horovod job its size range (the worker starts it in elastic mode). Horovod's
    Gloo timeout (HOROVOD_GLOO_TIMEOUT_SECONDS) is left at its 30 s unless the job's env sets it: shorter gets a dead
    host's survivors going sooner but fails a grow whose new rank starts slowly (docs/runtime.md)."""
    env = dict(spec.env) | {"HPCSCHED_JOB_ID": job_id, "HPCSCHED_GENERATION": str(generation),
                            "HPCSCHED_CHECKPOINT_DIR": str(checkpoint_dir)}
    if spec.steps:
        env["HPCSCHED_STEPS"] = str(spec.steps)
    if in_place_capable(spec):  # Horovod's elastic mode: the worker resizes it without a restart
        env |= {horovod_elastic.MIN_ENV: str(spec.min_procs), horovod_elastic.MAX_ENV: str(spec.max_procs)}
    return env


def batch_env(batch_size: int, base: int, lr_scaling: str) -> dict[str, str]:
    """An adaptive-batch attempt's batch in its environment, as its LaunchTask carries it (``adaptive_batch``)."""
    return {"HPCSCHED_BATCH_SIZE": str(batch_size), "HPCSCHED_BASE_BATCH": str(base),
            "HPCSCHED_LR_SCALING": lr_scaling}


def launch_tasks(job_id: str, generation: int, spec: JobSpec, placement: list[tuple[str, int]],
                 hosts: dict[str, str], port: int, checkpoint_dir: Path, group: str,
                 agents: dict[str, str] | None = None, batch_size: int = 0) -> list[tuple[str, pb.LaunchTask]]:
    """One attempt's tasks, one per (worker, procs) of ``placement`` in node-rank order, each with its worker:
    node 0's host and ``port`` are the rendezvous, ``hosts`` maps a worker to its host name, ``group`` is the
    co-location key (the job's id when it runs alone), ``agents`` maps a worker to its agent service's
    ``HOST:PORT`` (how node 0's mpirun starts daemons on the other hosts; workers without one are left out),
    ``batch_size`` the attempt's global batch for a job with ``batch:`` (0: none)."""
    size = sum(k for _, k in placement)
    host_list = [f"{hosts[w]}:{k}" for w, k in placement]
    agent_of = {hosts[w]: agents[w] for w, _ in placement if agents and w in agents}
    env = launch_env(job_id, generation, spec, checkpoint_dir)
    told: dict[str, object] = {}
    if spec.batch is not None and batch_size > 0:
        env |= batch_env(batch_size, spec.batch.base, spec.batch.lr_scaling)
        told = {"batch_size": batch_size, "base_batch": spec.batch.base, "lr_scaling": spec.batch.lr_scaling}
    out = []
    offset = 0
    for rank, (wid, k) in enumerate(placement):
        msg = pb.LaunchTask(
            task_id=task_id(job_id, generation, rank), job_id=job_id, generation=generation, launcher=spec.launcher,
            command=list(spec.command), env=env | {"HPCSCHED_WORKDIR": spec.workdir}, node_rank=rank,
            nnodes=len(placement), nprocs=k, world_size=size, master_addr=hosts[placement[0][0]], master_port=port,
            checkpoint_dir=str(checkpoint_dir), hosts=host_list, rank_offset=offset, group=group, agents=agent_of,
            **told,
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


@dataclass(frozen=True, slots=True)
class InPlaceChange:
    """What an in-place resize of an elastic Horovod attempt writes (``in_place_change``).

    ``resized``: (task id, its procs, its LaunchTask) for every live task of the attempt, in node-rank order; procs
    0 marks a released task (its worker left the placement: the task stops once Horovod has removed its ranks).
    ``added``: (worker, LaunchTask) of a new slot-holding task for each worker the job grows onto (the worker's
    agent starts the ranks node 0's horovodrun asks it for only while such a task is live there)."""

    resized: list[tuple[str, int, bytes]]
    added: list[tuple[str, pb.LaunchTask]]
    world_size: int

    def with_batch(self, batch_size: int) -> InPlaceChange:
        """The same change telling an adaptive-batch job its global batch at the new size: the LaunchTasks' batch
        field and environment, which node 0's worker writes beside the discovery file (``horovod_elastic``)."""
        def told(msg: pb.LaunchTask) -> pb.LaunchTask:
            msg.batch_size = batch_size
            msg.env.update(batch_env(batch_size, msg.base_batch, msg.lr_scaling))
            return msg

        return InPlaceChange([(tid, k, told(pb.LaunchTask.FromString(b)).SerializeToString())
                              for tid, k, b in self.resized], [(w, told(m)) for w, m in self.added], self.world_size)


def in_place_change(tasks: list[AllocRow], where: list[tuple[str, int]], hosts: dict[str, str],
                    agents: dict[str, str] | None = None) -> InPlaceChange | str:
    """An elastic Horovod attempt (``tasks``: all its allocations, exited ones too) resized in place to ``where``
    ((worker, procs), node-rank order), or why it cannot be ('' never: a str is the reason).

    Node 0 runs ``horovodrun``, whose discovery file is the job's host list: it must stay. Each node keeps its node
    rank; a worker the job grows onto gets the next one. Every task's host list stays indexed by node rank (a
    released node's entry has 0 slots, which the discovery file leaves out), so a task finds its own entry as at
    launch. ``agents`` (worker -> agent ``HOST:PORT``) is merged into every task's map: node 0's rsh agent needs
    the endpoint of a host the job grows onto."""
    ordered = sorted(tasks, key=lambda a: a.node_rank)
    if [a.node_rank for a in ordered] != list(range(len(ordered))):
        return f"node ranks {[a.node_rank for a in ordered]} are not 0..{len(ordered) - 1}"
    live = {a.worker_id: a for a in ordered if a.state != "exited" and a.nprocs > 0}
    if not ordered or ordered[0].state == "exited" or ordered[0].worker_id not in dict(where):
        return "its first node, which runs horovodrun, is not in the new placement"
    if len({w for w, _ in where}) != len(where) or any(k < 1 for _, k in where):
        return f"the placement {where} names a worker twice or gives one no procs"
    if any(w not in live and w not in hosts for w, _ in where):
        return f"a worker of {where} is not live"
    node0 = pb.LaunchTask.FromString(ordered[0].launch)
    want = dict(where)
    entries: list[tuple[str, int]] = []  # (host, procs) by node rank
    for a in ordered:
        old = pb.LaunchTask.FromString(a.launch)
        host = old.hosts[a.node_rank].rpartition(":")[0] if a.node_rank < len(old.hosts) else hosts[a.worker_id]
        keep = live.get(a.worker_id) is a
        entries.append((host, want.get(a.worker_id, 0) if keep else 0))
    new = [(w, k) for w, k in where if w not in live]
    entries += [(hosts[w], k) for w, k in new]
    host_list = [f"{h}:{k}" for h, k in entries]
    size = sum(k for _, k in entries)
    agent_of = dict(node0.agents) | {hosts[w]: agents[w] for w, _ in where if agents and w in agents and w in hosts}

    def rewrite(msg: pb.LaunchTask, procs: int) -> pb.LaunchTask:
        msg.nprocs, msg.world_size, msg.nnodes = procs, size, len(host_list)
        del msg.hosts[:]
        msg.hosts.extend(host_list)
        msg.agents.clear()
        msg.agents.update(agent_of)
        return msg

    resized = [(a.task_id, entries[a.node_rank][1], rewrite(pb.LaunchTask.FromString(a.launch),
                                                             entries[a.node_rank][1]).SerializeToString())
               for a in ordered if a.state != "exited"]
    added = []
    for i, (w, k) in enumerate(new, start=len(ordered)):
        msg = rewrite(pb.LaunchTask.FromString(ordered[0].launch), k)
        msg.task_id, msg.node_rank = task_id(node0.job_id, node0.generation, i), i
        msg.rank_offset = sum(n for _, n in entries[:i])
        added.append((w, msg))
    return InPlaceChange(resized, added, size)


def group_key(launch: bytes, job_id: str) -> str:
    """A task's co-location key, as its LaunchTask carries it (the job's own id for one written without)."""
    return pb.LaunchTask.FromString(launch).group or job_id


def slot_use(allocations: Iterable[AllocRow], keys: Mapping[str, str]
             ) -> tuple[dict[str, int], dict[str, str], dict[str, list[tuple[str, int]]]]:
    """Slots held per worker (a co-located group counts once: its largest member), each job's co-location key and
    its placement (node-rank order). ``keys``: job -> the co-location key stored with it (``Store.groups`` of the
    allocations' jobs); a job without one is alone (its own id)."""
    peak: dict[tuple[str, str], int] = {}
    groups: dict[str, str] = {}
    where: dict[str, list[tuple[int, str, int]]] = {}
    for a in allocations:
        key = keys.get(a.job_id) or a.job_id
        groups[a.job_id] = key
        peak[a.worker_id, key] = max(peak.get((a.worker_id, key), 0), a.nprocs)
        if a.nprocs > 0:  # a task released by an in-place shrink holds nothing: not part of the job's placement
            where.setdefault(a.job_id, []).append((a.node_rank, a.worker_id, a.nprocs))
    used: dict[str, int] = {}
    for (wid, _), k in peak.items():
        used[wid] = used.get(wid, 0) + k
    return used, groups, {j: [(w, k) for _, w, k in sorted(v)] for j, v in where.items()}
