"""The harvest loop: Slurm's pool changes in, ``hpcsched.milp.allocate`` decides, an executor acts.

One ``step()``:

1. poll the idle-node source; log each join/leave;
2. look at every run: note when it starts running; vacate a run (SIGTERM) that holds a node which
   left the pool (drained, slurmd dead, or in mode (b) allocated by Slurm); cancel one pending too
   long; when a run has ended, classify it: finished, stopped by us (a resize), or taken by Slurm
   (a preemption: counted with the steps it lost, progress minus checkpoint);
3. if anything changed and no stop is in flight, ask the allocator for node counts over the pool and
   start or resize runs to match. Resizing is checkpoint-and-restart: stop the run, then start the
   next one on the new node set once the old one has ended.

After a preemption the loop waits ``settle_s`` before deciding again: the batch job that preempted
us is being started on some of the nodes our job just freed, and Slurm may report them idle for a
moment in between; starting there would only be preempted again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcsched.milp import MilpJob, Problem, allocate
from hpcsched.slurm.executors import ENDED, PENDING, RUNNING, Executor, Run
from hpcsched.slurm.record import Recorder
from hpcsched.slurm.source import SlurmIdleSource
from hpcsched.slurm.spec import ElasticSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HarvestConfig:
    poll_s: float = 0.5  # seconds between Slurm polls
    settle_s: float = 3.0  # wait after a preemption before re-deciding
    pending_timeout_s: float = 20.0  # cancel a run Slurm has not started by then, decide again
    stop_timeout_s: float = 30.0  # a run asked to checkpoint and stop that is still alive then is killed
    solver: str = "highs"  # hpcsched.milp solver
    tfwd: float = 10.0  # the allocator's look-ahead window, seconds


class Harvester:
    """Runs elastic jobs on the nodes a live Slurm leaves idle (see the module docstring)."""

    def __init__(self, source: SlurmIdleSource, executor: Executor, specs: list[ElasticSpec], recorder: Recorder,
                 config: HarvestConfig | None = None) -> None:
        self.source, self.executor, self.rec = source, executor, recorder
        self.specs = {s.id: s for s in specs}
        self.cfg = config or HarvestConfig()
        self.runs: dict[str, Run] = {}
        self.finished: set[str] = {s.id for s in specs if s.done}
        self.lost: dict[str, frozenset[str]] = {}
        self.settle_until = 0.0
        self.dirty = True
        self._seq = 0
        self.nonoptimal: dict[str, int] = {}  # allocator status other than optimal -> decisions that ended so

    @property
    def done(self) -> bool:
        return len(self.finished) == len(self.specs)

    def step(self) -> None:
        ev = self.source.poll()
        now = self.source.now()
        pool = self.source.pool
        self.rec.pool_size(now, len(pool))
        left: dict[str, str] = {}
        if ev is not None:
            self.dirty = True
            why = self.source.reasons
            for n in ev.left:
                self.rec.event(ev.time, "leave", nodes=(n,), pool=len(pool), detail=why.get(n, ""))
                left[n] = why.get(n, "")
            for n in ev.joined:
                self.rec.event(ev.time, "join", nodes=(n,), pool=len(pool), detail=why.get(n, ""))
        for job_id, run in list(self.runs.items()):
            self._watch(job_id, run, left, now)
        if self.settle_until and now >= self.settle_until:
            self.settle_until, self.dirty = 0.0, True
        stopping = any(r.stop_requested for r in self.runs.values())
        if self.dirty and not stopping and not self.settle_until and not self.done:
            self._decide(now, pool)

    def _watch(self, job_id: str, run: Run, left: dict[str, str], now: float) -> None:
        state, detail = self.executor.state(run)
        if state == RUNNING and run.running_since is None:
            run.running_since = now
            self.rec.event(now, "running", job_id, run.nodes, detail=f"{self.executor.kind} {run.handle}")
            self.rec.tally(job_id).start = self.rec.tally(job_id).start or now
        taken = [n for n in run.nodes if n in left]
        if state != ENDED and taken and not run.stop_requested:
            run.preempted_by = "; ".join(f"{n}: {left[n]}" for n in taken)
            self.rec.event(now, "vacate", job_id, tuple(taken), detail=run.preempted_by)
            (self.executor.kill if state == PENDING else self.executor.stop)(run)
        elif state == PENDING and run.running_since is not None and not run.stop_requested:
            # PreemptMode=REQUEUE: Slurm put our run back in the queue (to start minutes later, after
            # BeginTime); cancel it and decide again now, like a cancelled preemption.
            run.preempted_by = f"requeued by Slurm ({detail})"
            self.rec.event(now, "requeued", job_id, run.nodes, detail=run.handle)
            self.executor.kill(run)
        elif state == PENDING and now - run.started > self.cfg.pending_timeout_s and not run.stop_requested:
            self.rec.event(now, "pending-timeout", job_id, run.nodes, detail=run.handle)
            self.executor.kill(run)
        if state != ENDED and run.stop_requested and not run.killed:
            run.stop_seen = run.stop_seen if run.stop_seen is not None else now
            if now - run.stop_seen > self.cfg.stop_timeout_s:
                self.rec.event(now, "kill", job_id, run.nodes, detail=f"still alive {self.cfg.stop_timeout_s:.0f}s "
                               "after SIGTERM")
                run.killed = True
                self.executor.kill(run)
        if state == ENDED:
            self._ended(job_id, run, detail, now)

    def _ended(self, job_id: str, run: Run, detail: str, now: float) -> None:
        spec, tally = self.specs[job_id], self.rec.tally(job_id)
        del self.runs[job_id]
        self.dirty = True
        if run.running_since is not None:
            tally.node_seconds += len(run.nodes) * (now - run.running_since)
        prog, ckpt = spec.progress_step(), spec.checkpoint_step()
        if spec.done:
            tally.end, tally.finished = now, True
            self.finished.add(job_id)
            self.rec.event(now, "finish", job_id, run.nodes, step=prog, ckpt_step=ckpt, detail=detail)
        elif run.stop_requested and not run.preempted_by:
            self.rec.event(now, "stopped", job_id, run.nodes, step=prog, ckpt_step=ckpt, lost_steps=prog - ckpt,
                           detail=detail)
        else:
            tally.preemptions += 1
            tally.lost_steps.append(prog - ckpt)
            self.lost[job_id] = frozenset(run.nodes)
            self.settle_until = now + self.cfg.settle_s
            self.rec.event(now, "preempted", job_id, run.nodes, step=prog, ckpt_step=ckpt, lost_steps=prog - ckpt,
                           detail=run.preempted_by or detail)

    def _decide(self, now: float, pool: tuple[str, ...]) -> None:
        self.dirty = False
        in_pool = set(pool)
        states = []
        for job_id, spec in self.specs.items():
            if job_id in self.finished:
                continue
            run = self.runs.get(job_id)
            held = run.nodes if run is not None and set(run.nodes) <= in_pool else ()
            states.append(MilpJob(spec.job, nodes=held, lost=self.lost.pop(job_id, frozenset()) - in_pool))
        d = allocate(Problem(tuple(states), pool), solver=self.cfg.solver)
        if d.status not in ("optimal", "empty"):
            self.nonoptimal[d.status] = self.nonoptimal.get(d.status, 0) + 1
            log.warning("allocator decision not optimal: %s %s over %d nodes (%s)", d.solver, d.status, len(pool),
                        " ".join(f"{j}={n}" for j, n in d.counts.items()))
        self.rec.event(now, "decision", pool=len(pool),
                       detail=" ".join(f"{j}={n}" for j, n in d.counts.items()) + f" ({d.solver} {d.status})")
        for job_id, target in d.nodes.items():
            run = self.runs.get(job_id)
            others = {n for j, r in self.runs.items() if j != job_id for n in r.nodes}
            if run is None:
                if target and others & set(target):
                    self.dirty = True  # a shrinking job still holds some of these: start once it has let go
                elif target:
                    self._seq += 1
                    run = self.executor.start(self.specs[job_id], tuple(target), self._seq, now)
                    self.runs[job_id] = run
                    self.rec.tally(job_id).max_nodes = max(self.rec.tally(job_id).max_nodes, len(target))
                    self.rec.event(now, "start", job_id, run.nodes, pool=len(pool),
                                   ckpt_step=self.specs[job_id].checkpoint_step(), detail=run.handle)
            elif set(target) != set(run.nodes):
                self.rec.event(now, "resize", job_id, run.nodes, pool=len(pool),
                               detail=f"{len(run.nodes)} -> {len(target)} nodes")
                state, _ = self.executor.state(run)
                (self.executor.kill if state == PENDING else self.executor.stop)(run)

    def run(self, timeout_s: float = 3600.0, on_step: Callable[[Harvester], None] | None = None) -> bool:
        """Step until every job finished (True) or ``timeout_s`` passed (False); unfinished runs are
        stopped with a checkpoint on the way out, also on Ctrl-C. ``on_step`` sees each step (progress)."""
        deadline = time.monotonic() + timeout_s
        try:
            while not self.done and time.monotonic() < deadline:
                t0 = time.monotonic()
                self.step()
                if on_step is not None:
                    on_step(self)
                time.sleep(max(0.0, self.cfg.poll_s - (time.monotonic() - t0)))
        finally:
            if not self.done:
                self.shutdown()
        return self.done

    def shutdown(self, wait_s: float = 20.0) -> None:
        """Stop every run (checkpoint first) and wait for them to end, so nothing outlives the harvester."""
        for run in self.runs.values():
            if not run.stop_requested:
                self.executor.stop(run)
        deadline = time.monotonic() + wait_s
        while self.runs and time.monotonic() < deadline:
            now = self.source.now()
            for job_id, run in list(self.runs.items()):
                state, detail = self.executor.state(run)
                if state == ENDED:
                    self._ended(job_id, run, detail, now)
            time.sleep(0.2)
        for run in self.runs.values():
            self.executor.kill(run)

    def write(self, out_meta: dict[str, object] | None = None) -> Path:
        return self.rec.finish({"mode": self.executor.kind, "solver": self.cfg.solver,
                                "nonoptimal_decisions": sum(self.nonoptimal.values()),
                                "nonoptimal_by_status": dict(self.nonoptimal),
                                "capacity_nodes": len(self.source.last.states) if self.source.last else 0,
                                **(out_meta or {})})
