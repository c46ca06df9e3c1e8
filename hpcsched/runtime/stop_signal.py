"""SIGTERM / SIGINT as a ``threading.Event`` for the daemons' loops, set without a lock in the signal handler.

A handler that calls ``Event.set()`` can deadlock the process: the handler runs in the main thread between two
bytecodes, and when that thread already holds the event's lock (inside ``Event.wait`` or a first handler's
``set``), the handler's ``set`` waits for it forever. A pilot's worker gets SIGTERM twice in a row (PBS or Slurm
signals the job's process group, and ``timeout`` passes its own on), and the second handler landed inside the first
one's ``set``: the worker hung, never left, and its node was never given back to the batch job that asked for it.

So the handler does nothing in Python: ``signal.set_wakeup_fd`` has the C-level handler write the signal's number
to a pipe, and a thread that reads the pipe sets the event. SIGUSR1 dumps every thread's stack to stderr (the
daemon's log), so an operator can see where a hung daemon is stuck: ``kill -USR1 PID``.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
DUMP_STACKS = signal.SIGUSR1


def until_signal() -> threading.Event:
    """An event set on the first SIGINT or SIGTERM. Call once, from the main thread, before the daemon's loop."""
    stop = threading.Event()
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the C handler never blocks; a full pipe only drops repeats
    for s in STOP_SIGNALS:
        signal.signal(s, _nothing)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    faulthandler.register(DUMP_STACKS, all_threads=True)
    wanted = {int(s) for s in STOP_SIGNALS}

    def watch() -> None:
        while True:
            got = os.read(read_fd, 64)
            if not got or wanted.intersection(got):
                stop.set()
                return

    threading.Thread(target=watch, name="stop-signal", daemon=True).start()
    return stop


def _nothing(signum: int, frame: object) -> None:
    """Replaces the default action (exit) so the wakeup fd alone reports the signal (module docstring)."""
