"""Sia (SOSP'23) and its Gavel baseline on heterogeneous GPU clusters: ``simulate --compat sia``.

Sia schedules adaptive (batch-size tuning) jobs by goodput with one integer program per 60 s round over
(job x GPU type x nodes x GPUs); its artifact's Gavel baseline time-shares rigid jobs in 360 s rounds.
This package reproduces the Sia artifact's simulator (siasosp23/artifacts, ``sia-simulator/``): its job
progress model (measured step times per GPU type, gradient statistics per epoch), its restart model and
both policies. The artifact ships no licence, so its code and profiles are not copied here: the profiles
are read from a directory given at run time (``--profiles``), in the artifact's own layout.

- ``profiles``: one application's measured step times and gradient statistics on one GPU type;
- ``goodput``: Pollux's throughput model fitted per GPU type, and the batch size that maximises goodput;
- ``job``: one job's progress through rounds, restarts and migrations;
- ``policy``: Sia's integer program (HiGHS);
- ``gavel``: the Gavel baseline's round mechanism over Gavel's max-sum-throughput allocation;
- ``simulate``: the round loop, the workload and cluster files, the summary.
"""
