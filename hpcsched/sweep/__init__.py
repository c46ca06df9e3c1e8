"""Experiment sweeps: a YAML grid of simulate / replay cells, run resumably on local cores or Ray.

``load_config`` parses and expands a config into cells, ``run_sweep`` runs the unfinished ones and
writes the tidy results table that ``hpcsched report`` turns into plots.

The names below are imported on first use, so that importing ``hpcsched.sweep.cli`` (which every
``hpcsched --help`` may do) does not load yaml, pandas and the process-pool runner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcsched.sweep.cell import Cell
    from hpcsched.sweep.config import SweepConfig, load_config
    from hpcsched.sweep.runner import SweepOutcome, run_sweep
    from hpcsched.sweep.table import read_table

__all__ = ["Cell", "SweepConfig", "SweepOutcome", "load_config", "read_table", "run_sweep"]

_HOME = {"Cell": "cell", "SweepConfig": "config", "load_config": "config", "SweepOutcome": "runner",
         "run_sweep": "runner", "read_table": "table"}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value
