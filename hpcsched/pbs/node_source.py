"""PBS Pro as a node source of the live controller, found by ``hpcsched.runtime.node_source`` by this module's
name: the source is called after its package (``node_source: pbs``), built by ``make`` and configured by the
controller file's ``pbs:`` section, read by ``read_section``."""

from hpcsched.pbs.config import read_pbs_config as read_section
from hpcsched.pbs.pilots import PbsPilots as make

__all__ = ["make", "read_section"]
