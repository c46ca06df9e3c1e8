"""Form interleaving groups of up to four jobs by repeated maximum-weight matching.

Round 1 matches single jobs into pairs; round 2 matches the resulting nodes (pairs and singles) so two
pairs become a group of four, or a pair and a single a group of three; and so on up to ``max_group``.
Merging only happens while the candidates need more GPUs than the cluster has: each merge frees the
GPUs of one node, and the first merge that makes everything fit is the last. That is the Muri
reference's procedure (``simulator/matching.py``), whose details this module keeps as options:

* GPU counts: jobs are matched only with jobs of the same GPU count (one matching per count, buckets
  in order of their highest-priority job). With ``mixed_gpus=True``, if that leaves the candidates
  still needing more GPUs than the cluster has, further rounds match across GPU counts: a group then
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
from hpcsched.interleave.screening import sparse_pairs
from hpcsched.primitives.speed import group_factor

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


Kind = tuple[int, ...]  # a node: sorted interned job-type ids of its members
_VECTOR_FROM = 64  # more node kinds than this: weights computed in one vectorised pass, not cached
_PAIRS_CACHE = 200_000  # ordered node sequences whose pairs are remembered (small buckets recur a lot)
_CHUNK = 50_000  # groups per vectorised period evaluation (bounds memory: 24 orderings x 16 floats each)


@dataclass
class Scorer:
    """Scores of groups by multiset of job types, memoised (a pure function's cache, nothing else).

    Job types are interned to small integers once, so a scheduling event works on tuples of ints:
    the score of a group, the weight between two nodes and the matching of a multiset of nodes are
    each computed once per run and then looked up.
    """

    rules: GroupingRules
    _ids: dict[TypeKey, int] = field(default_factory=dict)
    _types: list[TypeKey] = field(default_factory=list)
    _scores: dict[Kind, Score] = field(default_factory=dict)
    _weights: dict[tuple[Kind, Kind], float] = field(default_factory=dict)
    _matrices: dict[tuple[Kind, ...], np.ndarray] = field(default_factory=dict)
    _matches: dict[tuple, np.ndarray] = field(default_factory=dict)
    _pairs: dict[tuple[Kind, ...], list[tuple[int, int, float]]] = field(default_factory=dict)

    def intern(self, key: TypeKey) -> int:
        i = self._ids.get(key)
        if i is None:
            i = self._ids[key] = len(self._types)
            self._types.append(key)
        return i

    def scores(self, groups: Sequence[Kind]) -> list[Score]:
        missing = sorted({g for g in groups if g not in self._scores}, key=len)
        by_k: dict[int, list[Kind]] = {}
        for g in missing:
            by_k.setdefault(len(g), []).append(g)
        for k, gs in by_k.items():
            self._compute(k, gs)
        return [self._scores[g] for g in groups]

    def weight(self, a: Kind, b: Kind) -> float:
        """Edge weight between two nodes (0: no edge), per the rules' ``weight``."""
        w = self._weights.get((a, b))
        if w is None:
            w = 0.0
            if len(a) + len(b) <= self.rules.max_group:
                merged, sa, sb = self.scores([tuple(sorted(a + b)), a, b])
                if merged.efficiency > 0:
                    w = merged.efficiency if self.rules.weight == "efficiency" else merged.gain - sa.gain - sb.gain
            self._weights[(a, b)] = self._weights[(b, a)] = w
        return w

    def matrix(self, kinds: Sequence[Kind]) -> np.ndarray:
        """Edge weights between node kinds: looked up pair by pair and cached for few kinds (the usual
        case: a trace has a few dozen job types), one vectorised pass for many (distinct profiles)."""
        key = tuple(kinds)
        tw = self._matrices.get(key)
        if tw is not None:
            return tw
        u = len(kinds)
        if u > _VECTOR_FROM:
            return self._matrix_vectorised(kinds)
        tw = np.zeros((u, u))
        for a in range(u):
            for b in range(a, u):
                tw[a, b] = tw[b, a] = self.weight(kinds[a], kinds[b])
        self._matrices[key] = tw
        return tw

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        types = self._types
        stages = np.array([t[1 : 1 + STAGES] if t[1] is not None else (0.0,) * STAGES for t in types], dtype=float)
        profiled = np.array([t[1] is not None for t in types])
        gpus = np.array([t[0] for t in types], dtype=float)
        solo = np.array([t[-1] for t in types], dtype=float)
        return stages, profiled, gpus, solo

    def _matrix_vectorised(self, kinds: Sequence[Kind]) -> np.ndarray:
        rules = self.rules
        stages, profiled, gpus, solo = self._arrays()
        u = len(kinds)
        size = np.array([len(k) for k in kinds])
        width = int(size.max())
        members = np.full((u, width), -1, dtype=np.intp)  # kinds padded with -1
        for i, k in enumerate(kinds):
            members[i, : len(k)] = k
        part_gain = np.array([s.gain for s in self.scores(list(kinds))]) if rules.weight == "gain" else np.zeros(u)
        valid = size[:, None] + size[None, :] <= rules.max_group
        ii, jj = np.nonzero(np.triu(valid))
        tw = np.zeros((u, u))
        for la in np.unique(size):
            for lb in np.unique(size):
                sel = (size[ii] == la) & (size[jj] == lb)
                if not sel.any():
                    continue
                a, b = ii[sel], jj[sel]
                grp = np.concatenate([members[a, :la], members[b, :lb]], axis=1)
                w, ok = self._weights_of(grp, stages, profiled, gpus, solo)
                w = np.where(ok, w - part_gain[a] - part_gain[b], 0.0)
                tw[a, b] = w
                tw[b, a] = w
        return tw

    def _weights_of(
        self, grp: np.ndarray, stages: np.ndarray, profiled: np.ndarray, gpus: np.ndarray, solo: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Efficiency or gain (before subtracting the parts' gains) of G merged groups of k job types, and
        which of them can be scored at all (every member profiled)."""
        rules = self.rules
        t = stages[grp]
        raw = np.concatenate([rules.model.raw_periods(t[c : c + _CHUNK]) for c in range(0, len(t), _CHUNK)])
        period = raw * group_factor(grp.shape[1])
        ok = profiled[grp].all(axis=1) & (period > 0)
        safe = np.where(ok, period, 1.0)
        if rules.weight == "efficiency":
            w = t.sum(axis=(1, 2)) / (rules.model.resources * safe)
        else:
            w = (gpus[grp] * solo[grp]).sum(axis=1) / safe - gpus[grp].max(axis=1)
        return np.where(ok, w, 0.0), ok

    def _compute(self, k: int, gs: list[Kind]) -> None:
        types = self._types
        profiled = [g for g in gs if all(types[t][1] is not None for t in g)]
        for g in gs:
            if types[g[0]][1] is None or g not in profiled:
                self._scores[g] = Score(sum(types[t][-1] for t in g), 0.0, 0.0)
        if not profiled:
            return
        t = np.array([[types[i][1 : 1 + STAGES] for i in g] for g in profiled], dtype=float)
        raw = self.rules.model.raw_periods(t)
        busy = t.sum(axis=(1, 2))
        res = self.rules.model.resources
        for g, p, b in zip(profiled, raw.tolist(), busy.tolist(), strict=True):
            tk = [types[i] for i in g]
            if k == 1:
                self._scores[g] = Score(p, b / (res * tk[0][-1]), 0.0)
                continue
            eff_period = p * group_factor(k)
            gain = sum(x[0] * x[-1] for x in tk) / eff_period - max(x[0] for x in tk)
            self._scores[g] = Score(p, b / (res * eff_period), gain)


@dataclass(frozen=True, slots=True)
class Formed:
    """A group chosen by ``form_groups``: candidate indices, and its raw period (None for one job)."""

    members: tuple[int, ...]
    raw_period: float | None
    efficiency: float
    gain: float


def _gpus(node: tuple[int, ...], cands: Sequence[Candidate]) -> int:
    return max(cands[i].gpus for i in node)


def _match_exact(node_kinds: Sequence[Kind], scorer: Scorer) -> list[tuple[int, int, float]]:
    """Maximum-weight pairs (positions, weight) among nodes of the given kinds, listed in priority order."""
    seq = tuple(node_kinds)
    hit = scorer._pairs.get(seq)
    if hit is not None:
        return hit
    out = (_solve_reference if scorer.rules.match.reference_ties else _solve_exact)(seq, scorer)
    if len(scorer._pairs) >= _PAIRS_CACHE:
        scorer._pairs.clear()
    scorer._pairs[seq] = out
    return out


def _solve_exact(node_kinds: Sequence[Kind], scorer: Scorer) -> list[tuple[int, int, float]]:
    kinds = sorted(set(node_kinds))
    kind_ix = {k: i for i, k in enumerate(kinds)}
    node_type = [kind_ix[k] for k in node_kinds]
    u = len(kinds)
    tw = scorer.matrix(kinds)
    counts = np.bincount(node_type, minlength=u)
    ckey = (tuple(kinds), tuple(counts.tolist()))
    x = scorer._matches.get(ckey)
    if x is None:
        x, _ = pair_counts(np.repeat(np.arange(u), counts), tw, scorer.rules.match)
        if u <= _VECTOR_FROM:
            scorer._matches[ckey] = x
    return [(i, j, float(tw[node_type[i], node_type[j]])) for i, j in assign(node_type, x, tw)]


def _solve_reference(node_kinds: Sequence[Kind], scorer: Scorer) -> list[tuple[int, int, float]]:
    """The reference's blossom on the complete graph of the bucket (compat ablation: its tie-breaking)."""
    from hpcsched.interleave.refblossom import reference_matching  # opt-in: not loaded by default runs

    kinds = sorted(set(node_kinds))
    kind_ix = {k: i for i, k in enumerate(kinds)}
    nt = np.array([kind_ix[k] for k in node_kinds], dtype=np.intp)
    w = scorer.matrix(kinds)[np.ix_(nt, nt)].tolist()
    return [(i, j, w[i][j]) for i, j in reference_matching(w)]


def _match(node_kinds: Sequence[Kind], scorer: Scorer) -> list[tuple[int, int, float]]:
    """Pairs for one bucket: exact where that is cheap, else screened-sparse.

    Small buckets and buckets of few kinds are matched exactly (``matching``). Many *distinct* nodes go
    to ``screening.sparse_pairs`` (each node's few best and a few random partners, blossom on that graph,
    in parts of at most ``chunk`` nodes); that needs the pipeline model's period bound, so other models
    use each node's ``chunk_edges`` heaviest edges of the complete graph, in stride-dealt chunks of
    ``chunk`` nodes plus the leftovers. bench/bench_interleave.py measures the weight this loses
    against exact matching on the complete graph.
    """
    n = len(node_kinds)
    settings = scorer.rules.match
    if settings.reference_ties or n <= settings.dense_limit or len(set(node_kinds)) <= settings.type_limit:
        return _match_exact(node_kinds, scorer)
    if scorer.rules.model.kind == "pipeline":
        return sparse_pairs(node_kinds, scorer, settings)
    if n <= settings.chunk:
        return _match_exact(node_kinds, scorer)
    chunks = -(-n // settings.chunk)
    out: list[tuple[int, int, float]] = []
    for c in range(chunks):
        pos = list(range(c, n, chunks))
        out += [(pos[i], pos[j], w) for i, j, w in _match([node_kinds[p] for p in pos], scorer)]
    matched = {p for i, j, _ in out for p in (i, j)}
    rest = [p for p in range(n) if p not in matched]
    if 2 <= len(rest) < n:  # something matched, so this recursion shrinks
        out += [(rest[i], rest[j], w) for i, j, w in _match([node_kinds[p] for p in rest], scorer)]
    return out


def _round(
    buckets: list[list[tuple[int, ...]]],
    kinds_of: list[int],
    gpus: list[int],
    scorer: Scorer,
    required: int,
    capacity: int,
) -> tuple[list[list[tuple[int, ...]]], int, bool]:
    """One matching round over every bucket, then merges while ``required > capacity``."""
    rules = scorer.rules
    ready: list[tuple[float, int, int, tuple[int, ...], tuple[int, ...] | None]] = []  # (gain, bucket, pos, a, b)
    for bi, nodes in enumerate(buckets):
        node_kinds = [(kinds_of[n[0]],) if len(n) == 1 else tuple(sorted([kinds_of[i] for i in n])) for n in nodes]
        paired: dict[int, tuple[int, float]] = {}
        for i, j, w in _match(node_kinds, scorer):
            paired[i], paired[j] = (j, w), (i, w)
        for pos, node in enumerate(nodes):
            hit = paired.get(pos)
            if hit is None:
                ready.append((0.0, bi, pos, node, None))
            elif hit[0] < pos:
                ready.append((hit[1], bi, pos, nodes[hit[0]], node))
    if rules.merge_order == "gain":
        ready.sort(key=lambda r: (r[4] is None, -r[0], r[1], r[2]))
    out: list[list[tuple[int, ...]]] = [[] for _ in buckets]
    merged_any = False
    for _, bi, _, a, b in ready:
        if b is None:
            out[bi].append(a)
        elif required > capacity:
            out[bi].append(a + b)
            required -= min(max([gpus[i] for i in a]), max([gpus[i] for i in b]))
            merged_any = True
        else:
            out[bi].extend((a, b))
    return out, required, merged_any


def form_groups(cands: Sequence[Candidate], capacity: int, scorer: Scorer) -> list[Formed]:
    """Groups covering every candidate (singles included), merging only while they do not fit ``capacity``."""
    rules = scorer.rules
    kinds_of = [scorer.intern(c.key) for c in cands]
    gpus = [c.gpus for c in cands]
    by_gpus: dict[int, list[tuple[int, ...]]] = {}
    for i, c in enumerate(cands):
        by_gpus.setdefault(c.gpus, []).append((i,))
    buckets = list(by_gpus.values())
    required = sum(gpus)
    for _ in range(rules.max_group):  # the reference tries as many rounds as a group has members
        if required <= capacity:
            break
        buckets, required, merged = _round(buckets, kinds_of, gpus, scorer, required, capacity)
        if not merged:
            break
    if rules.mixed_gpus and required > capacity and len(buckets) > 1:
        # same-GPU groups could not make everything fit: now let GPU counts mix, where a merge pays
        order = sorted((n for b in buckets for n in b), key=min)
        buckets = [order]
        for _ in range(rules.max_group):
            if required <= capacity:
                break
            buckets, required, merged = _round(buckets, kinds_of, gpus, scorer, required, capacity)
            if not merged:
                break
    nodes = [n for b in buckets for n in b]
    scores = scorer.scores([tuple(sorted(kinds_of[i] for i in n)) for n in nodes])
    return [
        Formed(n, s.raw_period if len(n) > 1 else None, s.efficiency, s.gain)
        for n, s in zip(nodes, scores, strict=True)
    ]
