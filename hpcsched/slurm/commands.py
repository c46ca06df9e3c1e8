"""Running Slurm's command-line tools: one place that knows how they fail.

The CLI tools (not slurmrestd) are the interface: they are present wherever Slurm is, need no
token, and their text output is stable across 20.x-23.x for the fields used here.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence


class SlurmError(RuntimeError):
    """A Slurm tool is missing, timed out or exited non-zero; the message carries its stderr."""


def run(argv: Sequence[str], timeout: float = 15.0) -> str:
    """Run one Slurm tool and return its stdout; raise SlurmError with its stderr otherwise."""
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"{argv[0]} not found: is Slurm installed (scripts/slurm_cluster.sh up)?")
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv)} timed out after {timeout:.0f}s: is slurmctld up?") from None
    if p.returncode != 0:
        raise SlurmError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def available() -> str | None:
    """None when a controller answers here, else the reason Slurm cannot be used (for skip messages)."""
    for tool in ("sinfo", "squeue", "sbatch", "scontrol", "scancel"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (run scripts/slurm_cluster.sh up)"
    try:
        run(["scontrol", "ping"], timeout=5)
        out = run(["sinfo", "-h", "-o", "%N"], timeout=5)
    except SlurmError as e:
        return f"no Slurm controller answers: {e}"
    if not out.strip():
        return "Slurm answers but has no nodes"
    return None


def hostnames(hostlist: str) -> list[str]:
    """Expand a Slurm hostlist (``n[1-3,7]``) into node names."""
    if not hostlist or hostlist in ("(null)", "None"):
        return []
    try:
        from hpcsched.traces.slurm import expand_hostlist  # the trace readers' parser, when present
    except ImportError:
        return run(["scontrol", "show", "hostnames", hostlist]).split()
    return list(expand_hostlist(hostlist))
