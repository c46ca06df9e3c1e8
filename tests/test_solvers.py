"""The one HiGHS wrapper: solves do not depend on what ran before in the process, and HiGHS never writes
to standard output."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hpcsched.interleave.matching import MatchSettings, pair_counts
from hpcsched.milp import MilpJob, Problem, allocate
from hpcsched.model import ElasticJob, ScalingCurve

CURVE = ScalingCurve((0.0, 1, 2, 4, 8, 16), (0.0, 2831, 5259, 9988, 20379.2, 38895.3))


def _problem() -> Problem:
    """Three jobs over 11 nodes where greedy is not optimal (checked against the exact DP below)."""
    jobs = (
        MilpJob(ElasticJob("a", 0.0, 3, 8, CURVE, 1e8, 18, 12), nodes=("n0", "n1", "n2")),
        MilpJob(ElasticJob("b", 0.0, 2, 16, CURVE, 1e8, 30, 20)),
        MilpJob(ElasticJob("c", 0.0, 4, 4, ScalingCurve((0.0, 4.0), (0.0, 16000.0)), 1e8, 5, 5)),
    )
    return Problem(jobs, tuple(f"n{k}" for k in range(11)), tfwd=60.0)


def _foreign_highs_with_default_threads() -> None:
    """What another library in the process may do: a HiGHS model with HiGHS's default thread count."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.addVars(1, np.zeros(1), np.ones(1))
    h.run()


def test_the_interleave_matcher_then_the_milp_in_one_process_is_optimal() -> None:
    # The types engine solves an integer program with HiGHS; the MILP allocator solves the next one.
    x, engine = pair_counts([0, 0, 1, 1, 2], np.array([[0.5, 0.9, 0.2], [0.9, 0.4, 0.3], [0.2, 0.3, 0.1]]),
                            MatchSettings(dense_limit=0, type_limit=10))
    assert engine == "types"
    assert int(x.sum()) == 2
    d = allocate(_problem(), "highs")
    assert d.status == "optimal"
    assert d.objective == pytest.approx(allocate(_problem(), "dp").objective, rel=1e-9)


def test_a_solve_after_a_foreign_highs_with_another_thread_count_is_optimal() -> None:
    _foreign_highs_with_default_threads()
    d = allocate(_problem(), "highs")
    assert d.status == "optimal"
    assert d.objective == pytest.approx(allocate(_problem(), "dp").objective, rel=1e-9)


def test_highs_prints_nothing_on_stdout() -> None:
    code = ("from hpcsched.milp import allocate\n"
            "import tests.test_solvers as t\n"
            "d = allocate(t._problem(), 'highs')\n"
            "import sys; sys.stderr.write(d.status)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert r.stdout == ""
    assert r.stderr.strip().endswith("optimal")
