"""The state disk's free space: a floor below which the controller does not start and refuses submits.

The shipped example keeps the state database and the jobs' checkpoints on one disk. A job that filled its
checkpoint folder made every submit fail with SQLite's ``UNKNOWN: database or disk is full`` and filled the log
with tracebacks. With a floor the controller keeps room for what it must still write (heartbeats, job ends) and
says why it refuses, before SQLite has to: ``state_min_free`` (config) is a number of bytes, a size (``512MiB``,
``2G``), a share of the filesystem (``5%``) or 0 (no floor); by default the smaller of 1 GiB and 5% of the
filesystem, so a small test filesystem is not refused outright.

``diskguard.DiskGuard`` is the gRPC side (kept apart: the job client reads the config without loading gRPC);
``is_disk_full`` tells a SQLite error that means "the disk is full" from other ones, for one clear log line
instead of a traceback.
"""

from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from hpcsched.errors import InputError

DEFAULT_FLOOR = "default"
_DEFAULT_BYTES = 1 << 30
_DEFAULT_FRACTION = 0.05
_UNITS = {"": 1, "k": 10**3, "kb": 10**3, "kib": 1 << 10, "m": 10**6, "mb": 10**6, "mib": 1 << 20,
          "g": 10**9, "gb": 10**9, "gib": 1 << 30, "t": 10**12, "tb": 10**12, "tib": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


@dataclass(frozen=True, slots=True)
class Floor:
    """Free bytes to keep: ``nbytes`` absolute, or ``fraction`` of the filesystem, or (default) the smaller of both."""

    nbytes: int | None
    fraction: float | None

    def bytes_for(self, total: int) -> int:
        """The floor on a filesystem of ``total`` bytes."""
        if self.nbytes is not None and self.fraction is not None:
            return min(self.nbytes, int(total * self.fraction))
        if self.fraction is not None:
            return int(total * self.fraction)
        return self.nbytes or 0

    def __str__(self) -> str:
        if self.nbytes is not None and self.fraction is not None:
            return f"the smaller of {human(self.nbytes)} and {self.fraction:.0%} of the filesystem"
        if self.fraction is not None:
            return f"{self.fraction * 100:g}% of the filesystem"
        return human(self.nbytes or 0)


def parse_floor(value: object) -> Floor:
    """``state_min_free``'s value as a Floor; ValueError (with what is accepted) for anything else."""
    if value is None or value == DEFAULT_FLOOR:
        return Floor(_DEFAULT_BYTES, _DEFAULT_FRACTION)
    if isinstance(value, bool):
        raise ValueError("expected bytes (an integer), a size such as 512MiB or 2G, a percentage such as 5%, or 0")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"must be >= 0, got {value}")
        return Floor(int(value), None)
    text = str(value).strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            pct = -1.0
        if not 0 <= pct < 100:
            raise ValueError("a percentage must be 0 to 99.9, e.g. 5%")
        return Floor(None, pct / 100)
    m = _SIZE.fullmatch(text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError("expected bytes (an integer), a size such as 512MiB or 2G, a percentage such as 5%, or 0")
    return Floor(int(float(m.group(1)) * _UNITS[m.group(2).lower()]), None)


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def free_space(path: Path) -> tuple[int, int]:
    """(bytes free to this user, filesystem size) where ``path`` (or its nearest existing parent) lives."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def shortage(path: Path, floor: Floor) -> str:
    """'' when the filesystem of ``path`` has at least ``floor`` free, else why not (for a message)."""
    free, total = free_space(path)
    need = floor.bytes_for(total)
    if free >= need:
        return ""
    return (f"only {human(free)} free on the state's filesystem, under state_min_free ({floor}: {human(need)}); "
            "free some space (a job's checkpoints?) or lower state_min_free")


def check_at_start(state: Path, floor: Floor) -> None:
    """InputError naming the state file when its disk is already under the floor: refuse to start."""
    why = shortage(state, floor)
    if why:
        raise InputError(state, f"the controller does not start: {why}")


def is_disk_full(e: BaseException) -> bool:
    """Whether a SQLite error means the disk (or the quota) is full."""
    if getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
        return True
    text = str(e).lower()
    return isinstance(e, sqlite3.Error) and ("disk is full" in text or "no space left" in text)
