"""Conformance of the whole registry of Gavel's allocation policies (``hpcsched.hetero.policies``): every
registered policy keeps the allocation contract on random inputs, single and space-sharing alike, and the
registry refuses a duplicate name and names the known ones for an unknown one. A new Gavel policy module is
checked here without a new test."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hpcsched.hetero.policies import NO_SOLVER, POLICIES, REGISTRY, AllocationInput, GavelPolicy, make_policy

TYPES = ("k80", "p100", "v100")
# Gavel's FIFO gives a job the last type with free GPUs in name order, so it can over-commit a type (kept bug for
# bug: its figures depend on it; the mechanism then runs the jobs of highest priority): the capacity row of the
# contract is the programs', which FIFO solves none of.
OVER_COMMITS = {"fifo"}


def _input(rng: np.random.Generator, m: int, with_pairs: bool) -> AllocationInput:
    thr = rng.uniform(0.5, 10.0, (m, len(TYPES))) * np.array([1.0, 2.0, 4.0])
    sf = rng.choice([1, 1, 1, 2, 4], m).astype(float)
    pairs: tuple[tuple[int, int], ...] = ()
    pthr = None
    if with_pairs:  # equal-size pairs, each member slower than alone (as the throughput table has them)
        pairs = tuple((a, b) for a, b in itertools.combinations(range(m), 2) if sf[a] == sf[b])
        pthr = np.stack([np.stack([thr[a] * rng.uniform(0.4, 0.9, len(TYPES)),
                                   thr[b] * rng.uniform(0.4, 0.9, len(TYPES))], axis=1) for a, b in pairs]) \
            if pairs else np.zeros((0, len(TYPES), 2))
    return AllocationInput(
        job_ids=tuple(range(m)), types=TYPES, throughputs=thr, scale_factors=sf,
        priority_weights=rng.choice([1.0, 1.0, 2.0], m), steps_remaining=rng.uniform(1e3, 1e6, m),
        times_since_start=rng.uniform(0.0, 1e4, m), gpus=rng.choice([2, 4, 8], len(TYPES)).astype(float),
        prices=np.array([0.9, 1.5, 3.0]), slo_left=np.where(rng.random(m) < 0.3, rng.uniform(1e3, 1e5, m), np.inf),
        entities=tuple(rng.choice(["u1", "u2"], m).tolist()), pairs=pairs, pair_throughputs=pthr)


def test_every_policy_module_registers_itself() -> None:
    assert {"fifo", "max-min-fairness", "max-min-fairness-perf", "finish-time-fairness-perf",
            "min-total-duration-perf", "max-sum-throughput-perf", "max-min-fairness-packed", "fifo-packed",
            "finish-time-fairness-packed", "min-total-duration-packed",
            "max-sum-throughput-normalized-by-cost-packed-SLOs", "max-sum-throughput-normalized-by-cost-perf",
            "max-sum-throughput-normalized-by-cost-perf-SLOs", "max-min-fairness-water-filling",
            "max-min-fairness-water-filling-perf"} <= set(REGISTRY)
    assert list(POLICIES) == REGISTRY.names() and all(POLICIES.values())
    assert {"fifo", "fifo-packed"} <= set(NO_SOLVER) and not any(REGISTRY.get(n).solves for n in NO_SOLVER)


@pytest.mark.parametrize("name", REGISTRY.names())
def test_every_policy_keeps_the_allocation_contract(name: str) -> None:
    rng = np.random.default_rng(sum(map(ord, name)))
    for case in range(4):
        m = int(rng.integers(1, 7))
        pol = make_policy(name, seed=case)
        assert isinstance(pol, GavelPolicy) and pol.name == name
        inp = _input(rng, m, pol.space_sharing)
        x = pol.allocate(inp)
        rows = m + len(inp.pairs)
        assert x.shape == (rows, len(TYPES)), (name, case)
        assert np.isfinite(x).all() and (x >= -1e-9).all() and (x <= 1 + 1e-9).all(), (name, case, x)
        # each job's time, alone and in every pair holding it, is at most the whole round
        time = x[:m].sum(axis=1).copy()
        for p, (a, b) in enumerate(inp.pairs):
            time[a] += x[m + p].sum()
            time[b] += x[m + p].sum()
        assert (time <= 1 + 1e-6).all(), (name, case, time)
        if name not in OVER_COMMITS:  # a pair holds its GPUs once
            sf = np.concatenate([inp.scale_factors, [inp.scale_factors[a] for a, _ in inp.pairs]])
            assert ((sf[:, None] * x).sum(axis=0) <= inp.gpus + 1e-6).all(), (name, case)
        again = make_policy(name, seed=case).allocate(inp)  # a fresh policy, the same input: the same answer
        assert np.array_equal(x, again), (name, case)


def test_the_registry_refuses_a_duplicate_and_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        REGISTRY.register("fifo", "again")(lambda opts: make_policy("fifo"))
    with pytest.raises(KeyError, match=r"unknown Gavel policy 'las'; known: fifo, fifo-packed, "):
        make_policy("las")
    with pytest.raises(KeyError, match="unknown solver 'cplex'"):
        make_policy("max-min-fairness-perf", solver="cplex")
