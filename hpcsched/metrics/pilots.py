"""The figures of a controller run (``hpcsched calc STATE.db``) that harvested nodes with pilot jobs, from the
store's events (``pilot`` events the pilot manager records, the jobs' start / stopped / completed / stop events)
and progress.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

PILOT_UNITS = {
    "harvested_node_hours": "pilot node-hours",
    "pilot_busy_node_hours": "pilot node-hours with a task",
    "pilot_utilization": "busy / harvested",
    "pilots": "that ran",
    "pilots_preempted": "ended by Slurm",
    "pilots_window_end": "left at their idle window's end",
}
_ATTEMPT_END = ("stopped", "completed")


def _union_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by the union of ``intervals``."""
    total, cur_a = 0.0, 0.0
    cur_b: float | None = None  # the end of the run being merged; None: none yet
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b <= a:
            continue
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


Attempt = tuple[float, float, tuple[str, ...]]  # (from, to, workers) of one attempt of a job


def job_attempts(events: Sequence[Mapping[str, Any]], end: float) -> dict[str, list[Attempt]]:
    """Per job: (from, to, workers) of each attempt, from its ``start`` event to its ``stopped`` / ``completed``
    (or the next ``start``; ``end`` while it still ran). In-place resizes keep the attempt's worker."""
    out: dict[str, list[Attempt]] = {}
    open_: dict[str, tuple[float, tuple[str, ...]]] = {}
    for e in sorted(events, key=lambda e: e["time"]):
        jid = e.get("job_id")
        if not jid:
            continue
        if e["kind"] == "start" or e["kind"] in _ATTEMPT_END:
            if jid in open_:
                t0, workers = open_.pop(jid)
                out.setdefault(jid, []).append((t0, e["time"], workers))
            if e["kind"] == "start":
                open_[jid] = (e["time"], tuple(e.get("workers") or ()))
    for jid, (t0, workers) in open_.items():
        out.setdefault(jid, []).append((t0, max(t0, end), workers))
    return out


def restart_lost_steps(progress: Sequence[Mapping[str, Any]]) -> list[int]:
    """Per restart of a job (each attempt after the first that reported): the last step its previous attempt
    reported minus the checkpoint step it resumed from (its first reported step if it says none)."""
    by_job: dict[str, dict[int, list[Mapping[str, Any]]]] = {}
    for r in progress:
        by_job.setdefault(r["job_id"], {}).setdefault(int(r["generation"]), []).append(r)
    out = []
    for gens in by_job.values():
        order = sorted(gens)
        for prev, gen in zip(order, order[1:], strict=False):
            last = max(int(r["step"]) for r in gens[prev])
            resumed = [int(r["resumed_from"]) for r in gens[gen] if r.get("resumed_from") is not None]
            start = max(resumed) if resumed else min(int(r["step"]) for r in gens[gen])
            out.append(max(0, last - max(start, 0)))
    return out


def cancelled_pilot_workers(events: Sequence[Mapping[str, Any]]) -> set[str]:
    """Workers of the pilots the controller cancelled itself (stopping, idle, hung), from all its pilot events: a job
    stopped because such a worker left was not preempted. From all events, since the manager records its cancel after
    scancel returns and the worker's Leave can reach the store first."""
    return {e["worker"] for e in events if e["kind"] == "pilot" and e.get("worker") and (
        e.get("event") == "cancel" or e.get("event") == "gone" and e.get("cancelled"))}


def pilot_metrics(events: Sequence[Mapping[str, Any]], progress: Sequence[Mapping[str, Any]],
                  end: float | None = None) -> dict[str, Any]:
    """Harvesting figures of a controller run from its store (``Store.events()`` rows: time, job_id, kind and
    the detail's keys; ``Store.progress()`` rows).

    - ``harvested_node_hours``: pilot node time, each pilot from the poll that first saw it running to the one
      that found it gone from Slurm's queue (``end``, the store's last record by default, while it still runs);
      to within the pilot manager's ``poll_s``.
    - ``pilot_busy_node_hours``: of that, the time its worker held a task of some job (co-located jobs count
      once); ``pilot_utilization`` = busy / harvested.
    - ``pilots``: pilots that ran; ``pilots_preempted``: of those, the ones Slurm ended, not this controller
      (preemption, their time limit, an operator's scancel); ``pilots_window_end``: the ones that left by
      themselves at the end of their idle window (``time_limit: fit-idle-window``), counted apart because
      leaving then is the plan, not a loss.
    - ``preemptions``: job stops for a pilot (or any worker) leaving or preempted (``stop`` events, reason
      ``preempt``), not for a pilot this controller cancelled (``cancelled_pilot_workers``); ``lost_steps``: steps
      lost past the last checkpoint, summed over every restart of a job
      (preemption, resize, failure), ``max_lost_steps`` the largest one.
    - ``pilot_release_s_p50`` / ``_p99`` / ``_max``: how long a pilot Slurm ended held its node after Slurm
      signalled it (a preemption): the delay it added to the batch job that wanted the node.

    Figures that need pilots are left out and listed under ``unavailable`` with the reason when the run has
    none (``node_source: static``, or a store written before pilot events were recorded)."""
    if end is None:
        end = max([e["time"] for e in events] + [r["time"] for r in progress], default=0.0)
    out: dict[str, Any] = {}
    cancelled = cancelled_pilot_workers(events)
    stops = [e for e in events if e["kind"] == "stop" and e.get("reason") == "preempt"
             and e.get("worker_left") not in cancelled]
    lost = restart_lost_steps(progress)
    out["preemptions"] = len(stops)
    out["lost_steps"] = sum(lost)
    out["max_lost_steps"] = max(lost, default=0)
    # a pilot's batch job: "job" (node_source pbs) or "slurm_job" (node_source slurm, and states written before)
    pilot_ev = [{**e, "job": e.get("job") or e.get("slurm_job")} for e in events
                if e["kind"] == "pilot" and (e.get("job") or e.get("slurm_job"))]
    runs: dict[str, dict[str, Any]] = {}
    for e in sorted(pilot_ev, key=lambda e: e["time"]):
        p = runs.setdefault(e["job"], {"worker": e.get("worker") or f"pilot-{e['job']}", "from": None,
                                       "to": None, "cancelled": False, "window_end": False})
        kind = e.get("event")
        if p["from"] is None and (kind == "running" or kind == "adopt" and e.get("state") == "RUNNING"):
            p["from"] = e["time"]
        elif kind == "cancel":
            p["cancelled"] = True
        elif kind == "gone" and p["to"] is None:
            p["to"] = e["time"]
            p["cancelled"] = p["cancelled"] or bool(e.get("cancelled"))
            p["window_end"] = bool(e.get("window_end"))
    ran = {jid: p for jid, p in runs.items() if p["from"] is not None}
    if not ran:
        out["unavailable"] = {k: "no pilot ran in this controller run (node_source static, or a store from before "
                                 "pilots were recorded)" if not runs else
                              f"none of its {len(runs)} pilots ever ran (pending until cancelled)"
                              for k in ("harvested_node_hours", "pilot_busy_node_hours", "pilot_utilization")}
        return out
    busy_by_worker: dict[str, list[tuple[float, float]]] = {}
    for attempts in job_attempts(events, end).values():
        for t0, t1, workers in attempts:
            for w in workers:
                busy_by_worker.setdefault(w, []).append((t0, t1))
    held = busy = 0.0
    for p in ran.values():
        lo, hi = p["from"], p["to"] if p["to"] is not None else max(end, p["from"])
        held += hi - lo
        busy += _union_length(busy_by_worker.get(p["worker"], []), lo, hi)
    out["harvested_node_hours"] = held / 3600.0
    out["pilot_busy_node_hours"] = busy / 3600.0
    out["pilot_utilization"] = busy / held if held > 0 else None
    out["pilots"] = len(ran)
    ended = [p for p in ran.values() if p["to"] is not None and not p["cancelled"]]
    out["pilots_preempted"] = sum(1 for p in ended if not p["window_end"])
    out["pilots_window_end"] = sum(1 for p in ended if p["window_end"])
    # The cost a site pays: how long a preempted pilot held its node after Slurm signalled it, i.e. what it added
    # to the start of the batch job that preempted it (the pilot's script times it: slurm/pilot_config.py).
    release = sorted(float(e["release_s"]) for e in pilot_ev if e.get("event") == "gone"
                     and e.get("release_s") is not None and not e.get("cancelled"))
    if release:
        out["pilot_release_s_p50"] = release[(len(release) - 1) // 2]
        out["pilot_release_s_p99"] = release[min(len(release) - 1, math.ceil(0.99 * len(release)) - 1)]
        out["pilot_release_s_max"] = release[-1]
    elif out["pilots_preempted"]:
        out.setdefault("unavailable", {})["pilot_release_s"] = (
            "no preempted pilot timed its release (pilots from before the sentinel script, or worker_step: true)")
    return out
