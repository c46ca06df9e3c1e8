"""Harvesting totals of a controller's state for ``/metrics``: submits, preemptions, lost steps, harvested node-hours.

Why tail the state instead of counting in memory: these figures are what ``hpcsched calc`` reports over a run
(``metrics.pilots.pilot_metrics``), and an operator compares the two; counted from the state file they span the whole
state (a restarted controller goes on from its predecessor's totals) and cost the controller's write path nothing.
The ``events`` and ``progress`` tables are append-only (no row is ever deleted), so each read asks only for the rows
past the last one it saw (``rowid > last``): a scrape costs the rows written since the previous one. The first
read after a start reads the whole history once (about 1 s per million rows).

The same rules as ``metrics.pilots.pilot_metrics``, applied row by row:

- preemptions: ``stop`` events with reason ``preempt``, except stops for a worker whose pilot this controller
  cancelled itself; a cancel recorded after the stop it explains (the manager records it once ``scancel``
  returns) cannot un-count it here, where ``calc`` reading the whole history afterwards does: the counter may be
  higher than ``calc`` by those;
- lost steps: at each new attempt of a job that reported, the last step its previous attempt reported minus the
  checkpoint step the new one resumed from (its first reported step if it says none);
- harvested node-hours: each pilot from the event that first saw it running to the one that found it gone;
  a pilot still running counts up to the read;
- workers lost (silent past ``worker_timeout_s``: their tasks fenced) and workers that left (a final Leave): the
  ``worker_lost`` and ``worker_left`` events, what an alert on a lost worker counts.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass

from hpcsched.runtime.store import Store


@dataclass(frozen=True, slots=True)
class Totals:
    submitted: int
    jobs_by_state: dict[str, int]
    preemptions: int
    lost_steps: int
    harvested_node_hours: float
    pilots_ran: int
    workers_lost: int
    workers_left: int


class StateTally:
    """Running totals over one state file (module docstring). Thread-safe: reads are serialised."""

    def __init__(self, reader: Store) -> None:
        """``reader``: a read-only connection of its own (``Store.reader()``), usable from any thread."""
        assert reader.db is not None  # an open reader
        self.db: sqlite3.Connection = reader.db
        self._reader = reader
        self._lock = threading.Lock()
        self._event_row = 0
        self._progress_row = 0
        self.preemptions = 0
        self.lost_steps = 0
        self.workers_lost = 0
        self.workers_left = 0
        self._cancelled: set[str] = set()  # workers of pilots this controller cancelled
        self._open: dict[str, float] = {}  # pilot (Slurm job) -> since when it runs
        self._seen_pilots: set[str] = set()
        self._held_s = 0.0  # node-seconds of pilots that have ended
        self._attempt: dict[str, tuple[int, int]] = {}  # job -> (its last attempt that reported, its last step)

    def read(self, now: float | None = None) -> Totals:
        with self._lock:
            self._tail_events()
            self._tail_progress()
            by_state = dict(self.db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
            now = time.time() if now is None else now
            held = self._held_s + sum(max(0.0, now - t0) for t0 in self._open.values())
            return Totals(submitted=sum(by_state.values()), jobs_by_state=by_state, preemptions=self.preemptions,
                          lost_steps=self.lost_steps, harvested_node_hours=held / 3600.0,
                          pilots_ran=len(self._seen_pilots), workers_lost=self.workers_lost,
                          workers_left=self.workers_left)

    def close(self) -> None:
        self._reader.close()

    def _tail_events(self) -> None:
        rows = self.db.execute("SELECT rowid, time, kind, detail FROM events WHERE rowid > ? AND kind IN ('stop', "
                               "'pilot', 'worker_lost', 'worker_left') ORDER BY rowid", (self._event_row,)).fetchall()
        last = self.db.execute("SELECT MAX(rowid) FROM events").fetchone()[0]
        for _, t, kind, detail in rows:
            try:
                d = json.loads(detail)
            except ValueError:  # a damaged row counts for nothing rather than stopping every later scrape
                continue
            if kind == "stop":
                if d.get("reason") == "preempt" and d.get("worker_left") not in self._cancelled:
                    self.preemptions += 1
                continue
            if kind in ("worker_lost", "worker_left"):
                self.workers_lost += kind == "worker_lost"
                self.workers_left += kind == "worker_left"
                continue
            self._pilot(t, d)
        self._event_row = max(self._event_row, last or 0)

    def _pilot(self, t: float, d: dict) -> None:
        job, event = d.get("job") or d.get("slurm_job"), d.get("event")  # a PBS pilot's "job", a Slurm one's
        if d.get("worker") and (event == "cancel" or event == "gone" and d.get("cancelled")):
            self._cancelled.add(d["worker"])
        if not job:
            return
        if (event == "running" or event == "adopt" and d.get("state") == "RUNNING") and job not in self._seen_pilots:
            self._seen_pilots.add(job)
            self._open[job] = t
        elif event == "gone" and job in self._open:
            self._held_s += max(0.0, t - self._open.pop(job))

    def _tail_progress(self) -> None:
        rows = self.db.execute("SELECT rowid, job_id, generation, step, resumed_from FROM progress WHERE rowid > ? "
                               "ORDER BY rowid", (self._progress_row,)).fetchall()
        for rowid, job, gen, step, resumed in rows:
            self._progress_row = rowid
            prev = self._attempt.get(job)
            if prev is None or gen == prev[0]:
                self._attempt[job] = (gen, max(step, prev[1]) if prev else step)
            elif gen > prev[0]:  # a new attempt's first report: what its predecessor did past the checkpoint is lost
                start = resumed if resumed is not None else step
                self.lost_steps += max(0, prev[1] - max(start, 0))
                self._attempt[job] = (gen, step)
