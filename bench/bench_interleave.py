"""Interleaving benchmarks (issue 4): matching speed and quality, one big scheduling event, whole traces.

    .venv/bin/python bench/bench_interleave.py             # everything but the slow exact references
    .venv/bin/python bench/bench_interleave.py --full      # also exact matching on 2,000 nodes (minutes)
    .venv/bin/python bench/bench_interleave.py --only sims  # one section: matching | event | sims | gain | ablation

Figures printed as ``name: value (target ..., ratio ...)`` lines; the peers' figures come from
ANCHORS.md (reference simulator: 54-80 s for Muri-S on trace3, trace1 unfinished after 15 minutes).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcsched.allocator import DeclaredPolicy  # noqa: E402
from hpcsched.cluster_spec import read_cluster_spec  # noqa: E402
from hpcsched.interleave.grouping import Candidate, GroupingRules, Scorer, _match, form_groups  # noqa: E402
from hpcsched.interleave.matching import MatchSettings, assign, matching_weight, pair_counts  # noqa: E402
from hpcsched.interleave.period import PeriodModel  # noqa: E402
from hpcsched.interleave.policies import (  # noqa: E402
    COMPAT_RULES,
    REFERENCE_RULES,
    InterleavingPolicy,
    attained_gpu_s,
    remaining_gpu_s,
)
from hpcsched.policies import get_policy  # noqa: E402
from hpcsched.primitives.speed import SOLO_FACTOR  # noqa: E402
from hpcsched.sim import simulate  # noqa: E402
from hpcsched.traces import read_jobs  # noqa: E402

MURI = ROOT / "trace-data/muri"
N8G8 = ROOT / "cluster_spec/n8g8.csv"
EXACT = MatchSettings(dense_limit=10**9)


def random_candidates(n: int, seed: int) -> list[Candidate]:
    """Distinct profiles: each job heavy in one stage (as real DL jobs are), the rest random."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        s = rng.uniform(0.01, 0.3, 3)
        s[rng.integers(0, 3)] = rng.uniform(0.3, 1.0)
        out.append(Candidate(str(i), 4, tuple(s.tolist()), float(s.sum()) * SOLO_FACTOR))
    return out


def trace_candidates(n: int, seed: int) -> list[Candidate]:
    """Jobs drawn from trace2 (all GPU counts folded to one bucket): few distinct profiles, many jobs."""
    jobs = [j for j in read_jobs(MURI / "trace2.csv") if j.profile is not None]
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(jobs), size=n, replace=True)
    return [
        Candidate(str(k), 4, jobs[i].profile.stages(), (jobs[i].iteration_time or 1.0) * SOLO_FACTOR)
        for k, i in enumerate(pick)
    ]


def reprofiled_candidates(n: int, seed: int) -> list[Candidate]:
    """trace2 jobs with their profiles re-measured (+-5% per stage, as re-profiling yields): all distinct,
    mostly data-bound, so a few compute-bound jobs are everybody's best partner (hubs)."""
    rng = np.random.default_rng(seed)
    out = []
    for c in trace_candidates(n, seed):
        s = np.array(c.stages) * rng.uniform(0.95, 1.05, 3)
        out.append(Candidate(c.id, c.gpus, tuple(s.tolist()), c.solo_s))
    return out


def timed(fn, *args):
    """(result, wall seconds, CPU seconds): CPU time is what the figure would be on an idle machine."""
    t, c = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - t, time.process_time() - c


def bench_matching(full: bool) -> None:
    print("== matching 1 round: ours (grouping._match) vs exact blossom on the complete graph")
    sizes = (500, 1000, 2000) if full else (500, 1000)
    for label, make, weight in (
        ("random", random_candidates, "efficiency"),
        ("random", random_candidates, "gain"),
        ("re-profiled trace2", reprofiled_candidates, "efficiency"),
        ("re-profiled trace2", reprofiled_candidates, "gain"),
        ("trace2", trace_candidates, "efficiency"),
    ):
        for n in (*sizes, *(() if full else (2000,))):
            scorer = Scorer(GroupingRules(weight=weight))
            kinds = [(scorer.intern(c.key),) for c in make(n, seed=n)]
            pairs, wall, cpu = timed(_match, kinds, scorer)
            ours = sum(w for _, _, w in pairs)
            line = f"{label} {weight} n={n} types={len(set(kinds))}: ours {wall:.3f} s wall / {cpu:.3f} s CPU"
            if n in sizes and not (label == "trace2" and n > 1000):  # few types: exact by construction
                uniq = sorted(set(kinds))
                ix = {k: i for i, k in enumerate(uniq)}
                nt = [ix[k] for k in kinds]
                tw = scorer._matrix_vectorised(uniq)
                (xe, _), wall_e, cpu_e = timed(pair_counts, nt, tw, EXACT)
                exact = matching_weight(assign(nt, xe, tw), nt, tw)
                line += f"; exact {wall_e:.2f} s wall / {cpu_e:.2f} s CPU; weight ratio {ours / exact:.5f}"
            elif label == "trace2":
                line += " (few job types: the exact integer program)"
            else:
                line += " (exact on the full graph: --full)"
            print(line, flush=True)


def bench_event() -> None:
    print("== one scheduling event: 2,000 candidates grouped, capacity = required / 4 (Muri's 4 jobs per slot)")
    for label, make in (
        ("random", random_candidates),
        ("re-profiled trace2", reprofiled_candidates),
        ("trace2", trace_candidates),
    ):
        cands = make(2000, seed=7)
        capacity = sum(c.gpus for c in cands) // 4
        for name, rules in (
            ("muri-s rules", GroupingRules()),
            ("muri-s+ rules", GroupingRules(mixed_gpus=True, weight="gain", merge_order="gain")),
        ):
            formed, t, cpu = timed(form_groups, cands, capacity, Scorer(rules))
            need = sum(max(cands[i].gpus for i in f.members) for f in formed)
            sizes = np.bincount([len(f.members) for f in formed], minlength=5)[1:]
            print(
                f"{label} {name}: {t:.3f} s wall / {cpu:.3f} s CPU (target 1 s); groups of 1/2/3/4: "
                f"{'/'.join(map(str, sizes))}; GPUs needed {need} of {capacity}"
            )


def run(trace: str, policy: str, compat: str | None) -> tuple[dict, float, float, int]:
    jobs = read_jobs(MURI / f"{trace}.csv")
    res, _, cpu = timed(simulate, jobs, read_cluster_spec(N8G8), policy, compat)
    return res.summary(), res.wall_s, cpu, res.events


def bench_sims() -> None:
    print("== whole traces on n8g8 (wall time of simulate(), reading excluded)")
    targets = {"trace3": (3.0, "reference 54-80 s"), "trace1": (60.0, "reference > 900 s"), "trace2": (60.0, "")}
    for trace, (target, peer) in targets.items():
        for policy, compat in (("muri-s", "muri"), ("muri-l", "muri"), ("muri-s+", None)):
            s, wall, cpu, events = run(trace, policy, compat)
            print(
                f"{trace} {policy} compat={compat}: {wall:.2f} s wall / {cpu:.2f} s CPU for {events} events "
                f"(target {target:.0f} s{'; ' + peer if peer else ''}); avg JCT {s['avg_jct']:.2f} s, "
                f"p99 {s['p99_jct']:.2f} s",
                flush=True,
            )


def bench_gain() -> None:
    print("== Muri-S+ vs Muri-S (default mode, n8g8): avg JCT, p99 JCT, makespan in seconds")
    print(
        "| trace | jobs | Muri-S avg | Muri-S+ avg | gain | Muri-S p99 | Muri-S+ p99 | Muri-S makespan | "
        "Muri-S+ makespan |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for path in sorted(p for p in MURI.glob("*.csv") if p.name != "n8g8.csv"):
        a = run(path.stem, "muri-s", None)[0]
        b = run(path.stem, "muri-s+", None)[0]
        print(
            f"| {path.stem} | {a['jobs']} | {a['avg_jct']:.0f} | {b['avg_jct']:.0f} | "
            f"{a['avg_jct'] / b['avg_jct']:.3f}x | {a['p99_jct']:.0f} | {b['p99_jct']:.0f} | "
            f"{a['makespan']:.0f} | {b['makespan']:.0f} |",
            flush=True,
        )


def as_registered(name: str, fn: InterleavingPolicy) -> DeclaredPolicy:
    """A variant of a registered policy, run with that policy's hints (its compat loop rules)."""
    return DeclaredPolicy(name, fn, get_policy(name).hints)


def bench_ablation() -> None:
    """Where compat and default differ on trace3 Muri-S (one change at a time), and the reference's blossom."""
    print("== ablation, trace3 n8g8: Muri-S with each engine mode x each period model; avg / p99 JCT, s")
    jobs = read_jobs(MURI / "trace3.csv")
    cluster = read_cluster_spec(N8G8)
    for engine in ("muri", None):
        for rules in (COMPAT_RULES, REFERENCE_RULES):
            policy = InterleavingPolicy("muri-s", remaining_gpu_s, rules, compat_rules=rules)
            s = simulate(jobs, cluster, as_registered("muri-s", policy), engine).summary()
            print(
                f"engine {'compat' if engine else 'default'}, period model {rules.model.kind}: "
                f"avg {s['avg_jct']:.2f}, p99 {s['p99_jct']:.2f}",
                flush=True,
            )
    print(
        "== compat with the reference's own blossom (tie-breaking as its matching.py); published in brackets"
        " (Muri-L with the reference's autopack, as compat runs it)"
    )
    ref = GroupingRules(model=PeriodModel("muri4"), match=MatchSettings(reference_ties=True))
    published = {"muri-s": (85502.55, 992405.06), "muri-l": (88686.97, 927167.05)}
    for name, key in (("muri-s", remaining_gpu_s), ("muri-l", attained_gpu_s)):
        for label, rules in (("ours", COMPAT_RULES), ("reference blossom", ref)):
            policy = InterleavingPolicy(name, key, rules, compat_rules=rules, compat_autopack=name == "muri-l")
            (res, _, cpu) = timed(simulate, jobs, cluster, as_registered(name, policy), "muri")
            s = res.summary()
            avg, p99 = published[name]
            print(
                f"{name} {label}: avg {s['avg_jct']:.2f} ({s['avg_jct'] / avg - 1:+.2%} vs {avg}), "
                f"p99 {s['p99_jct']:.2f} ({s['p99_jct'] / p99 - 1:+.2%} vs {p99}); {cpu:.1f} s CPU",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="exact matching on 2,000 nodes too (slow)")
    ap.add_argument("--only", choices=("matching", "event", "sims", "gain", "ablation"))
    args = ap.parse_args()
    sections = {"matching": lambda: bench_matching(args.full), "event": bench_event, "sims": bench_sims,
                "gain": bench_gain, "ablation": bench_ablation}  # fmt: skip
    for name, fn in sections.items():
        if args.only in (None, name):
            fn()
            sys.stdout.flush()


if __name__ == "__main__":
    main()
