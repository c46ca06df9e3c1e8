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
   (``--nodelist``), leaving ``leave_before_s`` before their time limit (``--signal=B:TERM@...``). With
   ``time_limit: fit-idle-window`` a site without a scavenger partition is served too: each idle node's window
   until Slurm next needs it (a reservation, a pending job backfill planned there: ``hpcsched.slurm.idle_windows``)
   sets its pilot's time limit, nodes with a window below ``min_window_s`` get none, and the pilot's worker leaves
   at its own deadline before the window ends;
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
from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hpcsched.errors import InputError
from hpcsched.slurm import commands
from hpcsched.slurm.idle_windows import Windows, read_windows
from hpcsched.slurm.nodes import NodeState, parse_sinfo
from hpcsched.slurm.source import derive_pool, parse_squeue

log = logging.getLogger("hpcsched.runtime.pilots")

NODE_SOURCES = ("static", "slurm")


@dataclass(frozen=True, slots=True)
class PilotConfig:
    """The ``slurm:`` section of a controller file (``node_source: slurm``)."""

    partition: str | None = None  # the preemptible partition the site gives (scavenger); None: Slurm's default
    qos: str | None = None
    account: str | None = None
    time_limit_s: int = 3600  # each pilot's --time (fit-idle-window: the longest a pilot asks for)
    time_limit: str = "fixed"  # fixed: time_limit_s; fit-idle-window: each node's idle window (idle_windows.py)
    min_window_s: int = 600  # fit-idle-window: a node idle for less is not used ('idle window too short')
    window_margin_s: int = 60  # fit-idle-window: the pilot's time limit ends this long before the node's claim
    leave_before_s: int = 60  # SIGTERM this long before the time limit: checkpoint and leave in time
    signal: str = "TERM"  # the signal Slurm sends then (--signal=B:SIG@leave_before_s; fixed time_limit only)
    max_pilots: int = 4
    slots: int = 1  # per pilot's worker
    gpus: int = 0
    stop_grace_s: float = 4.0  # the pilot worker's checkpoint time on SIGTERM: below the partition's GraceTime
    orphan_timeout_s: float = 600.0  # a pilot whose controller is unreachable this long leaves (not restarted)
    poll_s: float = 2.0
    start_timeout_s: float = 300.0  # pending longer: cancelled (never started)
    register_timeout_s: float = 120.0  # running, but no worker registered by then: cancelled (hung)
    # Decisions wait at most this long after a pilot was submitted or started for its worker to register. Pilots
    # freed together register a few hundred ms apart; planning at each arrival started an elastic job at 1 proc
    # and relaunched it at every next one (a full stop, checkpoint and start each time).
    settle_s: float = 10.0
    idle_release_s: float = 60.0  # a pilot with nothing to run this long, while none is needed, is released
    work_dir: Path = Path("pilots")  # pilots' logs, work dirs and token file (a shared file system)
    python: str = sys.executable
    sbatch_args: tuple[str, ...] = ()  # anything else the site needs (--constraint, --mem, ...)
    # True: the worker runs as the job's step (srun). On preemption Slurm signals a job's steps at once but its batch
    # shell only when GraceTime is over, on its own timer: a batch job waited 12-19 s for pilots whose worker was the
    # batch shell, 2-6 s for steps (GraceTime 5 s). But then every process of the step gets the signal and the step
    # ends with the worker, so an elastic Horovod job's ranks there die instead of being removed at a commit and its
    # survivors wait out Gloo's timeout (docs/runtime.md): off by default until the worker keeps such ranks alive.
    worker_step: bool = False


_KEYS = {f for f in PilotConfig.__dataclass_fields__}
FIT = "fit-idle-window"
TIME_LIMITS = ("fixed", FIT)
_FIT_KEYS = ("min_window_s", "window_margin_s")  # read only by fit-idle-window: refused beside fixed


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
        if k == "time_limit":
            if v not in TIME_LIMITS:
                raise InputError(source, f"slurm: time_limit: expected one of {', '.join(TIME_LIMITS)}, got {v!r}",
                                 line)
            out[k] = v
        elif k == "work_dir":
            p = Path(str(v))
            out[k] = p if p.is_absolute() else (base / p).resolve()
        elif k == "sbatch_args":
            if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
                raise InputError(source, "slurm: sbatch_args: expected a list of strings", line)
            out[k] = tuple(v)
        elif want is bool and isinstance(v, bool):
            out[k] = v
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
    if cfg.time_limit != FIT:
        given = [k for k in _FIT_KEYS if k in data]
        if given:
            raise InputError(source, f"slurm: {given[0]} is read only with time_limit: {FIT} (time_limit is "
                                     f"{cfg.time_limit})", line)
    elif "signal" in data:
        raise InputError(source, f"slurm: signal is not read with time_limit: {FIT} (its pilots' workers leave at "
                                 "their own deadline, not on a Slurm --signal)", line)
    else:
        # Slurm keeps time limits in whole minutes (--time=0:45 becomes 1:00), so the shortest window used must
        # leave a whole minute after the margin, and the pilot must still run before it leaves.
        shortest = (cfg.min_window_s - cfg.window_margin_s) // 60 * 60
        if shortest < 60 or shortest <= cfg.leave_before_s:
            raise InputError(source, f"slurm: min_window_s ({cfg.min_window_s}) minus window_margin_s "
                                     f"({cfg.window_margin_s}) must give a time limit of at least one whole minute "
                                     f"(Slurm's unit) above leave_before_s ({cfg.leave_before_s}); it gives "
                                     f"{shortest} s", line)
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
    leave_by: float | None = None  # fit-idle-window: unix time its worker leaves at (before the node's claim)
    deadline: float | None = None  # fit-idle-window: ... at the latest, whenever it starts (script's $1)
    run_s: int = 0  # fit-idle-window: ... and at the latest this long after its start (script's $2)
    claim: str = ""  # fit-idle-window: what needs the node next ('reservation maint1 at 06:29:05'), if known

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
    """The batch script: the worker, named after the pilot job, exec'd as the job's one step (``worker_step``; else
    as the batch shell) so that Slurm's signals reach it.

    With ``time_limit: fit-idle-window`` the script takes two arguments, the unix time its worker must have left
    by (the node's claim less the margin and ``leave_before_s``) and the seconds after its start it leaves at
    (its time limit less ``leave_before_s``), and runs the worker under ``timeout``, which sends it SIGTERM at the
    earlier of the two, to the second. Slurm's ``--signal`` is not used then: Slurm sends it from a timer, early by
    up to its check period (measured: 11 s), and counts from the job's start, not from the claim; the time limit
    itself stays the backstop (SIGTERM, on which the worker still checkpoints, then SIGKILL after KillWait). GNU
    ``timeout`` passes on the SIGTERM Slurm sends it (a preemption, scancel) and, with ``--preserve-status``, exits
    with the worker's status, so a pilot that left cleanly ends COMPLETED rather than TIMEOUT."""
    argv = [cfg.python, "-m", "hpcsched.runtime", "worker", "--controller", controller, "--slots", str(cfg.slots),
            "--gpus", str(cfg.gpus), "--stop-grace", str(cfg.stop_grace_s), "--orphan-timeout",
            str(cfg.orphan_timeout_s)]
    if token_file is not None:
        argv += ["--token-file", str(token_file)]
    words = " ".join(shlex.quote(a) for a in argv)
    work = shlex.quote(str(cfg.work_dir))
    head = f"#!/bin/sh\n# hpcsched pilot ({tag}): one worker for the controller at {controller}\n"
    run = f'{words} --name "pilot-$SLURM_JOB_ID" --work-dir {work}/"$SLURM_JOB_ID"\n'
    # every CPU of the node to the step; no MPI plugin (the worker's mpirun must not see one); timeout inside the
    # step, so that a worker leaving at its deadline ends the step (and the job) with its own status
    step = ('srun --ntasks=1 --nodes=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}" --mpi=none --quiet '
            if cfg.worker_step else "")
    if cfg.time_limit != FIT:
        return head + "exec " + step + run
    # SIGKILL only if the worker is still there at its time limit, as Slurm would
    return (head + "# fit-idle-window: $1 = unix time to have left by, $2 = seconds after the start to leave at\n"
            'left=$(( $1 - $(date +%s) ))\n[ "$left" -gt "$2" ] && left=$2\n'
            'if [ "$left" -lt 1 ]; then echo "hpcsched pilot: its idle window ended at $1: no worker"; exit 0; fi\n'
            'echo "hpcsched pilot: the worker leaves in $left s"\n'
            f'exec {step}timeout --preserve-status -s TERM -k {cfg.leave_before_s} "$left" ' + run)


class PilotManager:
    """Claims idle Slurm nodes for the controller with pilot jobs (module docstring)."""

    def __init__(self, cfg: PilotConfig, view: ControllerView, controller: str, token: str | None, state: Path,
                 clock: Callable[[], float] = time.monotonic,
                 run: Callable[[list[str]], str] = lambda argv: commands.run(argv),
                 wall: Callable[[], float] = time.time) -> None:
        self.cfg, self.view, self.controller, self.clock, self.run = cfg, view, controller, clock, run
        self.wall = wall  # unix time: idle windows end at Slurm's clock times
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
        self.windows: Windows | None = None  # fit-idle-window: the last poll's estimate
        self._unplaced_said: tuple[str, ...] = ()
        self._planned: set[str] = set()  # fit-idle-window: idle nodes backfill holds for a pending job (last poll)

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

    def arriving(self, registered: Container[str]) -> list[str]:
        """The workers of pilots that Slurm runs or was just asked to run, not registered yet, each for at most
        ``settle_s`` after the pilot was first seen running (pending: submitted): the controller holds its
        decisions while this is not empty, so nodes that come back together are planned once. Called from the
        controller's scheduling thread: it reads a copy of the pilot table, which ``step`` replaces entries of."""
        now = self.clock()
        out = []
        for p in list(self.pilots.values()):
            since = p.running_since if p.running_since is not None else p.seen
            if (not p.ended and p.state in ("PENDING", "RUNNING") and p.worker not in registered
                    and now - since < self.cfg.settle_s):
                out.append(p.worker)
        return out

    # ------------------------------------------------------------------------------------------- step
    def step(self) -> None:
        now = self.clock()
        idle_nodes, why_not = self._idle_nodes()
        fits: dict[str, float] = {}  # fit-idle-window: node -> its usable window (s), longest first
        if self.cfg.time_limit == FIT:
            idle_nodes, fits = self._fit_windows(idle_nodes, why_not)
        listed = {p.job_id: p for p in self._listed()}
        for jid, p in listed.items():  # new to us: submitted by a predecessor on this state
            if jid not in self.pilots:
                self.pilots[jid] = Pilot(jid, p.node, p.state, seen=now)
                self._event("adopt", jid, f"{p.state} on {p.node or '?'}")
        for jid in list(self.pilots):
            if jid not in listed:
                gone = self.pilots.pop(jid)
                why = f"left Slurm's queue ({gone.state}: ended, preempted or past its time limit)"
                window_end = gone.leave_by is not None and self.wall() >= gone.leave_by - self.cfg.poll_s
                if window_end:
                    why = (f"left at the end of its idle window (by {_clock_time(gone.leave_by)}"
                           f"{', before ' + gone.claim if gone.claim else ''})")
                self._event("gone", jid, gone.ended or why, node=gone.node, cancelled=bool(gone.ended),
                            window_end=window_end and not gone.ended)
        workers = self.view.workers()
        for p in self.pilots.values():
            q = listed[p.job_id]
            p.state, p.node = q.state, q.node or p.node
            if q.state == "RUNNING" and p.running_since is None:
                p.running_since = now
                if p.deadline is not None:
                    p.leave_by = min(p.deadline, self.wall() + p.run_s)
                self._event("running", p.job_id, f"on {q.node}")
            self._check(p, now, workers)
        live_slots = sum(slots for alive, slots, _ in workers.values() if alive)
        # A pilot not serving yet counts as on its way, a cancelled one too until it has left Slurm's queue; one
        # whose worker left at the end of its idle window is neither (its replacement is claimed at once).
        wall = self.wall()
        pending = sum(1 for p in self.pilots.values() if not self._window_over(p, workers, wall) and (
            p.ended or p.running_since is None or not workers.get(p.worker, (False, 0, 0))[0]))
        running = sum(1 for p in self.pilots.values() if not self._window_over(p, workers, wall)) - pending
        claimed = {p.node for p in self.pilots.values()}
        idle = [n for n in idle_nodes if n not in claimed]
        demand = self.view.demand_slots()
        new = pilots_wanted(demand, live_slots, pending, running, len(idle), self.cfg)
        if new and now < self.hold_until:
            new = 0  # backing off after pilots that never started or hung (see _cancel)
        for node in idle[:new]:
            self._submit(node, f"queue wants {demand} slots, live workers have {live_slots}, {pending} pilots coming",
                         fits.get(node))
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
        self._write_status(demand, live_slots, why_not | {n: unused + self._window_note(n) for n in idle_nodes},
                           workers)

    def _window_over(self, p: Pilot, workers: dict[str, tuple[bool, int, int]], wall: float) -> bool:
        """Its worker has left at the end of its idle window; Slurm lists the pilot until that process exits.
        (``leave_by`` is set at the poll that first saw it running: up to ``poll_s`` after its start.)"""
        w = workers.get(p.worker)
        p_slack = self.cfg.poll_s + 1.0
        return p.leave_by is not None and wall >= p.leave_by - p_slack and w is not None and not w[0]

    def _fit_windows(self, nodes: list[str], why_not: dict[str, str]) -> tuple[list[str], dict[str, float]]:
        """fit-idle-window: of the idle (and backfill-planned) nodes, those whose idle window is at least
        ``min_window_s``, longest window first (a pilot there serves longest), with each one's usable window (the
        window less ``window_margin_s``, at most ``time_limit_s``); why each other one is not used goes into
        ``why_not``."""
        c = self.cfg
        try:
            w = read_windows(self.wall(), lambda j: j.name == self.name, self.run)
        except ValueError as e:  # Slurm printed something this reader does not know: no guessing at windows
            raise commands.SlurmError(f"could not read the idle windows: {e}") from None
        self.windows = w
        if w.unplaced != self._unplaced_said:  # said once per change, and in every status file
            self._unplaced_said = w.unplaced
            if w.unplaced:
                log.warning("pilots: pending jobs %s have an expected start but no scheduled nodes: their claims "
                            "on nodes are not known and not counted in the idle windows", ",".join(w.unplaced))
        fits = {}
        for n in nodes:
            window = w.seconds(n, c.time_limit_s + c.window_margin_s)
            if n in self._planned and n not in w.claims:  # held for a job whose start squeue does not give
                why_not[n] = "planned by backfill for a pending job whose start Slurm does not give: window unknown"
            elif window < c.min_window_s:
                why_not[n] = f"idle window too short ({window:.0f} s{self._window_note(n, bare=True)}; " \
                             f"min_window_s {c.min_window_s})"
            else:
                fits[n] = min(window - c.window_margin_s, float(c.time_limit_s))
        return sorted(fits, key=lambda n: -fits[n]), fits

    def _window_note(self, node: str, bare: bool = False) -> str:
        """' until reservation X at 06:29:05' (bare) or '; idle window 540 s until ...' for a node's status line."""
        w = self.windows
        if w is None or self.cfg.time_limit != FIT:
            return ""
        claim = w.claims.get(node)
        if claim is None:
            return "" if bare else "; idle window unbounded (no reservation or planned job)"
        until = f": {claim.what}" if claim.at <= w.now else f" until {claim.what} at {_clock_time(claim.at)}"
        if bare:
            return until
        return f"; idle window {w.seconds(node, self.cfg.time_limit_s + self.cfg.window_margin_s):.0f} s{until}"

    def _write_status(self, demand: int, live: int, nodes: dict[str, str],
                      workers: dict[str, tuple[bool, int, int]]) -> None:
        """``work_dir/status-TAG.json``, rewritten every step: each pilot, each node of the partition with what it
        does for the controller or why it is not used, and the last events (what an operator asks first)."""
        for p in self.pilots.values():
            w = workers.get(p.worker)
            serving = "worker alive" if w and w[0] else "worker gone" if w else "no worker yet"
            leaves = f"; leaves by {_clock_time(p.leave_by)}{', before ' + p.claim if p.claim else ''}" \
                if p.leave_by is not None else ""
            nodes[p.node] = (f"pilot {p.job_id} ({p.state.lower()}, {serving}{leaves}"
                             f"{'; ' + p.ended if p.ended else ''})")
        self.snapshot = PilotSnapshot(time.time(), {p.worker: (p.job_id, p.node, p.state)
                                                    for p in self.pilots.values()}, dict(sorted(nodes.items())))
        status = {"time": time.time(), "controller": self.controller, "pilot_job_name": self.name,
                  "demand_slots": demand, "live_slots": live,
                  "pilots": [{"job_id": p.job_id, "node": p.node, "state": p.state, "worker": p.worker,
                              "worker_alive": bool(workers.get(p.worker, (False,))[0]), "cancelled": p.ended,
                              "leave_by": p.leave_by}
                             for p in self.pilots.values()],
                  "nodes": dict(sorted(nodes.items())),
                  "events": [{"time": e.time, "kind": e.kind, "job_id": e.job_id, "detail": e.detail}
                             for e in self.events[-50:]]}
        if self.cfg.time_limit == FIT and self.windows is not None:
            w = self.windows
            status["idle_windows"] = {"time": w.now, "claims": {n: {"at": c.at, "what": c.what}
                                                                for n, c in sorted(w.claims.items())},
                                      "pending_jobs_without_nodes": list(w.unplaced)}
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
        if p.running_since is None and p.deadline is not None and self.wall() >= p.deadline:
            self._cancel(p, f"never started within its idle window (it was to leave by {_clock_time(p.deadline)})")
        elif p.running_since is None and now - p.seen > self.cfg.start_timeout_s:
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
    def _submit(self, node: str, why: str, usable_s: float | None = None) -> None:
        """One pilot on ``node``. fit-idle-window (``usable_s``: the node's window less the margin): its time
        limit is that window in whole minutes, rounded down (Slurm rounds seconds up to a minute, which would
        overlap the claim, and then would not start the pilot before the claim has passed)."""
        script = self.cfg.work_dir / f"pilot-{self.tag}.sh"
        tmp = script.with_name(script.name + f".{os.getpid()}.tmp")
        tmp.write_text(pilot_script(self.cfg, self.controller, self.token_file, self.tag))
        os.replace(tmp, script)
        c = self.cfg
        minutes = max(1, math.ceil(c.time_limit_s / 60)) if usable_s is None else int(usable_s // 60)
        argv = ["sbatch", "--parsable", "--job-name", self.name, "--nodes", "1", "--nodelist", node,
                "--time", f"{minutes}", "--output", str(c.work_dir / "pilot-%j.log"), "--chdir", str(c.work_dir)]
        if usable_s is None:
            # fit-idle-window leaves by the script's own deadline instead: Slurm sends --signal from a timer, and
            # on the loopback cluster B:TERM@25 on a 1-minute pilot came 36 s before its limit (11 s early)
            argv.insert(-4, f"--signal=B:{c.signal}@{c.leave_before_s}")
        for flag, value in (("--partition", c.partition), ("--qos", c.qos), ("--account", c.account)):
            if value:
                argv += [flag, value]
        args: list[str] = []
        leave_by, claim = None, ""
        deadline, run_s = None, 0
        if usable_s is not None:
            now = self.wall()
            deadline, run_s = now + usable_s - c.leave_before_s, minutes * 60 - c.leave_before_s
            leave_by = min(deadline, now + run_s)  # if it starts at once; set again when it does
            args = [str(int(deadline)), str(run_s)]
            cl = self.windows.claims.get(node) if self.windows is not None else None
            claim = f"{cl.what} at {_clock_time(cl.at)}" if cl else ""
            window = f"{usable_s + c.window_margin_s:.0f} s until {claim}" if claim else \
                f"unbounded (time_limit_s {c.time_limit_s})"
            why += f"; idle window {window}: --time {minutes} min, leaves by {_clock_time(leave_by)}"
        jid = self.run([*argv, *c.sbatch_args, str(script), *args]).strip().split(";")[0]
        self.pilots[jid] = Pilot(jid, node, seen=self.clock(), leave_by=leave_by, deadline=deadline, run_s=run_s,
                                 claim=claim)
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
        idle = [n for n in pool if states[n].harvestable]
        if self.cfg.time_limit == FIT:
            # Idle nodes backfill holds for a pending job serve until that job's expected start (its window).
            held = {n for j in jobs for n in j.nodes}
            self._planned = {n for n, st in states.items() if _planned(st) and n not in held}
            idle = [n for n in states if n in idle or n in self._planned]
        return idle, why | {n: states[n].raw for n in pool if not states[n].harvestable}

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

    def _event(self, kind: str, job_id: str, detail: str, node: str | None = None, cancelled: bool = False,
               window_end: bool = False) -> None:
        """Log, keep (the last 1000) and record in the controller's store: a ``pilot`` event with the Slurm job,
        its node, its worker and, for ``gone``, whether this controller had cancelled it and whether it left by
        itself at the end of its idle window (``fit-idle-window``); else Slurm ended it: preempted, its time
        limit, an operator's scancel."""
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
                detail_d["window_end"] = window_end
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


def _planned(st: NodeState) -> bool:
    """Idle, held by backfill for a pending job (``planned``, or ``idle-`` in the suffix notation), and nothing
    else wrong with it."""
    return not st.flags and (st.base == "planned" and not st.suffix or st.base == "idle" and st.suffix == "-")


def _clock_time(t: float) -> str:
    """Local HH:MM:SS, as Slurm prints its times on this machine."""
    return time.strftime("%H:%M:%S", time.localtime(t))


def reachable(address: str) -> str:
    """The address pilots dial: the controller's bound one, with a wildcard host (0.0.0.0, ::) replaced by this
    machine's name (a pilot on another node cannot dial 0.0.0.0)."""
    host, _, port = address.rpartition(":")
    return f"{socket.getfqdn()}:{port}" if host.strip("[]") in ("0.0.0.0", "::", "") else address
