"""Pool events with no elastic job to decide for, replayed in bulk: the idle pool's changes and the event rows of a
whole stretch at once, as array operations over the timeline's run columns.

Why: on a batch log the elastic jobs may arrive late (86% into the 10^7-row benchmark log), and every pool event
before the first submit, or in a later stretch where every job is done and the next is not yet submitted, only
moves nodes in and out of the pool and writes a row: millions of events at ~16 us each in the per-event walk.
Nothing is decided for them, so their effect is the pool they leave behind, each row's pool size and node counts,
the idle node-seconds and the (cached) empty decisions; all of that is computed here from the columns.

The pool left behind is what the per-event walk leaves (``idle_runs.IdleRuns``): every node whose last change in
the stretch was a join sits in that event's batch (batches in join order, after the ones older than the stretch),
and a node that left was cut out of the batch it was in. An event's joined runs become the runs of its batch only
when they are ascending and separated (as every timeline built from a log or from intervals gives them), and every
node's changes must alternate from its state before the stretch; a stretch that breaks either is left to the
per-event walk, which keeps its checks and errors (``replay_quiet`` returns None).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hpcsched.harvest.decision import Answer
from hpcsched.harvest.idle_runs import IdleRuns
from hpcsched.harvest.pool import RangeEvents

MIN_EVENTS = 64  # fewer events are cheaper one by one than a pass over per-node arrays
MAX_EVENTS = 1 << 19  # events per bulk pass: bounds the arrays a pass holds (a longer stretch takes several)



@dataclass(slots=True)
class QuietStretch:
    """The events replayed: their times, the time since the previous one, the pool's size after each and the nodes
    that joined and left at each; ``idle_ns`` the idle node-seconds with the stretch's added, in the walk's order."""

    times: np.ndarray
    dt: np.ndarray
    size: np.ndarray
    joined: np.ndarray
    left: np.ndarray
    idle_ns: float


def _expand(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Every index of the runs [lo, hi), run after run."""
    length = hi - lo
    if len(length) == 0:
        return np.zeros(0, dtype=np.int64)
    shift = lo - np.r_[0, np.cumsum(length)[:-1]]
    return np.repeat(shift, length) + np.arange(int(length.sum()), dtype=np.int64)


def _per_event(off: np.ndarray, length: np.ndarray, a: int) -> np.ndarray:
    """Nodes in each event's runs, from the events' run offsets (``a``: the first run's offset)."""
    cum = np.r_[0, np.cumsum(length)]
    return cum[off[1:] - a] - cum[off[:-1] - a]


def _runs(x: np.ndarray) -> list[tuple[int, int]]:
    """Ascending distinct indices as runs."""
    if len(x) == 0:
        return []
    cut = np.flatnonzero(np.diff(x) != 1) + 1
    return list(zip(x[np.r_[0, cut]].tolist(), (x[np.r_[cut - 1, len(x) - 1]] + 1).tolist(), strict=True))


def quiet_end(events: RangeEvents, k: int, until: float) -> int:
    """The end of the stretch from event ``k``: the first event at or after ``until`` (the next submit, when a
    job is admitted), at most ``MAX_EVENTS`` on."""
    return min(int(np.searchsorted(events.times, until, side="left")), k + MAX_EVENTS, len(events))


def replay_quiet(events: RangeEvents, k0: int, k1: int, t_prev: float, idle_ns: float, pool: IdleRuns,
                 machine: int) -> QuietStretch | None:
    """Apply events ``k0`` to ``k1 - 1`` to ``pool`` as the per-event walk would, with no job active; None (pool
    untouched) where they are too few, out of time order or not as the walk's checks want them."""
    n = k1 - k0
    if n < MIN_EVENTS:
        return None
    times = np.asarray(events.times[k0:k1], dtype=np.float64)
    if (np.diff(times) < 0).any() or times[0] < t_prev:
        return None
    joff, jlo, jhi = events.joined
    loff, llo, lhi = events.left
    joff, loff = joff[k0:k1 + 1], loff[k0:k1 + 1]
    ja, jb, la, lb = int(joff[0]), int(joff[-1]), int(loff[0]), int(loff[-1])
    jl, jh = jlo[ja:jb].astype(np.int64), jhi[ja:jb].astype(np.int64)
    ll, lh = llo[la:lb].astype(np.int64), lhi[la:lb].astype(np.int64)
    for lo, hi in ((jl, jh), (ll, lh)):
        if len(lo) and ((lo >= hi).any() or lo.min() < 0 or hi.max() > machine):
            return None
    jev = np.repeat(np.arange(n, dtype=np.int64), np.diff(joff))
    lev = np.repeat(np.arange(n, dtype=np.int64), np.diff(loff))
    if len(jl) > 1 and ((jev[1:] == jev[:-1]) & (jl[1:] <= jh[:-1])).any():
        return None  # an event's joined runs not ascending and apart: the walk's batches would keep them as given
    jn, ln = _per_event(joff, jh - jl, ja), _per_event(loff, lh - ll, la)

    # every node change as node * 2n + (2 x event + 1 if it joined, 2 x event if it left): sorted, a node's
    # changes in event order, a leave before a join at one event (the walk removes, then adds)
    span = 2 * n
    key = np.concatenate([_expand(jl, jh) * span + np.repeat(2 * jev + 1, jh - jl),
                          _expand(ll, lh) * span + np.repeat(2 * lev, lh - ll)])
    key.sort()
    node, val = key // span, key % span
    del key
    idle0 = np.zeros(machine + 1, dtype=np.int8)
    starts = np.fromiter(pool.starts, dtype=np.int64, count=len(pool.starts))
    ends = np.fromiter((pool.run[s][0] for s in pool.starts), dtype=np.int64, count=len(starts))
    np.add.at(idle0, starts, 1)
    np.add.at(idle0, ends, -1)
    idle0 = np.cumsum(idle0[:-1], dtype=np.int8)
    same = node[1:] == node[:-1]
    joins = (val & 1).astype(np.int8)
    first = np.r_[True, ~same]
    last = np.r_[~same, True]
    if (same & (joins[1:] == joins[:-1])).any() or (joins[first] == idle0[node[first]]).any():
        return None  # a node joining while idle or leaving while not: the walk says which and where

    size0 = pool.size
    for a, b in _runs(node[first & (joins == 0)]):  # idle before the stretch and left in it: cut from their batch
        pool.remove(a, b)
    stay = last & (joins == 1)
    nx, ev = node[stay], val[stay] // 2
    o = np.lexsort((nx, ev))
    nx, ev = nx[o], ev[o]
    if len(nx):
        head = np.r_[True, (ev[1:] != ev[:-1]) | (nx[1:] != nx[:-1] + 1)]
        at = np.flatnonzero(head)
        run_lo, run_hi = nx[at].tolist(), (nx[np.r_[at[1:], len(nx)] - 1] + 1).tolist()
        run_ev = ev[at].tolist()
        i = 0
        while i < len(run_ev):  # one batch per event whose joiners are still idle, in event order
            j = i
            while j < len(run_ev) and run_ev[j] == run_ev[i]:
                j += 1
            pool.add(list(zip(run_lo[i:j], run_hi[i:j], strict=True)), float(times[run_ev[i]]), events.names)
            i = j
    size = size0 + np.cumsum(jn - ln)
    if int(size[-1]) != pool.size:
        raise RuntimeError(f"bulk replay of events {k0}-{k1 - 1} left {pool.size} idle nodes, the counts say "
                           f"{int(size[-1])}: a replay bug")
    dt = np.diff(np.r_[t_prev, times])
    before = np.r_[size0, size[:-1]]
    total = float(np.cumsum(np.r_[idle_ns, dt * before])[-1])  # sequential, as the walk adds them
    return QuietStretch(times, dt, size, jn, ln, total)


def empty_answers(cache: dict[tuple[object, ...], Answer], sizes: np.ndarray,
                  key_of: Callable[[int], tuple[object, ...]],
                  solve: Callable[[int], Answer], limit: int) -> tuple[int, list[Answer], np.ndarray]:
    """The empty decision at each pool size in ``sizes`` through the decisions' cache, as one ``decide`` per event
    would go (a miss is solved and kept, the cache is emptied once it holds more than ``limit``): (the hits, the
    answers, each event's index into them)."""
    uniq, first, inv = np.unique(sizes, return_index=True, return_inverse=True)
    keys = [key_of(int(s)) for s in uniq]
    missing = [int(i) for i in np.argsort(first, kind="stable") if keys[i] not in cache]
    if len(cache) + len(missing) - 1 <= limit:  # no miss empties the cache: order does not matter
        for i in missing:
            cache[keys[i]] = solve(int(uniq[i]))
        return len(sizes) - len(missing), [cache[key] for key in keys], inv.reshape(-1)
    hits = 0
    answers: list[Answer] = []
    seen: dict[int, int] = {}
    at = np.empty(len(sizes), dtype=np.int64)
    for e, s in enumerate(sizes.tolist()):  # the cache is emptied within the stretch: the exact sequence
        key = key_of(s)
        got = cache.get(key)
        if got is None:
            if len(cache) > limit:
                cache.clear()
            got = cache[key] = solve(s)
        else:
            hits += 1
        if id(got) not in seen:
            seen[id(got)] = len(answers)
            answers.append(got)
        at[e] = seen[id(got)]
    return hits, answers, at


def tally(answers: list[Answer], at: np.ndarray, statuses: Counter[str]) -> tuple[object, int]:
    """Count each event's answer's status into ``statuses``: (the events' status column: one status all share or
    one a row, the jobs held at their minimum over the events)."""
    held = 0
    for (_, status, h), m in zip(answers, np.bincount(at, minlength=len(answers)).tolist(), strict=True):
        statuses[status] += m
        held += h * m
    names = {a[1] for a in answers}
    return (names.pop() if len(names) == 1 else [answers[i][1] for i in at.tolist()]), held
