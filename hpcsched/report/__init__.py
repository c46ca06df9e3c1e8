"""Reports of sweeps: a Markdown summary with PNG figures (JCT CDFs, normalised bars, utilisation over
time, harvesting vs Tfwd) built from a sweep directory's tidy table and its cells' files."""

from hpcsched.report.build import make_report

__all__ = ["make_report"]
