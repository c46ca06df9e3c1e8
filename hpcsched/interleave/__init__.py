"""Multi-resource interleaving: group periods, matching into groups of up to four, Muri policies.

Modules, each one concept: ``period`` (how fast a group iterates), ``matching`` (maximum-weight matching
engines), ``grouping`` (repeated matching into groups), ``policies`` (Muri-S, Muri-L, Muri-S+),
``reprofile`` (updating stage profiles from measured iteration times).
"""

from __future__ import annotations

from hpcsched.interleave.period import PeriodModel, muri4_cycles, pipeline_period, pipeline_periods

__all__ = ["PeriodModel", "muri4_cycles", "pipeline_period", "pipeline_periods"]
