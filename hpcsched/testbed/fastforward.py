"""Fast-forward (``hpcsched testbed --fast-forward N``): train N real steps, then skip ahead, like Muri's testbed.

A replay in real time spends nearly all of its wall time on steady-state training that the simulator
models well (a job at its measured pace). Fast-forward keeps everything else real and skips that part:

- Real time runs as usual: submissions, the controller's decisions, start-up, preemption, tear-down.
- A **jump** happens only when the run is steady: no job state has changed for ``settle_s``, no job is
  stopping or tearing down, and every running job that has trained in its current attempt has trained at
  least N real steps since the last jump (its measured pace, wall seconds per step, comes from those).
- A job still **starting** (launched, no trained step yet) does not hold the run back: its start-up stays
  real, and the seconds skipped while it started are owed to it and granted as steps (at its pace) at the
  first jump after it has trained N steps, as if it had trained through them. Its virtual start-up is
  thus its real one. What it is owed never passes its remaining steps at the fastest pace expected of
  it (its workload's nominal pace, or the fastest its workload has shown in this run): jumps stop there
  until it trains, so it never finishes later than it would have.
- The jump skips ``J`` real-equivalent seconds: at most ``max_jump_s``, never past the next submission
  and never past the earliest finish of a running job (its remaining steps x its pace), so every event
  the policy reacts to still happens in real time. Each running job is granted ``round(J / pace)`` steps
  (the earliest finisher exactly its remaining steps) by raising its credit in the ``fastforward`` file
  of its checkpoint dir; the workload adds the credit to its step counter at the next step boundary and
  reports the jump apart from its trained steps (``workloads/_common.py: FastForward``). The controller
  sees the steps done jump as from any progress report: its view of remaining work stays right.
- The run's **virtual clock** is real time plus the seconds skipped so far; ``jobs.csv`` maps it to
  trace seconds exactly as a real-time run maps real time (``Replay.virtual``).

Use it for long jobs (thousands of steps) so a long trace fits in minutes; jobs of a few dozen steps are
mostly start-up and gain nothing. It needs the controller's state file (pace) and its checkpoint root
(credit files) on this machine: ``--local`` has both. Policies that age jobs by real attained time
(las, tiresias, muri-l) see the skipped time as not attained: prefer fifo, srtf, srsf and muri-s.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

CREDIT_FILE = "fastforward"  # the name workloads/_common.py FastForward reads


@dataclass(frozen=True)
class Jump:
    real_t: float  # unix time the credits were granted
    seconds: float  # real-equivalent seconds skipped
    grants: dict[str, int]  # runtime job id -> steps


@dataclass(frozen=True)
class Pace:
    """What a running job's reports since the last jump say."""

    real_steps: int  # trained steps since the last jump (jump reports excluded)
    pace_s: float | None  # wall seconds per trained step, over those
    step: int  # latest reported step
    trained: bool  # this attempt has trained at all (else it is still starting)


@dataclass
class FastForwarder:
    """Decides and grants the jumps of one replay; ``replay`` calls ``step`` at every poll."""

    real_steps: int  # N: trained steps per job between jumps
    state: Path  # the controller's SQLite state
    ckpt_root: Path  # the controller's checkpoint root: one folder per runtime job id
    max_jump_s: float = 30.0  # real-equivalent seconds one jump may skip (bounds pace drift)
    settle_s: float = 1.0  # job states unchanged this long before a jump (the controller acts first)
    jumps: list[Jump] = field(default_factory=list)
    credit: dict[str, int] = field(default_factory=dict)
    owed: dict[str, float] = field(default_factory=dict)  # skipped seconds a starting job has not been granted
    nominal: dict[str, tuple[object, float]] = field(default_factory=dict)  # runtime id -> (workload, s/step)
    fastest: dict[object, float] = field(default_factory=dict)  # workload -> fastest pace measured in this run
    _signature: tuple = ()
    _changed_at: float = 0.0

    def skipped(self, t: float) -> float:
        """Seconds skipped by jumps granted at or before ``t``."""
        return sum(j.seconds for j in self.jumps if j.real_t <= t)

    def step(self, now: float, infos: dict, ours: set[str], until_submit: float | None) -> Jump | None:
        """Jump if the run is steady. ``infos``: runtime id -> JobInfo; ``ours``: the replay's runtime ids;
        ``until_submit``: virtual seconds to the next submission (None when all are submitted)."""
        mine = {rid: infos[rid] for rid in ours if rid in infos}
        sig = tuple(sorted((rid, i.state, i.generation) for rid, i in mine.items()))
        if sig != self._signature:
            self._signature, self._changed_at = sig, now
            return None
        if now - self._changed_at < self.settle_s or any(i.state == "stopping" for i in mine.values()):
            return None
        running = {rid: i for rid, i in mine.items() if i.state == "running"}
        pending = any(i.state == "pending" for i in mine.values())
        if not running:  # idle cluster: skip to the next submission; queued jobs are the controller's to start
            if pending or until_submit is None or until_submit <= 0:
                return None
            return self._grant(now, until_submit, {})
        since = self.jumps[-1].real_t if self.jumps else 0.0
        paces = read_paces(self.state, {rid: i.generation for rid, i in running.items()}, since)
        steady, starting, finish = {}, [], []
        for rid, i in running.items():
            p = paces.get(rid)
            if p is None or not p.trained:
                starting.append(rid)
                left = i.steps_total - (p.step if p is not None else i.steps_done)
                finish.append(left * self._expected(rid) - self.owed.get(rid, 0.0))
                continue
            if p.pace_s is None or p.real_steps < self.real_steps or p.step >= i.steps_total:
                return None  # not yet N steps since the last jump, or tearing down
            steady[rid] = p
            kind = self.nominal.get(rid, (rid, 0.0))[0]
            self.fastest[kind] = min(self.fastest.get(kind, p.pace_s), p.pace_s)
            finish.append((i.steps_total - p.step) * p.pace_s - self.owed.get(rid, 0.0))
        if not steady:
            return None
        jump = max(0.0, min([self.max_jump_s, *finish] + ([until_submit] if until_submit is not None else [])))
        grants = {}
        for rid, p in steady.items():
            rem = running[rid].steps_total - p.step
            due = jump + self.owed.get(rid, 0.0)
            grants[rid] = rem if rem * p.pace_s <= due else min(rem, round(due / p.pace_s))
        grants = {rid: g for rid, g in grants.items() if g > 0}
        if not grants:
            return None
        for rid in steady:
            self.owed.pop(rid, None)
        for rid in starting:
            self.owed[rid] = self.owed.get(rid, 0.0) + jump
        return self._grant(now, jump, grants)

    def _expected(self, rid: str) -> float:
        """The fastest pace a job that has not trained yet may show (0 when nothing is known: no jumps)."""
        kind, nominal = self.nominal.get(rid, (None, 0.0))
        return min(nominal, self.fastest.get(kind, nominal))

    def _grant(self, now: float, seconds: float, grants: dict[str, int]) -> Jump:
        for rid, g in grants.items():
            self.credit[rid] = self.credit.get(rid, 0) + g
            write_credit(self.ckpt_root / rid, self.credit[rid])
        j = Jump(now, seconds, grants)
        self.jumps.append(j)
        return j


def write_credit(ckpt_dir: Path, credit: int) -> None:
    """Atomically (rename): the workload never reads half a number."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_dir / f".{CREDIT_FILE}.tmp{os.getpid()}"
    tmp.write_text(f"{credit}\n")
    os.replace(tmp, ckpt_dir / CREDIT_FILE)


def read_paces(state: Path, generation: dict[str, int], since: float) -> dict[str, Pace]:
    """Trained steps and pace of each job's current attempt from its reports at or after ``since``.

    A window counts when its closing report carries stage times: a jump report has none (and the report
    that opens an attempt closes no window), so skipped steps never pass for fast training. ``trained``
    looks at the whole attempt.
    """
    if not generation:
        return {}
    db = sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=10)
    try:
        marks = ",".join("?" * len(generation))
        rows = db.execute(f"SELECT job_id, generation, time, step, data_s + compute_s + comm_s FROM progress "
                          f"WHERE job_id IN ({marks}) ORDER BY job_id, time", tuple(generation)).fetchall()
    finally:
        db.close()
    by: dict[str, list[tuple]] = {}
    for r in rows:
        if r[1] == generation[r[0]]:
            by.setdefault(r[0], []).append(r)
    out = {}
    for rid, rs in by.items():
        steps, secs, trained = 0, 0.0, False
        for a, b in zip(rs, rs[1:], strict=False):
            if b[4] and b[3] > a[3] and b[2] > a[2]:
                trained = True
                if a[2] >= since:
                    steps, secs = steps + b[3] - a[3], secs + b[2] - a[2]
        out[rid] = Pace(steps, secs / steps if steps else None, rs[-1][3], trained)
    return out
