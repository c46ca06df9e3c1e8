"""Admission: which newly arrived jobs enter the scheduling queue at all (Blox's admission-control plug-ins).

The contract every admission step keeps (checked over the whole registry by tests/test_plugins.py):

- it is a pure function of an ``AdmissionView`` (no state kept between calls, no clock, no I/O), so the
  simulator and the runtime's controller hold back the same jobs from the same state;
- it returns the jobs it holds back, each with the reason (shown as the job's waiting message); the policy
  never sees a held job, as Blox keeps them in its overflow queue;
- it only holds jobs that are pending and have never started: a job once admitted stays admitted (Blox
  never takes a job back out of its active set), and whether a job has started is in the state, so the step
  needs no memory of what it admitted before;
- with no jobs it holds nothing.

A new step is one module of this package that decorates its function with ``register(name)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcsched.plugins import PluginRegistry

if TYPE_CHECKING:
    from hpcsched.primitives.state import JobState


@dataclass(frozen=True, slots=True)
class AdmissionView:
    """What an admission step sees: the jobs (pending and running), the live workers' slots in total, and the
    load threshold (a fraction of those slots) that load-based steps admit up to."""

    now: float
    jobs: tuple[JobState, ...]
    capacity: int
    load_threshold: float = 1.0


Admission = Callable[[AdmissionView], dict[str, str]]
"""AdmissionView -> {held job id: reason}."""

REGISTRY: PluginRegistry[Admission] = PluginRegistry(__name__, "admission step")
register = REGISTRY.register
get_admission = REGISTRY.get

__all__ = ["REGISTRY", "Admission", "AdmissionView", "get_admission", "register"]
