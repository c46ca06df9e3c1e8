"""The simulator's own accounting (the default mode): how a running job's progress, service and completion are
settled, and when the engine must wake up for them.

Lazy: a job is settled only when it is looked at (a decision, its completion, a threshold crossing), from the
last time it was settled, so an event costs what it touches. A start, a resume or a move pays the job's restart
cost as wall time in which it makes no progress (``warm``); its completion is predicted from what is left at its
period and kept as an event (``sim.events``); a policy's service thresholds (Tiresias) are events too. The
reference simulator's per-event accounting is the other strategy (``hpcsched.compat.accounting``); the engine
holds one of them and calls the same methods.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hpcsched.sim.events import END, WAKE

if TYPE_CHECKING:
    from hpcsched.sim.jobrun import EngineJob

_INF = float("inf")


class LazyAccounting:
    """The default mode's accounting over one engine's state (its jobs, running set, thresholds, queue)."""

    def __init__(self, engine: Any) -> None:
        self.e = engine
        self.cwake = _INF  # unused here: only the reference accounting has a wake-up of its own

    def before_step(self) -> None:
        """Nothing to arm: completions and crossings are scheduled when they are predicted."""

    def advance(self, t: float) -> None:
        """Nothing: jobs are settled when looked at."""

    def end_tol(self, t: float) -> float:
        return 1e-9 * max(1.0, abs(t))

    def settle(self, j: EngineJob, t: float) -> None:
        """Settle one running job's progress up to ``t``: its restart cost first, then iterations at its period."""
        dt = t - j.since
        if dt > 0:
            j.executed += dt
            j.attained += dt * j.gpus
            j.gpu_s += dt * j.share
            w = min(dt, j.warm)
            j.warm -= w
            j.done += (dt - w) / j.period
            j.view = None
        j.since = t

    def settle_running(self, t: float) -> None:
        settle = self.settle
        for j in self.e.running.values():
            settle(j, t)

    def remaining(self, j: EngineJob) -> float:
        """Solo seconds left as a policy sees them (``JobView.remaining_s``)."""
        return max(j.total - j.done, 0.0) * j.it * j.slow

    def ended(self, j: EngineJob, t: float) -> None:
        """A job whose completion is due: settled, with the round-off of its last iterations forgiven."""
        self.settle(j, t)
        if abs(j.done - j.total) <= 1e-6 * max(1.0, j.total):
            j.done = j.total

    def wake_up(self, t: float) -> None:
        """Jobs whose attained service reaches a threshold now: settle them exactly onto it, arm the next."""
        e = self.e
        while True:
            due = e.queue.take_wakes(t)
            if not due:
                return
            for idx in due:
                j = e.jobs[idx]
                self.settle(j, t)
                for thr in e.thresholds:  # settle float round-off exactly onto the threshold crossed
                    if abs(j.attained - thr) <= 1e-9 * thr:
                        j.attained = thr
                self.push_wake(j)

    def push_wake(self, j: EngineJob) -> None:
        j.wake = _INF
        for thr in self.e.thresholds:
            if j.attained < thr:
                j.wake = j.since + (thr - j.attained) / j.gpus
                self.e.queue.schedule(j.wake, WAKE, j.idx)
                return

    def arm(self, now_running: Iterable[EngineJob], before: dict[int, Any], t: float) -> None:
        """After a decision: every running job's completion (re)predicted from ``t``, a new one's first crossing.
        Inline: it runs for every running job at every decision."""
        schedule, thresholds = self.e.queue.schedule, self.e.thresholds
        for j in now_running:
            j.since = t
            pred = t + j.warm + max(j.total - j.done, 0.0) * j.period
            if pred != j.predicted:
                j.predicted = pred
                schedule(pred, END, j.idx)
            if thresholds and j.idx not in before:
                self.push_wake(j)

    def arm_started(self, j: EngineJob, t: float) -> None:
        """A job started outside a decision (every job fits): its completion and first crossing."""
        self.arm((j,), {}, t)
