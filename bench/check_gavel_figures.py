"""Check that a speed change left every ``--compat gavel`` figure as it was, bit for bit (issue 19).

Runs ``hpcsched simulate --trace T --cluster C --policy P --compat gavel --json`` for every policy on the
reference traces (A on 8:8:8, A4 on 4:4:4) and either saves the JSON lines (``--save FILE``) or compares
them with a saved file (``--check FILE``). Every key is compared except ``wall_s`` (a timing); floats are
compared as the exact text ``json.dumps`` printed, so a change in the last bit shows. ``solver`` (counters
of LP solves and of answers reused) counts work, not results: a change there is listed, and fails the check
only with ``--strict`` (a speed change that solves fewer LPs moves it by design).

    python bench/check_gavel_figures.py --save /tmp/before.jsonl     # on the old code
    python bench/check_gavel_figures.py --check /tmp/before.jsonl    # on the new code: exit 1 on any change
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = {"A": (ROOT / "trace-data/gavel/A_120jobs_0.5jph_seed0.trace", "v100=8,p100=8,k80=8"),
          "A4": (ROOT / "trace-data/gavel/A4_120jobs_0.5jph_seed0_sfmax4.trace", "v100=4,p100=4,k80=4")}
TIMINGS = ("wall_s",)
WORK = ("solver",)  # counters of work done: listed when they change, a failure only with --strict


def run_case(trace: Path, cluster: str, policy: str) -> dict:
    """The ``--json`` summary of one CLI run, without its timings."""
    exe = str(Path(sys.executable).parent / "hpcsched")
    p = subprocess.run([exe, "simulate", "--trace", str(trace.relative_to(ROOT)), "--cluster", cluster, "--policy",
                        policy, "--compat", "gavel", "--json"], cwd=ROOT, capture_output=True, text=True, check=False)
    if p.returncode:
        raise SystemExit(f"{policy} on {trace.name} failed ({p.returncode}): {p.stderr[-2000:]}")
    out = json.loads(p.stdout)
    return {k: v for k, v in out.items() if k not in TIMINGS}


def main() -> int:
    from hpcsched.hetero.policies import POLICIES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--save", type=Path, help="write the figures here")
    g.add_argument("--check", type=Path, help="compare with the figures saved here; exit 1 on a difference")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--strict", action="store_true", help="a change in the work counters (solver) fails too")
    args = ap.parse_args()
    saved: dict[str, str] = {}
    if args.check:
        for line in args.check.read_text().splitlines():
            case, _, rest = line.partition(" ")
            saved[case] = rest
    lines, bad = [], 0
    for name in args.traces.split(","):
        trace, cluster = TRACES[name]
        for policy in args.policies.split(","):
            case = f"{name}/{policy}"
            got = json.dumps(run_case(trace, cluster, policy), sort_keys=True)
            lines.append(f"{case} {got}")
            if args.check:
                want = saved.get(case)
                w, o = (json.loads(want) if want else {}), json.loads(got)
                changed = sorted(k for k in set(w) | set(o) if w.get(k) != o.get(k))
                figures = [k for k in changed if args.strict or k not in WORK]
                bad += bool(figures) or not want
                verdict = ("not saved" if not want else "DIFFERENT" if figures else
                           "same figures, work counters changed" if changed else "same")
                print(f"{case}: {verdict}", flush=True)
                for k in changed if want else []:
                    print(f"    {k}: {w.get(k)!r} -> {o.get(k)!r}")
            else:
                print(case, flush=True)
    if args.save:
        args.save.write_text("\n".join(lines) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
