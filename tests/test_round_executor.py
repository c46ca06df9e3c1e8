"""Gavel's round mechanism as the runtime's executor (``hpcsched.hetero.round_executor``, issue 19): the decision of
one round on a hand-checked case (2 types, 3 jobs, a fixed allocation: priorities, rotation, deficits at a reset),
the reasons a job cannot take part, and parity with the simulator's loop (``hpcsched.hetero.rounds``): fed the time
the simulator charges, the executor picks the same jobs on the same types, round for round."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest

from hpcsched.hetero.policies import AllocationInput, GavelPolicy, make_policy
from hpcsched.hetero.round_executor import RoundExecutor, RoundJobView, throughputs
from hpcsched.hetero.rounds import RoundJob, simulate_rounds
from hpcsched.hetero.throughputs import load_throughputs
from hpcsched.primitives.hetero_cluster import parse_hetero_cluster

RESNET = "ResNet-50 (batch size 64)"  # v100 4.39, p100 2.62, k80 0.62 steps/s
REC = "Recommendation (batch size 512)"  # v100 23.32, p100 48.88, k80 32.86
TRANSFORMER = "Transformer (batch size 16)"  # v100 11.06, p100 9.54, k80 5.47


@dataclass
class Fixed(GavelPolicy):
    """A policy whose allocation is given (rows: jobs by id; columns: types by name), so priorities are by hand."""

    rows: dict[int, dict[str, float]] | None = None

    def allocate(self, inp: AllocationInput) -> np.ndarray:
        assert self.rows is not None
        return np.array([[self.rows[j][t] for t in inp.types] for j in inp.job_ids])


def _views(received: dict[str, dict[str, float]], models: dict[str, str]) -> list[RoundJobView]:
    return [RoundJobView(j, m, 1, float(i), None, (), received.get(j, {})) for i, (j, m) in enumerate(models.items())]


def test_a_round_by_hand() -> None:
    """Allocation A: v100 0.6; B: k80 0.7; C: v100 0.4, k80 0.3. Rounds of R = 10 s, every job starting each period
    at R/2 per type. Round 1: priority = 3 x allocation (every time equal): A 1.8 on v100, B 2.1 on k80 -> A v100,
    B k80. Round 2 (A ran 10 s on v100, B 10 s on k80; totals 25 s per type): v100 A 0.6/(15/25) = 1.0 < C
    0.4/(5/25) = 2.0; k80 B 0.7/(15/25) = 1.1667 < C 1.5, but C is taken on v100 -> C v100, B k80. Round 3 (totals
    35): v100 A 1.4 > C 0.9333; k80 C 0.3/(5/35) = 2.1 > B 0.98 -> A v100, C k80, B waits. Then C ends: the job set
    changed, so the allocation is re-solved (reset_s 0) and each deficit gains allocation x 30 s - time received."""
    table = load_throughputs()
    pol = Fixed(name="fixed", rows={0: {"v100": 0.6, "k80": 0.0}, 1: {"v100": 0.0, "k80": 0.7},
                                    2: {"v100": 0.4, "k80": 0.3}})
    ex = RoundExecutor(pol, table, round_s=10.0, reset_s=0.0)
    models = {"A": RESNET, "B": REC, "C": TRANSFORMER}
    gpus = {"v100": 1, "k80": 1}
    d1 = ex.decide(0.0, _views({}, models), gpus)
    assert d1.reset and d1.round == 1 and d1.assignment == {"A": "v100", "B": "k80"} and not d1.idle
    assert d1.priorities["A"]["v100"] == pytest.approx(1.8) and d1.priorities["B"]["k80"] == pytest.approx(2.1)
    assert d1.priorities["C"] == pytest.approx({"v100": 1.2, "k80": 0.9}) and d1.priorities["A"]["k80"] == 0.0
    assert d1.allocation == {"A": {"v100": 0.6, "k80": 0.0}, "B": {"v100": 0.0, "k80": 0.7},
                             "C": {"v100": 0.4, "k80": 0.3}}
    d2 = ex.decide(10.0, _views({"A": {"v100": 10.0}, "B": {"k80": 10.0}}, models), gpus)
    assert not d2.reset and d2.assignment == {"C": "v100", "B": "k80"}
    assert d2.priorities["A"]["v100"] == pytest.approx(1.0) and d2.priorities["C"]["v100"] == pytest.approx(2.0)
    assert d2.priorities["B"]["k80"] == pytest.approx(0.7 / 0.6) and d2.priorities["C"]["k80"] == pytest.approx(1.5)
    d3 = ex.decide(20.0, _views({"A": {"v100": 10.0}, "B": {"k80": 20.0}, "C": {"v100": 10.0}}, models), gpus)
    assert d3.assignment == {"A": "v100", "C": "k80"}
    assert d3.priorities["A"]["v100"] == pytest.approx(1.4) and d3.priorities["C"]["k80"] == pytest.approx(2.1)
    assert d3.priorities["B"]["k80"] == pytest.approx(0.98)
    # C ends; A ran 20 s on v100, B 20 s on k80 since the period began at 0; C's 20 s still count in the totals
    left = {"A": RESNET, "B": REC}
    d4 = ex.decide(30.0, _views({"A": {"v100": 20.0}, "B": {"k80": 20.0}}, left), gpus,
                   totals={"v100": 30.0, "k80": 30.0})
    assert d4.reset and d4.period_start == 30.0 and ex.resets == 2
    assert ex._deficit["A"] == pytest.approx({"v100": 0.6 * 30 - 20, "k80": 0.0})  # noqa: SLF001 (the rule by hand)
    assert ex._deficit["B"] == pytest.approx({"v100": 0.0, "k80": 0.7 * 30 - 20})  # noqa: SLF001
    assert d4.assignment == {"A": "v100", "B": "k80"} and "C" not in d4.allocation


def test_arrivals_wait_for_a_reset_and_reasons_are_given() -> None:
    """Gavel's reset rule: a job that arrives less than reset_s after the last reset is outside the allocation
    (priority 0); when the greedy pass still picks it, its GPUs idle for the round. Jobs that cannot take part
    say why, and the others are decided without them."""
    table = load_throughputs()
    ex = RoundExecutor("max-min-fairness-perf", table, round_s=10.0, reset_s=100.0)
    gpus = {"v100": 1, "k80": 1}
    d1 = ex.decide(0.0, [RoundJobView("A", RESNET, 1, 0.0)], gpus)
    assert d1.reset and d1.assignment == {"A": "v100"}
    late = [RoundJobView("A", RESNET, 1, 0.0, received={"v100": 10.0}), RoundJobView("B", REC, 1, 5.0)]
    d2 = ex.decide(10.0, late, gpus)
    assert not d2.reset and "B" not in d2.allocation and d2.priorities["B"] == {"v100": 0.0, "k80": 0.0}
    assert d2.assignment == {"A": "v100"} and d2.idle == {"B": "k80"}  # Gavel leaves B's K80 idle
    d3 = ex.decide(100.0, [*late[:1], RoundJobView("B", REC, 1, 5.0)], gpus)
    assert d3.reset and d3.assignment == {"A": "v100", "B": "k80"}
    bad = [RoundJobView("n", None, 1, 0.0), RoundJobView("u", "no such model", 1, 0.0),
           RoundJobView("s", RESNET, 3, 0.0), RoundJobView("t", RESNET, 1, 0.0, gpu_types=("p100",)),
           RoundJobView("w", RESNET, 2, 0.0)]
    d4 = RoundExecutor("max-min-fairness-perf", table).decide(0.0, bad, gpus)
    assert d4.assignment == {} and set(d4.excluded) == {"n", "u", "s", "t", "w"}
    assert "no model:" in d4.excluded["n"] and "not in the throughput table" in d4.excluded["u"]
    assert "at 3 procs" in d4.excluded["s"] and "sizes 1, 2, 4, 8" in d4.excluded["s"]
    assert "accepts p100" in d4.excluded["t"] and "needs 2 GPUs of one type" in d4.excluded["w"]
    d5 = RoundExecutor("min-total-duration-perf", table).decide(0.0, [RoundJobView("x", RESNET, 1, 0.0)], gpus)
    assert "needs each job's steps" in d5.excluded["x"]
    # case and spacing ignored; a type the table lacks: 0
    assert throughputs(RoundJobView("r", " recommendation  (BATCH size 512)", 1, 0.0), ["v100", "k80", "a100"],
                       table) == pytest.approx([23.32, 32.86, 0.0], abs=0.01)
    with pytest.raises(ValueError, match="space sharing"):
        RoundExecutor("max-min-fairness-packed", table)


def _simulated(policy: str, cluster: str, jobs: list[RoundJob], rounds: int, round_s: float
               ) -> tuple[list[dict[int, str]], list[dict[int, tuple[str, float]]]]:
    """The simulator's first ``rounds`` assignments, and what it charges each job that ran (type, s)."""
    table = load_throughputs()
    seen: list[dict[int, str]] = []

    def on_round(t: float, scheduled: dict[int, str]) -> None:
        seen.append(dict(scheduled))
        if len(seen) >= rounds:
            raise StopIteration

    with pytest.raises(StopIteration):
        simulate_rounds(jobs, parse_hetero_cluster(cluster), make_policy(policy), table, round_s=round_s,
                        on_round=on_round)
    charged = []
    for sched in seen:  # the simulator's micro-task: int(thr x round_s) steps, charged steps / thr seconds
        out = {}
        for jid, t in sched.items():
            thr = table.isolated(jobs[jid].job_type, t, jobs[jid].scale_factor)
            out[jid] = (t, int(thr * round_s) / thr)
        charged.append(out)
    return seen, charged


@pytest.mark.parametrize(("policy", "cluster", "n_jobs"), [
    ("max-min-fairness-perf", "v100=1,k80=1", 3), ("max-min-fairness-perf", "v100=2,p100=2,k80=2", 7),
    ("max-sum-throughput-perf", "v100=2,p100=1,k80=2", 6), ("max-min-fairness", "v100=2,p100=2,k80=2", 7),
    ("fifo", "v100=1,p100=1,k80=1", 5)])
def test_parity_with_the_simulator(policy: str, cluster: str, n_jobs: int) -> None:
    """Jobs that all arrive at 0 and outlive the rounds: fed the seconds the simulator charges (each round ends when
    its slowest micro-task does), the executor gives the simulator's assignment in every one of 12 rounds."""
    rng = random.Random(7)
    table = load_throughputs()
    models = table.job_types()
    jobs = [RoundJob(i, rng.choice(models), 10**9, rng.choice((1, 1, 1, 2)), 0.0) for i in range(n_jobs)]
    round_s = 360.0
    seen, charged = _simulated(policy, cluster, jobs, 12, round_s)
    spec = parse_hetero_cluster(cluster)
    ex = RoundExecutor(policy, table, round_s=round_s)
    received: dict[str, dict[str, float]] = {}
    now = 0.0
    for r, (want, paid) in enumerate(zip(seen, charged, strict=True)):
        views = [RoundJobView(str(j.id), j.job_type, j.scale_factor, 0.0, 10**9, (), dict(received.get(str(j.id), {})))
                 for j in jobs]
        d = ex.decide(now, views, spec.gpu_counts())
        assert d.assignment == {str(j): t for j, t in want.items()}, f"round {r + 1}"
        # the round ends when its slowest micro-task does; each job is charged from the round's start
        length = max((s for _, s in paid.values()), default=0.0)
        for jid, (t, s) in paid.items():
            received.setdefault(str(jid), {})
            received[str(jid)][t] = received[str(jid)].get(t, 0.0) + s
        now += length
