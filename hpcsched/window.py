"""``--window A-B``: figures over the jobs with ids A..B only (Blox's ``--start-id-track/--stop-id-track``).

Blox measures on an unbounded arrival stream: jobs keep arriving while the window's jobs run, and the
average covers only the window. A causal simulation's window jobs cannot depend on what arrives after they
all finish, so modes that run the whole trace give the same window figures as stopping at the window's end
(``--compat blox`` stops there, as Blox does).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hpcsched.results import JobResult

_WINDOW = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*")


def parse_window(text: str) -> tuple[int, int]:
    """'300-500' -> (300, 500): job ids, both ends included."""
    m = _WINDOW.fullmatch(text)
    if not m:
        raise ValueError(f"--window must be A-B (job ids, A <= B), got {text!r}")
    a, b = int(m.group(1)), int(m.group(2))
    if a > b:
        raise ValueError(f"--window must be A-B with A <= B, got {text!r}")
    return a, b


def in_window_id(job_id: str, window: tuple[int, int]) -> bool:
    """Whether a job's id lies in the window; a non-integer id is an error (no silent skip)."""
    try:
        n = int(job_id)
    except ValueError:
        raise ValueError(f"--window needs integer job ids; job {job_id!r} is not one") from None
    return window[0] <= n <= window[1]


def in_window(results: Iterable[JobResult], window: tuple[int, int]) -> list[JobResult]:
    """The results whose integer job id lies in the window (``in_window_id``)."""
    return [r for r in results if in_window_id(r.job_id, window)]
