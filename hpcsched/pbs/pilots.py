"""Node source ``pbs``: the controller harvests a PBS Pro cluster's free nodes with pilot jobs.

A pilot is one PBS job on one free node (``qsub -l select=1:host=NODE:ncpus=SLOTS``) whose only process is
``hpcsched worker``: once it runs, the node is a worker like any other. ``PbsPilots`` is the ``pbs`` entry of the
node-source registry (``hpcsched.runtime.node_source``: the contract) and every ``poll_s``:

1. reads PBS with one ``pbsnodes -a -F json`` and one ``qstat -f -F json`` (``read``): the free nodes no job holds,
   its own pilots by job name (a restarted controller on the same state file adopts its predecessor's), and the
   nodes other users' queued jobs wait for;
2. deletes pilots that will not serve: queued longer than ``start_timeout_s``, running without their worker
   registering within ``register_timeout_s``, or whose worker went silent;
3. gives nodes back (``yield_to_queued``): while queued batch jobs want more nodes than are free, it deletes as
   many pilots (idle ones first); PBS sends the worker SIGTERM and it checkpoints its tasks and leaves;
4. claims free nodes for the slots the queue could use beyond its live workers (one ``qsub`` per node, pinned to
   it), never nodes queued batch jobs are waiting for, and at most ``max_pilots``;
5. releases a pilot whose worker has had nothing to run for ``idle_release_s`` while no more are needed.

Everything it deletes in a poll goes in one ``qdel``. ``stop()`` deletes every pilot. Every decision is logged
with its reason and recorded in the controller's store as a ``pilot`` event (``job``, ``node``, ``worker``).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcsched.pbs import commands
from hpcsched.pbs.commands import PbsError
from hpcsched.pbs.config import PbsConfig, pilot_script, walltime
from hpcsched.pbs.read import PbsRead, read_pbs
from hpcsched.runtime.node_source import ControllerView, SourceView

log = logging.getLogger("hpcsched.pbs.pilots")


@dataclass(slots=True)
class PbsPilot:
    job_id: str
    node: str
    state: str = "PENDING"
    seen: float = 0.0  # when first seen (monotonic)
    running_since: float | None = None
    idle_since: float | None = None

    @property
    def worker(self) -> str:
        return f"pilot-{self.job_id}"


class PbsPilots:
    """The ``pbs`` node source (module docstring)."""

    name = "pbs"

    def __init__(self, cfg: PbsConfig, view: ControllerView, controller: str, token: str | None, state: Path,
                 clock: Callable[[], float] = time.monotonic,
                 run: Callable[[list[str]], str] = lambda argv: commands.run(argv)) -> None:
        self.cfg, self.demand_view, self.controller, self.clock, self.run = cfg, view, controller, clock, run
        self.tag = hashlib.sha256(str(Path(state).resolve()).encode()).hexdigest()[:8]  # one per state file
        self.job_name = f"hpcsched-{self.tag}"  # short: PBS Pro before 19 refused names over 15 characters
        self.pilots: dict[str, PbsPilot] = {}
        self.errors = 0  # polls that failed (PBS down, a command refused)
        self.token_file: Path | None = None
        cfg.work_dir.mkdir(parents=True, exist_ok=True)
        if token:
            self.token_file = cfg.work_dir / f"worker-token-{self.tag}"
            fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
        self.script = cfg.work_dir / f"pilot-{self.tag}.sh"
        self.script.write_text(pilot_script(cfg, controller, self.token_file, self.tag))
        self._view = SourceView("pbs")
        self._doomed: dict[str, str] = {}  # job id -> why, deleted at the end of this poll
        self._deleted: set[str] = set()  # pilots qdel'ed, until they leave qstat
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one step at a time (the thread's, a test's, stop's)

    # ------------------------------------------------------------------------------------ the contract
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="pbs-pilots", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.poll_s):
            try:
                self.step()
            except PbsError as e:
                self.errors += 1
                log.warning("pbs pilots: poll failed (%d so far): %s", self.errors, e)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.cfg.poll_s + 30)
            self._thread = None
        with self._lock:
            for jid in [j for j in self.pilots if j not in self._deleted]:
                self._doomed[jid] = "the controller stops"
            self._flush()

    def view(self) -> SourceView:
        return self._view

    def arriving(self, registered: Container[str]) -> list[str]:
        now = self.clock()
        return sorted(p.worker for p in list(self.pilots.values()) if p.state == "RUNNING"
                      and p.worker not in registered and p.running_since is not None and p.job_id not in self._deleted
                      and now - p.running_since < self.cfg.settle_s)

    def step(self) -> None:
        with self._lock:
            self._step()

    # ------------------------------------------------------------------------------------ one poll
    def _step(self) -> None:
        now = self.clock()
        read = read_pbs(self.run, self.job_name)
        workers = self.demand_view.workers()
        self._track(read, now, workers)
        for p in list(self.pilots.values()):
            self._check(p, now, workers)
        self._yield(read, workers)
        demand = self.demand_view.demand_slots()
        live = sum(slots for alive, slots, _ in workers.values() if alive)
        self._claim(read, demand, live, workers)
        self._release_idle(now, workers, demand, live)
        self._flush()
        self._view = SourceView("pbs", time.time(), self._nodes(read, workers),
                                {p.worker: (p.job_id, p.node, p.state) for p in self.pilots.values()})

    def _track(self, read: PbsRead, now: float, workers: dict[str, tuple[bool, int, int]]) -> None:
        for jid, j in read.pilots.items():
            p = self.pilots.get(jid)
            if p is None:  # a predecessor's (same state file), or one submitted and already listed
                p = self.pilots[jid] = PbsPilot(jid, j.nodes[0] if j.nodes else "", seen=now)
                self._event("adopt", p, "found in qstat")
            if j.state == "RUNNING" and p.state != "RUNNING":
                p.running_since = now
                self._event("running", p, f"on {j.nodes[0] if j.nodes else p.node}")
            p.state, p.node = j.state, (j.nodes[0] if j.nodes else p.node)
        for jid in [j for j in self.pilots if j not in read.pilots]:
            p = self.pilots.pop(jid)
            ours = jid in self._deleted
            self._event("gone", p, "left PBS (" + ("deleted by this controller" if ours
                                                   else "walltime, qdel by an operator, or its node failed") + ")",
                        cancelled=ours)
            self._deleted.discard(jid)

    def _check(self, p: PbsPilot, now: float, workers: dict[str, tuple[bool, int, int]]) -> None:
        if p.job_id in self._doomed or p.job_id in self._deleted:
            return
        w = workers.get(p.worker)
        if p.state == "PENDING" and now - p.seen > self.cfg.start_timeout_s:
            self._doomed[p.job_id] = f"queued for more than start_timeout_s ({self.cfg.start_timeout_s:g} s)"
        elif p.state == "RUNNING" and w is None and p.running_since is not None \
                and now - p.running_since > self.cfg.register_timeout_s:
            self._doomed[p.job_id] = (f"running without its worker registering for register_timeout_s "
                                      f"({self.cfg.register_timeout_s:g} s)")
        elif w is not None and not w[0]:
            self._doomed[p.job_id] = "its worker was lost (silent past its timeout)"

    def _yield(self, read: PbsRead, workers: dict[str, tuple[bool, int, int]]) -> None:
        """Give nodes to queued batch jobs the free nodes cannot serve: delete pilots, idle ones first."""
        if not self.cfg.yield_to_queued or not read.queued:
            return
        short = sum(j.nodect for j in read.queued) - len(read.free)
        running = [p for p in self.pilots.values() if p.state == "RUNNING" and p.job_id not in self._doomed
                   and p.job_id not in self._deleted]
        short -= len(self._deleted)  # nodes already on their way back
        running.sort(key=lambda p: (workers.get(p.worker, (True, 0, 0))[2] > 0, p.seen))  # idle ones first
        waiting = ", ".join(j.id for j in read.queued[:3]) + ("..." if len(read.queued) > 3 else "")
        for p in running[:max(0, short)]:
            self._doomed[p.job_id] = f"its node is given back: batch job(s) {waiting} wait for nodes"

    def _claim(self, read: PbsRead, demand: int, live: int, workers: dict[str, tuple[bool, int, int]]) -> None:
        gone = self._doomed.keys() | self._deleted
        kept = [p for p in self.pilots.values() if p.job_id not in gone]
        coming = [p for p in kept if p.worker not in workers]  # queued, or running before its worker registered
        missing = demand - live - len(coming) * self.cfg.slots
        wanted_by_batch = sum(j.nodect for j in read.queued)
        claimable = [n for n in read.free if n not in {p.node for p in kept}][wanted_by_batch:]
        count = min(math.ceil(missing / self.cfg.slots) if missing > 0 else 0, len(claimable),
                    self.cfg.max_pilots - len(kept))
        for node in claimable[:max(0, count)]:
            self._submit(node, f"the queue wants {missing} more slot(s)")

    def _submit(self, node: str, why: str) -> None:
        c = self.cfg
        select = f"select=1:host={node}:ncpus={c.slots}" + (f":ngpus={c.gpus}" if c.gpus else "")
        argv = ["qsub", "-N", self.job_name, "-l", select, "-l", f"walltime={walltime(c.walltime_s)}",
                "-j", "oe", "-o", str(c.work_dir / f"pilot-{self.tag}-{node}.log")]
        argv += (["-q", c.queue] if c.queue else []) + (["-A", c.account] if c.account else [])
        jid = self.run([*argv, *c.qsub_args, str(self.script)]).strip()
        if not jid:
            raise PbsError("qsub printed no job id")
        p = self.pilots[jid] = PbsPilot(jid, node, seen=self.clock())
        self._event("submit", p, f"on {node}: {why}")

    def _release_idle(self, now: float, workers: dict[str, tuple[bool, int, int]], demand: int, live: int) -> None:
        for p in self.pilots.values():
            w = workers.get(p.worker)
            idle = w is not None and w[0] and w[2] == 0
            p.idle_since = (p.idle_since or now) if idle else None
            spare = demand <= live - (w[1] if w else 0)  # the others serve the queue without it
            if idle and spare and p.job_id not in self._doomed and p.job_id not in self._deleted \
                    and now - (p.idle_since or now) >= self.cfg.idle_release_s:
                self._doomed[p.job_id] = f"nothing to run for idle_release_s ({self.cfg.idle_release_s:g} s)"
                live -= w[1] if w else 0

    def _flush(self) -> None:
        """Delete this poll's doomed pilots with one ``qdel`` (their workers get SIGTERM: checkpoint, leave)."""
        todo = [j for j in self._doomed if j in self.pilots]
        doomed, self._doomed = self._doomed, {}
        if not todo:
            return
        for jid in todo:
            self._event("cancel", self.pilots[jid], doomed[jid])
        self._deleted.update(todo)
        try:
            self.run(["qdel", *todo])
        except PbsError as e:  # e.g. one of them ended meanwhile: the next poll sees what is left and retries
            log.warning("pbs pilots: qdel %s: %s", " ".join(todo), e)

    def _nodes(self, read: PbsRead, workers: dict[str, tuple[bool, int, int]]) -> dict[str, tuple[str, str]]:
        out = {n: ("free", "") for n in read.free} | {n: (why, "") for n, why in read.why_not.items()}
        for p in self.pilots.values():
            if p.node:
                w = workers.get(p.worker)
                serving = "worker alive" if w and w[0] else "worker gone" if w else "no worker yet"
                out[p.node] = (f"pilot {p.job_id} ({p.state.lower()}, {serving})", p.job_id)
        return out

    def _event(self, kind: str, p: PbsPilot, detail: str, cancelled: bool = False) -> None:
        log.info("pilot %s: %s %s", p.job_id, kind, detail)
        record = getattr(self.demand_view, "record", None)
        if record is None:
            return
        d: dict[str, Any] = {"event": kind, "job": p.job_id, "node": p.node, "worker": p.worker, "state": p.state,
                             "detail": detail, "source": "pbs"}
        if kind == "gone":
            d["cancelled"] = cancelled
        try:
            record(d)
        except Exception:  # the store busy or closing: the log still has it
            log.exception("pbs pilots: could not record %s of pilot %s in the store", kind, p.job_id)
