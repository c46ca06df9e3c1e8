"""What happened during a harvest, kept two ways: an event log and the results ``hpcsched calc`` reads.

``events.csv`` has one row per event (pool join/leave, decision, start, running, stop, preempt,
finish) with the harvester's clock, so a run can be audited line by line. ``jobs.csv``/``meta.json``
(``hpcsched.results``) carry one row per elastic job with the node-seconds it held, and the pool's
integral over time as ``capacity_node_seconds``, so ``calc`` reports harvested utilisation. Extra
meta keys: ``harvested_node_hours``, ``preemptions``, ``lost_steps`` (per preemption), ``mode``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hpcsched.results import JobResult, write_results

EVENT_COLUMNS = ("t", "event", "job", "nodes", "pool", "step", "ckpt_step", "lost_steps", "detail")


@dataclass
class JobTally:
    """Per elastic job: when it first ran and ended, node-seconds held, preemptions and work lost."""

    job_id: str
    start: float | None = None
    end: float | None = None
    max_nodes: int = 0
    node_seconds: float = 0.0
    preemptions: int = 0
    lost_steps: list[int] = field(default_factory=list)
    finished: bool = False


class Recorder:
    """Appends events to ``out_dir/events.csv`` as they happen; ``finish`` writes jobs.csv/meta.json."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] = (out_dir / "events.csv").open("w", newline="")
        self._csv = csv.writer(self._fh)
        self._csv.writerow(EVENT_COLUMNS)
        self.tallies: dict[str, JobTally] = {}
        self.capacity_node_seconds = 0.0
        self._last_t: float | None = None
        self._last_pool = 0

    def event(self, t: float, event: str, job: str = "", nodes: tuple[str, ...] = (), pool: int | None = None,
              step: int | None = None, ckpt_step: int | None = None, lost_steps: int | None = None,
              detail: str = "") -> None:
        self._csv.writerow([f"{t:.3f}", event, job, " ".join(nodes), "" if pool is None else pool,
                            "" if step is None else step, "" if ckpt_step is None else ckpt_step,
                            "" if lost_steps is None else lost_steps, detail])
        self._fh.flush()

    def pool_size(self, t: float, size: int) -> None:
        """Integrate the pool size over time (called at every poll)."""
        if self._last_t is not None:
            self.capacity_node_seconds += self._last_pool * (t - self._last_t)
        self._last_t, self._last_pool = t, size

    def tally(self, job_id: str) -> JobTally:
        return self.tallies.setdefault(job_id, JobTally(job_id))

    def finish(self, meta: dict[str, Any]) -> Path:
        self._fh.close()
        rows = [JobResult(job_id=t.job_id, submit=0.0, start=t.start, end=t.end if t.finished else None,
                          nodes=t.max_nodes, node_seconds=t.node_seconds,
                          status="completed" if t.finished else "unfinished") for t in self.tallies.values()]
        held = sum(t.node_seconds for t in self.tallies.values())
        lost = [x for t in self.tallies.values() for x in t.lost_steps]
        return write_results(self.out_dir, rows, {
            "tool": "slurm-harvest",
            "capacity_node_seconds": self.capacity_node_seconds,
            "harvested_node_hours": held / 3600.0,
            "preemptions": sum(t.preemptions for t in self.tallies.values()),
            "lost_steps": lost,
            "max_lost_steps": max(lost, default=0),
            **meta,
        })
