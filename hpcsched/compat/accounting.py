"""``--compat muri``: the reference simulator's accounting and queue lists, as a strategy of the simulator's
engine (the engine holds one accounting; the default one is ``hpcsched.sim.accounting``).

What the reference does, and this reproduces (its published numbers depend on it):

- every running job is settled at EVERY event, for the whole interval since the last one, and each interval
  costs every running job its restart charge (``EngineJob.charge``: its own, or its group's sum);
- a completion is predicted from what is left at its period ("iterations"), or, in Tiresias' loop, after its
  duration of wall time truncated to whole seconds ("wall"); no round-off is forgiven;
- the next wake-up for a service threshold is recomputed at every event as ceil(limit / gpus) - executed + now
  (with the reference's float trap defused: it loops for ever where round-off leaves a job a hair short);
- a never-run job shows the trace's duration as its remaining time where the loop did (Muri's);
- Tiresias' loop orders jobs by its queue lists, whose order is history (``ReferenceLists``).

The engine is read through a few attributes (``running``, ``active``, ``jobs``, ``thresholds``, ``queue``,
``now``, ``events``); this package does not import the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from hpcsched.compat.muri import CompatRules
from hpcsched.primitives.speed import SOLO_FACTOR

_INF = math.inf
_END, _WAKE = 0, 2  # the engine's event kinds (``hpcsched.sim.events``: END, WAKE)


class ReferenceAccounting:
    """The reference's per-event accounting for one run under ``rules`` (the policy's loop)."""

    def __init__(self, engine: Any, rules: CompatRules) -> None:
        self.e = engine
        self.rules = rules
        self.cwake = _INF  # the wake-up time armed for this step (one entry, job -1, in the engine's queue)

    def before_step(self) -> None:
        """Recompute the next threshold wake-up from every running job, as the reference does at each event."""
        e = self.e
        best = _INF
        if e.thresholds and e.running:
            now = e.now
            for j in e.running.values():
                for thr in e.thresholds:
                    if j.attained < thr:
                        w = math.ceil(thr / j.gpus) - j.executed + now
                        if w <= now:  # float round-off left it a hair short: time cannot advance to it
                            j.executed = float(math.ceil(thr / j.gpus))  # (the reference loops forever here)
                            j.attained = max(j.attained, j.executed * j.gpus, thr)
                            j.view = None
                            continue
                        best = min(best, w)
                        break
        if best != self.cwake:
            self.cwake = best
            if best < _INF:
                e.queue.schedule(best, _WAKE, -1)

    def advance(self, t: float) -> None:
        """Settle every running job for the interval since the last event, charging its restart cost."""
        e = self.e
        if not e.events:
            return
        dt = t - e.now
        if dt <= 0:
            return
        for j in e.running.values():
            j.executed += dt
            j.attained += dt * j.gpus
            j.gpu_s += dt * j.share
            j.done += max(dt - j.charge, 0.0) / j.period
            j.view = None

    def end_tol(self, t: float) -> float:
        return 0.0

    def settle(self, j: Any, t: float) -> None:
        """Nothing: every job was settled at this event already."""

    def settle_running(self, t: float) -> None:
        """Nothing: ``advance`` settled them all."""

    def remaining(self, j: Any) -> float:
        if not j.ever_ran and self.rules.new_remaining == "duration":
            return j.dur
        return max(j.total - j.done, 0.0) * j.it * SOLO_FACTOR

    def ended(self, j: Any, t: float) -> None:
        """Nothing: the reference ends a job as it stands."""

    def wake_up(self, t: float) -> None:
        """Nothing to re-arm: ``before_step`` recomputes the next wake-up."""

    def arm(self, now_running: Iterable[Any], before: dict[int, Any], t: float) -> None:
        """Predict every running job's completion from ``t`` by the loop's rule."""
        schedule = self.e.queue.schedule
        wall = self.rules.progress == "wall"
        for j in now_running:
            if wall:
                pred = max(float(int(t + j.dur - j.executed)), t)
            else:
                pred = t + max(j.total - j.done, 0.0) * j.period
            if pred != j.predicted:
                j.predicted = pred
                schedule(pred, _END, j.idx)

    def arm_started(self, j: Any, t: float) -> None:
        self.arm((j,), {}, t)


def list_position(j: Any) -> tuple[int, int]:
    """A job's place in the reference's queue lists (queue, then position in it): compat Tiresias' order."""
    return j.q, j.seq


class ReferenceLists:
    """Tiresias' loop in the reference orders jobs by per-queue lists whose order is history. A list is kept as
    (j.q, j.seq): arrivals and demotions take the next seq at the back, and after each decision the running
    jobs take seqs ahead of every waiting one, so a job preempted now is at the front of its list's waiting
    part and a waiting job's key never changes."""

    def __init__(self, engine: Any) -> None:
        self.e = engine
        self.front = self.back = 0  # next seq at the lists' front (counts down) / back (counts up)

    def arrive(self, j: Any) -> None:
        j.q, j.seq = 0, self.back
        self.back += 1

    def demote(self) -> None:
        """A running job that reached its queue's limit moves to the END of the next queue (one step per event,
        in arrival order)."""
        thr = self.e.thresholds
        for j in sorted(self.e.running.values(), key=lambda j: j.idx):
            if j.q < len(thr) and j.attained >= thr[j.q]:
                j.q += 1
                j.seq = self.back
                self.back += 1
                j.view = None

    def rank(self) -> None:
        """Policy called: every job's rank is its position in the concatenated lists (``JobView.rank_hint``)."""
        for rank, j in enumerate(sorted(self.e.active.values(), key=list_position)):
            if j.hint != rank:
                j.hint = rank
                j.view = None

    def reseq(self) -> None:
        run = sorted(self.e.running.values(), key=list_position)
        base = self.front - len(run)
        for i, j in enumerate(run):
            j.seq = base + i
        self.front = base
