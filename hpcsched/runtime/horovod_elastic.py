"""Elastic Horovod jobs resize in place: the worker rewrites a host list, ``horovodrun`` adapts, nothing restarts.

A ``horovodrun`` task whose job may change size (``HPCSCHED_MIN_PROCS`` < ``HPCSCHED_MAX_PROCS`` in its
environment) is launched in Horovod's elastic mode: ``--min-np/--max-np`` and a host-discovery script
in the task's directory instead of a fixed ``-H`` list. The script only prints a small file beside it
(``host:slots`` per line). Horovod's driver runs it every second; when the answer changes it tells the
ranks, which re-form the world at their next commit (``workloads/horovod_train.py``): survivors keep
their process and in-memory state, removed ranks exit, new ranks are started and receive the state by
broadcast. Resizing the job is then one atomic rewrite of that file (``resize``), against a checkpoint,
a stop, a relaunch of every rank and a restore for the other launchers. Across hosts Horovod starts a new
host's rank by running ``ssh`` (the worker's shim: ``rsh_agent``), which finds that host's worker in the task's
agent map (``AGENTS``), rewritten with the host list.

An adaptive-batch job (``adaptive_batch``) is told its new global batch with each in-place resize: ``resize`` first
rewrites a small JSON file beside the host list (``batch.json``, its path in the ranks' environment as
HPCSCHED_BATCH_FILE: ``batch_env``), then the host list. Horovod's driver acts on the host list only, so when the
ranks re-form they find the batch chosen for the new size; they agree on the newest version any of them read
(``workloads/adaptive_train.py``: a rank on another host cannot see the file). The environment, fixed at launch,
cannot say a batch chosen later.

Each rewrite is logged (``resizes.jsonl``) so the time from the request to the program's first report at
the new size can be measured from the task's own files (``resize_times``).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from hpcsched.runtime import launchers
from hpcsched.runtime.launchers.common import host_slots, local_alias
from hpcsched.runtime.rpc import pb

log = logging.getLogger("hpcsched.runtime.horovod_elastic")

MIN_ENV, MAX_ENV = "HPCSCHED_MIN_PROCS", "HPCSCHED_MAX_PROCS"  # the job's size range, in the task environment
SCRIPT, HOSTS, RANGE, LOG = "discover_hosts.sh", "horovod_hosts", "horovod_range", "resizes.jsonl"
AGENTS = "agents.json"  # host -> its worker's agent service: read by the rsh agent on every call (rsh_agent.FILE_ENV)
# Horovod blacklists a host whose rank failed (a preempted pilot: Slurm's SIGTERM reaches the rank's wrapper; a host
# killed under the job) and, without a cooldown, never uses it again: a pilot that came back on that node later was
# placed by the scheduler but never given a rank (the resize timed out into a relaunch). With this range Horovod may
# take such a host again some seconds after the failure (lower * 2^failures + jitter, at most the upper bound) once the
# discovery file lists it: the scheduler's host list decides, as for every other host.
BLACKLIST_COOLDOWN_S = (2, 60)
ALIAS = "horovod_alias.json"  # host -> its name in the discovery file (common.local_alias: node 0's own)
BATCH, BATCH_ENV = "batch.json", "HPCSCHED_BATCH_FILE"  # the batch told in place, and where the ranks find it


@dataclass(frozen=True, slots=True)
class BatchTold:
    """The global batch an adaptive-batch job is told for ``world_size`` processes (``LaunchTask.batch_size``,
    ``base_batch``, ``lr_scaling``)."""

    batch_size: int
    world_size: int
    base_batch: int
    lr_scaling: str

    @staticmethod
    def of(t: pb.LaunchTask) -> BatchTold | None:
        """What a LaunchTask tells, None for a job without ``batch:``."""
        return BatchTold(t.batch_size, t.world_size, t.base_batch, t.lr_scaling) if t.batch_size > 0 else None


def size_range(t: pb.LaunchTask) -> tuple[int, int] | None:
    """The task's [min, max] processes when it is an elastic horovodrun task, else None."""
    if not launchers.get(t.launcher).elastic_in_place or MIN_ENV not in t.env or MAX_ENV not in t.env:
        return None
    try:
        lo, hi = int(t.env[MIN_ENV]), int(t.env[MAX_ENV])
    except ValueError:
        return None
    return (lo, hi) if 1 <= lo < hi else None


def host_lines(hosts: list[str], alias: dict[str, str] | None = None) -> str:
    """``a:1,a:1,b:2`` -> ``a:2`` / ``b:2`` lines, the discovery script's output (hosts with 0 slots left out);
    ``alias`` renames hosts (node 0's own loopback address is ``localhost`` to Horovod: ``common.local_alias``)."""
    return "".join(f"{(alias or {}).get(h, h)}:{n}\n" for h, n in host_slots(hosts).items() if n > 0)


def _write_hosts(task_dir: Path, hosts: list[str]) -> None:
    try:
        alias = json.loads((task_dir / ALIAS).read_text())
    except FileNotFoundError:
        alias = {}
    text = host_lines(hosts, alias)
    tmp = task_dir / f".{HOSTS}.tmp"
    tmp.write_text(text)
    os.replace(tmp, task_dir / HOSTS)  # the script never prints half a list


def write_agents(task_dir: Path, agents: dict[str, str]) -> Path:
    """The host -> agent map the task's rsh agent reads (``rsh_agent.FILE_ENV``), replaced atomically. A job that
    grows in place onto a host it was not launched on needs that host's agent: the launcher's environment, fixed
    at launch, cannot say it."""
    tmp = task_dir / f".{AGENTS}.tmp"
    tmp.write_text(json.dumps(dict(sorted(agents.items()))))
    os.replace(tmp, task_dir / AGENTS)
    return task_dir / AGENTS


def write_batch(task_dir: Path, told: BatchTold) -> int:
    """Replace the batch file atomically with a newer version (the ranks take the newest: one they read before a
    rewrite is never taken for the new one); returns that version."""
    try:
        version = int(json.loads((task_dir / BATCH).read_text())["version"]) + 1
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        version = 0
    tmp = task_dir / f".{BATCH}.tmp"
    tmp.write_text(json.dumps({"version": version, "batch_size": told.batch_size, "world_size": told.world_size,
                               "base_batch": told.base_batch, "lr_scaling": told.lr_scaling}))
    os.replace(tmp, task_dir / BATCH)
    return version


def batch_env(t: pb.LaunchTask, task_dir: Path) -> dict[str, str]:
    """The ranks' path to the batch file of an elastic task of an adaptive-batch job (``elastic_command`` wrote
    it), else nothing."""
    return {BATCH_ENV: str(task_dir / BATCH)} if size_range(t) is not None and t.batch_size > 0 else {}


def elastic_command(argv: list[str], t: pb.LaunchTask, task_dir: Path) -> list[str]:
    """The rigid ``horovodrun`` command line with its fixed ``-H`` list swapped for the discovery script and
    the job's size range; writes the script and the first host list (the launch placement)."""
    rng = size_range(t)
    if rng is None:
        return argv
    if "-H" not in argv:
        log.warning("task %s: no -H list in %s; launching it rigid (it will resize by stop/relaunch)", t.task_id, argv)
        return argv
    task_dir.mkdir(parents=True, exist_ok=True)
    (task_dir / ALIAS).write_text(json.dumps(local_alias(t)))  # every later host list is renamed alike
    _write_hosts(task_dir, list(t.hosts))
    (task_dir / RANGE).write_text(f"{rng[0]} {rng[1]}\n")  # what resize() may ask for
    write_agents(task_dir, dict(t.agents))
    if (told := BatchTold.of(t)) is not None:
        write_batch(task_dir, told)
    script = task_dir / SCRIPT
    script.write_text(f"#!/bin/sh\nexec cat {shlex.quote(str(task_dir / HOSTS))}\n")
    script.chmod(0o755)
    i = argv.index("-H")
    lo, hi = rng
    return [*argv[:i], "--min-np", str(lo), "--max-np", str(hi), "--host-discovery-script", str(script),
            "--blacklist-cooldown-range", *(str(s) for s in BLACKLIST_COOLDOWN_S), *argv[i + 2:]]


def resize(task_dir: Path, hosts: list[str], agents: dict[str, str] | None = None,
           batch: BatchTold | None = None) -> int:
    """Ask a running elastic task for a new placement (``host:slots`` per node, hosts with 0 slots left out);
    returns its new size. ``agents``: the host -> agent map for the new placement, written first, so the rsh
    agent knows a new host before Horovod's driver sees it; ``batch``: the global batch for the new size, written
    before the host list too, so the ranks find it when they re-form (module docstring).

    Horovod's driver sees the change within about a second and the ranks re-form at their next commit. A size
    outside the job's range is refused here: below ``--min-np`` Horovod would wait (10 minutes) for slots,
    above ``--max-np`` it would leave the extra slots idle.
    """
    if not (task_dir / SCRIPT).exists():
        raise ValueError(f"{task_dir} holds no elastic Horovod task")
    lines = host_lines(hosts)  # validates every entry
    size = sum(int(line.rpartition(":")[2]) for line in lines.splitlines())
    lo, hi = (int(x) for x in (task_dir / RANGE).read_text().split())
    if not lo <= size <= hi:
        raise ValueError(f"{size} processes is outside the job's range {lo}..{hi}")
    if batch is not None and batch.world_size != size:
        raise ValueError(f"a batch told for {batch.world_size} processes, the placement has {size}")
    if agents:
        write_agents(task_dir, agents)
    entry: dict[str, object] = {"time": time.time(), "hosts": list(hosts), "world_size": size}
    if batch is not None:
        entry |= {"batch_size": batch.batch_size, "batch_version": write_batch(task_dir, batch)}
    _write_hosts(task_dir, hosts)
    with open(task_dir / LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")
    return size


@dataclass(frozen=True, slots=True)
class InPlaceResize:
    requested: float  # unix time of the host-list rewrite
    from_size: int
    to_size: int
    seconds: float | None  # request -> first progress report at the new size; None: none seen (yet)
    step: int | None  # the step of that report (training went on from where it was)


def resize_times(task_dir: Path, progress_file: Path | None = None) -> list[InPlaceResize]:
    """Pair every logged host-list rewrite with the program's first progress report at the new size after it."""
    try:
        asks = [json.loads(line) for line in (task_dir / LOG).read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []
    reports = []
    try:
        for line in (progress_file or task_dir / "progress.jsonl").read_text().splitlines():
            try:
                reports.append(json.loads(line))
            except ValueError:
                continue  # a line being written
    except FileNotFoundError:
        pass
    out = []
    for ask in asks:
        before = [r for r in reports if r.get("time", 0) <= ask["time"]]
        after = next((r for r in reports
                      if r.get("time", 0) > ask["time"] and r.get("world_size") == ask["world_size"]), None)
        out.append(InPlaceResize(ask["time"], before[-1]["world_size"] if before else 0, ask["world_size"],
                                 after["time"] - ask["time"] if after else None, after["step"] if after else None))
    return out
