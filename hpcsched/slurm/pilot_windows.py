"""``time_limit: fit-idle-window``: which idle nodes a pilot may use, and for how long, when Slurm has plans.

A site without a scavenger partition still has nodes idle until something claims them: a reservation, or a
pending job backfill planned there (``hpcsched.slurm.idle_windows`` reads both). Each such node's window sets
its pilot's time limit; a node whose window is below ``min_window_s`` gets none, with the reason in the status
file. The pending jobs' plan comes from the poll's one ``squeue`` (``pilot_read``), not from a call of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from hpcsched.slurm import commands
from hpcsched.slurm.idle_windows import Windows, read_windows
from hpcsched.slurm.nodes import NodeState
from hpcsched.slurm.pilot_config import PilotConfig
from hpcsched.slurm.pilot_read import SlurmRead

log = logging.getLogger("hpcsched.slurm.pilots")


class WindowFit:
    """The last poll's idle windows and the idle nodes backfill holds for a pending job."""

    def __init__(self, cfg: PilotConfig, job_name: str) -> None:
        self.cfg, self.job_name = cfg, job_name
        self.windows: Windows | None = None
        self.planned: set[str] = set()
        self._unplaced_said: tuple[str, ...] = ()

    def with_planned(self, idle: list[str], read: SlurmRead) -> list[str]:
        """``idle`` and the idle nodes backfill holds for a pending job (they serve until that job's expected
        start: their window), in Slurm's node order."""
        held = {n for j in read.holding for n in j.nodes}
        self.planned = {n for n, st in read.states.items() if planned(st) and n not in held}
        return [n for n in read.states if n in idle or n in self.planned]

    def fit(self, nodes: list[str], why_not: dict[str, str], now: float, read: SlurmRead,
            run: Callable[[list[str]], str]) -> tuple[list[str], dict[str, float]]:
        """Of the idle (and backfill-planned) nodes, those whose idle window is at least ``min_window_s``, longest
        window first (a pilot there serves longest), with each one's usable window (the window less
        ``window_margin_s``, at most ``time_limit_s``); why each other one is not used goes into ``why_not``."""
        c = self.cfg

        def from_poll(argv: list[str]) -> str:  # the pending jobs' squeue: this poll's one squeue answers it
            return read.pending_text if argv[0] == "squeue" else run(argv)

        try:
            w = read_windows(now, lambda j: j.name == self.job_name, from_poll)
        except ValueError as e:  # Slurm printed something this reader does not know: no guessing at windows
            raise commands.SlurmError(f"could not read the idle windows: {e}") from None
        self.windows = w
        if w.unplaced != self._unplaced_said:  # said once per change, and in every status file
            self._unplaced_said = w.unplaced
            if w.unplaced:
                log.warning("pilots: pending jobs %s have an expected start but no scheduled nodes: their claims "
                            "on nodes are not known and not counted in the idle windows", ",".join(w.unplaced))
        fits = {}
        for n in nodes:
            window = w.seconds(n, c.time_limit_s + c.window_margin_s)
            if n in self.planned and n not in w.claims:  # held for a job whose start squeue does not give
                why_not[n] = "planned by backfill for a pending job whose start Slurm does not give: window unknown"
            elif window < c.min_window_s:
                why_not[n] = f"idle window too short ({window:.0f} s{self.note(n, bare=True)}; " \
                             f"min_window_s {c.min_window_s})"
            else:
                fits[n] = min(window - c.window_margin_s, float(c.time_limit_s))
        return sorted(fits, key=lambda n: -fits[n]), fits

    def note(self, node: str, bare: bool = False) -> str:
        """' until reservation X at 06:29:05' (bare) or '; idle window 540 s until ...' for a node's status line."""
        w = self.windows
        if w is None or self.cfg.time_limit != "fit-idle-window":
            return ""
        claim = w.claims.get(node)
        if claim is None:
            return "" if bare else "; idle window unbounded (no reservation or planned job)"
        until = f": {claim.what}" if claim.at <= w.now else f" until {claim.what} at {clock_time(claim.at)}"
        if bare:
            return until
        return f"; idle window {w.seconds(node, self.cfg.time_limit_s + self.cfg.window_margin_s):.0f} s{until}"


def planned(st: NodeState) -> bool:
    """Idle, held by backfill for a pending job (``planned``, or ``idle-`` in the suffix notation), and nothing
    else wrong with it."""
    return not st.flags and (st.base == "planned" and not st.suffix or st.base == "idle" and st.suffix == "-")


def clock_time(t: float) -> str:
    """Local HH:MM:SS, as Slurm prints its times on this machine."""
    return time.strftime("%H:%M:%S", time.localtime(t))
