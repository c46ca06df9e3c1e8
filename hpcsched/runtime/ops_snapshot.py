"""One consistent reading of a running controller's pool for what operators see (``/metrics``, the status page).

Why one module: the Prometheus collector, the status page and the utilisation sampler read the same things (who is
alive, leaving or lost, the slots held, the node source's pilots and nodes), and each of them must cost the
controller little. The lock is held only to copy the few live tables (who was heard, who is leaving, the worker
rows, the live allocations): everything computed from them (slots in use with co-location, the counts) is done
after it is released, so a scrape never holds a heartbeat behind a computation.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hpcsched.runtime.launch import slot_use

if TYPE_CHECKING:
    from hpcsched.runtime.server import ControllerServer

WORKER_STATES = ("alive", "leaving", "lost")
LOCK_WAIT_S = 1.0  # a read waits this long for the controller's lock before it answers with the previous snapshot


@dataclass(frozen=True, slots=True)
class WorkerLine:
    """A worker as the status page lists it; ``pilot``: its external (Slurm) job, node and state, or None."""

    id: str
    host: str
    state: str
    slots: int
    used: int
    gpus: int
    gpu_type: str
    pilot: tuple[str, str, str] | None


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """The pool at ``time`` (wall clock). ``slots_total``/``slots_used``: over the live workers (alive or leaving);
    ``nodes``: the node source's nodes -> (what each does for the controller or why it is not used, its job)."""

    time: float
    workers_by_state: Mapping[str, int]
    slots_total: int
    slots_used: int
    pilots_by_state: Mapping[str, int]
    source: str
    nodes: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    workers: tuple[WorkerLine, ...] = ()  # only when asked for (``PoolReader.read(lines=True)``)

    @property
    def utilisation(self) -> float:
        """Slots in use over live slots (0 with no live worker)."""
        return self.slots_used / self.slots_total if self.slots_total else 0.0


class PoolReader:
    """Reads ``PoolSnapshot`` s of one controller server (slots counted as the scheduling step counts them,
    ``launch.slot_use``, with the co-location keys stored with the jobs). Not thread-safe: its owner serialises
    reads.

    A controller so busy that its lock is not free within ``wait_s`` (a long scheduling step, a registration storm)
    is when an operator most needs its metrics: the read then answers with the previous snapshot, whose ``time``
    says how old it is (``hpcsched_pool_age_seconds``), and counts it in ``stale_reads``, instead of waiting."""

    def __init__(self, server: ControllerServer, wait_s: float = LOCK_WAIT_S) -> None:
        self.server = server
        self.wait_s = wait_s
        self.stale_reads = 0
        self._last: dict[bool, PoolSnapshot] = {}  # the previous snapshot, with and without worker lines

    def read(self, lines: bool = False) -> PoolSnapshot:
        ctl = self.server.ctl
        last = self._last.get(lines)
        if not ctl.lock.acquire(timeout=self.wait_s if last is not None else -1):
            self.stale_reads += 1
            assert last is not None
            return last
        try:  # copies only: the rows are immutable snapshots (memstore), so copying the dicts is enough
            heard = set(ctl.last_seen)
            leaving = set(ctl.leaving)
            rows = ctl.store.workers()
            allocs = ctl.store.live_allocations()
            keys = ctl.store.groups({a.job_id for a in allocs})
        finally:
            ctl.lock.release()
        used = slot_use(allocs, keys)[0]
        view = self.server.source.view()
        states: Counter[str] = Counter()
        total = busy = 0
        out: list[WorkerLine] = []
        for w in rows:
            state = ("leaving" if w.id in leaving else "alive") if w.id in heard else "lost"
            states[state] += 1
            if state != "lost":
                total += w.slots
                busy += min(used.get(w.id, 0), w.slots)
            if lines:
                out.append(WorkerLine(w.id, w.host, state, w.slots, used.get(w.id, 0), w.gpus, w.gpu_type,
                                      view.workers.get(w.id)))
        pilots = Counter(p[2].lower() for p in view.workers.values() if p[2] != "GONE")
        snap = PoolSnapshot(time=time.time(), workers_by_state={s: states.get(s, 0) for s in WORKER_STATES},
                            slots_total=total, slots_used=busy, pilots_by_state=dict(pilots), source=view.name,
                            nodes=dict(view.nodes), workers=tuple(out))
        self._last[lines] = snap
        return snap


def node_use_class(use: str) -> str:
    """A node's use text (``idle, not claimed: max_pilots (4) reached``) as a short label for a metric: its words
    before the first punctuation, so a label's values stay few (the numbers in the text would make a series each)."""
    head = use
    for sep in ",:(;":
        head = head.split(sep, 1)[0]
    return head.strip().lower()[:40] or "unknown"
