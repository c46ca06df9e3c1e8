"""Reports of sweeps: a Markdown summary with PNG figures (JCT CDFs, normalised bars, utilisation over
time, harvesting vs Tfwd) built from a sweep directory's tidy table and its cells' files.

``make_report`` is loaded on first use so that ``hpcsched --help`` and other commands do not pay for
matplotlib.
"""

from __future__ import annotations

from typing import Any

__all__ = ["make_report"]


def __getattr__(name: str) -> Any:
    if name == "make_report":
        from hpcsched.report.build import make_report

        return make_report
    raise AttributeError(name)
