"""What the task guard costs a task's start: N starts of ``true`` through setpriv (the worker's start before the
guard) and through the guard (process group, and a cgroup v2 leaf where writable). Prints medians and maxima in ms
and the load average before and after. ``python bench/bench_task_guard.py``"""

import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable

from hpcsched.runtime.sandbox import Sandbox

N = 30


def timed(start: Callable[[], subprocess.Popen]) -> tuple[float, float]:
    ts = []
    for _ in range(N):
        t0 = time.perf_counter()
        start().wait()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1000, max(ts) * 1000


def main() -> None:
    setpriv = shutil.which("setpriv")
    off, auto = Sandbox("bench", cgroups="off"), Sandbox("bench", cgroups="auto")
    env = dict(os.environ)
    print("load", open("/proc/loadavg").read().split()[:3])
    rows = [("setpriv (before)", lambda: subprocess.Popen([setpriv, "--pdeathsig", "KILL", "--", "true"],
                                                          start_new_session=True)),
            ("guard, process group", lambda: off.spawn(["true"], env)),
            (f"guard, {auto.mode.split(' (')[0]}", lambda: auto.spawn(["true"], env, leaf="t"))]
    try:
        for name, start in rows:
            med, top = timed(start)
            print(f"{name:32s} median {med:.1f} ms, max {top:.1f} ms")
    finally:
        auto.close()
    print("load", open("/proc/loadavg").read().split()[:3])


if __name__ == "__main__":
    main()
