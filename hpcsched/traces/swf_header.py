"""The SWF header (``; Key: value`` lines) and the SWF fields no ``Job`` attribute holds.

Kept apart from the reader so that the row reader and the columnar summary (``swf_columns``) share them.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from pathlib import Path

from hpcsched.errors import InputError

# Every header field SWF 2.2 defines (the Parallel Workloads Archive's format page), by lower-case name.
HEADER_FIELDS = ("Version", "Computer", "Installation", "Acknowledge", "Information", "Conversion", "MaxJobs",
                 "MaxRecords", "Preemption", "UnixStartTime", "TimeZone", "TimeZoneString", "StartTime", "EndTime",
                 "MaxNodes", "MaxProcs", "MaxRuntime", "MaxMemory", "AllowOveruse", "MaxQueues", "Queues", "Queue",
                 "MaxPartitions", "Partitions", "Partition", "Note")
FIELD_BY_LOWER = {k.lower(): k for k in HEADER_FIELDS}
_NUMERIC_FIELDS = frozenset({"MaxJobs", "MaxRecords", "UnixStartTime", "TimeZone", "MaxNodes", "MaxProcs", "MaxRuntime",
                             "MaxMemory", "MaxQueues", "MaxPartitions"})
_REPEATED_FIELDS = frozenset({"Queue", "Partition", "Note"})  # one line per queue / partition / note
# SWF fields no ``Job`` attribute holds (0-based index -> name): seen known, they are listed in
# ``meta['swf_fields_not_kept']`` (name -> first line) so a conversion can say it did not carry them over.
NOT_KEPT = {5: "average CPU time (field 6)", 6: "used memory (field 7)", 9: "requested memory (field 10)",
            12: "group (field 13)", 13: "executable (field 14)", 15: "partition (field 16)",
            16: "preceding job (field 17)", 17: "think time (field 18)"}

def _getter(indices: tuple[int, ...]) -> Callable[[list[str]], tuple[str, ...]]:
    """The fields at ``indices`` of a row, as a tuple even for one index (the unknown value it is compared with is
    one; ``itemgetter`` of one index gives the bare value)."""
    if len(indices) > 1:
        return itemgetter(*indices)
    k = indices[0]
    return lambda row: (row[k],)


class NotKept:
    """Which of the ``NOT_KEPT`` fields a log fills, each with its first line. Only the fields not seen yet
    are looked at (one C-level ``itemgetter`` per row), so a log that fills them all costs nothing more."""

    def __init__(self) -> None:
        self.first: dict[str, int] = {}
        self._pending: tuple[int, ...] = tuple(NOT_KEPT)
        self._get = _getter(self._pending)
        self._none: tuple[str, ...] = ("-1",) * len(self._pending)

    def check(self, f: list[str], lineno: int) -> None:
        if not self._pending or self._get(f) == self._none:
            return
        for i in self._pending:
            if f[i] != "-1":
                self.first[NOT_KEPT[i]] = lineno
        self._pending = tuple(i for i in self._pending if NOT_KEPT[i] not in self.first)
        if self._pending:
            self._get = _getter(self._pending)
            self._none = ("-1",) * len(self._pending)


class Header:
    """The ``; Key: value`` comment block: the first value of each key for the reader, every defined field
    (repeated ones as lists, continuation lines joined to the field above them) for ``report.meta``."""

    def __init__(self) -> None:
        self.first: dict[str, str] = {}
        self.fields: dict[str, object] = {}
        self.other: dict[str, str] = {}
        self._last: str | None = None

    def __contains__(self, key: str) -> bool:
        return key in self.first

    def __getitem__(self, key: str) -> str:
        return self.first[key]

    def add(self, line: str) -> None:
        raw = line.lstrip()[1:]
        body = raw.strip()
        if not body:
            self._last = None  # a bare ';' ends a field's continuation lines
            return
        key, sep, value = body.partition(":")
        name = FIELD_BY_LOWER.get(key.strip().lower()) if sep else None
        if name is None and self._last is not None and raw[:3].isspace():  # an indented line continues a field
            self._extend(self._last, body)
            return
        if name is None:
            if sep and key.strip() and " " not in key.strip():
                self.first.setdefault(key.strip(), value.strip())
                self.other.setdefault(key.strip(), value.strip())
            self._last = None
            return
        value = value.strip()
        self.first.setdefault(name, value)
        if name in _REPEATED_FIELDS:
            items = self.fields.setdefault(name, [])
            if isinstance(items, list):  # always, for a repeated field
                items.append(value)
        else:
            self.fields.setdefault(name, value)
        self._last = name

    def _extend(self, name: str, more: str) -> None:
        if name in _REPEATED_FIELDS:
            items = self.fields[name]
            if isinstance(items, list):  # always, for a repeated field
                items[-1] = f"{items[-1]}\n{more}" if items[-1] else more
        elif isinstance(self.fields.get(name), str):
            self.fields[name] = f"{self.fields[name]}\n{more}" if self.fields[name] else more
            if self.first.get(name) == "":
                self.first[name] = more

    def meta(self) -> dict[str, object]:
        """Defined fields, numbers as numbers where they are numbers (MaxNodes: 100 -> 100)."""
        out: dict[str, object] = {}
        for name in HEADER_FIELDS:
            if name not in self.fields:
                continue
            v = self.fields[name]
            if name in _NUMERIC_FIELDS and isinstance(v, str):
                try:
                    f = float(v.split()[0])
                    v = int(f) if f.is_integer() and abs(f) < 2**63 else f
                except (ValueError, IndexError, OverflowError):
                    pass
            out[name] = v
        if self.other:
            out["other"] = dict(self.other)
        return out


def header_int(path: Path, header: Header, key: str) -> int | None:
    if key not in header:
        return None
    try:
        v = int(float(header[key].split()[0]))
    except (ValueError, IndexError, OverflowError):
        raise InputError(path, f"SWF header {key}: {header[key]!r} is not a number") from None
    return v if v > 0 else None
