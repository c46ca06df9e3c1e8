"""Experiment sweeps: a YAML grid of simulate / replay cells, run resumably on local cores or Ray.

``load_config`` parses and expands a config into cells, ``run_sweep`` runs the unfinished ones and
writes the tidy results table that ``hpcsched report`` turns into plots.
"""

from hpcsched.sweep.cell import Cell
from hpcsched.sweep.config import SweepConfig, load_config
from hpcsched.sweep.runner import SweepOutcome, run_sweep
from hpcsched.sweep.table import read_table

__all__ = ["Cell", "SweepConfig", "SweepOutcome", "load_config", "read_table", "run_sweep"]
