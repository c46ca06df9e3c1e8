"""Rate-limited log lines: one line per distinct cause per interval, with how many were left out.

A failure that repeats (a refused call from one peer, a scheduling step that fails at every tick, a store write on
a full disk) otherwise writes one line, or one traceback, per occurrence: a full disk once filled the log with
hundreds of tracebacks, on the very disk that was full. The first occurrence of a cause is logged at once; later
ones within ``every_s`` are counted, and the next line logged for that cause says how many were not.
"""

from __future__ import annotations

import logging
import threading
import time

LOG_EVERY_S = 10.0
_MAX_KEYS = 10_000  # bounded memory against many distinct peers or causes


class LogThrottle:
    """At most one log line per key per ``every_s`` on ``logger``; the next one says how many were suppressed."""

    def __init__(self, logger: logging.Logger, every_s: float = LOG_EVERY_S) -> None:
        self.logger = logger
        self.every_s = every_s
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}
        self.suppressed = 0  # lines left out so far, all keys together

    def log(self, level: int, key: str, message: str, *args: object, exc_info: bool = False) -> bool:
        """Log ``message % args`` at ``level`` unless ``key`` was logged less than ``every_s`` ago; True if logged.
        ``exc_info``: with the current exception's traceback, the first time this key is logged only (a bug shows
        where it is once; its repetitions are counted)."""
        now = time.monotonic()
        with self._lock:
            last, dropped = self._last.get(key, (-1e18, 0))
            if now - last < self.every_s:
                self._last[key] = (last, dropped + 1)
                self.suppressed += 1
                return False
            if len(self._last) > _MAX_KEYS:
                self._last.clear()
            self._last[key] = (now, 0)
        suffix = f" ({dropped} more like it in the last {now - last:.0f} s not logged)" if dropped else ""
        self.logger.log(level, message + suffix, *args, exc_info=exc_info and last < -1e17)
        return True

    def warn(self, key: str, message: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, message, *args)

    def error(self, key: str, message: str, *args: object) -> bool:
        return self.log(logging.ERROR, key, message, *args)


def cause(e: BaseException) -> str:
    """A key naming an exception's cause for ``LogThrottle``: its type and first line (bounded), so the same error
    repeated is one cause and a different one is logged on its own."""
    first = (str(e).splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:160]}"
