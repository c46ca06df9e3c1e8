"""What a worker's heartbeat means against the store: each task it reports (known, unknown, of a stale generation,
exited) and each task the store expects on it (to launch, to stop, lost), as verdicts the controller acts on.

Reconciliation is declarative (see ``controller``): the database says which tasks should exist and which must
go, the heartbeat says which do, and the reply carries the difference. These functions only compare; they
read no store and write nothing, so every case can be checked with plain rows. Progress reports are turned
into the job's new fields and events the same way (``progress_update``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from hpcsched.runtime.lifecycle import IN_PLACE, IN_PLACE_TIMEOUT_S
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.store_rows import AllocRow, JobRow


class Reported(StrEnum):
    """What to do about one task a worker reported."""

    EXITED = "exited"  # it ended and the store still had it live: forget it, record the exit (the attempt may end)
    FORGET = "forget"  # it ended and the store already knew (or never knew it): only tell the worker to forget it
    STALE = "stale"  # it runs but nobody wants it (unknown, an old generation, its job no longer active): kill it
    CONFIRMED = "confirmed"  # the launch it was sent has started: the allocation becomes running
    RUNNING = "running"  # running as expected


class Expected(StrEnum):
    """What to do about one live allocation on the reporting worker, given whether the worker reported it."""

    OK = "ok"  # as it should be
    STOP = "stop"  # its job is stopping and the task runs: tell the worker to stop it
    NEVER_STARTED = "never_started"  # its job is stopping and the task never started: it exits now, nothing to stop
    RESEND_RESIZE = "resend_resize"  # an in-place resize not seen at its new size: send the LaunchTask again
    RESIZE_TIMED_OUT = "resize_timed_out"  # that resize never showed within IN_PLACE_TIMEOUT_S: stop and relaunch
    RELEASE = "release"  # an in-place shrink left its worker out (procs 0): stop it once Horovod removed its ranks
    RELEASED = "released"  # released before it ever started: it exits now (code 0: it is no part of the outcome)
    LAUNCH = "launch"  # not started yet: send (or resend) its LaunchTask
    LOST = "lost"  # it was running and the worker no longer knows it (the worker restarted): the attempt is lost


def is_current(a: AllocRow | None, job: JobRow | None) -> bool:
    """A reported task belongs to its job's current attempt (its progress counts)."""
    return a is not None and job is not None and a.generation == job.generation


def reported(running: bool, a: AllocRow | None, job: JobRow | None) -> Reported:
    """A reported task (``running`` or exited) against its allocation ``a`` and its job, as stored."""
    if not running:
        return Reported.EXITED if a is not None and a.state != "exited" else Reported.FORGET
    if a is None or job is None or not is_current(a, job) or a.state == "exited" \
            or job.state not in ("running", "stopping"):
        return Reported.STALE
    if a.state == "launching":
        return Reported.CONFIRMED
    return Reported.RUNNING


def expected(a: AllocRow, job: JobRow, seen: pb.TaskStatus | None, now: float,
             timeout_s: float = IN_PLACE_TIMEOUT_S) -> Expected:
    """A live allocation on the reporting worker against what it reported of that task (``seen``, or None)."""
    if job.state == "stopping":
        if seen is not None and seen.running:
            return Expected.STOP
        if seen is None and a.state == "launching":
            return Expected.NEVER_STARTED
    if a.nprocs == 0 and job.state == "running":  # released by an in-place shrink (``launch.in_place_change``)
        if seen is not None and seen.running:
            return Expected.RELEASE
        if seen is None and a.state == "launching":
            return Expected.RELEASED
    if seen is not None:
        if seen.running and job.state == "running" and job.stop_reason == IN_PLACE:
            if job.stop_time is not None and now - job.stop_time > timeout_s:
                return Expected.RESIZE_TIMED_OUT
            return Expected.RESEND_RESIZE  # until it reports at the new size
        return Expected.OK
    if a.state == "launching":
        return Expected.LAUNCH
    return Expected.LOST


@dataclass(slots=True)
class ProgressUpdate:
    """One progress report's effect: the progress row, the job's changed fields, the events, in write order."""

    row: dict[str, object]
    fields: dict[str, object]
    events: list[tuple[str, dict[str, object]]] = field(default_factory=list)


def progress_update(job: JobRow, p: pb.Progress, now: float) -> ProgressUpdate:
    """What a progress report of the job's current attempt changes: steps, losses, checkpoint, stage times, done,
    and the end of a resize (the first report of the attempt placed after a relaunch resize, or the first report
    at the new size after an in-place one)."""
    row: dict[str, object] = {
        "time": p.time, "step": p.step, "loss": p.loss, "samples_per_s": p.samples_per_s, "data_s": p.data_s,
        "compute_s": p.compute_s, "comm_s": p.comm_s, "world_size": p.world_size, "checkpoint": p.checkpoint,
        "resumed_from": p.resumed_from if p.resumed_from >= 0 else None}
    if p.batch_size > 0:  # an adaptive-batch job's report (``adaptive_batch``): kept for the controller's fit
        row["batch_size"] = p.batch_size
        if p.grad_sqr or p.grad_var:  # none measured (a process's first report): NULL, not a measured 0
            row |= {"grad_sqr": p.grad_sqr, "grad_var": p.grad_var}
    f: dict[str, object] = {"steps_done": p.step}
    events: list[tuple[str, dict[str, object]]] = []
    if not p.first:  # a process's first report comes before its first step: it has no loss yet
        f["last_loss"] = p.loss
        if job.first_loss is None:
            f["first_loss"] = p.loss
    if p.checkpoint:
        f["ckpt_step"], f["ckpt_path"] = p.step, p.checkpoint
    if p.data_s + p.compute_s + p.comm_s > 0:
        f.update(iteration_s=p.data_s + p.compute_s + p.comm_s, data_s=p.data_s, compute_s=p.compute_s,
                 comm_s=p.comm_s)
    if p.done:
        f["done"] = 1
    if p.first:
        if p.resumed_from >= 0:
            events.append(("resume", {"generation": job.generation, "resumed_from": p.resumed_from,
                                      "last_checkpoint": job.ckpt_step}))
        # A resize ends at the first report of the attempt placed after the stop (the job is running
        # again). The first report of the attempt being stopped (slow to start: stopped before it ever
        # reported) arrives while the job is still stopping and is no resize.
        if job.stop_reason == "resize" and job.stop_time is not None and job.state == "running":
            f["last_resize_s"] = now - job.stop_time
            f["stop_reason"], f["stop_time"] = None, None
            events.append(("resized", {"seconds": f["last_resize_s"], "procs": job.procs, "resize_kind": "relaunch"}))
    if job.stop_reason == IN_PLACE and job.stop_time is not None and job.state == "running" \
            and p.world_size == job.procs:
        f["last_resize_s"] = now - job.stop_time
        f["stop_reason"], f["stop_time"] = None, None
        events.append(("resized", {"seconds": f["last_resize_s"], "procs": job.procs, "resize_kind": IN_PLACE}))
    return ProgressUpdate(row, f, events)
