"""Harvest mode ``controller``: a harvest config run by the runtime's controller on pilot workers (one launch path).

Why: the harvester's own executors (modes scavenger and local) plan with their own loop and start training
themselves; the runtime's controller with ``node_source: slurm`` already claims idle nodes with pilot jobs running
``hpcsched worker``, plans every job with the shared decision core (MILP sizing for jobs with a scaling curve) and
launches through the workers. In this mode ``hpcsched slurm harvest`` is only a front end to that controller:

1. it starts the controller in this process (``ControllerServer``: port 0 on loopback, a state in ``OUT/run``,
   fresh random user and worker tokens, pilots in the config's partition with its QOS / account / time limit,
   at most one pilot per node of the partition, one slot each);
2. submits each configured job as an elastic runtime job: launcher ``direct`` (one process per pilot), between
   ``jmin`` and ``jmax`` processes, ``steps``, the job's scaling curve (the harvester's default, linear, when it
   names none) with ``resize_s`` its larger scale cost; ``{python}`` becomes this interpreter, ``{ckpt_dir}`` and
   ``{steps}`` the runtime's ``$HPCSCHED_CHECKPOINT_DIR`` / ``$HPCSCHED_STEPS`` (the command runs under ``sh -c``
   only when it names them). Each submit carries the request id ``harvest:ID``, so a second run on the same
   ``--out`` resumes the same jobs (from their checkpoints) instead of submitting them again;
3. waits for them, polling the harvestable pool itself (the harvester's ``SlurmIdleSource``: its join / leave
   events and its size integrated over time, which ``capacity_node_seconds`` has always been);
4. stops the controller (it cancels its pilots: their workers checkpoint their tasks and leave) and writes
   ``events.csv``, ``jobs.csv`` and ``meta.json`` in the harvest schema from the controller's store (``to_results``).
"""

from __future__ import annotations

import csv
import logging
import secrets
import shlex
import string
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpcsched.errors import InputError
from hpcsched.slurm import commands
from hpcsched.slurm.config import HarvestFile
from hpcsched.slurm.record import EVENT_COLUMNS
from hpcsched.slurm.source import SlurmIdleSource
from hpcsched.slurm.spec import ElasticSpec

log = logging.getLogger("hpcsched.slurm.controller_mode")

REQUEST_PREFIX = "harvest:"
# The runtime's variables that the harvester's placeholders stand for (spec.ElasticSpec.argv's).
PLACEHOLDER_ENV = {"ckpt_dir": "HPCSCHED_CHECKPOINT_DIR", "steps": "HPCSCHED_STEPS"}
FINAL = ("completed", "failed", "cancelled")


def runtime_command(spec: ElasticSpec, python: str = sys.executable) -> list[str]:
    """The job's command for the runtime: ``{python}`` replaced now; ``{ckpt_dir}`` / ``{steps}`` are only known
    to the task (the runtime picks the checkpoint directory per job), so a command naming them runs as
    ``sh -c 'exec ...'`` with those words double-quoted variables, the rest quoted as written."""
    uses_env = False
    words = []
    for arg in spec.command:
        parts = []
        for literal, name, fmt, conv in string.Formatter().parse(arg):
            if literal:
                parts.append(shlex.quote(literal))
            if name is None:
                continue
            if fmt or conv or name not in (*PLACEHOLDER_ENV, "python"):
                raise ValueError(f"job {spec.id}: unknown placeholder {{{name}}} in {arg!r} (known: {{python}}, "
                                 "{ckpt_dir}, {steps})")
            if name == "python":
                parts.append(shlex.quote(python))
            else:
                uses_env = True
                parts.append(f'"${{{PLACEHOLDER_ENV[name]}}}"')
        words.append("".join(parts) or "''")
    if not uses_env:
        return [a.format(python=python) for a in spec.command]
    return ["/bin/sh", "-c", "exec " + " ".join(words)]


def job_yaml(spec: ElasticSpec, workdir: Path, python: str = sys.executable) -> str:
    """One harvest job as a runtime job file (``runtime.jobfile.parse_job_spec`` checks it again on submit)."""
    job = spec.job
    doc: dict[str, Any] = {
        "name": spec.id, "launcher": "direct", "procs": job.jmax, "min_procs": job.jmin, "max_procs": job.jmax,
        "steps": spec.steps, "workdir": str(workdir), "command": runtime_command(spec, python),
        # The harvester's allocator sized every job by its curve (linear by default): so does the controller's MILP.
        "scaling": {"procs": [int(n) for n in job.curve.nodes], "rates": [float(r) for r in job.curve.rates],
                    "resize_s": max(job.scale_up_s, job.scale_down_s)},
    }
    return yaml.safe_dump(doc, sort_keys=False, width=1 << 30)


def partition_nodes(partition: str) -> list[str]:
    """The nodes of the pilots' partition: at most one pilot each (the pool harvest may claim)."""
    out = commands.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N"])
    return sorted(set(out.split()))


def controller_config(hf: HarvestFile, out: Path, max_pilots: int):  # -> ControllerConfig (runtime import)
    """The controller a harvest config asks for: loopback, port 0, its own state and tokens, pilots in the
    config's partition (``HarvestFile.pilot``: QOS, account, time limit, ...), MILP look-ahead ``tfwd``."""
    from hpcsched.runtime.config import ControllerConfig
    from hpcsched.slurm.pilot_config import read_pilot_config

    pilot = {"work_dir": str(out.resolve() / "pilots")} | hf.pilot | {
        "partition": hf.partition, "max_pilots": max(1, max_pilots), "slots": 1}
    user, worker = secrets.token_hex(16), secrets.token_hex(16)
    return ControllerConfig(
        listen="127.0.0.1:0", address_file=out / "run" / "controller.addr", state=out / "run" / "state.db",
        checkpoint_root=(out / "checkpoints").resolve(), token=user, worker_token=worker,
        heartbeat_interval_s=0.5, schedule_interval_s=0.3, min_runtime_s=hf.min_runtime_s,
        milp_tfwd_s=hf.config.tfwd, pilots=read_pilot_config(pilot, str(hf.path), None, hf.path.parent))


@dataclass
class HarvestJobView:
    """One harvest job as the controller's store has it now."""

    id: str
    job_id: str
    state: str = "pending"
    procs: int = 0
    steps_done: int = 0
    steps: int = 0
    started: float | None = None  # unix time of its first start


@dataclass
class ControllerHarvest:
    """A harvest config run by an in-process controller (module docstring). ``start``, ``step`` until ``done``
    (or a deadline), ``stop``, ``write``."""

    hf: HarvestFile
    out: Path
    source: SlurmIdleSource = field(default_factory=SlurmIdleSource)
    server: Any = None  # hpcsched.runtime.server.ControllerServer once started
    jobs: dict[str, HarvestJobView] = field(default_factory=dict)
    duplicates: list[str] = field(default_factory=list)  # jobs an earlier run on this --out had submitted
    pool_events: list[tuple[float, str, str, int, str]] = field(default_factory=list)  # (unix t, kind, node, pool, why)
    capacity_node_seconds: float = 0.0
    t0: float = field(default_factory=time.time)
    nonoptimal_decisions: int = 0  # the controller's steps whose MILP sizing was not optimal (read at stop)
    nonoptimal_by_status: dict[str, int] = field(default_factory=dict)  # jobs by their last such sizing status
    _last: tuple[float, int] | None = None
    _log_handler: logging.Handler | None = None

    @property
    def done(self) -> bool:
        return bool(self.jobs) and all(j.state in FINAL for j in self.jobs.values())

    @property
    def finished(self) -> list[str]:
        return [j.id for j in self.jobs.values() if j.state == "completed"]

    def start(self) -> str:
        """Start the controller (its log: ``OUT/controller.log``) and submit the jobs; returns its address."""
        from hpcsched.runtime.server import ControllerServer

        self.out.mkdir(parents=True, exist_ok=True)
        self._log_handler = logging.FileHandler(self.out / "controller.log")
        self._log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger("hpcsched")
        root.addHandler(self._log_handler)
        root.setLevel(logging.INFO)
        root.propagate = False  # the terminal shows progress; the controller's lines go to its log
        nodes = partition_nodes(self.hf.partition)
        if not nodes:
            raise InputError(self.hf.path, f"partition: Slurm lists no node in partition {self.hf.partition!r}")
        self.server = ControllerServer(controller_config(self.hf, self.out, len(nodes)))
        address = self.server.start()
        workdir = Path.cwd()
        for spec in self.hf.specs:
            jid, dup = self.server.ctl.submit_once(job_yaml(spec, workdir), f"{self.hf.path}: job {spec.id}",
                                                   request_id=REQUEST_PREFIX + spec.id)
            if dup:
                self.duplicates.append(spec.id)
            self.jobs[spec.id] = HarvestJobView(spec.id, jid, steps=spec.steps)
        self.step()
        return address

    def step(self) -> None:
        """One poll: the pool (events, capacity) and every job's state from the controller's store."""
        now = time.time()
        ev = self.source.poll()
        pool = len(self.source.pool)
        if self._last is not None:
            self.capacity_node_seconds += self._last[1] * (now - self._last[0])
        self._last = (now, pool)
        if ev is not None:
            why = self.source.reasons
            self.pool_events += [(now, "leave", n, pool, why.get(n, "")) for n in ev.left]
            self.pool_events += [(now, "join", n, pool, why.get(n, "")) for n in ev.joined]
        ctl = self.server.ctl
        with ctl.lock:
            rows = {j.id: j for j in ctl.store.jobs(ids=[v.job_id for v in self.jobs.values()])}
        for v in self.jobs.values():
            r = rows.get(v.job_id)
            if r is not None:
                v.state, v.procs, v.steps_done, v.started = r.state, r.procs, r.steps_done, r.start_time

    def run(self, timeout_s: float, poll_s: float, on_step: Callable[[ControllerHarvest], None] | None = None) -> bool:
        """Poll until every job ended (True: all completed) or ``timeout_s``; the controller stops either way."""
        deadline = time.monotonic() + timeout_s
        try:
            while not self.done and time.monotonic() < deadline:
                t = time.monotonic()
                self.step()
                if on_step is not None:
                    on_step(self)
                time.sleep(max(0.0, poll_s - (time.monotonic() - t)))
        finally:
            self.stop()
        return len(self.finished) == len(self.jobs)

    def stop(self) -> None:
        """Stop the controller: it cancels every pilot (their workers checkpoint and stop their tasks) first."""
        if self.server is not None:
            ctl = self.server.ctl
            self.nonoptimal_decisions = ctl.nonoptimal_decisions
            self.nonoptimal_by_status = {}
            for how in dict(ctl.sizing).values():
                if how != "optimal":
                    self.nonoptimal_by_status[how] = self.nonoptimal_by_status.get(how, 0) + 1
            try:
                self.server.stop()
            finally:
                self.server = None
                if self._log_handler is not None:
                    root = logging.getLogger("hpcsched")
                    root.removeHandler(self._log_handler)
                    root.propagate = True
                    self._log_handler.close()
        if self._last is not None:  # the pool's integral up to the end of the run
            now = time.time()
            self.capacity_node_seconds += self._last[1] * (now - self._last[0])
            self._last = (now, self._last[1])

    def write(self, extra_meta: dict[str, Any] | None = None) -> Path:
        """events.csv, jobs.csv and meta.json from the controller's store (read-only, after ``stop``)."""
        from hpcsched.runtime.store import Store

        events: list[dict[str, Any]] = []
        progress: list[dict[str, Any]] = []
        if (self.out / "run" / "state.db").exists():  # else the controller never started: an empty run
            store = Store(self.out / "run" / "state.db", query_only=True)
            try:
                events, progress = store.events(), store.progress()
            finally:
                store.close()
        names = {v.job_id: v.id for v in self.jobs.values()}
        meta = {"capacity_node_seconds": self.capacity_node_seconds,
                "capacity_nodes": len(self.source.last.states) if self.source.last else 0,
                "nonoptimal_decisions": self.nonoptimal_decisions, "nonoptimal_by_status": self.nonoptimal_by_status,
                "resumed_jobs": self.duplicates, "state": str(self.out / "run" / "state.db"),
                "checkpoint_dirs": {v.id: str((self.out / "checkpoints" / v.job_id).resolve())
                                    for v in self.jobs.values()}, **(extra_meta or {})}
        return to_results(self.out, self.t0, names, events, progress, self.pool_events, meta)


def _generations(progress: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, int]]:
    """(job, generation) -> last step, last checkpoint step, resumed_from (-1 when not said) of that attempt."""
    out: dict[tuple[str, int], dict[str, int]] = {}
    for r in progress:
        g = out.setdefault((r["job_id"], int(r["generation"])), {"last": 0, "ckpt": -1, "resumed": -1})
        step = int(r["step"])
        g["last"] = max(g["last"], step)
        if r.get("checkpoint"):
            g["ckpt"] = max(g["ckpt"], step)
        if r.get("resumed_from") is not None:
            g["resumed"] = max(g["resumed"], int(r["resumed_from"]))
    return out


def to_results(out: Path, t0: float, names: dict[str, str], events: list[dict[str, Any]],
               progress: list[dict[str, Any]], pool_events: list[tuple[float, str, str, int, str]],
               meta: dict[str, Any]) -> Path:
    """A controller run in the harvest schema: ``events.csv`` (``record.EVENT_COLUMNS``; times in seconds from
    ``t0``), ``jobs.csv`` and ``meta.json`` (``results.write_results``). ``names``: controller job id -> harvest id.

    Events: pool ``join`` / ``leave`` (polled here), ``pilot-submit`` / ``pilot-running`` / ``pilot-cancel`` /
    ``pilot-gone`` / ``pilot-adopt`` (the pilot manager's), and per job ``start`` (an attempt: its pilots' nodes),
    ``running`` (its first report: ``ckpt_step`` the step it resumed from), ``vacate`` (stopped because its pilot
    was preempted or left), ``stop`` (because this controller cancelled its pilot: stopping, idle), ``resize``
    (stopped to be relaunched at another size), ``preempted`` / ``stopped`` (the attempt ended: ``step`` its last
    step, ``ckpt_step`` the step the next attempt resumed from, else its last checkpoint, ``lost_steps`` the
    difference), ``finish``, ``failed`` (a failed attempt, with the reason).
    ``lost_steps`` in meta: one entry per preemption, as in the harvester's modes."""
    from hpcsched.metrics.pilots import cancelled_pilot_workers, job_attempts, pilot_metrics
    from hpcsched.results import JobResult, write_results

    gens = _generations(progress)
    node_of: dict[str, str] = {}  # worker -> Slurm node of its pilot
    for e in events:
        if e["kind"] == "pilot" and e.get("worker") and e.get("node"):
            node_of[e["worker"]] = e["node"]
    rows: list[tuple[float, list[object]]] = []

    def row(t: float, event: str, job: str = "", nodes: tuple[str, ...] = (), pool: int | None = None,
            step: int | None = None, ckpt: int | None = None, lost: int | None = None, detail: str = "") -> None:
        rows.append((t, [f"{t - t0:.3f}", event, job, " ".join(nodes), "" if pool is None else pool,
                         "" if step is None else step, "" if ckpt is None else ckpt, "" if lost is None else lost,
                         detail]))

    for t, kind, node, pool, why in pool_events:
        row(t, kind, nodes=(node,), pool=pool, detail=why)
    stop_reason: dict[str, str] = {}
    cancelled = cancelled_pilot_workers(events)  # a stop for one of those was no preemption by Slurm
    gen_of: dict[str, int] = {}
    workers_of: dict[str, tuple[str, ...]] = {}
    preempt_lost: list[int] = []
    tallies: dict[str, dict[str, Any]] = {jid: {"preemptions": 0, "lost": [], "max_procs": 0} for jid in names}
    for e in sorted(events, key=lambda e: e["time"]):
        t, kind, jid = e["time"], e["kind"], e.get("job_id")
        if kind == "pilot":
            row(t, f"pilot-{e.get('event', '')}", nodes=(e["node"],) if e.get("node") else (),
                detail=f"Slurm job {e.get('slurm_job', '')}: {e.get('detail', '')}".rstrip(": "))
            continue
        if jid not in names:
            continue
        name, tally = names[jid], tallies[jid]
        nodes = workers_of.get(jid, ())
        if kind == "start":
            gen_of[jid] = int(e.get("generation", 0))
            workers = tuple(e.get("workers") or ())
            nodes = workers_of[jid] = tuple(node_of.get(w, w) for w in workers)
            tally["max_procs"] = max(tally["max_procs"], int(e.get("procs", len(workers))))
            row(t, "start", name, nodes, detail=f"attempt {gen_of[jid]}: {e.get('procs', len(workers))} procs on "
                                               f"{', '.join(workers)}")
        elif kind == "resume":
            row(t, "running", name, nodes, ckpt=int(e.get("resumed_from", 0)),
                detail=f"attempt {e.get('generation', '')}'s first report: from step {e.get('resumed_from', 0)}")
        elif kind == "stop":
            reason = str(e.get("reason", ""))
            stop_reason[jid] = reason
            left = str(e.get("worker_left", ""))
            if reason == "preempt" and left in cancelled:
                # its pilot was cancelled by this controller (stopping, idle, hung): no preemption by Slurm
                stop_reason[jid] = "pilot cancelled"
                row(t, "stop", name, (node_of.get(left, left),), detail=f"its pilot {left} was cancelled by the "
                                                                         "controller")
            elif reason == "preempt":
                row(t, "vacate", name, (node_of.get(left, left),) if left else nodes,
                    detail=f"its pilot {left} was preempted or left" if left else "preempted")
            elif reason == "resize":
                row(t, "resize", name, nodes, detail=f"{len(nodes)} -> {e.get('new_procs', '?')} procs")
            else:
                row(t, "stop", name, nodes, detail=reason)
        elif kind == "stopped":
            g = gen_of.get(jid, 0)
            got = gens.get((jid, g), {"last": 0, "ckpt": -1, "resumed": -1})
            nxt = gens.get((jid, g + 1))
            ckpt = nxt["resumed"] if nxt is not None and nxt["resumed"] >= 0 else max(got["ckpt"], got["resumed"], 0)
            lost = max(0, got["last"] - ckpt)
            preempted = stop_reason.get(jid) == "preempt"
            if preempted:
                tally["preemptions"] += 1
                tally["lost"].append(lost)
                preempt_lost.append(lost)
            row(t, "preempted" if preempted else "stopped", name, nodes, step=got["last"], ckpt=ckpt, lost=lost,
                detail=stop_reason.get(jid, str(e.get("reason", ""))))
        elif kind == "completed":
            row(t, "finish", name, nodes, step=int(e.get("steps", 0)), ckpt=int(e.get("steps", 0)))
        elif kind == "task_failed":
            row(t, "failed", name, nodes, detail=f"exit {e.get('exit_code', '')}: {e.get('reason', '')}")
        elif kind == "resized":
            row(t, "resized", name, nodes, detail=f"{e.get('procs', '')} procs, {float(e.get('seconds', 0)):.2f} s "
                                                  "from the stop to the first report")
        elif kind == "cancel":
            row(t, "cancel", name, nodes)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "events.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(EVENT_COLUMNS)
        w.writerows(r for _, r in sorted(rows, key=lambda x: x[0]))

    end = max([e["time"] for e in events] + [r["time"] for r in progress], default=t0)
    attempts = job_attempts(events, end)
    completed = {e["job_id"]: e["time"] for e in events if e["kind"] == "completed"}
    first_start: dict[str, float] = {}
    for e in events:
        if e["kind"] == "start" and e.get("job_id") in names:
            first_start.setdefault(e["job_id"], e["time"])
    results = []
    held = 0.0
    for jid, name in names.items():
        secs = sum((b - a) * len(ws) for a, b, ws in attempts.get(jid, []))
        held += secs
        start = first_start.get(jid)
        results.append(JobResult(job_id=name, submit=0.0, start=None if start is None else start - t0,
                                 end=completed[jid] - t0 if jid in completed else None,
                                 nodes=tallies[jid]["max_procs"], node_seconds=secs,
                                 status="completed" if jid in completed else "unfinished"))
    pilots = pilot_metrics(events, progress, end)
    meta = {"tool": "slurm-harvest", "mode": "controller", "solver": "controller decision core",
            "harvested_node_hours": held / 3600.0, "preemptions": len(preempt_lost), "lost_steps": preempt_lost,
            "max_lost_steps": max(preempt_lost, default=0),
            "max_relaunch_lost_steps": max(_relaunch_lost(gens), default=0),
            "pilot_node_hours": pilots.get("harvested_node_hours"),
            "pilot_busy_node_hours": pilots.get("pilot_busy_node_hours"),
            "pilot_utilization": pilots.get("pilot_utilization"), "pilots": pilots.get("pilots", 0),
            "pilots_preempted": pilots.get("pilots_preempted", 0),
            "controller_jobs": {name: jid for jid, name in names.items()},
            "failed_attempts": sum(1 for e in events if e["kind"] == "task_failed" and e.get("job_id") in names),
            "nonoptimal_by_status": {}} | meta
    return write_results(out, results, meta)


def _relaunch_lost(gens: dict[tuple[str, int], dict[str, int]]) -> list[int]:
    """Per relaunch of a job (preemption or resize): its previous attempt's last step minus the step it resumed
    from (what the restart had to compute again)."""
    out = []
    for (jid, g), cur in gens.items():
        prev = gens.get((jid, g - 1))
        if prev is not None and cur["resumed"] >= 0:
            out.append(max(0, prev["last"] - cur["resumed"]))
    return out

