"""The PBS Pro commands the pilot source runs, and their one error type."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence


class PbsError(RuntimeError):
    """A PBS command that failed or could not run (missing, timed out, non-zero exit), with its stderr."""


def run(argv: Sequence[str], timeout: float = 15.0) -> str:
    """Run one PBS command and return its stdout; PbsError saying which command and why otherwise."""
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise PbsError(f"{argv[0]}: not found (is PBS Pro installed and on PATH?)") from None
    except subprocess.TimeoutExpired:
        raise PbsError(f"{argv[0]}: no answer within {timeout:g} s") from None
    if out.returncode != 0:
        raise PbsError(f"{' '.join(argv[:2])}: exit {out.returncode}: {out.stderr.strip()[:500]}")
    return out.stdout
