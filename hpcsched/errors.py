"""Errors a user can act on: each names the file and, where known, the line.

The CLI turns an ``InputError`` into one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad input (a trace, a spec, a config): says where, so the user can open the file and fix it."""

    def __init__(self, path: str | Path | None, message: str, line: int | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.path or "<input>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        return f"{where}: {self.message}"
