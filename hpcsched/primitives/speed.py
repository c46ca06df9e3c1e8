"""The numbers and rules that decide how fast jobs run in simulation, in both modes.

Two modes share one engine (``hpcsched.sim.engine``):

- default mode fixes what the reference gets wrong (see docs/simulator.md for each difference and its
  effect in numbers): a job pays its restart cost once, when it is started, resumed or moved to
  other GPUs, and it completes when its last iteration is done, so work is conserved exactly;
- ``compat="muri"`` reproduces the reference simulator (Rivendile/Muri ``simulator/run_sim.py``)
  closely enough to give its published table: the restart cost is subtracted from EVERY running
  job's progress at EVERY event, but completion times are predicted without it (so jobs finish with
  iterations left), and each policy keeps the reference's own loop quirks (``hpcsched.compat.muri``).

The speed model is the same in both: a solo job runs one iteration per ``iteration_time x 1.015``;
an interleaving group of k jobs runs one iteration of every member per ``period_s x GROUP_FACTOR[k]``
(the reference's measured slowdowns 1.33 / 1.5 / 1.37 over its 1.015 solo factor).
"""

from __future__ import annotations

SOLO_FACTOR = 1.015
GROUP_FACTOR: dict[int, float] = {1: SOLO_FACTOR, 2: 1.33 / SOLO_FACTOR, 3: 1.5 / SOLO_FACTOR, 4: 1.37 / SOLO_FACTOR}
"""Multiplier on a group's interleaved period by member count (>4 members: the 4-member factor)."""

DEFAULT_RESTART_S = 10.0
"""Restart cost of a model the table does not know (the reference's fallback)."""

# Seconds to (re)start a job, by GPU count then model: profiled by Muri's authors (run_sim.py).
_RESTART_S: dict[int, dict[str, float]] = {
    1: {"vgg16": 7, "vgg19": 7, "resnet18": 4, "shufflenet_v2_x1_0": 4, "bert": 10, "gpt2": 10, "a2c": 38, "dqn": 5},
    2: {"vgg16": 7, "vgg19": 7, "resnet18": 5, "shufflenet_v2_x1_0": 4, "bert": 10, "gpt2": 10, "a2c": 39, "dqn": 5},
    4: {"vgg16": 8, "vgg19": 8, "resnet18": 5, "shufflenet_v2_x1_0": 5, "bert": 10, "gpt2": 10, "a2c": 39, "dqn": 6},
    8: {"vgg16": 9, "vgg19": 9, "resnet18": 7, "shufflenet_v2_x1_0": 5, "bert": 10, "gpt2": 10, "a2c": 46, "dqn": 6},
    16: {"vgg16": 9, "vgg19": 10, "resnet18": 7, "shufflenet_v2_x1_0": 7, "bert": 10, "gpt2": 10, "a2c": 46, "dqn": 8},
    32: {"vgg16": 10, "vgg19": 10, "resnet18": 7, "shufflenet_v2_x1_0": 8, "bert": 10, "gpt2": 10, "a2c": 46, "dqn": 8},
}


def restart_cost(model: str | None, gpus: int) -> float:
    """Seconds a job of ``model`` on ``gpus`` GPUs loses each time it (re)starts.

    GPU counts between the profiled ones use the next smaller profiled count (the reference knows
    only 1/2/4/8/16/32); unknown models and model-less traces (Philly) use 10 s.
    """
    key = max((k for k in _RESTART_S if k <= max(gpus, 1)), default=1)
    if model is None:
        return DEFAULT_RESTART_S
    return float(_RESTART_S[key].get(model, DEFAULT_RESTART_S))


def group_factor(k: int) -> float:
    return GROUP_FACTOR[min(max(k, 1), 4)]
