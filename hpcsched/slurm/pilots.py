"""Node source ``slurm``: the controller harvests a supercomputer's idle nodes with pilot jobs.

A pilot is one Slurm job on one node whose only process is ``hpcsched worker --controller ...``: once it runs,
the node is a worker like any other and the controller's decision core plans over it; when Slurm takes the node
back (preemption in a scavenger partition, the time limit, a cancel) the worker gets SIGTERM, checkpoints and
stops its tasks within its grace and leaves (the controller re-plans at once, ``Controller.leave``).

``PilotManager`` is the ``slurm`` entry of the node-source registry (``hpcsched.runtime.node_source``: the
contract). It runs beside the controller (a thread, started and stopped with its server) and every ``poll_s``:

1. reads Slurm with one ``sinfo`` and one ``squeue`` (``pilot_read``: the plain-idle nodes of the pilots'
   partition that no job holds, and its own pilots by job name, so a restarted controller adopts the pilots of
   its predecessor on the same state file);
2. ends pilots that will not serve: pending longer than ``start_timeout_s`` (never started), running without
   their worker registering within ``register_timeout_s`` (hung), or whose worker went silent (died);
3. decides how many nodes to claim (``pilots_wanted``: the slots the queue could use beyond the live workers,
   bounded by the idle nodes and ``max_pilots``) and submits them with one ``sbatch`` (a job array of one-node
   pilots; Slurm places them on idle nodes of the partition), leaving ``leave_before_s`` before their time limit
   (``--signal=B:TERM@...``). With ``time_limit: fit-idle-window`` a site without a scavenger partition is served
   too: each idle node's window until Slurm next needs it (a reservation, a pending job backfill planned there:
   ``hpcsched.slurm.idle_windows``) sets its pilot's time limit, so each such pilot is its own ``sbatch`` pinned
   to its node (``--nodelist``; an array shares one time limit), nodes with a window below ``min_window_s`` get
   none, and the pilot's worker leaves at its own deadline before the window ends;
4. releases a pilot whose worker has had nothing to run for ``idle_release_s`` while the queue needs no more;
5. cancels what it ended this poll with one ``scancel`` of all their ids, and rewrites its status file only
   when what it says has changed.

Nothing outlives the controller's wish: ``stop()`` cancels every pilot (Slurm sends SIGTERM; the workers
checkpoint and leave), and each pilot has a time limit. A controller killed with ``kill -9`` leaves its pilots
running until it comes back (a controller restarted on the same state and address adopts them) or until
``orphan_timeout_s`` without it has passed (their workers checkpoint and leave) or their time limit. Every
decision is logged with its reason and kept in ``events``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Container
from pathlib import Path
from typing import Any

from hpcsched.runtime.node_source import ControllerView, SourceView
from hpcsched.slurm import commands
from hpcsched.slurm.pilot_config import FIT, PilotConfig, pilot_script, pilots_wanted
from hpcsched.slurm.pilot_read import SQUEUE_FORMAT, SlurmRead, parse_jobs, parse_read, read_raw
from hpcsched.slurm.pilot_records import Pilot, PilotEvent, node_use
from hpcsched.slurm.pilot_windows import WindowFit, clock_time
from hpcsched.slurm.source import derive_pool

log = logging.getLogger("hpcsched.slurm.pilots")

VACATED_HOLD_POLLS, VACATED_HOLD_S = 5, 5.0  # a node a pilot was preempted from is left to the preemptor (_vacated)


class PilotManager:
    """Claims idle Slurm nodes for the controller with pilot jobs (module docstring); the ``slurm`` node source.
    ``view`` may also have ``record(detail)`` (a pilot event into the controller's store, which ``hpcsched calc``
    reads) and ``pilot_history()`` (worker -> (Slurm job, node) a predecessor on the same state recorded)."""

    name = "slurm"

    def __init__(self, cfg: PilotConfig, view: ControllerView, controller: str, token: str | None, state: Path,
                 clock: Callable[[], float] = time.monotonic,
                 run: Callable[[list[str]], str] = lambda argv: commands.run(argv),
                 wall: Callable[[], float] = time.time) -> None:
        self.cfg, self.demand_view, self.controller, self.clock, self.run = cfg, view, controller, clock, run
        self.wall = wall  # unix time: idle windows end at Slurm's clock times
        # One tag per state file: a restarted controller (same state) knows its predecessor's pilots by name.
        self.tag = hashlib.sha256(str(Path(state).resolve()).encode()).hexdigest()[:8]
        self.job_name = f"hpcsched-pilot-{self.tag}"
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
        # What listings show (node_source.SourceView): replaced whole at the end of each step (read from RPC threads).
        self._view = SourceView(self.name)
        self.fit = WindowFit(cfg, self.job_name)  # fit-idle-window: each idle node's window (last poll)
        # node -> until when (monotonic) it is not claimed: a node a pilot was just preempted from shows idle until
        # Slurm starts the job that preempted it there; a pilot submitted then only waits behind that job
        self._vacated: dict[str, float] = {}
        self._cancels: list[str] = []  # ids ended this poll: one scancel for all of them at its end
        self._status_said = ""  # the status file's content (less its time) as last written
        self._read: SlurmRead | None = None
        self._quiet: tuple[Any, ...] | None = None  # a settled poll's inputs: the next one with the same skips
        self.quiet_polls = 0  # polls skipped so (counted: nothing the manager did not do goes unsaid)

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
            ids = list(self._listed())
            if ids:
                self.run(["scancel", *ids])
                for jid in ids:
                    self._event("cancel", jid, "controller stopping")
            deadline = time.monotonic() + wait_s
            while self._listed() and time.monotonic() < deadline:
                time.sleep(0.5)
            left = list(self._listed())
            if left:
                log.error("pilots: %s still listed %.0f s after scancel", ",".join(left), wait_s)
            for jid in ids:
                if jid not in left:
                    p = self.pilots.pop(jid, None)
                    self._event("gone", jid, "cancelled: controller stopping", node=p.node if p else "",
                                cancelled=True)
        except commands.SlurmError as e:
            log.error("pilots: could not cancel the pilots at stop: %s", e)
        self._view = SourceView(self.name, time.time(), self._view.nodes, self._workers_view())

    def view(self) -> SourceView:
        return self._view

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
        raw = read_raw(self.run, self.cfg.partition)
        workers = self.demand_view.workers()
        demand = self.demand_view.demand_slots()
        # A poll that finds everything as the last one left it, with nothing waiting on a timer, has nothing to
        # decide: at 10,000 nodes parsing and re-deriving everything is the manager's whole cost (bench_slurm.py).
        quiet = (raw, workers, demand)
        if self._quiet is not None and self._quiet == quiet:
            self.quiet_polls += 1
            return
        self._quiet = None
        self._read = read = parse_read(raw, self.job_name)
        idle_nodes, why_not = self._idle_nodes(read)
        fits: dict[str, float] = {}  # fit-idle-window: node -> its usable window (s), longest first
        if self.cfg.time_limit == FIT:
            idle_nodes, fits = self.fit.fit(idle_nodes, why_not, self.wall(), read, self.run)
        listed = read.pilots
        for jid, (state, node) in listed.items():  # new to us: submitted by a predecessor on this state
            if jid not in self.pilots:
                self.pilots[jid] = Pilot(jid, node, state, seen=now)
                self._event("adopt", jid, f"{state} on {node or '?'}")
        for jid in list(self.pilots):
            if jid not in listed:
                gone = self.pilots.pop(jid)
                why = f"left Slurm's queue ({gone.state}: ended, preempted or past its time limit)"
                window_end = gone.leave_by is not None and self.wall() >= gone.leave_by - self.cfg.poll_s
                if window_end:
                    why = (f"left at the end of its idle window (by {clock_time(gone.leave_by)}"
                           f"{', before ' + gone.claim if gone.claim else ''})")
                release = self._release_s(jid)
                if release is not None and not gone.ended:
                    why += f"; it left {release:.2f} s after Slurm signalled it"
                self._event("gone", jid, gone.ended or why, node=gone.node, cancelled=bool(gone.ended),
                            window_end=window_end and not gone.ended, release_s=release)
                if not gone.ended and gone.node:
                    self._vacated[gone.node] = now + max(VACATED_HOLD_S, VACATED_HOLD_POLLS * self.cfg.poll_s)
        for p in self.pilots.values():
            state, node = listed[p.job_id]
            p.state, p.node = state, node or p.node
            if state == "RUNNING" and p.running_since is None:
                p.running_since = now
                if p.deadline is not None:
                    p.leave_by = min(p.deadline, self.wall() + p.run_s)
                self._event("running", p.job_id, f"on {node}")
            self._check(p, now, workers)
        live_slots = sum(slots for alive, slots, _ in workers.values() if alive)
        # A pilot not serving yet counts as on its way, a cancelled one too until it has left Slurm's queue; one
        # whose worker left at the end of its idle window is neither (its replacement is claimed at once).
        wall = self.wall()
        pending = sum(1 for p in self.pilots.values() if not self._window_over(p, workers, wall) and (
            p.ended or p.running_since is None or not workers.get(p.worker, (False, 0, 0))[0]))
        running = sum(1 for p in self.pilots.values() if not self._window_over(p, workers, wall)) - pending
        claimed = {p.node for p in self.pilots.values()}
        self._vacated = {n: t for n, t in self._vacated.items() if t > now}
        why_not |= {n: "idle a moment: Slurm just ended its pilot (preempted), left to the job that wants it"
                    for n in self._vacated if n in idle_nodes}
        idle_nodes = [n for n in idle_nodes if n not in self._vacated]
        idle = [n for n in idle_nodes if n not in claimed]
        # array elements not placed yet will take some of these idle nodes
        unplaced = sum(1 for p in self.pilots.values() if not p.node and not p.ended)
        new = pilots_wanted(demand, live_slots, pending, running, max(0, len(idle) - unplaced), self.cfg)
        if new and now < self.hold_until:
            new = 0  # backing off after pilots that never started or hung (see _cancel)
        why = f"queue wants {demand} slots, live workers have {live_slots}, {pending} pilots coming"
        if new and self.cfg.time_limit == FIT:
            for node in idle[:new]:
                self._submit_on(node, why, fits[node])
        elif new:
            self._submit_array(new, why)
        self._release_idle(now, workers, demand, live_slots)
        self._flush_cancels()
        if demand <= live_slots + pending * self.cfg.slots:
            unused = f"idle, not needed: the queue wants {demand} slots, live workers have {live_slots}" + (
                f", {pending} pilots coming" if pending else "")
        elif now < self.hold_until:
            unused = f"idle, not claimed: backing off for {self.hold_until - now:.0f} s after pilots that never served"
        elif len(self.pilots) >= self.cfg.max_pilots:
            unused = f"idle, not claimed: max_pilots ({self.cfg.max_pilots}) reached"
        else:
            unused = "idle, to be claimed"
        self._write_status(demand, live_slots, why_not | {n: unused + self.fit.note(n) for n in idle_nodes},
                           workers)
        if self._settled(new, now, workers):
            self._quiet = quiet

    def _settled(self, submitted: int, now: float, workers: dict[str, tuple[bool, int, int]]) -> bool:
        """Whether the next poll may skip its decisions if Slurm, the workers and the demand are unchanged: nothing
        submitted or cancelled now, no back-off running out, and every pilot running with a live, busy worker (a
        pending, hung, idle or orphaned pilot is ended by a timer). Never with fit-idle-window (its windows end by
        the clock)."""
        if submitted or now < self.hold_until or self._vacated or self.cfg.time_limit == FIT:
            return False
        for p in self.pilots.values():
            w = workers.get(p.worker)
            if p.ended or p.state != "RUNNING" or w is None or not w[0] or w[2] == 0:
                return False
        return True

    def _window_over(self, p: Pilot, workers: dict[str, tuple[bool, int, int]], wall: float) -> bool:
        """Its worker has left at the end of its idle window; Slurm lists the pilot until that process exits.
        (``leave_by`` is set at the poll that first saw it running: up to ``poll_s`` after its start.)"""
        w = workers.get(p.worker)
        p_slack = self.cfg.poll_s + 1.0
        return p.leave_by is not None and wall >= p.leave_by - p_slack and w is not None and not w[0]

    def _write_status(self, demand: int, live: int, nodes: dict[str, str],
                      workers: dict[str, tuple[bool, int, int]]) -> None:
        """``work_dir/status-TAG.json``: each pilot, each node of the partition with what it does for the
        controller or why it is not used, and the last events (what an operator asks first). Rewritten only when
        any of that changed (its ``time`` says when it last did): at 10,000 nodes a rewrite at every poll would
        be the manager's largest cost. The listings' view is replaced at every poll."""
        nodes |= {p.node: node_use(p, workers) for p in self.pilots.values() if p.node}
        nodes = dict(sorted(nodes.items()))
        jobs_on = {p.node: p.job_id for p in self.pilots.values() if p.node}
        self._view = SourceView(self.name, time.time(), {n: (use, jobs_on.get(n, "")) for n, use in nodes.items()},
                                self._workers_view())
        status = {"controller": self.controller, "pilot_job_name": self.job_name,
                  "demand_slots": demand, "live_slots": live,
                  "pilots": [{"job_id": p.job_id, "node": p.node, "state": p.state, "worker": p.worker,
                              "worker_alive": bool(workers.get(p.worker, (False,))[0]), "cancelled": p.ended,
                              "leave_by": p.leave_by}
                             for p in self.pilots.values()],
                  "nodes": nodes,
                  "events": [{"time": e.time, "kind": e.kind, "job_id": e.job_id, "detail": e.detail}
                             for e in self.events[-50:]]}
        if self.cfg.time_limit == FIT and self.fit.windows is not None:
            w = self.fit.windows
            status["idle_windows"] = {"claims": {n: {"at": c.at, "what": c.what}
                                                 for n, c in sorted(w.claims.items())},
                                      "pending_jobs_without_nodes": list(w.unplaced)}
        said = json.dumps(status, sort_keys=True)
        if said == self._status_said:
            return
        self._status_said = said
        if "idle_windows" in status and self.fit.windows is not None:  # when the windows were read (not compared)
            status["idle_windows"] = {"time": self.fit.windows.now} | status["idle_windows"]
        path = self.status_path
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"time": time.time()} | status, indent=1) + "\n")
        os.replace(tmp, path)

    def _workers_view(self) -> dict[str, tuple[str, str, str]]:
        """worker -> (Slurm job, node, state): the pilots now, and those gone (``GONE``) that this controller or a
        predecessor on its state had."""
        out = {w: (jid, node, "GONE") for w, (jid, node) in list(self.known.items())}
        return out | {p.worker: (p.job_id, p.node, p.state) for p in list(self.pilots.values())}

    @property
    def status_path(self) -> Path:
        return self.cfg.work_dir / f"status-{self.tag}.json"

    def _check(self, p: Pilot, now: float, workers: dict[str, tuple[bool, int, int]]) -> None:
        """End a pilot that will not serve (never started, hung, its worker died)."""
        if p.ended:
            return
        w = workers.get(p.worker)
        if p.running_since is None and p.deadline is not None and self.wall() >= p.deadline:
            self._cancel(p, f"never started within its idle window (it was to leave by {clock_time(p.deadline)})")
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
    def _script(self) -> Path:
        script = self.cfg.work_dir / f"pilot-{self.tag}.sh"
        tmp = script.with_name(script.name + f".{os.getpid()}.tmp")
        tmp.write_text(pilot_script(self.cfg, self.controller, self.token_file, self.tag))
        os.replace(tmp, script)
        return script

    def _sbatch_argv(self, minutes: int, output: str) -> list[str]:
        c = self.cfg
        argv = ["sbatch", "--parsable", "--job-name", self.job_name, "--nodes", "1", "--time", f"{minutes}",
                "--output", str(c.work_dir / output), "--chdir", str(c.work_dir)]
        for flag, value in (("--partition", c.partition), ("--qos", c.qos), ("--account", c.account)):
            if value:
                argv += [flag, value]
        return argv

    def _submit_array(self, count: int, why: str) -> None:
        """``count`` pilots with one ``sbatch``: a job array of one-node pilots, placed by Slurm on idle nodes
        of the partition (``--signal``: their workers leave ``leave_before_s`` before the time limit)."""
        c = self.cfg
        argv = self._sbatch_argv(max(1, math.ceil(c.time_limit_s / 60)), "pilot-%A_%a.log")
        argv += [f"--array=0-{count - 1}", f"--signal=B:{c.signal}@{c.leave_before_s}"]
        array = self.run([*argv, *c.sbatch_args, str(self._script())]).strip().split(";")[0]
        for i in range(count):
            jid = f"{array}_{i}"
            self.pilots[jid] = Pilot(jid, "", seen=self.clock())
            self._event("submit", jid, f"element {i + 1} of {count} of array {array}: {why}")

    def _submit_on(self, node: str, why: str, usable_s: float) -> None:
        """fit-idle-window: one pilot pinned to ``node`` (``usable_s``: its window less the margin). Its time
        limit is that window in whole minutes, rounded down (Slurm rounds seconds up to a minute, which would
        overlap the claim, and then would not start the pilot before the claim has passed). It leaves by the
        script's own deadline, not by --signal: Slurm sends that from a timer, and on the loopback cluster B:TERM@25
        on a 1-minute pilot came 36 s before its limit (11 s early)."""
        c = self.cfg
        minutes = int(usable_s // 60)
        argv = self._sbatch_argv(minutes, "pilot-%j.log") + ["--nodelist", node]
        now = self.wall()
        deadline, run_s = now + usable_s - c.leave_before_s, minutes * 60 - c.leave_before_s
        leave_by = min(deadline, now + run_s)  # if it starts at once; set again when it does
        cl = self.fit.windows.claims.get(node) if self.fit.windows is not None else None
        claim = f"{cl.what} at {clock_time(cl.at)}" if cl else ""
        window = f"{usable_s + c.window_margin_s:.0f} s until {claim}" if claim else \
            f"unbounded (time_limit_s {c.time_limit_s})"
        why += f"; idle window {window}: --time {minutes} min, leaves by {clock_time(leave_by)}"
        jid = self.run([*argv, *c.sbatch_args, str(self._script()), str(int(deadline)), str(run_s)]
                       ).strip().split(";")[0]
        self.pilots[jid] = Pilot(jid, node, seen=self.clock(), leave_by=leave_by, deadline=deadline, run_s=run_s,
                                 claim=claim)
        self._event("submit", jid, f"on {node}: {why}")

    def _cancel(self, p: Pilot, why: str, failed: bool = True) -> None:
        """End a pilot (cancelled with the others of this poll at its end: ``_flush_cancels``). One that never
        served (never started, or its worker never registered) holds new submissions back for start_timeout_s,
        doubling with each such failure in a row up to 10 minutes: a partition that never starts pilots, or a node
        set-up where the worker cannot start, is not flooded with new ones. A pilot that served and then lost its
        worker is replaced at once."""
        self._cancels.append(p.job_id)
        p.ended = why
        if failed:
            self.failures += 1
            backoff = min(self.cfg.start_timeout_s * 2 ** (self.failures - 1), 600.0)
            self.hold_until = self.clock() + backoff
            why += f"; no new pilot for {backoff:.0f} s"
        self._event("cancel", p.job_id, why)

    def _flush_cancels(self) -> None:
        """One ``scancel`` for every pilot ended this poll. A job that left Slurm meanwhile makes scancel exit
        non-zero ('Invalid job id') after cancelling the others: that is not a failure. Any other error keeps the
        ids for the next poll's call."""
        if not self._cancels:
            return
        ids, self._cancels = self._cancels, []
        try:
            self.run(["scancel", *ids])
        except commands.SlurmError as e:
            if "invalid job id" not in str(e).lower():
                self._cancels = ids + self._cancels
                raise
            log.info("pilots: scancel: some pilots had already left Slurm: %s", e)

    def _idle_nodes(self, read: SlurmRead) -> tuple[list[str], dict[str, str]]:
        """Plain-idle nodes no job holds, in Slurm's order, within the pilots' partition when one is set (the
        harvester's state table and pool rule: ``hpcsched.slurm.nodes``, ``source.derive_pool``), and why each
        other node is not."""
        states = read.states
        pool, why = derive_pool(states, read.holding, lambda j: False)
        idle = [n for n in pool if states[n].harvestable]
        if self.cfg.time_limit == FIT:
            idle = self.fit.with_planned(idle, read)
        return idle, why | {n: states[n].raw for n in pool if not states[n].harvestable}

    def _listed(self) -> dict[str, tuple[str, str]]:
        """Our pilots Slurm lists now: id -> (state, node) (for ``stop``; a poll reads them with everything)."""
        out = self.run(["squeue", "-h", "-r", "--name", self.job_name, "-o", SQUEUE_FORMAT])
        try:
            return parse_jobs(out, self.job_name)[1]
        except ValueError as e:
            raise commands.SlurmError(str(e)) from None

    def _release_s(self, job_id: str) -> float | None:
        """How long a gone pilot held its node after Slurm signalled its steps (a preemption, a cancel): the
        ``preempted`` and ``released`` times its script wrote (pilot_config._SENTINEL); None when it was not
        signalled so or the files are unreadable (a pilot killed outright writes no ``released``)."""
        d = self.cfg.work_dir / job_id
        try:
            return max(0.0, float((d / "released").read_text()) - float((d / "preempted").read_text()))
        except (OSError, ValueError):
            return None

    def log_path(self, job_id: str) -> Path:
        return self.cfg.work_dir / f"pilot-{job_id}.log"

    def _event(self, kind: str, job_id: str, detail: str, node: str | None = None, cancelled: bool = False,
               window_end: bool = False, release_s: float | None = None) -> None:
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
        record = getattr(self.demand_view, "record", None)
        if record is not None:
            detail_d: dict[str, Any] = {"event": kind, "slurm_job": job_id, "node": node, "worker": worker,
                                        "state": p.state if p else "", "detail": detail}
            if kind == "gone":
                detail_d["cancelled"] = cancelled
                detail_d["window_end"] = window_end
                if release_s is not None:
                    detail_d["release_s"] = release_s
            try:
                record(detail_d)
            except Exception:  # the store busy or closing: the status file and the log still have it
                log.exception("pilots: could not record %s of pilot %s in the store", kind, job_id)
