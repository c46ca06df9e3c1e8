"""Run the BLAS libraries numpy and scipy load on one thread for the simulation.

Why: the simulator refits a 7-parameter model hundreds of times with L-BFGS-B, whose BLAS calls are tiny;
with OpenBLAS's default of one thread per core, on a loaded machine its threads spin against each other and
the same run took 8-14x longer here (8 s vs 68-113 s wall, load 11-15 on 2 cores). Setting the
environment variables works only before the libraries load, so this calls OpenBLAS's own setter on every
OpenBLAS already loaded in the process (what threadpoolctl does, without the dependency).
"""

from __future__ import annotations

import ctypes

SETTERS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
           "openblas_set_num_threads64_")


def limit_blas_threads(n: int = 1) -> int:
    """Set every loaded OpenBLAS to ``n`` threads; returns how many libraries were set (0 where there is no
    /proc or no OpenBLAS: then nothing changes but speed)."""
    import numpy  # noqa: F401  (load the libraries first)
    import scipy.optimize  # noqa: F401

    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
    except OSError:
        return 0
    done = 0
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                done += 1
                break
    return done
