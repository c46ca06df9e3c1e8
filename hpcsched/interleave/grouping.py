"""Form interleaving groups of up to four jobs by repeated maximum-weight matching.

Round 1 matches single jobs into pairs; round 2 matches the resulting nodes (pairs and singles) so two
pairs become a group of four, or a pair and a single a group of three; and so on up to ``max_group``.
Merging only happens while the candidates need more GPUs than the cluster has: each merge frees the
GPUs of one node, and the first merge that makes everything fit is the last. That is the Muri
reference's procedure (``simulator/matching.py``), whose details this module keeps as options:

* ``mixed_gpus=False``: only jobs with the same GPU count are matched (one matching per GPU count,
  buckets in order of their highest-priority job); ``True`` matches across GPU counts, a group then
  holds ``max(member GPUs)`` GPUs and a merge frees the smaller node's GPUs.
* ``weight="efficiency"``: edge weight = interleaving efficiency of the merged group (the reference);
  ``"gain"``: GPU-equivalents of work gained by the merge, sum(g_j x solo_j / period) - max(g_j), minus
  what the two parts already gained. Only merges with a positive gain get an edge, so a group is formed
  only if it runs faster than its members taking turns on the GPUs.
* ``merge_order="index"``: matched pairs are merged in the order of their lower-priority member (the
  reference); ``"gain"``: the most valuable merges first.

Scores are cached per multiset of job types (same stages, GPUs and solo speed), so a scheduling event
mostly does dictionary look-ups; the matchings themselves are cached per multiset of node types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hpcsched.interleave.matching import MatchSettings, assign, pair_counts
from hpcsched.interleave.period import MAX_GROUP, STAGES, PeriodModel
from hpcsched.sim.semantics import SOLO_FACTOR, group_factor

TypeKey = tuple  # (gpus, data_s, compute_s, network_s, solo_s) or (gpus, None, solo_s) without a profile


@dataclass(frozen=True, slots=True)
class Candidate:
    """One job offered for grouping; candidates are given highest priority first."""

    id: str
    gpus: int
    stages: tuple[float, float, float] | None  # None: no profile, never grouped
    solo_s: float  # seconds per iteration when running alone (the simulator's solo period)

    @property
    def key(self) -> TypeKey:
        if self.stages is None:
            return (self.gpus, None, self.solo_s)
        return (self.gpus, *self.stages, self.solo_s)


@dataclass(frozen=True, slots=True)
class GroupingRules:
    model: PeriodModel = PeriodModel()
    max_group: int = MAX_GROUP
    mixed_gpus: bool = False
    weight: str = "efficiency"  # or "gain"
    merge_order: str = "index"  # or "gain"
    match: MatchSettings = MatchSettings()

    def __post_init__(self) -> None:
        if not 1 <= self.max_group <= MAX_GROUP:
            raise ValueError(f"max_group must be 1..{MAX_GROUP}, got {self.max_group}")
        if self.weight not in ("efficiency", "gain") or self.merge_order not in ("index", "gain"):
            raise ValueError(f"bad rules: weight={self.weight!r} merge_order={self.merge_order!r}")


@dataclass(frozen=True, slots=True)
class Score:
    raw_period: float  # what the simulator multiplies by its k-job slowdown factor
    efficiency: float
    gain: float  # GPU-equivalents gained over the members taking turns; 0 for one job


@dataclass
class Scorer:
    """Scores of groups by multiset of job types, memoised (a pure function's cache, nothing else)."""

    rules: GroupingRules
    _scores: dict[tuple[TypeKey, ...], Score] = field(default_factory=dict)
    _matches: dict[tuple, np.ndarray] = field(default_factory=dict)

    def scores(self, groups: Sequence[tuple[TypeKey, ...]]) -> list[Score]:
        missing = sorted({g for g in groups if g not in self._scores}, key=len)
        by_k: dict[int, list[tuple[TypeKey, ...]]] = {}
        for g in missing:
            by_k.setdefault(len(g), []).append(g)
        for k, gs in by_k.items():
            self._compute(k, gs)
        return [self._scores[g] for g in groups]

    def _compute(self, k: int, gs: list[tuple[TypeKey, ...]]) -> None:
        profiled = [g for g in gs if all(t[1] is not None for t in g)]
        for g in gs:
            if g not in profiled:
                solo = sum(t[-1] for t in g) * SOLO_FACTOR
                self._scores[g] = Score(solo, 0.0, 0.0)
        if not profiled:
            return
        t = np.array([[t[1 : 1 + STAGES] for t in g] for g in profiled], dtype=float)
        raw = self.rules.model.raw_periods(t)
        busy = t.sum(axis=(1, 2))
        for g, p, b in zip(profiled, raw, busy, strict=True):
            eff_period = float(p) * (group_factor(k) if k > 1 else 1.0)
            if k == 1:
                self._scores[g] = Score(float(p), float(b / (self.rules.model.resources * g[0][-1] * SOLO_FACTOR)), 0.0)
                continue
            work = sum(tk[0] * tk[-1] * SOLO_FACTOR for tk in g) / eff_period
            gain = work - max(tk[0] for tk in g)
            self._scores[g] = Score(float(p), float(b / (self.rules.model.resources * eff_period)), float(gain))


@dataclass(frozen=True, slots=True)
class Formed:
    """A group chosen by ``form_groups``: candidate indices, and its raw period (None for one job)."""

    members: tuple[int, ...]
    raw_period: float | None
    efficiency: float
    gain: float


def _gpus(node: tuple[int, ...], cands: Sequence[Candidate]) -> int:
    return max(cands[i].gpus for i in node)


def _round(
    buckets: list[list[tuple[int, ...]]], cands: Sequence[Candidate], scorer: Scorer, required: int, capacity: int
) -> tuple[list[list[tuple[int, ...]]], int, bool]:
    """One matching round over every bucket, then merges while ``required > capacity``."""
    rules = scorer.rules
    ready: list[tuple[float, int, int, tuple[int, ...], tuple[int, ...] | None]] = []  # (gain, bucket, pos, a, b)
    for bi, nodes in enumerate(buckets):
        node_keys = [tuple(sorted(cands[i].key for i in node)) for node in nodes]
        kinds = sorted(set(node_keys), key=repr)
        kind_ix = {k: i for i, k in enumerate(kinds)}
        node_type = [kind_ix[k] for k in node_keys]
        u = len(kinds)
        tw = np.zeros((u, u))
        pairs_needed: list[tuple[int, int, tuple[TypeKey, ...]]] = []
        for a in range(u):
            for b in range(a, u):
                if len(kinds[a]) + len(kinds[b]) <= rules.max_group:
                    pairs_needed.append((a, b, tuple(sorted(kinds[a] + kinds[b]))))
        merged = scorer.scores([m for _, _, m in pairs_needed])
        parts = dict(zip(kinds, scorer.scores(kinds), strict=True)) if rules.weight == "gain" else {}
        for (a, b, _), s in zip(pairs_needed, merged, strict=True):
            if s.efficiency <= 0:
                continue
            w = s.efficiency if rules.weight == "efficiency" else s.gain - parts[kinds[a]].gain - parts[kinds[b]].gain
            tw[a, b] = tw[b, a] = w
        counts = np.bincount(node_type, minlength=u)
        ckey = (tuple(kinds), tuple(counts.tolist()))
        x = scorer._matches.get(ckey)
        if x is None:
            canon = np.repeat(np.arange(u), counts)
            x, _ = pair_counts(canon, tw, rules.match)
            scorer._matches[ckey] = x
        paired: dict[int, int] = {}
        for i, j in assign(node_type, x):
            paired[i], paired[j] = j, i
        for pos, node in enumerate(nodes):
            partner = paired.get(pos)
            if partner is None:
                ready.append((0.0, bi, pos, node, None))
            elif partner < pos:
                ready.append((tw[node_type[partner], node_type[pos]], bi, pos, nodes[partner], node))
    if rules.merge_order == "gain":
        ready.sort(key=lambda r: (r[4] is None, -r[0], r[1], r[2]))
    out: list[list[tuple[int, ...]]] = [[] for _ in buckets]
    merged_any = False
    for _, bi, _, a, b in ready:
        if b is None:
            out[bi].append(a)
        elif required > capacity:
            out[bi].append(a + b)
            required -= min(_gpus(a, cands), _gpus(b, cands))
            merged_any = True
        else:
            out[bi].extend((a, b))
    return out, required, merged_any


def form_groups(cands: Sequence[Candidate], capacity: int, scorer: Scorer) -> list[Formed]:
    """Groups covering every candidate (singles included), merging only while they do not fit ``capacity``."""
    rules = scorer.rules
    if rules.mixed_gpus:
        buckets = [[(i,) for i in range(len(cands))]]
    else:
        by_gpus: dict[int, list[tuple[int, ...]]] = {}
        for i, c in enumerate(cands):
            by_gpus.setdefault(c.gpus, []).append((i,))
        buckets = list(by_gpus.values())
    required = sum(c.gpus for c in cands)
    for _ in range(rules.max_group):  # the reference tries as many rounds as a group has members
        if required <= capacity:
            break
        buckets, required, merged = _round(buckets, cands, scorer, required, capacity)
        if not merged:
            break
    nodes = [n for b in buckets for n in b]
    scores = scorer.scores([tuple(sorted(cands[i].key for i in n)) for n in nodes])
    return [
        Formed(n, s.raw_period if len(n) > 1 else None, s.efficiency, s.gain)
        for n, s in zip(nodes, scores, strict=True)
    ]
