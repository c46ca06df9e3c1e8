"""Progress with an ETA on stderr, the one helper every long command uses (simulate, compare, replay, trace
inspect and convert).

It is shown only where someone watches it: never under ``--json`` or ``--quiet`` (scripts read those
outputs) and never when stderr is not a terminal (logs and CI would fill with redraws).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Update = Callable[..., None]
"""``update(done=None, total=None, label=None)``: work done so far, a new total, a new description (each optional)."""


def wanted(as_json: bool = False, quiet: bool = False) -> bool:
    """Whether a progress bar may be shown: nobody asked for machine output or quiet, and stderr is a TTY."""
    return not (as_json or quiet) and sys.stderr.isatty()


@contextmanager
def progress_bar(label: str, total: float | None, enabled: bool) -> Iterator[Update | None]:
    """A transient bar (description, bar, percent, elapsed, ETA) on stderr; yields its ``update`` function, or
    None when ``enabled`` is false (callers then skip the bookkeeping entirely)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)

        def update(done: float | None = None, total: float | None = None, label: str | None = None) -> None:
            fields: dict[str, object] = {}
            if done is not None:
                fields["completed"] = done
            if total is not None:
                fields["total"] = total
            if label is not None:
                fields["description"] = label
            bar.update(task, **fields)  # type: ignore[arg-type]

        yield update
