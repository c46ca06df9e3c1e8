"""A replay's event rows (``replay_config.EVENT_COLUMNS``) kept as typed columns, read back as the tuples they were.

A replay on a 10^7-job log makes 3.3 million rows; as Python tuples (~250 bytes each) they alone passed 800 MB.
Here each column is a flat array (8 bytes a float, 4 an int, 1 a status code): about 90 bytes a row. Rows are
gathered in a chunk of tuples and moved into the columns a chunk at a time, so appending costs what a list
append does. A value whose Python type is not its column's (an ``int`` time from a hand-made timeline, a rate
summed over no jobs: ``0``) is kept aside as it was, so every row reads back equal and of the same types
(``repr`` included: tests hash the rows).
"""

from __future__ import annotations

import bisect
import csv
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import TextIO, overload

import numpy as np

_CHUNK = 65_536  # rows held as tuples before they move into the columns


class EventRows(Sequence[tuple[object, ...]]):
    """Rows of a fixed column layout: ``kinds`` has one letter a column, ``d`` float, ``i`` int, ``s`` str."""

    def __init__(self, kinds: str) -> None:
        self.kinds = kinds
        self.cols: list[array[int] | array[float]] = [array("b" if k == "s" else k) for k in kinds]
        self.codes: dict[str, int] = {}  # status strings in the ``s`` columns, as small codes
        self.names: list[str] = []
        self.odd: dict[tuple[int, int], object] = {}  # (row, column) -> a value not of its column's type
        # rows whose value in a float column is an int the float holds exactly (a rate summed over no jobs is the
        # int 0: on a log where the jobs arrive late that is most rows, so 8 bytes a row, not a dict entry)
        self.ints: dict[int, array[int]] = {}
        self.stored = 0  # rows moved into the columns
        self.chunk: list[tuple[object, ...]] = []

    def append(self, row: tuple[object, ...]) -> None:
        self.chunk.append(row)
        if len(self.chunk) >= _CHUNK:
            self._store()

    def _store(self) -> None:
        rows, base = self.chunk, self.stored
        if not rows:
            return
        for c, (kind, col, values) in enumerate(zip(self.kinds, self.cols, zip(*rows, strict=True), strict=True)):
            if kind == "s":
                codes = self.codes
                for v in values:
                    if v not in codes:
                        codes[v] = len(self.names)  # type: ignore[index]
                        self.names.append(v)  # type: ignore[arg-type]
                col.extend(codes[v] for v in values)  # type: ignore[index]
                continue
            want = float if kind == "d" else int
            odd = [i for i, v in enumerate(values) if type(v) is not want]
            if odd:
                as_float: set[int] = set()
                for i in odd:
                    v = values[i]
                    if kind == "d" and type(v) is int and float(v) == v:
                        self.ints.setdefault(c, array("q")).append(base + i)
                        as_float.add(i)
                    else:
                        self.odd[(base + i, c)] = v
                # an int kept in ``ints`` is stored as its float (read back as ``int`` of it); others as 0
                col.extend(want(v) if type(v) is want or i in as_float else 0  # type: ignore[arg-type, misc]
                           for i, v in enumerate(values))
            else:
                col.extend(values)  # type: ignore[arg-type]
        self.stored += len(rows)
        self.chunk = []

    def __len__(self) -> int:
        return self.stored + len(self.chunk)

    def extend(self, columns: Sequence[object], n: int) -> None:
        """``n`` rows given a column at a time, read back as if each row had been appended: a column is a numpy
        array of ``n`` values of its kind (float, int; read back as Python ``float`` and ``int``), a sequence of
        ``n`` strings for a status column, or one Python value every row shares (kept with its type, as
        ``append`` keeps it)."""
        self._store()
        base = self.stored
        for c, (kind, col, v) in enumerate(zip(self.kinds, self.cols, columns, strict=True)):
            code = np.dtype(col.typecode)
            if kind == "s":
                values = [v] * n if isinstance(v, str) else list(v)  # type: ignore[call-overload]
                for x in dict.fromkeys(values):
                    if x not in self.codes:
                        self.codes[x] = len(self.names)
                        self.names.append(x)
                if isinstance(v, str):
                    col.frombytes(np.full(n, self.codes[v], dtype=code).tobytes())
                else:
                    col.extend(self.codes[x] for x in values)
            elif isinstance(v, np.ndarray):
                if len(v) != n:
                    raise ValueError(f"column {c} has {len(v)} values for {n} rows")
                col.frombytes(np.ascontiguousarray(v, dtype=code).tobytes())
            elif type(v) is (float if kind == "d" else int):
                col.frombytes(np.full(n, v, dtype=code).tobytes())
            elif kind == "d" and type(v) is int and float(v) == v:
                self.ints.setdefault(c, array("q")).frombytes(np.arange(base, base + n, dtype=np.int64).tobytes())
                col.frombytes(np.full(n, float(v), dtype=code).tobytes())
            else:
                self.odd.update(((base + i, c), v) for i in range(n))
                col.frombytes(np.zeros(n, dtype=code).tobytes())
        self.stored += n

    def write_csv(self, f: TextIO, fmt: Callable[[float], str]) -> None:
        """Every row as ``csv.writer`` writes it with floats shown by ``fmt`` and other values by ``str``, the
        stored rows a column at a time: formatting 3.3 million rows one by one took longer than the replay's
        decisions. The result is byte for byte that of ``writerow`` (numbers and plain words need no quoting;
        a status that would is written by ``csv.writer``)."""
        w = csv.writer(f)

        def text(v: object) -> str:
            return fmt(v) if isinstance(v, float) else str(v)

        plain = not any(set(x) & set(',"\r\n') or not x for x in self.names)
        by_chunk: dict[int, list[tuple[int, int, object]]] = {}
        for (k, c), v in self.odd.items():
            by_chunk.setdefault(k // _CHUNK, []).append((k, c, v))
        for a in range(0, self.stored, _CHUNK):
            b = min(a + _CHUNK, self.stored)
            if not plain:
                w.writerows([text(v) for v in self._row(k)] for k in range(a, b))
                continue
            cols: list[list[str]] = []
            for kind, col in zip(self.kinds, self.cols, strict=True):
                part = col[a:b]
                if kind == "d":
                    cols.append([fmt(v) for v in part])
                elif kind == "s":
                    cols.append([self.names[int(v)] for v in part])
                else:
                    cols.append(list(map(str, part)))
            for c, rows in self.ints.items():
                for k in rows[bisect.bisect_left(rows, a):bisect.bisect_left(rows, b)]:
                    cols[c][k - a] = str(int(self.cols[c][k]))
            for k, c, v in by_chunk.get(a // _CHUNK, ()):
                cols[c][k - a] = text(v)
            f.write("".join([",".join(r) + "\r\n" for r in zip(*cols, strict=True)]))  # csv.writer's line end
        w.writerows([text(v) for v in row] for row in self.chunk)

    def _row(self, k: int) -> tuple[object, ...]:
        if k >= self.stored:
            return self.chunk[k - self.stored]
        out: list[object] = [col[k] for col in self.cols]
        for c, kind in enumerate(self.kinds):
            if kind == "s":
                out[c] = self.names[int(col_k)] if isinstance(col_k := out[c], int) else col_k
        for c, rows in self.ints.items():
            i = bisect.bisect_left(rows, k)
            if i < len(rows) and rows[i] == k:
                out[c] = int(self.cols[c][k])
        if self.odd:
            for c in range(len(self.kinds)):
                v = self.odd.get((k, c), self)
                if v is not self:
                    out[c] = v
        return tuple(out)

    @overload
    def __getitem__(self, k: int) -> tuple[object, ...]: ...

    @overload
    def __getitem__(self, k: slice) -> list[tuple[object, ...]]: ...

    def __getitem__(self, k: int | slice) -> tuple[object, ...] | list[tuple[object, ...]]:
        if isinstance(k, slice):
            return [self._row(i) for i in range(*k.indices(len(self)))]
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError("event row out of range")
        return self._row(k)

    def __iter__(self) -> Iterator[tuple[object, ...]]:
        for k in range(len(self)):
            yield self._row(k)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EventRows | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EventRows({len(self)} rows)"

