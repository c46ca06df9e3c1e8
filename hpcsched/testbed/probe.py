"""A start-up probe: how long this machine takes, right now, to start a Python process that imports torch.

A job's start-up on the testbed (process start, torch import, rendezvous) is CPU-bound, so on a shared
machine it follows the load: the same jobs started in 43 s at load 16 and far faster idle. Profiles learned
in one run carry the probe taken then; a later run probes again before its first job and scales the learned
start-up and tear-down by the ratio, so the prediction uses how the machine is now, and still nothing the
predicted jobs did.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

PROBE = "import torch, torch.distributed"


def startup_probe(repeat: int = 3) -> float:
    """Median wall seconds of ``python -c 'import torch, torch.distributed'`` over ``repeat`` runs."""
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", PROBE], check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
