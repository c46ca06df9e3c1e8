"""A replay's progress as ``progress(done, total)`` in event units, at most four times a second."""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class ReplayProgress:
    """The replay stops at the last event or once every elastic job is done, whichever comes first, so
    ``done`` is the events replayed or, when further along, the share of the jobs' samples done scaled to
    the events: an ETA from events alone said a minute for a replay that ended five seconds later.
    ``need``: the jobs' total samples; ``samples_done()``: the samples done so far (summed only when shown).
    """

    def __init__(self, progress: Callable[[int, int], None] | None, total: int, need: float,
                 samples_done: Callable[[], float]) -> None:
        self.progress, self.total, self.samples_done = progress, total, samples_done
        self.need = need or 1.0
        self.shown = 0
        self.last = -math.inf

    def __call__(self, k: int) -> None:
        if self.progress is None or (now := time.monotonic()) - self.last < 0.25:
            return
        self.last = now
        work = max(self.samples_done(), 0.0) / self.need
        self.shown = max(self.shown, k, min(int(work * self.total), self.total))
        self.progress(self.shown, self.total)
