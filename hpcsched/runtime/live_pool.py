"""The live workers as the scheduling step sees them, kept between steps, and the bounded set it plans over.

Why: at 10,000 workers a step that re-read, sorted and converted every worker row, summed every worker's free slots
and handed all of them to the decision core (which builds a free-slot map and scans candidates over them) spent
most of its ~200 ms there, though a step starts a few hundred jobs at most. The live set changes only when a worker
registers, leaves or is lost (``Controller._workers_changed``), so the rows, the planner's ``WorkerState`` views and
the index below are rebuilt only then; a step's own work grows with the workers that hold slots and with the jobs it
plans, not with the fleet.

The planned-over set (``for_step``) is every live worker that holds slots, plus, for each shape of worker (its
launchers, GPU type and slot count: what decides which jobs may go there), the first ``demand + 1`` workers of that
shape that hold none, in id order, where ``demand`` is the most processes the step's jobs could take. Why this
changes no decision of consolidated placement (the only placement it is used with, ``Stepping._bounded_pool``):
each placement touches at least one process's worth of a worker, so at most ``demand`` of a shape's idle workers
are touched in a step, and one shown idle worker of that shape is left untouched, with an id below every idle
worker left out. First fit, whole idle nodes and in-place growth all take workers in id order, so each would take
that shown worker (same launchers, type and slots, all free) before any one left out. The slot total the core
admits against is smaller but still covers every job at its largest size, so admission and greedy growth come out
the same; where a shape has fewer idle workers than that, all of them are shown.
"""

from __future__ import annotations

from collections.abc import Iterable

from hpcsched.primitives.state import WorkerState
from hpcsched.runtime.store_rows import WorkerRow

Shape = tuple[tuple[str, ...], str, int]  # (launchers, GPU type, slots)


class LivePool:
    """The live workers' rows (in id order), their planner views, their slots and the idle-worker index by shape."""

    def __init__(self) -> None:
        self.rows: list[WorkerRow] = []
        self.views: dict[str, WorkerState] = {}
        self.slots: dict[str, int] = {}
        self.total = 0
        self._shapes: dict[Shape, list[str]] = {}
        self.rebuilds = 0  # times the live set changed and was read again (a registration storm: at most one a step)

    def rebuild(self, rows: Iterable[WorkerRow]) -> None:
        """The live set changed: ``rows`` are the live workers (any order)."""
        self.rows = sorted(rows, key=lambda w: w.id)
        self.views = {w.id: WorkerState(w.id, w.slots, w.launchers, gpu_type=w.gpu_type) for w in self.rows}
        self.slots = {w.id: w.slots for w in self.rows}
        self.total = sum(self.slots.values())
        self._shapes = {}
        for w in self.rows:
            self._shapes.setdefault((tuple(sorted(w.launchers)), w.gpu_type, w.slots), []).append(w.id)
        self.rebuilds += 1

    def __len__(self) -> int:
        return len(self.rows)

    def free_slots(self, used: dict[str, int]) -> int:
        """Free slots over the live workers, given the slots held per worker: O(workers holding slots)."""
        slots = self.slots
        return self.total - sum(min(k, slots[w]) for w, k in used.items() if w in slots and k > 0)

    def everyone(self) -> tuple[WorkerState, ...]:
        return tuple(self.views.values())

    def for_step(self, used: dict[str, int], demand: int) -> tuple[WorkerState, ...]:
        """The workers a step plans over (rules in the module docstring): O(workers holding slots + shapes x demand)."""
        views = self.views
        out = [views[w] for w in used if w in views]
        for ids in self._shapes.values():
            shown = 0
            for wid in ids:
                if wid in used:
                    continue
                out.append(views[wid])
                shown += 1
                if shown > demand:
                    break
        return tuple(out)
