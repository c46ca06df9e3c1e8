"""In-place resizes of elastic Horovod jobs: the controller's writes when such a job grows or shrinks without a restart.

An elastic Horovod job (``horovodrun``, ``min_procs < max_procs``) is launched in Horovod's elastic mode and
resized in place (the scheduler's ``Plan.resizes``), on one worker or across several: the job stays running
(same generation, no checkpoint) and its allocations take the new placement at once (``launch.in_place_change``):
every live task of the attempt gets the new host list, a worker it grows onto gets a new slot-holding task (its
agent then starts the ranks node 0's horovodrun asks for), and a worker it leaves keeps a released task (0 procs)
that is stopped with a checkpoint signal once Horovod has removed its ranks, its end no part of the outcome. The
changed LaunchTasks are sent again on every heartbeat until a report at the new size arrives; the node-0 worker,
seeing a LaunchTask for a task it runs with another host list, rewrites the task's discovery file (and the agent
map its rsh agent reads). The time from the decision to that report is ``last_resize_s`` too (event ``resized``,
kind ``in-place``). A planned resize of a job whose last one has not been seen yet waits for it (``apply``):
Horovod forgets a host change that reaches rank 0 while its ranks re-form.

A worker that leaves or is lost (drained, or silent for ``worker_timeout_s``) does not stop such a job when its
first node is elsewhere and the rest hold its minimum: it shrinks in place onto the rest (``shrink_away``). An
in-place resize that cannot be made (its first node not in the placement) or is not seen within
``IN_PLACE_TIMEOUT_S`` falls back to stop and relaunch, said by event ``resize`` with ``resize_kind: relaunch`` and
the reason.

An adaptive-batch job (``batch:``) is told its global batch for the new size with the new placement: the
controller's ``BatchTracker`` chooses it as for a relaunch, the changed LaunchTasks carry it, and node 0's worker
writes it beside the discovery file before the host list (``horovod_elastic``).

``InPlaceResizer`` does these writes for the controller, which calls it under its lock and store transaction; it
holds no state of its own beyond references to the controller's store, its attempt-start times (hysteresis) and
its task-exit rule.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from hpcsched.runtime.launch import in_place_capable, in_place_change
from hpcsched.runtime.lifecycle import IN_PLACE
from hpcsched.runtime.store import Store
from hpcsched.runtime.store_rows import AllocRow, JobRow, WorkerRow

log = logging.getLogger("hpcsched.runtime.controller")  # the controller's decisions: one log to read them in


def agent_endpoints(workers: Iterable[WorkerRow], agent_port: dict[str, int]) -> dict[str, str]:
    """Worker -> its WorkerAgent ``HOST:PORT`` (those that said their port): how node 0's launcher reaches the other
    nodes of a job (``rsh_agent``). An IPv6 host is bracketed."""
    return {w.id: f"[{w.host}]:{agent_port[w.id]}" if ":" in w.host else f"{w.host}:{agent_port[w.id]}"
            for w in workers if w.id in agent_port}


class InPlaceResizer:
    """The in-place resize writes (rules in the module docstring); every method runs under the controller's lock
    and inside its store transaction."""

    def __init__(self, store: Store, attempt_start: dict[str, float],
                 task_exited: Callable[[JobRow, AllocRow, int], None],
                 choose_batch: Callable[[JobRow, int], int] | None = None) -> None:
        """``attempt_start``: the controller's job -> start of the current size (changed in place: an in-place
        resize restarts the hysteresis clock); ``task_exited``: the controller's rule for a task that ended;
        ``choose_batch``: the global batch of a job at a size (``BatchTracker.choose``; 0 for a job without
        ``batch:``)."""
        self.store = store
        self.choose_batch = choose_batch
        self.attempt_start = attempt_start
        self.task_exited = task_exited
        self.waiting: set[str] = set()  # jobs whose planned resize waits for their last one (logged once)
        self.wanted_agents: set[str] = set()  # workers a resize waits on for their agent port (the controller re-plans)

    def apply(self, resizes: dict[str, list[tuple[str, int]]], workers: list[WorkerRow], agent_port: dict[str, int],
              now: float) -> None:
        """Carry out a plan's resizes (job -> new placement, node-rank order), except for a job whose last in-place
        resize has not been seen at its size yet: Horovod forgets a host change that reaches rank 0 while the
        ranks re-form (on the loopback Slurm, pilots returning 2 s apart grew a job 1 -> 2 -> 3 and it stayed
        at 2), so a plan's next change waits for the report that ends the last one (the next step plans again)."""
        if not resizes:  # most steps: no O(workers) host and agent maps for nothing
            self.waiting = set()
            return
        hosts = {w.id: w.host for w in workers}
        agents = agent_endpoints(workers, agent_port)
        pending = set()
        for jid, where in resizes.items():
            job = self.store.job(jid)
            if job.stop_reason == IN_PLACE:  # its last in-place resize is not seen yet: this one waits for it
                pending.add(jid)
                if jid not in self.waiting:
                    log.info("job %s: in-place resize to %s waits until its resize to %d procs is seen", jid, where,
                             job.procs)
                continue
            self.resize(job, where, hosts, now, agents)
        self.waiting = pending

    def resize(self, job: JobRow, where: list[tuple[str, int]], hosts: dict[str, str], now: float,
               agents: dict[str, str] | None = None, why: str = "") -> bool:
        """Give a running elastic Horovod job its new placement without a restart: every live task of its attempt
        gets the new host list (node 0's worker rewrites the discovery file), a worker it grows onto gets a new
        slot-holding task, a worker it leaves keeps a released task (procs 0) that is stopped once Horovod has
        removed its ranks. When that cannot be done (``launch.in_place_change`` says why) the job is stopped and
        relaunched at the new size instead, and the event says so. True: in place."""
        tasks = [a for a in self.store.allocations(job_id=job.id, live_only=False) if a.generation == job.generation]
        held = {a.worker_id for a in tasks if a.state != "exited" and a.nprocs > 0}
        unknown = [w for w, _ in where if w not in held and agents is not None and w not in agents]
        # a worker whose agent's port is not known yet (a daemon that did not say it as it registered says it in its
        # first heartbeat): the next step plans again
        if unknown:
            self.wanted_agents.update(unknown)
            log.info("job %s: in-place resize onto %s waits for its agent port", job.id, ", ".join(unknown))
            return False
        change = in_place_change(tasks, where, hosts, agents)
        procs = sum(k for _, k in where)
        if isinstance(change, str):
            log.warning("job %s: in-place resize %d -> %d procs to %s refused (%s): stop and relaunch instead",
                        job.id, job.procs, procs, where, change)
            self.store.update_job(job.id, state="stopping", stop_reason="resize", stop_time=now, target_procs=procs)
            self.store.event(job.id, "resize", resize_kind="relaunch", from_procs=job.procs, procs=procs,
                             reason=f"in-place resize refused: {change}")
            return False
        batch = self.choose_batch(job, change.world_size) if self.choose_batch is not None else 0
        if batch > 0:
            change = change.with_batch(batch)
        for tid, k, launch in change.resized:
            self.store.resize_allocation(tid, k, launch)
        for wid, msg in change.added:
            self.store.add_allocation(AllocRow(msg.task_id, job.id, job.generation, wid, msg.node_rank, msg.nprocs,
                                               "launching", None, msg.SerializeToString()))
        self.store.update_job(job.id, procs=change.world_size, target_procs=change.world_size, stop_reason=IN_PLACE,
                              stop_time=now)
        workers = [w for w, _ in where]
        released = [a.worker_id for a in tasks if a.state != "exited" and a.nprocs > 0 and a.worker_id not in workers]
        detail: dict[str, object] = {"worker": workers[0]} if len(workers) == 1 else {"workers": workers}
        if released:
            detail["released"] = released
        if why:
            detail["reason"] = why
        if batch > 0:
            detail["batch_size"] = batch
        self.store.event(job.id, "resize", resize_kind=IN_PLACE, from_procs=job.procs, procs=change.world_size,
                         **detail)
        self.attempt_start[job.id] = now  # hysteresis: the new size must run min_runtime_s before the next change
        log.info("job %s: resize in place %d -> %d procs on %s%s%s", job.id, job.procs, change.world_size, where,
                 f", batch {batch}" if batch > 0 else "", f" ({why})" if why else "")
        return True

    def shrink_away(self, job: JobRow, wid: str, why: str, now: float) -> bool:
        """A running elastic Horovod job loses worker ``wid`` (it leaves or is lost): shrink it in place onto its
        other workers when its first node (horovodrun) is elsewhere and they hold at least its minimum, instead of
        stopping it. True when this took the job in hand (shrunk in place, or stopped to be relaunched when that
        was refused): the caller then does not stop it again."""
        if job.state != "running" or not in_place_capable(job.spec):
            return False
        tasks = sorted((a for a in self.store.allocations(job_id=job.id) if a.generation == job.generation
                        and a.nprocs > 0), key=lambda a: a.node_rank)
        rest = [(a.worker_id, a.nprocs) for a in tasks if a.worker_id != wid]
        if not rest or len(rest) == len(tasks) or tasks[0].node_rank != 0 or tasks[0].worker_id == wid \
                or sum(k for _, k in rest) < job.spec.min_procs:  # node 0 (horovodrun) must stay
            return False
        hosts = {w.id: w.host for w in self.store.workers()}
        self.resize(job, rest, hosts, now, why=why)
        return True

    def release_exited(self, job: JobRow, a: AllocRow, how: str) -> None:
        """A task released by an in-place shrink ended (or went with its worker): its ranks had left the job, so
        its end is no part of the attempt's outcome (recorded as 0; the real end is logged)."""
        log.info("job %s: released task %s on %s %s", job.id, a.task_id, a.worker_id, how)
        self.store.set_alloc_state(a.task_id, "exited", 0)
        self.task_exited(job, a, 0)
