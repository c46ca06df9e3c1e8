"""Goodput-adaptive training: Pollux's model of throughput x statistical efficiency (OSDI'21).

Public API:

- :class:`GoodputModel` -- ``GoodputModel.load("cifar10")``: ``.throughput(nodes, gpus, batch)``,
  ``.efficiency(batch)``, ``.goodput(nodes, gpus, batch)``, ``.best_batch(nodes, gpus)``, ``.speedup(...)``,
  ``.at_epoch(e)``; fitted from the shipped profiles of :data:`APPLICATIONS` per GPU type in :data:`GPU_TYPES`.
- :func:`fit_perf_params`, :class:`PerfParams`, :class:`GradParams` -- the 7-parameter step-time model and its
  fit to observed steps (what a job learns online).
- :class:`GoodputFunction`, :class:`SpeedupFunction`, :class:`BatchChoice` -- goodput from fitted parameters and
  gradient statistics, and the best batch size per allocation.
- :func:`load_profile`, :class:`ApplicationProfile` -- the measured profile (ground truth for simulation).

The profiles are the Pollux artifact's (Apache-2.0; ``data/pollux/NOTICE``). Fitting and profile interpolation
need scipy (the ``goodput`` extra); evaluating a fitted model needs numpy only.
"""

from hpcsched.goodput.function import BatchChoice, GoodputFunction, SpeedupFunction
from hpcsched.goodput.model import BatchSplit, GoodputModel
from hpcsched.goodput.perf import GradParams, PerfParams, fit_perf_params, step_time
from hpcsched.goodput.profiles import (
    APPLICATIONS,
    GPU_TYPES,
    ApplicationProfile,
    ProfileError,
    load_profile,
    packed_placement,
)

__all__ = [
    "APPLICATIONS", "GPU_TYPES", "ApplicationProfile", "BatchChoice", "BatchSplit", "GoodputFunction",
    "GoodputModel", "GradParams", "PerfParams", "ProfileError", "SpeedupFunction", "fit_perf_params",
    "load_profile", "packed_placement", "step_time",
]
