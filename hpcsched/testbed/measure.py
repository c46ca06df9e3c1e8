"""What the runtime measured, read back from the controller's SQLite state (read-only).

Per job and attempt (generation): when the controller launched it (``start`` event), its progress reports
(step, time, per-stage seconds), and when it was recorded complete. From these:

- **pace**: real seconds per step between consecutive reports of one attempt. This is the wall-clock
  rate, so it includes everything a step really costs (checkpoints, reports, contention), unlike the
  per-stage timers, which only give the split between data, compute and communication;
- **sharing**: how many of the run's jobs held tasks on the same worker at the middle of a report window
  (1 = alone on its worker). On CPU workers these jobs share the node's cores;
- **group size**: how many of those had the SAME co-location key (the ``group`` of the controller's
  ``start`` event; a job launched alone has its own id) and were TRAINING, i.e. ran interleaved on the
  same slots (1 = not interleaved). For sharing a job is live from its launch to its attempt's last
  report (a starting process imports torch and loads the cores); as a group mate only from its first
  report (the one before its first step) to its last: a mate that is still starting takes no stage turn,
  so its partner trains at its solo pace meanwhile. Counting start-up as interleaving made a "pair" of a
  job that finished while its mate was still starting (an end-to-end run: 64 such windows, pace /
  pipeline period 0.42) and made the fitted factors swing between runs of the same set-up (pairs
  0.68-1.05, groups of 4 0.34-1.03 over 22 runs; 0.95-1.05 and 1.05-1.09 counting training mates only);
- **solo**: the windows where a job ran alone on its worker; failing that, alone in its group (others
  on the worker's other slots) with no mate starting on its slots either (a start-up, torch import and
  rendezvous, is the heaviest load a window can see, so such a window says little about the job's own
  pace; ``starting``); a job that only ever ran beside mates has no solo pace, and its own stage times
  (which exclude waiting for a group mate's turn) stand for it;
- **overhead**: launch decision -> first report (process start, torch import, rendezvous) plus last
  report -> recorded completion (exit, teardown, the next heartbeat), per attempt.
"""

from __future__ import annotations

import sqlite3
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.model import ResourceProfile


@dataclass
class Window:
    job_id: str  # runtime id
    generation: int
    t0: float
    t1: float
    steps: int
    data_s: float
    compute_s: float
    comm_s: float
    sharing: int = 1
    group_size: int = 1
    members: tuple[str, ...] = ()  # runtime ids of the training members of its group (itself included), sorted
    starting: int = 0  # mates launched on its slots (same co-location key) that had not reported yet

    @property
    def pace(self) -> float:
        return (self.t1 - self.t0) / self.steps

    @property
    def own_s(self) -> float:
        """Seconds per step spent in its own stages (not waiting for a turn)."""
        return self.data_s + self.compute_s + self.comm_s


@dataclass
class Measured:
    job_id: str
    windows: list[Window] = field(default_factory=list)
    startup_s: list[float] = field(default_factory=list)  # per attempt
    teardown_s: float | None = None
    attempts: int = 0

    def solo_windows(self) -> list[Window]:
        """Alone on its worker; else alone on its slots, no mate starting; else none (the module docstring)."""
        return ([w for w in self.windows if w.sharing == 1]
                or [w for w in self.windows if w.group_size == 1 and not w.starting])

    def solo_pace(self) -> float | None:
        """Median pace of the solo windows; a job that only ran interleaved: its median own stage time."""
        ws = self.solo_windows()
        if ws:
            return statistics.median(w.pace for w in ws)
        return statistics.median(w.own_s for w in self.windows) if self.windows else None

    def profile(self) -> ResourceProfile | None:
        """Median per-stage split of the same windows (real seconds)."""
        ws = self.solo_windows() or self.windows
        if not ws:
            return None
        return ResourceProfile(*(statistics.median(getattr(w, k) for w in ws) for k in ("data_s", "compute_s",
                                                                                           "comm_s")))

    def overhead_s(self) -> float:
        """One attempt's start-up plus the tear-down: what a job pays beyond its steps when run once."""
        start = statistics.median(self.startup_s) if self.startup_s else 0.0
        return start + (self.teardown_s or 0.0)


def _connect(state: Path) -> sqlite3.Connection:
    if not state.is_file():
        raise InputError(state, "no such controller state file")
    return sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=10)


def read_measurements(state: Path, job_ids: set[str]) -> dict[str, Measured]:
    """Measurements of the runtime jobs ``job_ids`` from a controller state file."""
    import json

    db = _connect(state)
    try:
        events = db.execute("SELECT time, job_id, kind, detail FROM events WHERE job_id IS NOT NULL "
                            "ORDER BY time").fetchall()
        rows = db.execute("SELECT job_id, generation, time, step, data_s, compute_s, comm_s FROM progress "
                          "ORDER BY job_id, generation, time").fetchall()
    finally:
        db.close()
    out = {j: Measured(j) for j in job_ids}
    launches: dict[tuple[str, int], tuple[float, list[str], str]] = {}
    completed: dict[str, float] = {}
    for t, jid, kind, detail in events:
        if jid not in out:
            continue
        d = json.loads(detail)
        if kind == "start":
            launches[(jid, int(d.get("generation", 0)))] = (t, list(d.get("workers", [])), str(d.get("group") or jid))
        elif kind == "completed":
            completed[jid] = t
    by_attempt: dict[tuple[str, int], list[tuple]] = {}
    for r in rows:
        if r[0] in out:
            by_attempt.setdefault((r[0], r[1]), []).append(r)
    spans: list[tuple[str, str, float, float, float, str]] = []  # job, worker, launch, first, last report, key
    for (jid, gen), rs in by_attempt.items():
        m = out[jid]
        m.attempts += 1
        launched = launches.get((jid, gen))
        if launched is not None:
            m.startup_s.append(max(0.0, rs[0][2] - launched[0]))
            spans += [(jid, w, launched[0], rs[0][2], rs[-1][2], launched[2]) for w in launched[1]]
        for a, b in zip(rs, rs[1:], strict=False):
            if b[3] > a[3] and b[2] > a[2] and (b[4] or b[5] or b[6]):  # a fast-forward jump has no stage times
                m.windows.append(Window(jid, gen, a[2], b[2], b[3] - a[3], b[4] or 0.0, b[5] or 0.0, b[6] or 0.0))
        if jid in completed and gen == max(g for (j, g) in by_attempt if j == jid):
            m.teardown_s = max(0.0, completed[jid] - rs[-1][2])
    for m in out.values():
        for w in m.windows:
            mid = (w.t0 + w.t1) / 2
            _, mine, key = launches.get((w.job_id, w.generation), (0.0, [], w.job_id))
            live = [(j, f, k) for j, wk, a, f, b, k in spans if j != w.job_id and wk in mine and a <= mid <= b]
            w.sharing = 1 + len({j for j, _, _ in live})
            w.members = tuple(sorted({w.job_id} | {j for j, f, k in live if k == key and f <= mid}))
            w.starting = len({j for j, f, k in live if k == key and f > mid})
            w.group_size = len(w.members)
    return out
