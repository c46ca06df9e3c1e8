"""Where a Python process spends its time, by sampling every thread's stack (no py-spy, no yappi here).

Run a program under it, as ``python -m`` would::

    python bench/stack_sampler.py OUT.json -m hpcsched.runtime controller --config c.yaml

A daemon thread wakes every ``--period`` (5 ms), reads ``sys._current_frames()`` and counts each thread's stack,
and reads each thread's CPU time from ``/proc/self/task/TID/stat``. A thread blocked in C (a lock, a condition,
gRPC's completion queue, a socket) shows as its Python caller: such samples are counted apart as ``waiting`` (their
leaf is one of the blocking calls below) so the ``busy`` ranking holds only threads that were running Python or
waiting for the GIL to run it. The report (written every 5 s and at exit, so a SIGKILL loses at most 5 s) holds:
- ``threads``: per Python thread, its name, samples, and CPU seconds (the kernel's count, C code included);
- ``busy_inclusive``: function -> busy samples with it anywhere on the stack (what a call costs with its callees);
- ``busy_self``: function -> busy samples with it as the leaf;
- ``busy_stacks``: the commonest busy stacks, leaf last.
Sampling holds the GIL for ~0.1 ms per wake: a few % of one core at 5 ms with 60 threads.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import runpy
import sys
import threading
import time
from pathlib import Path

# Leaf functions in which a thread waits (for a lock, an event, I/O) rather than computes.
WAITING = {"wait", "_wait_for_tstate_lock", "acquire", "get", "select", "poll", "_poll", "sleep", "accept", "recv",
           "_serve", "_worker", "_next_event", "next_event", "readline", "read", "wait_for_termination", "_run_once",
           "_receive", "_spin", "_spin_until", "join", "_serve_forever"}
DEPTH = 40
TOP = 60


def _where(code) -> str:
    return f"{Path(code.co_filename).name}:{code.co_name}"


def _thread_cpu(tid: int) -> float:
    try:
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler:
    def __init__(self, out: Path, period: float) -> None:
        self.out, self.period = out, period
        self.samples = collections.Counter()  # thread ident -> samples
        self.busy_incl: collections.Counter = collections.Counter()
        self.busy_self: collections.Counter = collections.Counter()
        self.stacks: collections.Counter = collections.Counter()
        self.waiting = 0
        self.busy = 0
        self.started = time.time()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.me = 0

    def run(self) -> None:
        self.me = threading.get_ident()
        last_write = time.monotonic()
        while not self._stop.wait(self.period):
            frames = sys._current_frames()
            with self._lock:
                for ident, frame in frames.items():
                    if ident == self.me:
                        continue
                    self.samples[ident] += 1
                    stack = []
                    f = frame
                    while f is not None and len(stack) < DEPTH:
                        stack.append(_where(f.f_code))
                        f = f.f_back
                    if frame.f_code.co_name in WAITING:
                        self.waiting += 1
                        continue
                    self.busy += 1
                    self.busy_self[stack[0]] += 1
                    for fn in set(stack):
                        self.busy_incl[fn] += 1
                    self.stacks[tuple(reversed(stack[:12]))] += 1
            del frames
            if time.monotonic() - last_write > 5:
                last_write = time.monotonic()
                self.write()

    def write(self) -> None:
        with self._lock:
            threads = []
            for t in threading.enumerate():
                if t.ident in self.samples or t.ident == self.me:
                    threads.append({"name": t.name, "samples": self.samples.get(t.ident, 0),
                                    "cpu_s": _thread_cpu(t.native_id) if t.native_id else None})
            report = {"seconds": round(time.time() - self.started, 1), "period_s": self.period,
                      "busy_samples": self.busy, "waiting_samples": self.waiting,
                      "process_cpu_s": round(time.process_time(), 2), "threads": threads,
                      "busy_inclusive": self.busy_incl.most_common(TOP), "busy_self": self.busy_self.most_common(TOP),
                      "busy_stacks": [{"n": n, "stack": list(s)} for s, n in self.stacks.most_common(25)]}
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        os.replace(tmp, self.out)

    def stop(self) -> None:
        self._stop.set()
        self.write()


def main() -> None:
    args = sys.argv[1:]
    period = 0.005
    if args[:1] == ["--period"]:
        period, args = float(args[1]), args[2:]
    if len(args) < 3 or args[1] != "-m":
        sys.exit("usage: stack_sampler.py [--period S] OUT.json -m MODULE [ARGS...]")
    out, module = Path(args[0]).resolve(), args[2]
    s = Sampler(out, period)
    threading.Thread(target=s.run, name="stack-sampler", daemon=True).start()
    atexit.register(s.stop)
    sys.argv = [module, *args[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
