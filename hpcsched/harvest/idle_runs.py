"""The idle pool of a replay as runs of node indices, so no step costs per node of the machine."""


import bisect
from collections.abc import Iterator, Sequence

from hpcsched.milp.mapping import NodeRuns, Run


class IdleRuns:
    """The idle pool as runs of node indices, in the order decisions hand nodes out: longest idle first.

    Each event's joined runs form a batch appended at the end (dict order is join order); nodes that
    leave are cut out of their runs wherever they are. Runs are found by bisecting their sorted starts,
    so an event costs per run it touches and a decision walks only the front of the pool: nothing is
    per node, whatever the machine's size.
    """

    def __init__(self) -> None:
        self.starts: list[int] = []  # every run's first index, sorted
        self.run: dict[int, tuple[int, int]] = {}  # first index -> (end, batch)
        self.batches: dict[int, list[int]] = {}  # batch -> first indices of its runs, in hand-out order
        self.ordered: dict[int, bool] = {}  # batch -> its runs are in index order (bisect) or as given
        self.joined_at: dict[int, float | None] = {}  # batch -> time it joined (None: idle at the start)
        self.size = 0
        self._next = 0

    def add(self, runs: Sequence[Run], now: float | None, names: Sequence[str]) -> None:
        """A batch of nodes joining at ``now``, handed out after every node already idle."""
        if not runs:
            return
        batch, los = self._next, []
        self._next += 1
        for lo, hi in runs:
            k = bisect.bisect_right(self.starts, lo)
            if (k > 0 and self.run[self.starts[k - 1]][0] > lo) or (k < len(self.starts) and self.starts[k] < hi):
                clash = next(x for x in range(lo, hi) if self.covers(x, x + 1))
                raise ValueError(f"node {names[clash]} joins the idle pool at {now} but is already in it")
            self.starts.insert(k, lo)
            self.run[lo] = (hi, batch)
            los.append(lo)
            self.size += hi - lo
        self.batches[batch] = los
        self.ordered[batch] = all(a < b for a, b in zip(los, los[1:], strict=False))
        self.joined_at[batch] = now

    def remove(self, a: int, b: int) -> list[tuple[int, int, float | None]]:
        """Cut [a, b) out of the pool; the pieces cut, ascending, with the time each joined."""
        cut: list[tuple[int, int, float | None]] = []
        k = max(bisect.bisect_right(self.starts, a) - 1, 0)
        while k < len(self.starts) and self.starts[k] < b:
            lo = self.starts[k]
            hi, batch = self.run[lo]
            if hi <= a:
                k += 1
                continue
            c, d = max(lo, a), min(hi, b)
            cut.append((c, d, self.joined_at[batch]))
            pieces = [(x, y) for x, y in ((lo, c), (d, hi)) if y > x]
            del self.run[lo]
            self.starts[k:k + 1] = [x for x, _ in pieces]
            for x, y in pieces:
                self.run[x] = (y, batch)
            los = self.batches[batch]
            i = bisect.bisect_left(los, lo) if self.ordered[batch] else los.index(lo)
            los[i:i + 1] = [x for x, _ in pieces]
            if not los:
                del self.batches[batch], self.ordered[batch], self.joined_at[batch]
            self.size -= d - c
            k += len(pieces)
        return cut

    def covers(self, a: int, b: int) -> bool:
        """Is every node of [a, b) in the pool?"""
        k = bisect.bisect_right(self.starts, a) - 1
        while a < b:
            if k < 0 or k >= len(self.starts) or self.starts[k] > a:
                return False
            hi = self.run[self.starts[k]][0]
            if hi <= a:
                return False
            a, k = hi, k + 1
        return True

    def walk(self) -> Iterator[Run]:
        """Every idle node in hand-out order, as runs."""
        for los in self.batches.values():
            for lo in los:
                yield lo, self.run[lo][0]

    def nodes(self, names: Sequence[str]) -> NodeRuns:
        return NodeRuns(self.walk(), names)
