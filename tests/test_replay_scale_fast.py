"""What makes a long replay fast without changing it: decisions whose optimum is unique taken from the DP (the
answer HiGHS must give), and event rows kept as columns that read back as the same tuples."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from hpcsched.harvest.event_rows import EventRows
from hpcsched.harvest.replay_config import EVENT_COLUMNS, EVENT_KINDS
from hpcsched.milp import MilpJob, Objective, Problem, job_values, objective_value
from hpcsched.milp.allocate import solve_counts_sized
from hpcsched.milp.dp import solve_dp_unique
from hpcsched.model import ElasticJob, ScalingCurve

SHUFFLE = ScalingCurve((0.0, 1, 2, 4, 8, 16, 32, 64), (0.0, 2831, 5259, 9988, 20379.2, 38895.3, 74125.1, 145081.5))


def _problem(rng: random.Random) -> Problem:
    """Small decisions with non-concave curves, random holdings and pool sizes (some with identical jobs)."""
    pool = tuple(f"n{k}" for k in range(rng.randint(0, 12)))
    free, states = list(pool), []
    shared = None
    for i in range(rng.randint(1, 3)):
        if shared is None or rng.random() < 0.6:
            xs = sorted(rng.sample(range(0, 12), rng.randint(2, 5)))
            curve = ScalingCurve(tuple(float(x) for x in xs), tuple(float(rng.randint(0, 100)) for _ in xs))
            jmin = rng.randint(1, 3)
            shared = (curve, jmin, rng.randint(jmin, 9), float(rng.randint(0, 30)), float(rng.randint(0, 30)))
        curve, jmin, jmax, up, dw = shared
        c = rng.randint(0, min(len(free), jmax))
        states.append(MilpJob(ElasticJob(f"j{i}", 0.0, jmin, jmax, curve, 1e8, up, dw), free[:c]))
        free = free[c:]
    return Problem(tuple(states), pool, rng.choice([1.0, 10.0]), Objective.REFERENCE)


def _optima(problem: Problem) -> tuple[float, list[tuple[int, ...]]]:
    """The best objective by brute force and every count vector within 1e-6 of it."""
    values, size = job_values(problem), len(problem.pool)
    scored = [(objective_value(values, c), c) for c in itertools.product(range(size + 1), repeat=len(values))
              if sum(c) <= size and all(math.isfinite(v.value(n)) for v, n in zip(values, c, strict=True))]
    best = max(v for v, _ in scored)
    return best, [c for v, c in scored if v >= best - 1e-6]


def test_unique_optimum_is_the_milp_answer_and_ties_are_left_to_it() -> None:
    rng = random.Random(7)
    unique = tied = 0
    for _ in range(300):
        p = _problem(rng)
        values = job_values(p)
        got = solve_dp_unique(values, len(p.pool))
        best, optima = _optima(p)
        highs, status, _ = solve_counts_sized(p.jobs, len(p.pool), p.tfwd, p.objective, "highs")
        if got is None:
            tied += 1
            continue
        unique += 1
        assert optima == [tuple(got)], (p, got, optima)  # the one optimum, by brute force
        assert got == highs and status == "optimal"  # so the MILP returns it too
        shortcut = solve_counts_sized(p.jobs, len(p.pool), p.tfwd, p.objective, "highs", unique_shortcut=True)
        assert shortcut == (got, "optimal", 0)
    assert unique > 100 and tied > 20  # both kinds were met


def test_identical_jobs_in_identical_states_tie() -> None:
    """Two shufflenet jobs on 0 nodes and 5 free nodes: (2, 3) and (3, 2) are worth the same."""
    jobs = tuple(MilpJob(ElasticJob(f"j{i}", 0.0, 1, 64, SHUFFLE, 1e8, 18.0, 12.0)) for i in range(2))
    values = job_values(Problem(jobs, tuple(f"n{k}" for k in range(5)), 10.0))
    assert solve_dp_unique(values, 5) is None
    alone = job_values(Problem(jobs[:1], tuple(f"n{k}" for k in range(5)), 10.0))
    assert solve_dp_unique(alone, 5) == [5]  # one job: its best count is unique


def test_event_rows_read_back_the_same_tuples_and_types(monkeypatch: pytest.MonkeyPatch) -> None:
    import hpcsched.harvest.event_rows as er

    monkeypatch.setattr(er, "_CHUNK", 4)  # rows cross several chunk boundaries
    rows = []
    for k in range(11):
        t: object = 0 if k == 0 else 1_600_000_000.0 + k  # a hand-made timeline's int start stays an int
        rate: object = 0 if k == 3 else 1234.5 * k  # a rate summed over no jobs is the int 0
        rows.append((t, float(k), 40, k, 1, 12, 3, k // 2, 1, 0.25 * k, 2, 3.5, rate, 10.0, 1e-5 * k,
                     "finished" if k == 10 else "optimal"))
    ev = EventRows(EVENT_KINDS)
    for r in rows:
        ev.append(r)
    assert len(EVENT_KINDS) == len(EVENT_COLUMNS)
    assert ev.stored == 8 and len(ev) == 11
    assert list(ev) == rows and ev[-1] == rows[-1] and ev[2:5] == rows[2:5]
    assert repr(list(ev)) == repr(rows)  # types too: the replay digests hash the rows' repr
    assert set(ev.ints) == {0, 12} and not ev.odd  # an int time or rate is kept as a row index: 8 bytes
    with pytest.raises(IndexError):
        ev[11]


def test_event_rows_csv_is_what_csv_writer_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    import csv
    import io

    import hpcsched.harvest.event_rows as er
    from hpcsched.harvest.run import _num

    monkeypatch.setattr(er, "_CHUNK", 4)
    rng = random.Random(3)
    rows = []
    for k in range(23):  # five stored chunks and three pending rows; odd types inside stored chunks
        rows.append((0 if k == 5 else 1_600_000_000.0 + rng.random() * 1e4, rng.choice([0.0, -0.0, 1e-7, 3.25]),
                     rng.randint(0, 5000), k, 1, 12, 3, 2, 1, rng.random() * 1e9, 2, 1e-9 * k,
                     0 if k in (6, 7, 9, 21) else rng.random() * 1e6, 10.0, rng.random(),
                     rng.choice(["optimal", "empty"])))
    ev = er.EventRows(EVENT_KINDS)
    for r in rows:
        ev.append(r)
    want, got = io.StringIO(), io.StringIO()
    w = csv.writer(want)
    for r in rows:
        w.writerow([_num(v) for v in r])
    ev.write_csv(got, lambda v: str(_num(v)))
    assert got.getvalue() == want.getvalue()
    ev.names[0] = "a,b"  # a status that needs quoting goes through csv.writer
    quoted = io.StringIO()
    ev.write_csv(quoted, lambda v: str(_num(v)))
    assert '"a,b"' in quoted.getvalue()
