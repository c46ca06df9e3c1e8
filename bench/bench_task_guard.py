"""What the task guard costs a task's start: N starts of ``true`` through setpriv (the worker's start before the
guard) and through the guard (process group, and a cgroup v2 leaf where writable), each started cold (a Python
starts for it) and handed to a spare guard started ahead (as a worker daemon does; ``SPACING_S`` between starts, as
launches are spaced by heartbeats, so the next spare is up). Prints medians and maxima in ms and the load average
before and after. ``python bench/bench_task_guard.py``"""

import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable

from hpcsched.runtime.sandbox import Sandbox

N = 30
SPACING_S = 0.3


def timed(start: Callable[[], subprocess.Popen], spacing_s: float = 0.0, between: Callable[[], None] | None = None
          ) -> tuple[float, float]:
    ts = []
    for _ in range(N):
        if between is not None:
            between()  # what the worker's poll loop does between launches
        time.sleep(spacing_s)
        t0 = time.perf_counter()
        start().wait()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1000, max(ts) * 1000


def main() -> None:
    setpriv = shutil.which("setpriv")
    off, auto = Sandbox("bench", cgroups="off"), Sandbox("bench", cgroups="auto")
    off_spare, auto_spare = Sandbox("bench", cgroups="off", spare=True), Sandbox("bench", cgroups="auto", spare=True)
    env = dict(os.environ)
    out = open(os.devnull, "wb")
    cg = auto.mode.split(" (")[0]
    print("load", open("/proc/loadavg").read().split()[:3])
    rows = [("setpriv (before)", lambda: subprocess.Popen([setpriv, "--pdeathsig", "KILL", "--", "true"],
                                                          start_new_session=True), 0.0, None),
            ("guard, process group", lambda: off.spawn(["true"], env, stdout=out), 0.0, None),
            (f"guard, {cg}", lambda: auto.spawn(["true"], env, stdout=out, leaf="t"), 0.0, None),
            ("spare guard, process group", lambda: off_spare.spawn(["true"], env, stdout=out), SPACING_S,
             off_spare.refill),
            (f"spare guard, {cg}", lambda: auto_spare.spawn(["true"], env, stdout=out, leaf="t"), SPACING_S,
             auto_spare.refill)]
    try:
        for name, start, spacing, between in rows:
            med, top = timed(start, spacing, between)
            print(f"{name:32s} median {med:.1f} ms, max {top:.1f} ms")
    finally:
        for sb in (off, auto, off_spare, auto_spare):
            sb.close()
    print("load", open("/proc/loadavg").read().split()[:3])


if __name__ == "__main__":
    main()
