"""The Pollux search's building blocks against their plain definitions.

The search's operators are written for speed (each pass touches only what breaks a constraint, duplicate
offspring are found by one sort, fronts by one sweep); each must give exactly what the plain formulation gives, and
draw the same random numbers, so a seeded run allocates the same at every round as before the rewrite.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcsched.compat.pollux_ga import PolluxGAPolicy, _fronts, _row_keys, _unseen


def _plain_repair(pol: PolluxGAPolicy, states: np.ndarray) -> np.ndarray:
    """The constraints over every entry, the random trim keys drawn from ``pol.rng`` in the same order."""
    states = states.astype(np.int64)
    distributed = np.count_nonzero(states, axis=2) > 1
    mask = (states * distributed[:, :, None]) > 0
    states[np.cumsum(mask, axis=1) > 1] = 0
    shuffle = np.argsort(pol.rng.random(states.shape), axis=2)
    s = np.take_along_axis(states, shuffle, axis=2)
    s = np.diff(np.minimum(np.cumsum(s, axis=2), pol.max_rep[None, :, None]), axis=2, prepend=0)
    states = np.take_along_axis(s, np.argsort(shuffle, axis=2), axis=2)
    return np.diff(np.minimum(np.cumsum(states, axis=1), pol.gpus_per_node), axis=1, prepend=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_repair_equals_the_plain_formulation_and_draws_the_same(seed: int) -> None:
    gen = np.random.default_rng(100 + seed)
    fast, plain = PolluxGAPolicy(nodes=6, gpus_per_node=4, seed=seed), PolluxGAPolicy(nodes=6, gpus_per_node=4,
                                                                                        seed=seed)
    for _ in range(20):
        jobs = int(gen.integers(1, 9))
        cap = gen.integers(1, 9, size=jobs)
        fast.max_rep = plain.max_rep = cap
        states = gen.integers(0, 5, size=(int(gen.integers(1, 40)), jobs, 6))
        got = fast._repair(states)
        assert np.array_equal(got, _plain_repair(plain, states))
        assert (got.sum(axis=1) <= 4).all() and (got.sum(axis=2) <= cap[None]).all()
    assert fast.rng.random() == plain.rng.random()  # the random streams stayed in step


def test_unseen_equals_a_set_of_bytes() -> None:
    gen = np.random.default_rng(5)
    for _ in range(50):
        seen = gen.integers(0, 2, size=(int(gen.integers(0, 30)), 3, 2)).astype(np.int8)
        kids = gen.integers(0, 2, size=(int(gen.integers(1, 30)), 3, 2)).astype(np.int8)
        known = {s.tobytes() for s in seen}
        want = []
        for i, kid in enumerate(kids):
            if kid.tobytes() not in known:
                known.add(kid.tobytes())
                want.append(i)
        assert _unseen(_row_keys(seen), _row_keys(kids)).tolist() == want


def _plain_fronts(f: np.ndarray) -> list[list[int]]:
    """Repeatedly peel the points no remaining point dominates (equal points share a front)."""
    left, out = set(range(len(f))), []
    while left:
        front = [i for i in left if not any((f[j] <= f[i]).all() and (f[j] < f[i]).any() for j in left)]
        out.append(sorted(front))
        left -= set(front)
    return out


def test_fronts_equal_the_plain_non_dominated_sort() -> None:
    gen = np.random.default_rng(9)
    for _ in range(40):
        f = gen.integers(0, 6, size=(int(gen.integers(1, 60)), 2)).astype(float) * -0.5  # many ties, -0.0 too
        assert [fr.tolist() for fr in _fronts(f)] == _plain_fronts(f)


def _plain_mutate(pol: PolluxGAPolicy, states: np.ndarray) -> np.ndarray:
    """The mutation over every entry with its probabilities as full arrays, drawing from ``pol.rng`` in order."""
    rng, shape = pol.rng, states.shape
    reset = rng.random(shape[:2]) < 0.1
    states = np.where(reset[:, :, None], pol.base[None], states)
    prob = np.where(rng.random(shape[:2]) < 0.1, 0.1, 0.0)
    states = np.where(rng.random(shape) < prob[:, :, None], 0, states)
    has_free = (pol.gpus_per_node - states.sum(axis=1) >= 1)[:, None, :]
    prob1 = has_free / max(shape[1], 1)
    on = (states > 0) & has_free
    prob2 = on / np.maximum(on.sum(axis=1, keepdims=True), 1)
    m = rng.random(shape) < prob1 + prob2 - prob1 * prob2
    return np.where(m, rng.integers(states, pol.gpus_per_node + 1), states).astype(np.int8)


@pytest.mark.parametrize("seed", [0, 1])
def test_mutate_equals_the_plain_formulation_and_draws_the_same(seed: int) -> None:
    gen = np.random.default_rng(200 + seed)
    fast, plain = PolluxGAPolicy(nodes=6, gpus_per_node=4, seed=seed), PolluxGAPolicy(nodes=6, gpus_per_node=4,
                                                                                        seed=seed)
    for _ in range(30):
        jobs = int(gen.integers(1, 9))
        fast.base = plain.base = gen.integers(0, 3, size=(jobs, 6)).astype(np.int8)
        fast.max_rep = gen.integers(1, 9, size=jobs)
        states = fast._repair(gen.integers(0, 5, size=(int(gen.integers(1, 40)), jobs, 6)).astype(np.int8))
        plain.rng.random(states.shape)  # the repair's keys, drawn on the fast side
        assert np.array_equal(fast._mutate(states), _plain_mutate(plain, states))
    assert fast.rng.random() == plain.rng.random()
