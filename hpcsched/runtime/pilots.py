"""Node source ``slurm``: the controller harvests a supercomputer's idle nodes with pilot jobs.

A pilot is one Slurm job on one node whose only process is ``hpcsched worker --controller ...``: once it runs,
the node is a worker like any other and the controller's decision core plans over it; when Slurm takes the node
back (preemption in a scavenger partition, the time limit, a cancel) the worker gets SIGTERM, checkpoints and
stops its tasks within its grace and leaves (the controller re-plans at once, ``Controller.leave``).

``PilotManager`` runs beside the controller (a thread, started and stopped with its server) and every
``poll_s``:

1. reads Slurm once (``sinfo``/``squeue`` through the harvester's parsers: the plain-idle nodes of the pilots'
   partition that no job holds) and its own pilots (``squeue``, by job name, so a restarted controller adopts
   the pilots of its predecessor on the same state file);
2. ends pilots that will not serve: pending longer than ``start_timeout_s`` (never started), running without
   their worker registering within ``register_timeout_s`` (hung), or whose worker went silent (died);
3. decides how many nodes to claim (``pilots_wanted``: the slots the queue could use beyond the live workers,
   bounded by the idle nodes and ``max_pilots``) and submits that many pilots, each pinned to an idle node
   (``--nodelist``), so a site without a scavenger partition is served too: pilots take only nodes Slurm
   reports idle and leave ``leave_before_s`` before their time limit (``--signal=B:TERM@...``);
4. releases a pilot whose worker has had nothing to run for ``idle_release_s`` while the queue needs no more.

Nothing outlives the controller's wish: ``stop()`` cancels every pilot (Slurm sends SIGTERM; the workers
checkpoint and leave), and each pilot has a time limit. A controller killed with ``kill -9`` leaves its pilots
running until it comes back (a controller restarted on the same state and address adopts them) or until
``orphan_timeout_s`` without it has passed (their workers checkpoint and leave) or their time limit. Every
decision is logged with its reason and kept in ``events``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hpcsched.errors import InputError
from hpcsched.slurm import commands
from hpcsched.slurm.nodes import parse_sinfo
from hpcsched.slurm.source import derive_pool, parse_squeue

log = logging.getLogger("hpcsched.runtime.pilots")

NODE_SOURCES = ("static", "slurm")


@dataclass(frozen=True, slots=True)
class PilotConfig:
    """The ``slurm:`` section of a controller file (``node_source: slurm``)."""

    partition: str | None = None  # the preemptible partition the site gives (scavenger); None: Slurm's default
    qos: str | None = None
    account: str | None = None
    time_limit_s: int = 3600  # each pilot's --time
    leave_before_s: int = 60  # SIGTERM this long before the time limit: checkpoint and leave in time
    signal: str = "TERM"  # the signal Slurm sends then (--signal=B:SIG@leave_before_s)
    max_pilots: int = 4
    slots: int = 1  # per pilot's worker
    gpus: int = 0
    stop_grace_s: float = 4.0  # the pilot worker's checkpoint time on SIGTERM: below the partition's GraceTime
    orphan_timeout_s: float = 600.0  # a pilot whose controller is unreachable this long leaves (not restarted)
    poll_s: float = 2.0
    start_timeout_s: float = 300.0  # pending longer: cancelled (never started)
    register_timeout_s: float = 120.0  # running, but no worker registered by then: cancelled (hung)
    idle_release_s: float = 60.0  # a pilot with nothing to run this long, while none is needed, is released
    work_dir: Path = Path("pilots")  # pilots' logs, work dirs and token file (a shared file system)
    python: str = sys.executable
    sbatch_args: tuple[str, ...] = ()  # anything else the site needs (--constraint, --mem, ...)


_KEYS = {f for f in PilotConfig.__dataclass_fields__}


def read_pilot_config(data: Any, source: str, line: int | None, base: Path) -> PilotConfig:
    """The ``slurm:`` mapping of a controller file, validated (errors name the file and the section's line)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(source, "slurm: expected a mapping (partition, qos, account, time_limit_s, ...)", line)
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise InputError(source, f"slurm: unknown key {unknown[0]!r}; expected one of {', '.join(sorted(_KEYS))}",
                         line)
    out: dict[str, Any] = {}
    defaults = PilotConfig()
    for k, v in data.items():
        want = type(getattr(defaults, k))
        if k in ("partition", "qos", "account"):
            want = str
        if k == "work_dir":
            p = Path(str(v))
            out[k] = p if p.is_absolute() else (base / p).resolve()
        elif k == "sbatch_args":
            if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
                raise InputError(source, "slurm: sbatch_args: expected a list of strings", line)
            out[k] = tuple(v)
        elif want is float and isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            out[k] = float(v)
        elif want is int and isinstance(v, int) and not isinstance(v, bool) and (v > 0 or k == "gpus" and v == 0):
            out[k] = v
        elif want is str and isinstance(v, str) and v:
            out[k] = v
        else:
            raise InputError(source, f"slurm: {k}: expected a {'positive ' if want in (int, float) else ''}"
                                     f"{want.__name__}, got {v!r}", line)
    cfg = PilotConfig(**out)
    if "work_dir" not in out:
        cfg = PilotConfig(**(out | {"work_dir": (base / "pilots").resolve()}))
    if cfg.leave_before_s >= cfg.time_limit_s:
        raise InputError(source, f"slurm: leave_before_s ({cfg.leave_before_s}) must be below time_limit_s "
                                 f"({cfg.time_limit_s})", line)
    return cfg


def pilots_wanted(demand_slots: int, live_slots: int, pending: int, running: int, idle_nodes: int,
                  cfg: PilotConfig) -> int:
    """How many new pilots to submit now: enough for the slots the queue could use beyond what the live workers
    and the pilots already on their way give, at most one per idle node and ``max_pilots`` in all."""
    missing = demand_slots - live_slots - pending * cfg.slots
    if missing <= 0:
        return 0
    return max(0, min(math.ceil(missing / cfg.slots), idle_nodes, cfg.max_pilots - pending - running))


@dataclass(slots=True)
class Pilot:
    """One pilot job as the manager knows it."""

    job_id: str
    node: str  # the node it asked for (or runs on)
    state: str = "PENDING"
    seen: float = 0.0  # when first seen (monotonic)
    running_since: float | None = None
    idle_since: float | None = None  # its worker alive with nothing to run, since
    dead_since: float | None = None  # its worker gone from the controller while the job still runs, since
    ended: str = ""  # why the manager ended it, when it did

    @property
    def worker(self) -> str:
        return f"pilot-{self.job_id}"


class ControllerView(Protocol):
    """What the manager reads from the controller: the queue's demand and the live workers."""

    def demand_slots(self) -> int: ...

    def workers(self) -> dict[str, tuple[bool, int, int]]:
        """worker -> (alive, slots, used)."""
        ...

    # Optional (``ControllerDemand`` has both): ``record(detail)`` keeps a pilot event in the controller's store
    # (``hpcsched calc`` reads pilot node time from them), ``pilot_history()`` gives worker -> (Slurm job, node)
    # of the pilots a predecessor on the same state recorded.


@dataclass(slots=True)
class PilotEvent:
    time: float
    kind: str  # submit, running, registered, cancel, gone, adopt
    job_id: str
    detail: str = ""


def pilot_script(cfg: PilotConfig, controller: str, token_file: Path | None, tag: str) -> str:
    """The batch script: the worker, named after the pilot job, exec'd so that Slurm's signals reach it."""
    argv = [cfg.python, "-m", "hpcsched.runtime", "worker", "--controller", controller, "--slots", str(cfg.slots),
            "--gpus", str(cfg.gpus), "--stop-grace", str(cfg.stop_grace_s), "--orphan-timeout",
            str(cfg.orphan_timeout_s)]
    if token_file is not None:
        argv += ["--token-file", str(token_file)]
    words = " ".join(shlex.quote(a) for a in argv)
    work = shlex.quote(str(cfg.work_dir))
    return (f"#!/bin/sh\n# hpcsched pilot ({tag}): one worker for the controller at {controller}\n"
            f'exec {words} --name "pilot-$SLURM_JOB_ID" --work-dir {work}/"$SLURM_JOB_ID"\n')


class PilotManager:
    """Claims idle Slurm nodes for the controller with pilot jobs (module docstring)."""

    def __init__(self, cfg: PilotConfig, view: ControllerView, controller: str, token: str | None, state: Path,
                 clock: Callable[[], float] = time.monotonic,
                 run: Callable[[list[str]], str] = lambda argv: commands.run(argv)) -> None:
        self.cfg, self.view, self.controller, self.clock, self.run = cfg, view, controller, clock, run
        # One tag per state file: a restarted controller (same state) knows its predecessor's pilots by name.
        self.tag = hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:8]
        self.name = f"hpcsched-pilot-{self.tag}"
        self.pilots: dict[str, Pilot] = {}
        self.events: list[PilotEvent] = []
        self.token_file: Path | None = None
        cfg.work_dir.mkdir(parents=True, exist_ok=True)
        if token:
            self.token_file = cfg.work_dir / f"worker-token-{self.tag}"
            fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0  # pilots in a row that never served (reset when one registers)
        self.hold_until = 0.0  # no new pilot before this (monotonic): the back-off after failures
        # worker -> (Slurm job, node) of every pilot this controller (or its predecessor on this state) had, so
        # `hpcsched workers` names a pilot's worker as one after its pilot has left Slurm; bounded.
        self.known: dict[str, tuple[str, str]] = dict(getattr(view, "pilot_history", dict)())
        # What `hpcsched workers --nodes` shows: replaced whole at the end of each step (read from other threads).
        self.snapshot = PilotSnapshot()

    # ------------------------------------------------------------------------------------------- loop
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="pilots")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except commands.SlurmError as e:  # Slurm unreachable for a moment: said, and tried again
                log.warning("pilots: a Slurm command failed (tried again in %g s): %s", self.cfg.poll_s, e)
            except Exception:  # a bug in one step must not end harvesting silently: logged loudly
                log.exception("pilots: step failed")
            self._stop.wait(self.cfg.poll_s)

    def stop(self, wait_s: float = 30.0) -> None:
        """Cancel every pilot (their workers checkpoint and leave) and wait until Slurm lists none."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.cfg.poll_s + 30)
        try:
            ids = [p.job_id for p in self._listed()]
            if ids:
                self.run(["scancel", *ids])
                for jid in ids:
                    self._event("cancel", jid, "controller stopping")
            deadline = time.monotonic() + wait_s
            while self._listed() and time.monotonic() < deadline:
                time.sleep(0.5)
            left = [p.job_id for p in self._listed()]
            if left:
                log.error("pilots: %s still listed %.0f s after scancel", ",".join(left), wait_s)
            for jid in ids:
                if jid not in left:
                    p = self.pilots.pop(jid, None)
                    self._event("gone", jid, "cancelled: controller stopping", node=p.node if p else "",
                                cancelled=True)
        except commands.SlurmError as e:
            log.error("pilots: could not cancel the pilots at stop: %s", e)

    # ------------------------------------------------------------------------------------------- step
    def step(self) -> None:
        now = self.clock()
        idle_nodes, why_not = self._idle_nodes()
        listed = {p.job_id: p for p in self._listed()}
        for jid, p in listed.items():  # new to us: submitted by a predecessor on this state
            if jid not in self.pilots:
                self.pilots[jid] = Pilot(jid, p.node, p.state, seen=now)
                self._event("adopt", jid, f"{p.state} on {p.node or '?'}")
        for jid in list(self.pilots):
            if jid not in listed:
                gone = self.pilots.pop(jid)
                self._event("gone", jid, gone.ended or f"left Slurm's queue ({gone.state}: ended, preempted or "
                                                      "past its time limit)", node=gone.node,
                            cancelled=bool(gone.ended))
        workers = self.view.workers()
        for p in self.pilots.values():
            q = listed[p.job_id]
            p.state, p.node = q.state, q.node or p.node
            if q.state == "RUNNING" and p.running_since is None:
                p.running_since = now
                self._event("running", p.job_id, f"on {q.node}")
            self._check(p, now, workers)
        live_slots = sum(slots for alive, slots, _ in workers.values() if alive)
        # A pilot not serving yet counts as on its way, a cancelled one too until it has left Slurm's queue.
        pending = sum(1 for p in self.pilots.values() if p.ended or p.running_since is None
                      or not workers.get(p.worker, (False, 0, 0))[0])
        running = len(self.pilots) - pending
        claimed = {p.node for p in self.pilots.values()}
        idle = [n for n in idle_nodes if n not in claimed]
        demand = self.view.demand_slots()
        new = pilots_wanted(demand, live_slots, pending, running, len(idle), self.cfg)
        if new and now < self.hold_until:
            new = 0  # backing off after pilots that never started or hung (see _cancel)
        for node in idle[:new]:
            self._submit(node, f"queue wants {demand} slots, live workers have {live_slots}, {pending} pilots coming")
        self._release_idle(now, workers, demand, live_slots)
        if demand <= live_slots + pending * self.cfg.slots:
            unused = f"idle, not needed: the queue wants {demand} slots, live workers have {live_slots}" + (
                f", {pending} pilots coming" if pending else "")
        elif now < self.hold_until:
            unused = f"idle, not claimed: backing off for {self.hold_until - now:.0f} s after pilots that never served"
        elif len(self.pilots) >= self.cfg.max_pilots:
            unused = f"idle, not claimed: max_pilots ({self.cfg.max_pilots}) reached"
        else:
            unused = "idle, to be claimed"
        self._write_status(demand, live_slots, why_not | {n: unused for n in idle_nodes}, workers)

    def _write_status(self, demand: int, live: int, nodes: dict[str, str],
                      workers: dict[str, tuple[bool, int, int]]) -> None:
        """``work_dir/status-TAG.json``, rewritten every step: each pilot, each node of the partition with what it
        does for the controller or why it is not used, and the last events (what an operator asks first)."""
        for p in self.pilots.values():
            w = workers.get(p.worker)
            serving = "worker alive" if w and w[0] else "worker gone" if w else "no worker yet"
            nodes[p.node] = f"pilot {p.job_id} ({p.state.lower()}, {serving}{'; ' + p.ended if p.ended else ''})"
        self.snapshot = PilotSnapshot(time.time(), {p.worker: (p.job_id, p.node, p.state)
                                                    for p in self.pilots.values()}, dict(sorted(nodes.items())))
        status = {"time": time.time(), "controller": self.controller, "pilot_job_name": self.name,
                  "demand_slots": demand, "live_slots": live,
                  "pilots": [{"job_id": p.job_id, "node": p.node, "state": p.state, "worker": p.worker,
                              "worker_alive": bool(workers.get(p.worker, (False,))[0]), "cancelled": p.ended}
                             for p in self.pilots.values()],
                  "nodes": dict(sorted(nodes.items())),
                  "events": [{"time": e.time, "kind": e.kind, "job_id": e.job_id, "detail": e.detail}
                             for e in self.events[-50:]]}
        path = self.status_path
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(status, indent=1) + "\n")
        os.replace(tmp, path)

    @property
    def status_path(self) -> Path:
        return self.cfg.work_dir / f"status-{self.tag}.json"

    def _check(self, p: Pilot, now: float, workers: dict[str, tuple[bool, int, int]]) -> None:
        """End a pilot that will not serve (never started, hung, its worker died)."""
        if p.ended:
            return
        w = workers.get(p.worker)
        if p.running_since is None and now - p.seen > self.cfg.start_timeout_s:
            self._cancel(p, f"never started: pending {now - p.seen:.0f} s "
                            f"(start_timeout_s {self.cfg.start_timeout_s:g})")
        elif p.running_since is not None and w is None and now - p.running_since > self.cfg.register_timeout_s:
            self._cancel(p, f"hung: running {now - p.running_since:.0f} s and its worker never registered "
                            f"(register_timeout_s {self.cfg.register_timeout_s:g}; log {self.log_path(p.job_id)})")
        elif w is not None and not w[0] and p.state == "RUNNING":
            # Gone from the controller while Slurm still runs the pilot: a worker that left (preempted, its time
            # limit) exits within its grace and the job ends; one still listed well after that is dead or stuck.
            p.dead_since = p.dead_since if p.dead_since is not None else now
            if now - p.dead_since > self.cfg.stop_grace_s + 10:
                self._cancel(p, f"its worker {p.worker} is gone from the controller (left or silent) while the "
                                f"pilot still runs, {now - p.dead_since:.0f} s now", failed=False)
        elif w is not None and w[0]:
            self.failures = 0
            if w[2] == 0:
                p.idle_since = p.idle_since if p.idle_since is not None else now
            else:
                p.idle_since = None

    def _release_idle(self, now: float, workers: dict[str, tuple[bool, int, int]], demand: int, live: int) -> None:
        """Give back one pilot at a time that has had nothing to run for idle_release_s, while the queue would
        still fit without it."""
        for p in sorted(self.pilots.values(), key=lambda p: p.job_id):
            if p.ended or p.idle_since is None or now - p.idle_since < self.cfg.idle_release_s:
                continue
            if demand <= live - self.cfg.slots:
                self._cancel(p, f"idle {now - p.idle_since:.0f} s and not needed (queue wants {demand} slots, "
                                f"live workers have {live})", failed=False)
                return

    # ------------------------------------------------------------------------------------- Slurm verbs
    def _submit(self, node: str, why: str) -> None:
        script = self.cfg.work_dir / f"pilot-{self.tag}.sh"
        tmp = script.with_name(script.name + f".{os.getpid()}.tmp")
        tmp.write_text(pilot_script(self.cfg, self.controller, self.token_file, self.tag))
        os.replace(tmp, script)
        c = self.cfg
        argv = ["sbatch", "--parsable", "--job-name", self.name, "--nodes", "1", "--nodelist", node,
                "--time", f"{max(1, math.ceil(c.time_limit_s / 60))}",
                f"--signal=B:{c.signal}@{c.leave_before_s}", "--output", str(c.work_dir / "pilot-%j.log"),
                "--chdir", str(c.work_dir)]
        for flag, value in (("--partition", c.partition), ("--qos", c.qos), ("--account", c.account)):
            if value:
                argv += [flag, value]
        jid = self.run([*argv, *c.sbatch_args, str(script)]).strip().split(";")[0]
        self.pilots[jid] = Pilot(jid, node, seen=self.clock())
        self._event("submit", jid, f"on {node}: {why}")

    def _cancel(self, p: Pilot, why: str, failed: bool = True) -> None:
        """Cancel a pilot. One that never served (never started, or its worker never registered) holds new
        submissions back for start_timeout_s, doubling with each such failure in a row up to 10 minutes: a
        partition that never starts pilots, or a node set-up where the worker cannot start, is not flooded with
        new ones. A pilot that served and then lost its worker is replaced at once."""
        self.run(["scancel", p.job_id])
        p.ended = why
        if failed:
            self.failures += 1
            backoff = min(self.cfg.start_timeout_s * 2 ** (self.failures - 1), 600.0)
            self.hold_until = self.clock() + backoff
            why += f"; no new pilot for {backoff:.0f} s"
        self._event("cancel", p.job_id, why)

    def _idle_nodes(self) -> tuple[list[str], dict[str, str]]:
        """Plain-idle nodes no job holds, in Slurm's order, within the pilots' partition when one is set (the
        harvester's state table and pool rule: ``hpcsched.slurm.nodes``, ``source.derive_pool``), and why each
        other node is not."""
        part = ["-p", self.cfg.partition] if self.cfg.partition else []
        states = parse_sinfo(self.run(["sinfo", "-N", "-h", *part, "-o", "%N %T"]))
        jobs = parse_squeue(self.run(["squeue", "-h", "-t", "CONFIGURING,RUNNING,COMPLETING,SUSPENDED,SIGNALING",
                                      "-o", "%i|%P|%j|%T|%N"]), commands.hostnames)
        pool, why = derive_pool(states, jobs, lambda j: False)
        return [n for n in pool if states[n].harvestable], why | {n: states[n].raw for n in pool
                                                                  if not states[n].harvestable}

    def _listed(self) -> list[Pilot]:
        out = self.run(["squeue", "-h", "--name", self.name, "-o", "%i|%T|%N"])
        pilots = []
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3:
                pilots.append(Pilot(parts[0], parts[2], parts[1]))
        return pilots

    def log_path(self, job_id: str) -> Path:
        return self.cfg.work_dir / f"pilot-{job_id}.log"

    def _event(self, kind: str, job_id: str, detail: str, node: str | None = None, cancelled: bool = False) -> None:
        """Log, keep (the last 1000) and record in the controller's store: a ``pilot`` event with the Slurm job,
        its node, its worker and, for ``gone``, whether this controller had cancelled it (else Slurm ended it:
        preempted, its time limit, an operator's scancel)."""
        e = PilotEvent(time.time(), kind, job_id, detail)
        self.events.append(e)
        del self.events[:-1000]  # bounded: a controller runs for weeks
        log.info("pilot %s: %s %s", job_id, kind, detail)
        p = self.pilots.get(job_id)
        node = node if node is not None else p.node if p else ""
        worker = f"pilot-{job_id}"
        if node:
            self.known[worker] = (job_id, node)
            if len(self.known) > 10000:
                del self.known[next(iter(self.known))]
        record = getattr(self.view, "record", None)
        if record is not None:
            detail_d: dict[str, Any] = {"event": kind, "slurm_job": job_id, "node": node, "worker": worker,
                                        "state": p.state if p else "", "detail": detail}
            if kind == "gone":
                detail_d["cancelled"] = cancelled
            try:
                record(detail_d)
            except Exception:  # the store busy or closing: the status file and the log still have it
                log.exception("pilots: could not record %s of pilot %s in the store", kind, job_id)


@dataclass(frozen=True, slots=True)
class PilotSnapshot:
    """The manager's last poll, for listings: worker -> (Slurm job, node, state) of its pilots, and each node of
    the partition with what it does for the controller or why it is not used (as in ``status-TAG.json``)."""

    time: float = 0.0
    pilots: dict[str, tuple[str, str, str]] = dataclasses.field(default_factory=dict)
    nodes: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclass(slots=True)
class ControllerDemand:
    """``ControllerView`` over a live ``Controller``: the slots its queue could use (each pending or running job's
    ``max_procs``: an elastic job grows into harvested nodes) and its workers."""

    ctl: Any

    def demand_slots(self) -> int:
        with self.ctl.lock:
            jobs = self.ctl.store.jobs(("pending", "running"))
        return sum(j.spec.max_procs for j in jobs)

    def workers(self) -> dict[str, tuple[bool, int, int]]:
        return {w.worker_id: (w.alive, w.slots, w.used) for w in self.ctl.list_workers()}

    def record(self, detail: dict[str, Any]) -> None:
        """A ``pilot`` event in the store (job_id NULL): what ``hpcsched calc`` reads pilot node time from."""
        with self.ctl.lock:
            self.ctl.store.event(None, "pilot", **detail)

    def pilot_history(self) -> dict[str, tuple[str, str]]:
        """worker -> (Slurm job, node) of the pilots recorded in the store (a predecessor's included)."""
        with self.ctl.lock:
            events = self.ctl.store.events(kind="pilot")
        return {e["worker"]: (e["slurm_job"], e["node"]) for e in events if e.get("worker") and e.get("node")}


def reachable(address: str) -> str:
    """The address pilots dial: the controller's bound one, with a wildcard host (0.0.0.0, ::) replaced by this
    machine's name (a pilot on another node cannot dial 0.0.0.0)."""
    host, _, port = address.rpartition(":")
    return f"{socket.getfqdn()}:{port}" if host.strip("[]") in ("0.0.0.0", "::", "") else address
