"""A running median over a bounded window of values with multiplicities: the causal Tfwd predictor."""


import bisect
from collections import deque


class MedianWindow:
    """Median of the last ``size`` idle-stretch lengths: the causal Tfwd predictor.

    A preemption can end thousands of stretches of one length at once (a big log job takes the nodes
    that joined together), so lengths are kept as (length, count) runs: ``add(x, count)`` is exactly
    ``count`` single adds, at a cost per run.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.order: deque[list[float | int]] = deque()  # [length, count], oldest first
        self.counts: dict[float, int] = {}
        self.keys: list[float] = []  # distinct lengths held, sorted
        self.total = 0
        self._median: float | None = None
        self._stale = False

    def add(self, x: float, count: int = 1) -> None:
        if count <= 0:
            return
        self.order.append([x, count])
        self._count(x, count)
        self.total += count
        while self.total > self.size:
            head = self.order[0]
            drop = min(int(head[1]), self.total - self.size)
            self._count(float(head[0]), -drop)
            self.total -= drop
            head[1] = int(head[1]) - drop
            if head[1] == 0:
                self.order.popleft()
        self._stale = True

    def _count(self, x: float, d: int) -> None:
        n = self.counts.get(x, 0) + d
        if n == 0:
            del self.counts[x]
            del self.keys[bisect.bisect_left(self.keys, x)]
            return
        if x not in self.counts:
            bisect.insort(self.keys, x)
        self.counts[x] = n

    def median(self) -> float | None:
        if self.total < 10:
            return None
        if self._stale:
            k, seen = self.total // 2, 0
            for x in self.keys:
                seen += self.counts[x]
                if seen > k:
                    self._median = x
                    break
            self._stale = False
        return self._median

