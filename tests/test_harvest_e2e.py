"""Issue 18's end-to-end run on the REAL 4-node loopback Slurm (scripts/slurm_cluster.sh up), with the controller's
``slurm`` node source and the muri-s policy: elastic jobs and a Muri-S pair on harvested nodes while batch jobs
from a real Slurm log preempt them, one ``kill -9`` of the controller mid-run, and the replayer (``hpcsched
replay``) on the same batch events. One controller run serves every check.

- Each pilot's worker advertises its own address, 127.0.0.1N on Slurm node nN (``pilot_python``), as a node of a
  real cluster has one: to Open MPI each pilot is then another host. ``ssh``/``rsh`` on PATH only record calls
  (none may be made).
- Two elastic jobs (min 1, max 2 procs, a declared scaling curve, so the MILP sizes them over the pilots), both
  placed on two pilots: a ``torchrun`` job (torch's agent on each pilot, Gloo all-reduce; ``netns_job.py --comm
  gloo``) and an ``mpirun`` job (mpi4py) whose second rank runs under the Open MPI daemon that the second pilot's
  worker started for the rsh agent (no ssh; the launching pilot is ``localhost`` to mpirun, the other 127.0.0.1N).
  Checked in the pilots' logs: torchrun's node-1 task launched on another pilot; the ``orted`` started there "for a
  remote launcher" and exited 0.
- A Muri-S pair (two rigid 1-proc ``direct`` jobs with complementary declared stage profiles, ``--stage-ms``) is
  submitted once both elastic jobs hold all four pilots: muri-s groups them on one slot (the MILP shrinks an
  elastic job for it) and run there with the worker's interleave directory for their group (the turn locks); they
  finish with exact steps and the elastic job grows back. Each took at least ``PAIR_IN_TURN`` of its steps in turn
  with its mate.
- A short segment of a real Slurm log (the Eagle sacct sample under /work/shared/trace-data/slurm, read with the
  project's sacct reader), compressed 10x in time and scaled from 30 to 4 nodes, is submitted to the high-priority
  ``batch`` partition: Slurm preempts the scavenger pilots (SIGTERM, GraceTime 5 s).
- Checked: each preempted job stops within the grace time with a checkpoint; the jobs shrink/come back and finish
  with exact step counts; the controller killed with ``kill -9`` and restarted loses no job and adopts the pilots;
  lost steps (last step reported before a stop minus the step the next attempt resumed from, from the store) are
  at most one checkpoint interval per preemption.
- Live vs replay (``live_vs_replay``, which also re-examines a kept run): harvested-pool utilisation and average JCT
  of the live run; then ``hpcsched replay --idle`` on the same batch events (Slurm's jobcomp log of this run), given
  what the run measured of what harvesting costs: each node's stretches from when the controller could plan with a
  pilot's worker there to when the pilot was preempted, each job's relaunch cost (stop to exit + start to first
  report) charged per restart and its steps/s at 1 and 2 processes, the live MILP's look-ahead. Asserted within
  ``REPLAY_TOLERANCE`` (the issue's 10%). The figures (and a replay on the declared inputs, for the record) are
  printed and written to ``$HPCSCHED_E2E_OUT`` (JSON) when set.

Not here: elastic Horovod across pilots (tests/test_runtime_netns.py runs it across network-namespace hosts).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_procs import (
    ROOT,
    client,
    controller_config,
    jobs_by_id,
    kill_tree,
    start_controller,
    stop,
    submit,
    wait_for,
)
from slurm_cluster import NODES, clean_cluster, sh, squeue  # noqa: F401 (clean_cluster: autouse fixture)

from hpcsched.slurm import commands

WHY_NOT = commands.available()
TRACE = Path(os.environ.get("HPCSCHED_TRACE_DATA", "/work/shared/trace-data")) / "slurm" / "eagle-sacct-sample.csv"
JOBCOMP = Path("/var/log/slurm/jobcomp.txt")
MPI_MISSING = shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None
pytestmark = [
    # alone: the live run's JCT is compared with the replay's model; a busy test beside it (CI: 2 cores, two xdist
    # workers) stretched it past the tolerance once (+10.7%), so `make test` runs it with nothing beside it
    pytest.mark.slurm, pytest.mark.slow, pytest.mark.mpi, pytest.mark.alone,
    pytest.mark.skipif(WHY_NOT is not None, reason=f"no real Slurm: {WHY_NOT}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the loopback Slurm runs pilots as root)"),
    pytest.mark.skipif(MPI_MISSING, reason="needs Open MPI (mpirun) and mpi4py"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (the torchrun job)"),
    pytest.mark.skipif(not TRACE.exists(), reason=f"no real Slurm log at {TRACE}"),
]

# The log segment: Eagle jobs 532217-532219 (consecutive submits, 67-193 s long, 10-30 nodes), times / 10 and
# nodes x 4/30 rounded up (10 -> 2, 30 -> 4).
SEGMENT = ("532217", "532218", "532219")
TIME_SCALE = 10.0
NODE_SCALE = 4 / 30
MIN_BATCH_S = 8.0  # a batch job shorter than this after compression runs this long (Slurm's 1 s clock)
WORK_MS = 100.0  # a step: 100 ms at 1 proc, 50 ms at 2 (netns_job.py --work-ms)
RATES = (1000 / WORK_MS, 2000 / WORK_MS)  # steps/s at 1 and 2 procs: the declared curve, live and replayed
MIN_MEASURED_STEPS = 50  # steps at one size before its measured rate replaces the declared one
STEPS = 1300
CKPT_EVERY = 40
GRACE_S = 5.0  # the scavenger partition's GraceTime (deploy/slurm/slurm.conf)
# Live vs replay: the issue asks for 10% on utilisation and average JCT; asserted at that. The replay is given what
# this run measured (``live_vs_replay``) and re-decides as the controller does. Eight runs (one with a busy loop beside
# it), and one inside a full-suite run: utilisation +0.1..+5.2%, JCT +1.9..+5.8% (docs/slurm.md).
REPLAY_TOLERANCE = 0.10
RESIZE_S = 3.0  # the jobs' declared resize cost (scaling.resize_s): what the controller's MILP charges a resize
# The Muri-S pair: two rigid 1-process jobs with complementary declared stage profiles (data-heavy, compute-heavy), so
# muri-s groups them on one slot, where they take turns per stage (workloads/_common.StageTurns).
SETTLE_S = 10.0  # the controller's hold while pilots are arriving (slurm.settle_s), live and as the replay is given it
TFWD_S = 60.0  # the MILP's look-ahead, live (the controller's milp_tfwd_s default) and replayed
PAIR = {"pair-io": (30.0, 10.0), "pair-cpu": (10.0, 30.0)}  # ms of data, compute per step
PAIR_STEPS = 250
PAIR_IN_TURN = 0.8  # the least share of its steps each member takes in turn with its mate


def batch_segment() -> list[dict]:
    """The segment's jobs through the project's sacct reader, compressed: offset from the first submit, nodes,
    seconds."""
    from hpcsched.traces import open_trace

    jobs = {j.id: j for j in open_trace(TRACE) if j.id in SEGMENT}
    assert sorted(jobs) == sorted(SEGMENT), sorted(jobs)
    t0 = min(j.submit for j in jobs.values())
    out = []
    for jid in SEGMENT:
        j = jobs[jid]
        out.append({"id": jid, "at": (j.submit - t0) / TIME_SCALE,
                    "nodes": max(1, min(4, math.ceil(j.nodes * NODE_SCALE - 1e-9))),
                    "seconds": max(MIN_BATCH_S, round((j.end - j.start) / TIME_SCALE)),
                    "log_nodes": j.nodes, "log_seconds": j.end - j.start})
    return out


def pilot_python(d: Path) -> Path:
    """The pilots' ``python`` (``slurm: python:``): the worker it runs advertises ``127.0.0.1N`` on Slurm node nN, its
    own address as a node of a real cluster has (the kernel routes all of 127/8 to ``lo``). Open MPI compares
    exact interface addresses, so to it each pilot is another host and ``mpirun`` must start a daemon on the
    second pilot through the rsh agent; with every pilot at 127.0.0.1 it ran both ranks on the first."""
    p = d / "pilot-python"
    p.write_text('#!/bin/sh\nnode="${SLURMD_NODENAME:-$SLURM_JOB_NODELIST}"\n'
                 'case "$node" in n[0-9]) ;; *) echo "pilot-python: not on a node nN: \'$node\'" >&2; exit 2;; esac\n'
                 f'exec {sys.executable} "$@" --host "127.0.0.1${{node#n}}"\n')
    p.chmod(0o755)
    return p


def record_ssh_calls(d: Path) -> str:
    """Put first on PATH an ``ssh`` and an ``rsh`` that only record their calls in ``d/ssh-called`` and fail (none
    may be made: the controller and its pilots inherit this PATH). Returns the PATH to restore."""
    fake = d / "fakebin"
    fake.mkdir()
    for tool in ("ssh", "rsh"):
        (fake / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {d}/ssh-called\nexit 255\n')
        (fake / tool).chmod(0o755)
    old_path = os.environ["PATH"]
    os.environ["PATH"] = f"{fake}:{old_path}"
    return old_path


def stop_with_its_pilots(ctl: subprocess.Popen) -> None:
    """Stop a controller the way an operator does (SIGTERM: it cancels its pilots), killing it if it hangs."""
    ctl.send_signal(signal.SIGTERM)
    try:
        ctl.wait(timeout=60)
    except subprocess.TimeoutExpired:
        stop(ctl)


def harvest_config(d: Path, listen: str = "127.0.0.1:0") -> Path:
    cfg = controller_config(d, listen=listen, min_runtime_s=2, stop_grace_s=4, policy="muri-s")
    with cfg.open("a") as f:
        f.write("node_source: slurm\nslurm:\n  partition: scavenger\n  max_pilots: 4\n  slots: 1\n"
                "  stop_grace_s: 3\n  poll_s: 1\n  time_limit_s: 900\n  leave_before_s: 30\n"
                f"  idle_release_s: 5\n  settle_s: {SETTLE_S:g}\n  start_timeout_s: 120\n  register_timeout_s: 60\n"
                "  work_dir: pilots\n"
                f"  python: {pilot_python(d)}\n")
    return cfg


def job_yaml(d: Path, name: str, launcher: str, comm: str) -> Path:
    p = d / f"{name}.yaml"
    p.write_text(f"name: {name}\nlauncher: {launcher}\nprocs: 2\nmin_procs: 1\nmax_procs: 2\nsteps: {STEPS}\n"
                 f"workdir: {ROOT}\nscaling: {{procs: [1, 2], rates: [{RATES[0]}, {RATES[1]}], resize_s: {RESIZE_S}}}\n"
                 f"command: [tests/netns_job.py, --comm, {comm}, --checkpoint-every, '{CKPT_EVERY}', "
                 f"--work-ms, '{WORK_MS}']\n")
    return p


def pair_yaml(d: Path, name: str) -> Path:
    data_ms, compute_ms = PAIR[name]
    p = d / f"{name}.yaml"
    p.write_text(f"name: {name}\nlauncher: direct\nprocs: 1\nsteps: {PAIR_STEPS}\nworkdir: {ROOT}\n"
                 f"profile: {{data_s: {data_ms / 1e3}, compute_s: {compute_ms / 1e3}, comm_s: 0.0}}\n"
                 f"command: [tests/netns_job.py, --checkpoint-every, '{CKPT_EVERY}', --stage-ms, "
                 f"'{data_ms:g},{compute_ms:g}']\n")
    return p


def store_rows(db: Path, sql: str) -> list[sqlite3.Row]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def held_intervals(events: list[sqlite3.Row], end: float) -> list[tuple[float, float, int]]:
    """(from, to, procs) while a job held nodes, from its start / resize / stopped / completed events: from a start
    until its ranks exited (a stopping job's nodes are busy until its checkpoint is written, as the replay counts a
    job's nodes through its rescale stall)."""
    out, cur = [], None
    for e in events:
        d = json.loads(e["detail"])
        if e["kind"] == "start":
            if cur is not None:  # no stopped event for the last attempt (a controller restart in between)
                out.append((cur[0], e["time"], cur[1]))
            cur = (e["time"], int(d["procs"]))
        elif e["kind"] in ("completed", "stopped", "task_failed") and cur is not None:
            out.append((cur[0], e["time"], cur[1]))
            cur = None
        elif e["kind"] == "resize" and cur is not None and "procs" in d:
            out.append((cur[0], e["time"], cur[1]))
            cur = (e["time"], int(d["procs"]))
    if cur is not None:
        out.append((cur[0], end, cur[1]))
    return out


def lost_steps(progress: list[sqlite3.Row]) -> list[int]:
    """Per restart of the job (a generation after the first): last step reported before it minus the step it
    resumed from."""
    by_gen: dict[int, list[sqlite3.Row]] = {}
    for r in progress:
        by_gen.setdefault(r["generation"], []).append(r)
    gens = sorted(by_gen)
    out = []
    for prev, gen in zip(gens, gens[1:], strict=False):
        last = max(r["step"] for r in by_gen[prev])
        resumed = [r["resumed_from"] for r in by_gen[gen] if r["resumed_from"] is not None]
        start = max(resumed) if resumed else min(r["step"] for r in by_gen[gen])
        out.append(max(0, last - max(start, 0)))
    return out


def batch_jobs(lines: list[str], names: set[str]) -> list[dict]:
    """The batch jobs in Slurm's jobcomp lines: submit, start and end (epoch s), nodes."""
    from hpcsched.traces.hostlist import expand_hostlist

    out = []
    for line in lines:
        kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if kv.get("Name") in names and kv.get("Partition") == "batch":
            t = [time.mktime(time.strptime(kv[k], "%Y-%m-%dT%H:%M:%S")) for k in ("SubmitTime", "StartTime", "EndTime")]
            out.append({"submit": t[0], "start": t[1], "end": t[2], "nodes": expand_hostlist(kv["NodeList"])})
    return out


def batch_busy(jobs: list[dict]) -> list[tuple[float, float, list[str]]]:
    """(start, end, nodes) of the batch jobs."""
    return [(j["start"], j["end"], j["nodes"]) for j in jobs]


def worker_times(events: list[sqlite3.Row], node_of: dict[str, str], kind: str) -> dict[str, list[float]]:
    """node -> the times of the store's ``kind`` events (register, worker_draining) of the pilots' workers on it."""
    out: dict[str, list[float]] = {}
    for e in events:
        if e["kind"] == kind and (node := node_of.get(json.loads(e["detail"])["worker"])):
            out.setdefault(node, []).append(e["time"])
    return out


def preempted_busy(jobs: list[dict], drains: dict[str, list[float]]) -> list[tuple[float, float, list[str]]]:
    """The batch jobs' node time as harvesting lost it: on each node from when its pilot's worker was told to leave
    for the job (Slurm preempted the pilot once the job was submitted: a drain between its submit and its start, not
    one an earlier job took), else from its start. The pilots' grace time is node time the batch job took from the
    pool before it started. The nodes whose pilots one job preempted leave together, at the first of their drains:
    Slurm preempts them at once and the controller stops the jobs on them in one step, where the replay, given each
    drain's own time (milliseconds apart), decided at each and charged a job every resize and preemption between
    (14 relaunches of the torch job against 4 live, +33 % JCT when a relaunch cost 19 s at load 15-19)."""
    out, used = [], set()
    for j in sorted(jobs, key=lambda j: j["start"]):
        drained = {}
        for n in j["nodes"]:
            t = min((t for t in drains.get(n, ()) if j["submit"] - 1.0 <= t <= j["start"] and (n, t) not in used),
                    default=None)
            if t is not None:
                drained[n] = t
                used.add((n, t))
        together = min(drained.values(), default=j["start"])
        out.extend(((together if n in drained else j["start"]), j["end"], [n]) for n in j["nodes"])
    return out


def usable_from(events: list[sqlite3.Row], node_of: dict[str, str], settle_s: float) -> dict[str, list[float]]:
    """node -> the times the controller could first plan with a pilot's worker there: its registration, or, while
    other pilots were still arriving, the end of the controller's hold (``PilotManager.arriving``: a pilot Slurm runs
    or was asked to run and whose worker has not registered, for at most ``settle_s`` from when it was seen running,
    else submitted or adopted). Nodes that come back together are planned once, live as in the replay."""
    episodes = []  # [from, seen running, registered, ended] per pilot, from its submit or adoption
    by_worker: dict[str, list] = {}
    for e in events:
        d, t = json.loads(e["detail"]), e["time"]
        if e["kind"] == "pilot" and d.get("worker"):
            ep = by_worker.get(d["worker"])
            if d["event"] in ("submit", "adopt") or ep is None:
                ep = by_worker[d["worker"]] = [t, t if d["event"] == "adopt" else None, math.inf, math.inf]
                episodes.append(ep)
            if d["event"] == "running" and ep[1] is None:
                ep[1] = t
            elif d["event"] in ("gone", "cancel"):
                ep[3] = min(ep[3], t)
        elif e["kind"] == "register" and (ep := by_worker.get(d["worker"])) and ep[2] == math.inf:
            ep[2] = t

    def arriving(t: float) -> bool:
        return any(a <= t < min(reg, end) and t - (run if run is not None and run <= t else a) < settle_s
                   for a, run, reg, end in episodes)

    ends = sorted({x for a, run, reg, end in episodes
                   for x in (reg, end, (run if run is not None else a) + settle_s, a + settle_s) if x < math.inf})
    return {node: [min((c for c in [r, *ends] if c >= r and not arriving(c)), default=r) for r in regs]
            for node, regs in worker_times(events, node_of, "register").items()}


def node_seconds(intervals: list[tuple[float, float, int]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) * n for a, b, n in intervals)


def idle_intervals(busy: list[tuple[float, float, list[str]]], start: float, served: dict[str, list[float]],
                   taken: list[tuple[float, float, list[str]]]) -> list[tuple[str, float, float]]:
    """Each node's idle stretches from ``start`` on, around the batch jobs (BFTrainer's idle-interval file), as
    harvesting offered them: from the first time a pilot's worker registered on the node in the stretch (``served``:
    node -> registration times; a stretch no pilot served is left out), less the node time ``taken`` by others (the
    Muri pair). The nodes stayed idle after the segment: the last stretch runs an hour past ``start`` (an open one,
    ``-1``, ends the replay at the last pool change, before the jobs finish)."""
    out = []
    for node in NODES:
        t, stretches = start, []
        for a, b, _ in sorted(x for x in busy if node in x[2]):
            if a > t:
                stretches.append((t, a))
            t = max(t, b)
        stretches.append((t, start + 3600.0))
        for a, b in stretches:
            a = min((r for r in served.get(node, ()) if a <= r < b), default=b)
            for x, y, _ in sorted(x for x in taken if node in x[2] and x[1] > a and x[0] < b):
                if x > a:
                    out.append((node, a, x))
                a = max(a, y)
            if a < b:
                out.append((node, a, b))
    return out


Busy = list[tuple[float, float, list[str]]]  # (from, to, nodes)


def run_replay(d: Path, name: str, busy: Busy, taken: Busy,
               served: dict[str, list[float]], submits: dict[str, float], t0: float, resize_s: dict[str, float],
               rates: dict[str, tuple[float, float]] | None = None, accounting: str = "reference",
               extra: tuple[str, ...] = ()) -> dict:
    """``hpcsched replay`` on the live run's batch events (``busy``: the batch jobs' start, end and nodes from
    Slurm's jobcomp log) as BFTrainer idle intervals of the 4 nodes from the first elastic submit on, each stretch
    from when a pilot served it (``served``) and without the Muri pair's node time (``taken``), with the elastic
    jobs as they were submitted: same bounds, steps and submit times, Tcup = Tcdw = ``resize_s`` per job, and
    ``rates`` (steps/s at 1 and 2 processes) per job, else the declared curve. Same MILP look-ahead as live."""
    idle, order = d / f"{name}-idle.csv", d / "replay-node-order.txt"
    order.write_text("".join(f"{n}\n" for n in NODES))
    with idle.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["node", "idle_start", "idle_end"])
        w.writerows(idle_intervals(busy, t0, served, taken))
    bnd, nps = d / f"{name}-Jbnd.csv", d / f"{name}-JNPs.csv"
    curves = {jid: json.dumps([0.0, *(rates or {}).get(jid, RATES)]) for jid in submits}
    with bnd.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job", "Tcup", "Tcdw", "Jmin", "Jmax", "Pmax", "Tsub"])
        w.writerows([jid, resize_s[jid], resize_s[jid], 1, 2, float(STEPS), sub] for jid, sub in submits.items())
    with nps.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job", "Ns", "Ps", "Os", "Tsub"])
        w.writerows([jid, "[0.0, 1.0, 2.0]", curves[jid], curves[jid], sub] for jid, sub in submits.items())
    out = d / name
    exe = shutil.which("hpcsched", path=str(Path(sys.executable).parent)) or "hpcsched"
    r = subprocess.run([exe, "replay", "--idle", str(idle), "--node-order", str(order), "--nodes", str(len(NODES)),
                        "--jobs", str(bnd), "--curves", str(nps), "--out", str(out), "--start", str(t0),
                        "--tfwd", f"{TFWD_S:g}", "--exact-events", "--accounting", accounting, *extra, "--json",
                        "--quiet"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    with (out / "jobs.csv").open() as f:
        rows = list(csv.DictReader(f))
    jct = [float(x["end"]) - float(x["submit"]) for x in rows if x["end"]]
    summary["avg_jct_s"] = sum(jct) / len(jct) if jct else float("nan")
    summary["jobs_done"] = len(jct)
    summary["used_node_s"] = sum(float(x["node_seconds"]) for x in rows)
    summary["end"] = max((float(x["end"]) for x in rows if x["end"]), default=t0)
    return {k: summary[k] for k in ("utilization", "avg_jct_s", "jobs_done", "preemptions", "rescales",
                                    "used_node_s", "end")}


def merged(busy: list[tuple[float, float, list[str]]]) -> list[tuple[float, float, list[str]]]:
    """One-node intervals merged per node where they overlap."""
    out: list[tuple[float, float, list[str]]] = []
    for a, b, nodes in sorted(busy, key=lambda x: (x[2], x[0])):
        if out and out[-1][2] == nodes and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(b, out[-1][1]), nodes)
        else:
            out.append((a, b, nodes))
    return out


def relaunch_cost(events: list[sqlite3.Row], progress: list[sqlite3.Row], jid: str) -> tuple[float, float]:
    """What one change of the job's size cost it as it ran: the mean seconds from a stop to its ranks' exit (the
    checkpoint) and from a start to the attempt's first progress report (launch, rendezvous, restore). Every live
    resize, preemption and restart pays both (a stop and a relaunch)."""
    ev = [e for e in events if e["job_id"] == jid]
    stops = []
    for e in ev:
        if e["kind"] == "stop":
            after = [x["time"] for x in ev if x["kind"] == "stopped" and x["time"] >= e["time"]]
            if after:
                stops.append(after[0] - e["time"])
    first = {}
    for r in progress:
        if r["job_id"] == jid:
            first.setdefault(r["generation"], r["time"])
    starts = [first[g] - e["time"] for e in ev if e["kind"] == "start"
              and (g := json.loads(e["detail"])["generation"]) in first]
    return (sum(stops) / len(stops) if stops else 0.0), sum(starts) / len(starts)


def measured_rates(progress: list[sqlite3.Row], jid: str) -> tuple[float, float]:
    """The job's steps/s at 1 and 2 processes as it ran: over each attempt's reports after its first five (the
    relaunch and rendezvous are the resize cost's), steps over seconds, summed per world size. A size not seen for
    ``MIN_MEASURED_STEPS`` keeps its declared rate (said on stdout): pilots now leave their nodes within about a
    second of a preemption, so a batch job's stretch, and the job's time at 1 process, can be too short to measure."""
    by_gen: dict[int, list[sqlite3.Row]] = {}
    for r in progress:
        if r["job_id"] == jid:
            by_gen.setdefault(r["generation"], []).append(r)
    steps, secs = {1: 0, 2: 0}, {1: 0.0, 2: 0.0}
    for rows in by_gen.values():
        rows = rows[5:]
        if len(rows) > 10 and rows[0]["world_size"] in steps:
            steps[rows[0]["world_size"]] += rows[-1]["step"] - rows[0]["step"]
            secs[rows[0]["world_size"]] += rows[-1]["time"] - rows[0]["time"]
    out = []
    for size, declared in zip((1, 2), RATES, strict=True):
        if steps[size] >= MIN_MEASURED_STEPS:
            out.append(steps[size] / secs[size])
        else:
            print(f"{jid}: {steps[size]} steps measured at {size} process(es), under {MIN_MEASURED_STEPS}: the replay "
                  f"is given the declared {declared:g} steps/s there")
            out.append(declared)
    return out[0], out[1]


def pilot_logs(d: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((d / "pilots").glob("pilot-*.log")))


def test_elastic_jobs_on_harvested_nodes_preempted_by_a_real_log_segment(tmp_path: Path) -> None:
    segment = batch_segment()
    old_path = record_ssh_calls(tmp_path)
    comp_before = len(JOBCOMP.read_text().splitlines()) if JOBCOMP.exists() else 0
    ctl, addr = start_controller(tmp_path, harvest_config(tmp_path))
    c = client(addr)
    figures: dict = {"segment": segment}
    try:
        t_start = time.time()
        ids = {submit(c, job_yaml(tmp_path, "torch2", "torchrun", "gloo")): "torchrun",
               submit(c, job_yaml(tmp_path, "mpi2", "mpirun", "mpi")): "mpirun"}

        def both_on_two_pilots() -> dict | None:
            js = jobs_by_id(c)
            return js if all(js[j].state == "running" and len(js[j].workers) == 2 and js[j].steps_done >= 10
                             for j in ids) else None

        wait_for("both elastic jobs running on two pilots each", both_on_two_pilots, 180, poll=0.5)
        figures["first_start_s"] = time.time() - t_start
        # The pair, with every pilot taken: two more 1-slot jobs than slots, so muri-s groups them on one slot (the
        # MILP shrinks an elastic job for it); both elastic jobs grow back once the pair is done.
        pair = {submit(c, pair_yaml(tmp_path, name)): name for name in PAIR}
        wait_for("the pair done", lambda: all(j.state == "completed" for jid, j in jobs_by_id(c).items()
                                              if jid in pair), 120, poll=0.5)
        wait_for("both elastic jobs back on two pilots each", both_on_two_pilots, 120, poll=0.5)
        figures["all_on_two_pilots_s"] = time.time() - t_start
        # the batch segment, at its compressed times; the controller killed -9 once in the middle
        t_b0 = time.time()
        names = set()
        plan = [(b["at"], "batch", b) for b in segment] + [(segment[1]["at"] + 5.0, "kill", None)]
        for at, what, b in sorted(plan, key=lambda x: x[0]):
            time.sleep(max(0.0, t_b0 + at - time.time()))
            if what == "batch":
                name = f"trace-{b['id']}"
                names.add(name)
                b["slurm_id"] = sh("sbatch", "--parsable", "-p", "batch", f"-N{b['nodes']}", "-J", name,
                                   "--wrap", f"sleep {b['seconds']}").strip()
                b["submitted"] = time.time()
            else:
                c.close()
                kill_tree(ctl)  # the controller only: the pilots are Slurm's
                figures["killed_at_s"] = time.time() - t_start
                ctl, addr2 = start_controller(tmp_path, harvest_config(tmp_path, listen=addr))
                assert addr2 == addr
                c = client(addr)
                figures["restart_s"] = time.time() - t_start - figures["killed_at_s"]
                assert set(ids) | set(pair) <= set(jobs_by_id(c)), "a job was lost across the kill -9"
        done = wait_for("the elastic jobs done", lambda: (js := jobs_by_id(c)) and all(
            js[j].state in ("completed", "failed", "cancelled") for j in ids) and js, 600, poll=1.0)
        figures["wall_s"] = time.time() - t_start
        for jid, kind in ids.items():
            j = done[jid]
            assert j.state == "completed", (kind, j.message, (tmp_path / "controller.log").read_text()[-4000:])
            assert j.steps_done == STEPS, (kind, j.steps_done)
            assert j.restarts == 0, (kind, j.message)  # preemptions and resizes are not failed attempts
            result = json.loads((tmp_path / "run" / "ckpt" / jid / "result.json").read_text())
            assert result["steps"] == STEPS, (kind, result)  # exact, across preemptions and the restart
        wait_for("the batch jobs to end", lambda: not any(n.startswith("trace-") for n, _ in squeue().values()), 120)
        time.sleep(1.5)  # jobcomp is written as jobs end
    finally:
        c.close()
        stop_with_its_pilots(ctl)
        os.environ["PATH"] = old_path

    db = tmp_path / "run" / "state.db"
    events = store_rows(db, "SELECT time, job_id, kind, detail FROM events ORDER BY rowid")
    progress = store_rows(db, "SELECT * FROM progress ORDER BY rowid")
    logs = pilot_logs(tmp_path)

    # The Muri-S pair: grouped on one pilot's slot, taking turns per stage, exact steps.
    for jid, name in pair.items():
        j = done[jid]
        result = json.loads((tmp_path / "run" / "ckpt" / jid / "result.json").read_text())
        assert j.state == "completed" and j.steps_done == result["steps"] == PAIR_STEPS, (name, j.message, result)
        # They took turns: the steps each began while its mate was live in the group's directory (StageTurns).
        # 243-246 of 250 in 7 runs; before the worker stopped handing the second member to a warm supervisor still
        # importing torch, which started it 2-13 s after its mate, 0-197 (tests/test_interleave_turns.py).
        assert result["steps_with_mate"] >= PAIR_IN_TURN * PAIR_STEPS, (name, result)
        figures.setdefault("pair", {})[name] = {"jct_s": j.end_time - j.submit_time, "turn_wait_s": {
            k: round(v, 2) for k, v in result["turn_wait_s"].items()}, "interleave_dir": result["interleave_dir"],
            "steps_with_mate": result["steps_with_mate"]}
    starts = {jid: [json.loads(e["detail"]) for e in events if e["job_id"] == jid and e["kind"] == "start"]
              for jid in pair}
    a, b = pair
    together = [(x["group"], x["workers"]) for x in starts[a] if (x["group"], x["workers"]) in
                [(y["group"], y["workers"]) for y in starts[b]]]
    assert together and together[0][0] and len(together[0][1]) == 1, starts  # one group key, one pilot
    assert together[0][1][0].startswith("pilot-"), starts
    dirs = {v["interleave_dir"] for v in figures["pair"].values()}
    assert len(dirs) == 1 and together[0][1][0] in next(iter(dirs)), figures["pair"]  # the same slot's turns

    per_job = {}
    stops_in_grace = []
    for jid, kind in ids.items():
        ev = [e for e in events if e["job_id"] == jid]
        preempts = [e for e in ev if e["kind"] == "stop" and json.loads(e["detail"]).get("reason") == "preempt"]
        # a preempted job is stopped (its ranks checkpointed and exited) within the grace time
        for p in preempts:
            after = [e["time"] for e in ev if e["kind"] == "stopped" and e["time"] >= p["time"]]
            stops_in_grace.append(round(after[0] - p["time"], 2) if after else None)
        lost = lost_steps([r for r in progress if r["job_id"] == jid])
        per_job[kind] = {"jct_s": done[jid].end_time - done[jid].submit_time, "preemptions": len(preempts),
                         "restarts_of_attempts": len(lost), "lost_steps": lost,
                         "stops": sum(e["kind"] == "stop" for e in ev), "restarts": done[jid].restarts}
        assert all(x <= CKPT_EVERY for x in lost), (kind, lost)
        # it ran across two pilots: rank 1 on the second pilot's worker, started there by torchrun's agent, or by
        # the Open MPI daemon that mpirun started there through the rsh agent (no ssh)
        on_two = [json.loads(e["detail"])["workers"] for e in ev if e["kind"] == "start"
                  and len(json.loads(e["detail"])["workers"]) == 2]
        assert on_two, (kind, figures)
        if kind == "torchrun":
            assert re.search(rf"launched {jid}\.g\d+\.n1 \(torchrun, 1 procs\)", logs), kind
        else:
            assert re.search(rf"job {jid} attempt \d+: started .*orted.* for a remote launcher", logs), kind
            assert re.search(rf"job {jid} attempt \d+: remote launcher's command \(pid \d+\) exited with 0", logs)
    comp = JOBCOMP.read_text().splitlines()[comp_before:]
    (tmp_path / "batch-jobcomp.txt").write_text("".join(f"{line}\n" for line in comp))
    busy = batch_busy(batch_jobs(comp, names))
    figures |= {"jobs": per_job, "stops_s": stops_in_grace, "batch_busy": busy,
                "ssh_called": (tmp_path / "ssh-called").read_text() if (tmp_path / "ssh-called").exists() else ""}
    assert len(busy) == len(segment), (busy, comp)
    assert sum(v["preemptions"] for v in per_job.values()) >= 1, figures  # the log segment did preempt pilots
    assert all(s is not None and s <= GRACE_S for s in stops_in_grace), stops_in_grace
    assert figures["ssh_called"] == ""
    assert (tmp_path / "controller.log").read_text().count("adopt ") >= 1  # the restarted controller adopted pilots

    figures |= live_vs_replay(tmp_path)
    print("\n" + json.dumps(figures, indent=1, default=str))
    if os.environ.get("HPCSCHED_E2E_OUT"):
        Path(os.environ["HPCSCHED_E2E_OUT"]).write_text(json.dumps(figures, indent=1, default=str) + "\n")
    assert figures["replay"]["jobs_done"] == len(ids)
    off = {k: round(v, 3) for k, v in figures["diff"].items() if abs(v) > REPLAY_TOLERANCE}
    assert not off, f"replay vs live beyond {REPLAY_TOLERANCE:.0%}: {off} ({figures})"


def live_vs_replay(d: Path) -> dict:
    """Live figures of a run kept in ``d`` (the controller's store ``run/state.db`` and Slurm's jobcomp lines of the
    run, ``batch-jobcomp.txt``) and the replay on the same batch events (REPLAY_TOLERANCE), from those files alone,
    so a kept run can be re-examined: ``python tests/test_harvest_e2e.py DIR``.

    - Live: the harvested pool's utilisation = node-seconds the elastic jobs held (from a start until the ranks
      exited) / node-seconds neither a batch job (jobcomp StartTime to EndTime) nor the Muri pair held, from the first
      elastic submit to the last completion; their average JCT.
    - The replay is given what the run measured of what harvesting costs: each node's idle stretches from when the
      controller could plan with a pilot's worker there (``usable_from``) to when its pilot was preempted for the
      batch job (``preempted_busy``), less the pair's node time; each job's relaunch cost (stop to exit + start to
      first report) as Tcup = Tcdw, charged per restart (``--accounting restart``: the controller resizes these jobs
      by relaunching them) and its steps/s at 1 and 2 processes; the live MILP's look-ahead. For the record, also
      the replay on the jobs' declared inputs (curve, 3 s resize) over the whole batch-free pool."""
    db = d / "run" / "state.db"
    events = store_rows(db, "SELECT time, job_id, kind, detail FROM events ORDER BY rowid")
    progress = store_rows(db, "SELECT * FROM progress ORDER BY rowid")
    rows = {r["id"]: r for r in store_rows(db, "SELECT id, name, submit_time, end_time FROM jobs")}
    ids = {jid: r["name"] for jid, r in rows.items() if r["name"] in ("torch2", "mpi2")}
    pair = [jid for jid, r in rows.items() if r["name"] in PAIR]
    t_start = min(rows[j]["submit_time"] for j in ids)
    t_end = max(rows[j]["end_time"] for j in ids)
    node_of = {x["worker"]: x["node"] for e in events if e["kind"] == "pilot"
               and (x := json.loads(e["detail"])).get("node")}
    pair_busy = []
    for jid in pair:
        ev = [e for e in events if e["job_id"] == jid]
        for a, b, n in held_intervals(ev, t_end):
            (start,) = [json.loads(e["detail"]) for e in ev if e["kind"] == "start" and e["time"] == a]
            pair_busy.append((a, b, [node_of[start["workers"][0]]] * n))
    pair_busy = merged(pair_busy)  # the pair's members share their slot: its node time once
    jobs = batch_jobs((d / "batch-jobcomp.txt").read_text().splitlines(), {f"trace-{x}" for x in SEGMENT})
    busy = batch_busy(jobs)
    taken = busy + pair_busy  # node time the elastic jobs could not have: batch jobs and the Muri pair

    def pool(hi: float) -> float:  # node-seconds from the first elastic submit to hi that neither batch nor pair took
        return len(NODES) * (hi - t_start) - node_seconds([(a, b, len(n)) for a, b, n in taken], t_start, hi)

    used = sum(node_seconds(held_intervals([e for e in events if e["job_id"] == j], t_end), t_start, t_end)
               for j in ids)
    live = {"utilization": used / pool(t_end), "avg_jct_s": sum(rows[j]["end_time"] - rows[j]["submit_time"]
                                                                 for j in ids) / len(ids),
            "pool_node_s": pool(t_end), "used_node_s": used}
    submits = {jid: rows[jid]["submit_time"] for jid in ids}
    costs = {jid: relaunch_cost(events, progress, jid) for jid in ids}
    rates = {jid: measured_rates(progress, jid) for jid in ids}
    sizes = {jid: {r["world_size"] for r in progress if r["job_id"] == jid} for jid in ids}
    assert all({1, 2} <= seen for seen in sizes.values()), sizes  # each job was shrunk to 1 and grown to 2
    served = usable_from(events, node_of, SETTLE_S)
    lost = preempted_busy(jobs, worker_times(events, node_of, "worker_draining"))
    replay = run_replay(d, "replay", lost, pair_busy, served, submits, t_start,
                        {jid: sum(c) for jid, c in costs.items()}, rates, accounting="restart", extra=("--no-pause",))
    every = {n: [t_start] + [b for _, b, nodes in busy if n in nodes] for n in NODES}  # free at once
    declared = run_replay(d, "replay-declared", busy, pair_busy, every, submits, t_start,
                          dict.fromkeys(ids, RESIZE_S))
    for r in (replay, declared):  # over the same pool as the live figure (the batch-free node time to its end)
        r["utilization"] = r["used_node_s"] / pool(r["end"])
    return {"live": live, "pair_busy": pair_busy, "replay": replay, "replay_declared": declared,
            "measured": {ids[j]: {"stop_s": round(costs[j][0], 2), "launch_s": round(costs[j][1], 2),
                                  "steps_per_s": [round(x, 2) for x in rates[j]]} for j in ids},
            "usable_from": {n: [round(t - t_start, 1) for t in ts] for n, ts in served.items()},
            "preempted_from": [(round(a - t_start, 1), round(b - t_start, 1), n) for a, b, n in lost],
            "diff": {k: (replay[k] - live[k]) / live[k] for k in ("utilization", "avg_jct_s")},
            "diff_declared": {k: (declared[k] - live[k]) / live[k] for k in ("utilization", "avg_jct_s")}}


if __name__ == "__main__":  # re-examine a kept run: python tests/test_harvest_e2e.py DIR (pytest --basetemp keeps it)
    print(json.dumps({k: v for k, v in live_vs_replay(Path(sys.argv[1])).items() if k != "pair_busy"}, indent=1,
                     default=str))
