"""Testbed experiments: replay a DL trace through the real runtime and hold the simulator to it.

``mapping`` turns trace jobs into small real training jobs (time scaling, model -> workload),
``local`` starts a controller and workers on this machine, ``driver`` submits the jobs at their scaled
times and writes the real ``jobs.csv``, ``measure`` reads what the runtime measured, ``feedback`` builds
the simulations (trace profiles, measured profiles, the policy as designed), ``profiles`` learns
per-workload profiles from an earlier run to predict a new one (``probe`` carries their start-up cost
to the new run's load), ``fastforward`` skips steady training at the measured pace (``--fast-forward``),
``compare`` prints the sim-vs-real table and ``run`` ties them together for ``hpcsched testbed`` (``cli``).
"""
