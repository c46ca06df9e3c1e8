"""One admitted elastic job's state in a replay: its nodes, progress and counters, and what a resize costs it."""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcsched.milp.mapping import Run
from hpcsched.milp.problem import job_rate
from hpcsched.model import ElasticJob


@dataclass(slots=True)
class JobRun:
    job: ElasticJob
    held: list[Run] = field(default_factory=list)  # node index runs, oldest first (shrinking drops the newest)
    n: int = 0  # nodes held
    samples: float = 0.0
    rate: float = 0.0
    pending_loss: float = 0.0  # samples lost to the last decision's restart, charged at the next event
    start: float | None = None
    end: float | None = None
    node_seconds: float = 0.0
    max_nodes: int = 0
    rescales: int = 0
    preemptions: int = 0
    past_pmax_ns: float = 0.0  # node-seconds held after reaching Pmax, before an event saw it
    step_past_ns: float = 0.0  # the last step's share of that, kept only if the job completes at the event
    valued: ElasticJob | None = None  # the job as the MILP values it, when a valuation revalues it (else ``job``)
    rates: dict[int, float] = field(default_factory=dict)  # job_rate(rates_of, n) by n, as computed
    rates_of: ElasticJob | None = None

    def rate_at(self, n: int) -> float:
        """``job_rate(job, n)``, remembered: a replay asks it for the same few counts millions of times (a
        valuation may swap ``job`` as the job progresses: its rates are then computed afresh)."""
        if self.rates_of is not self.job:
            self.rates, self.rates_of = {}, self.job
        rate = self.rates.get(n)
        if rate is None:
            rate = self.rates[n] = job_rate(self.job, n)
        return rate

    def restart_loss(self, accounting: str, preempted: bool, c: int, n: int, new_rate: float, first: bool) -> float:
        """Samples a decision moving the job from ``c`` to ``n`` nodes costs it (``ReplayConfig.accounting``)."""
        job = self.job
        if accounting == "reference":  # T x old rate (a start is free but the very first)
            if first and n > 0:
                return job.scale_up_s * new_rate
            if n > c:
                return job.scale_up_s * self.rate_at(c)
            if n < c:
                return job.scale_down_s * self.rate_at(c)
            return 0.0
        if n > 0 and (preempted or n != c):  # one stall per restart, at the new rate
            return (job.scale_down_s if preempted or n < c else job.scale_up_s) * new_rate
        return 0.0
