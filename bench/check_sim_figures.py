"""Check that a change to the simulators left their figures as they were, bit for bit.

For the DL engine: every registered baseline and Muri policy on the bundled trace3 (n8g8), in the default mode
and under ``--compat muri``; for Gavel's rounds: every registered Gavel policy on the reference traces A
(8:8:8) and A4 (4:4:4), HiGHS. Each case is one line: its name, its event or round count, and the sha256 of
every job's start, end and GPU-seconds plus the timeline (DL) or every round's schedule (Gavel), so a change in
the last bit of any of them shows. Save the lines on the old code, check them on the new one:

    python bench/check_sim_figures.py --save /tmp/before.txt     # on the old code
    python bench/check_sim_figures.py --check /tmp/before.txt    # on the new code: exit 1 on any change

``--only dl`` or ``--only gavel`` runs one half (the Gavel half takes minutes: 30 runs).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DL_POLICIES = ("fifo", "srtf", "srsf", "las", "tiresias", "themis", "muri-s", "muri-l", "muri-s+")
GAVEL_TRACES = {"A": ("trace-data/gavel/A_120jobs_0.5jph_seed0.trace", "v100=8,p100=8,k80=8"),
                "A4": ("trace-data/gavel/A4_120jobs_0.5jph_seed0_sfmax4.trace", "v100=4,p100=4,k80=4")}


def _digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def dl_cases() -> Iterator[str]:
    from hpcsched.cluster_spec import read_cluster_spec
    from hpcsched.sim.engine import simulate
    from hpcsched.traces import read_jobs

    jobs = read_jobs(ROOT / "trace-data/muri/trace3.csv")
    spec = read_cluster_spec(ROOT / "cluster_spec/n8g8.csv")
    for compat in (None, "muri"):
        for policy in DL_POLICIES:
            r = simulate(jobs, spec, policy, compat)
            rows = [(x.job_id, x.start, x.end, x.gpu_seconds) for x in r.results]
            yield f"dl {compat or 'default'} {policy} events={r.events} {_digest((rows, r.timeline_values))}"


def gavel_cases() -> Iterator[str]:
    from hpcsched.hetero.cluster import parse_hetero_cluster
    from hpcsched.hetero.policies import POLICIES, make_policy
    from hpcsched.hetero.rounds import simulate_rounds
    from hpcsched.hetero.simulate import load_round_jobs
    from hpcsched.hetero.throughputs import load_throughputs

    table = load_throughputs()
    for name, (trace, cluster) in GAVEL_TRACES.items():
        for policy in POLICIES:
            rounds: list[tuple[float, tuple[tuple[int, str], ...]]] = []

            def on_round(t: float, scheduled: dict[int, str], rounds: list = rounds) -> None:
                rounds.append((t, tuple(sorted(scheduled.items()))))

            res = simulate_rounds(load_round_jobs(ROOT / trace), parse_hetero_cluster(cluster),
                                  make_policy(policy, 0, solver="highs"), table, seed=0, on_round=on_round)
            key = (res.end, res.first_start, res.gpu_seconds, res.makespan, res.rounds, res.allocations, rounds)
            yield f"gavel {name} {policy} rounds={res.rounds} {_digest(key)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--save", type=Path, help="write the case lines here")
    what.add_argument("--check", type=Path, help="compare with the case lines saved here; exit 1 on any change")
    ap.add_argument("--only", choices=("dl", "gavel"), help="run one half")
    a = ap.parse_args()
    lines = []
    for source in (dl_cases, gavel_cases):
        if a.only and not source.__name__.startswith(a.only):
            continue
        for line in source():
            print(line, flush=True)
            lines.append(line)
    if a.save:
        a.save.write_text("\n".join(lines) + "\n")
        return 0
    saved = {" ".join(x.split()[:3]): x for x in a.check.read_text().splitlines() if x}
    changed = [x for x in lines if saved.get(" ".join(x.split()[:3])) != x]
    missing = sorted(set(saved) - {" ".join(x.split()[:3]) for x in lines})
    if a.only:  # the other half was not run
        missing = [m for m in missing if m.startswith(a.only)]
    for x in changed:
        print(f"CHANGED: {x}\n    was: {saved.get(' '.join(x.split()[:3]), '(absent)')}", file=sys.stderr)
    for m in missing:
        print(f"MISSING: {m}", file=sys.stderr)
    print(f"{len(lines) - len(changed)} of {len(lines)} cases identical", file=sys.stderr)
    return 1 if changed or missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
