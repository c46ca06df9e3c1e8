"""The one HiGHS wrapper of the package: every HiGHS model is made by ``new_highs`` and solved by ``run``.

HiGHS keeps two things per process, not per model, and both bit us:

* its task scheduler: the first solve fixes the thread count for the whole process, and a later model
  asking for another count fails with ``kError`` (highspy 1.16: "the scheduler has already been
  initialized to use 2 threads") and no solution. One caller with the default thread count was enough to
  make every later allocator decision fall back to greedy. So every model here is single-threaded (these
  models are tiny; one thread is also what keeps replays reproducible), and ``run`` resets a scheduler
  that something else in the process left with another thread count, then solves again.
* its banner: the first ``Highs()`` of a process prints a copyright banner on standard output, before any
  option can silence it, which broke ``--json`` output. ``new_highs`` sends that first construction's
  output to /dev/null at the file-descriptor level (HiGHS writes from C++).

A lock serialises construction and solves: the scheduler reset must not happen under another thread's
solve, and these solves are short.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import highspy

_LOCK = threading.Lock()  # HiGHS's own state is process-wide; so is the lock guarding it
_BANNER_SHOWN = threading.Event()  # set once the process's first Highs() (the one that prints) is made


class SolverError(RuntimeError):
    """HiGHS could not solve a model: the message says what it returned."""


def _construct_silently() -> highspy.Highs:
    """The process's first ``Highs()``, with file descriptor 1 pointed at /dev/null while it prints."""
    import highspy

    sys.stdout.flush()
    libc = ctypes.CDLL(None)
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        h = highspy.Highs()
        libc.fflush(None)  # C stdio may still hold the banner: flush it while it still goes nowhere
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
    return h


def new_highs(time_limit: float | None = None) -> highspy.Highs:
    """A silent, single-threaded HiGHS model (optionally with a time limit in seconds)."""
    import highspy

    with _LOCK:
        if _BANNER_SHOWN.is_set():
            h = highspy.Highs()
        else:
            h = _construct_silently()
            _BANNER_SHOWN.set()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    if time_limit is not None:
        h.setOptionValue("time_limit", float(time_limit))
    return h


def run(h: highspy.Highs) -> highspy.HighsModelStatus:
    """Solve ``h`` and return its model status; raises ``SolverError`` when HiGHS itself fails.

    An error on the first try is most often a scheduler that another solve in this process started with
    another thread count: the scheduler is reset and the model solved once more."""
    import highspy

    with _LOCK:
        status = h.run()
        if status == highspy.HighsStatus.kError:
            highspy.Highs.resetGlobalScheduler(True)
            status = h.run()
    if status == highspy.HighsStatus.kError:
        raise SolverError(f"HiGHS failed: run() returned {status}, model status {h.getModelStatus()}")
    return h.getModelStatus()


__all__ = ["SolverError", "new_highs", "run"]
