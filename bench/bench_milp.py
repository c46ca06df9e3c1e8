"""Speed and quality of the harvesting allocator and replayer (issue 5), against BFTrainer's figures.

    .venv/bin/python bench/bench_milp.py decision      # one decision, 100 jobs x 4,000 nodes, every solver
    .venv/bin/python bench/bench_milp.py replay40      # 40 nodes, 10 shufflenet jobs, Tfwd 1/10/60/300
    .venv/bin/python bench/bench_milp.py extensions    # what window objective / restart accounting / predicted Tfwd buy
    .venv/bin/python bench/bench_milp.py full [--solver dp]  # 14.9 days, 4,734 nodes, 1,000 jobs
    .venv/bin/python bench/bench_milp.py ricc          # the 447,794-job RICC log -> idle events
    .venv/bin/python bench/bench_milp.py symmetric     # 300 identical / 300 mixed jobs: per-job vs class model

Prints markdown rows for bench/RESULTS.md. Times are wall seconds (and CPU seconds where the
shared machine's load makes wall time misleading).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcsched.harvest.pool import timeline_from_intervals, timeline_from_log  # noqa: E402
from hpcsched.harvest.replay import ReplayConfig, replay  # noqa: E402
from hpcsched.milp import MilpJob, Objective, Problem, SolverUnavailable, allocate, job_values  # noqa: E402
from hpcsched.milp.backends import solve_highs  # noqa: E402
from hpcsched.milp.baselines import greedy  # noqa: E402
from hpcsched.milp.formulation import build  # noqa: E402
from hpcsched.milp.problem import objective_value  # noqa: E402
from hpcsched.model import ElasticJob  # noqa: E402
from hpcsched.traces.bftrainer import read_elastic_jobs, read_idle_intervals, read_node_order  # noqa: E402

BF = ROOT / "trace-data" / "bftrainer"
REFERENCE = {1.0: 0.731, 10.0: 0.952, 60.0: 0.997, 300.0: 1.000}
RICC = Path("/work/shared/trace-data/swf/RICC-2010-2.swf.gz")


def _jobs(n: int) -> list[ElasticJob]:
    tag = "10J" if n == 10 else "1000J"
    return read_elastic_jobs(BF / f"hps-shufflenet-Jbnd-{tag}.csv", BF / f"hps-shufflenet-JNPs-{tag}.csv")


def decision() -> None:
    rng = random.Random(5)
    jobs = read_elastic_jobs(BF / "ImageNet-imgps-Jbnd-1001J.csv", BF / "ImageNet-imgps-JNPs-1001J.csv")[:100]
    pool = [f"n{k}" for k in range(4000)]
    free, states = list(pool), []
    for j in jobs:
        c = rng.choice([0, 0, 1, 4, 8, 16, 30, 50, 64])
        states.append(MilpJob(j, tuple(free[:c])))
        free = free[c:]
    print("| solver | objective | vs HiGHS | variables | status | wall s (median of 3) | CPU s (median of 3) |")
    print("|---|---|---|---|---|---|---|")
    ref = None
    for solver in ("highs", "dp", "cbc", "gurobi", "greedy", "equal"):
        for tfwd in (10.0,):
            p = Problem(tuple(states), tuple(pool), tfwd)
            runs, cpu = [], []
            try:
                for _ in range(3):
                    c0 = time.process_time()
                    runs.append(allocate(p, solver))
                    cpu.append(time.process_time() - c0)
            except SolverUnavailable as e:
                print(f"| {solver} | unavailable: {e} |  |  |  |  |  |")
                continue
            d = runs[0]
            ref = ref if ref is not None else d.objective
            secs = statistics.median(r.seconds for r in runs)
            print(f"| {solver} | {d.objective:,.0f} | {d.objective / ref:.4f} | {d.n_vars} | {d.status} | {secs:.3f} | "
                  f"{statistics.median(cpu):.3f} |", flush=True)
    print(f"(reference node-level model at this size: {2 * 100 * 4000 + 4 * 100:,} binaries; count model above)")


def _forty():
    nodes = read_node_order(BF / "node-order.txt")[:40]
    jobs = _jobs(10)
    return jobs, timeline_from_intervals(read_idle_intervals(BF / "idle-intervals.csv.gz"), nodes,
                                         start=min(j.submit for j in jobs))


def _row(name: str, res, secs: float) -> str:
    s = res.summary
    jct = [r.end - r.submit for r in res.jobs if r.end is not None]
    span_h = (s["end"] - s["start"]) / 3600
    avg = statistics.mean(jct) / 3600 if jct else float("nan")
    return (f"| {name} | {s['utilization']:.4f} | {s['jobs_done']} | {span_h:.2f} | {avg:.2f} | {s['rescales']} | "
            f"{s['samples']:.4g} | {s['idle_node_hours']:.1f} | {secs:.1f} |")


HEAD = ("| run | utilisation | jobs done | last completion (h) | avg JCT (h) | rescales | samples | idle node-h | "
        "wall s |\n|---|---|---|---|---|---|---|---|---|")


def replay40(solver: str) -> None:
    jobs, tl = _forty()
    print(HEAD)
    for tfwd, ref in REFERENCE.items():
        t0 = time.perf_counter()
        res = replay(tl, jobs, ReplayConfig(tfwd=tfwd, solver=solver))
        row = _row(f"{solver} Tfwd {tfwd:g} (reference {ref:.3f})", res, time.perf_counter() - t0)
        print(row, flush=True)


def extensions(solver: str) -> None:
    jobs, tl = _forty()
    variants = [
        ("reference objective, reference accounting", dict()),
        ("reference objective, restart accounting", dict(accounting="restart")),
        ("window objective, restart accounting", dict(accounting="restart", objective=Objective.WINDOW)),
        ("reference objective + predicted Tfwd, reference accounting", dict(predict_tfwd=True)),
        ("reference objective + predicted Tfwd, restart accounting", dict(predict_tfwd=True, accounting="restart")),
        ("window objective + predicted Tfwd, restart accounting",
         dict(predict_tfwd=True, accounting="restart", objective=Objective.WINDOW)),
        ("reference objective, exact completion/submit events", dict(exact_events=True)),
        ("reference objective + predicted Tfwd, exact events", dict(predict_tfwd=True, exact_events=True)),
    ]
    print(HEAD)
    for tfwd in (10.0, 60.0):
        for name, kw in variants:
            t0 = time.perf_counter()
            res = replay(tl, jobs, ReplayConfig(tfwd=tfwd, solver=solver, **kw))
            print(_row(f"Tfwd {tfwd:g}: {name}", res, time.perf_counter() - t0), flush=True)


def full(solver: str, tfwd: float) -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    jobs = _jobs(1000)
    order = read_node_order(BF / "node-order.txt")
    tl = timeline_from_intervals(read_idle_intervals(BF / "idle-intervals.csv.gz"), order,
                                 start=min(j.submit for j in jobs))
    t1, c1 = time.perf_counter(), time.process_time()
    print(f"events built: {len(tl.events)} in {t1 - t0:.1f} s wall, {c1 - c0:.1f} s CPU", flush=True)
    res = replay(tl, jobs, ReplayConfig(tfwd=tfwd, solver=solver))
    t2, c2 = time.perf_counter(), time.process_time()
    print(HEAD)
    print(_row(f"full 4,734 nodes, 1,000 jobs, {solver}, Tfwd {tfwd:g}", res, t2 - t0))
    s = res.summary
    print(f"replay {t2 - t1:.1f} s wall, {c2 - c1:.1f} s CPU; total {t2 - t0:.1f} s wall, {c2 - c0:.1f} s CPU; "
          f"solver {s['solve_seconds']:.1f} s over {s['events']} decisions ({s['decisions_cached']} cached)")


def ricc() -> None:
    if not RICC.is_file():
        print(f"skipped: {RICC} not present")
        return
    t0, c0 = time.perf_counter(), time.process_time()
    tl = timeline_from_log(RICC)
    print(f"RICC -> {len(tl.events):,} idle events on {len(tl.nodes)} nodes in {time.perf_counter() - t0:.1f} s wall, "
          f"{time.process_time() - c0:.1f} s CPU; {tl.notes}")


def _symmetric_cases() -> dict[str, Problem]:
    """Issue 17's busy decision: 300 identical shufflenet jobs waiting on 2,000 idle nodes; and 300 jobs in a
    few classes (shufflenet and the first two ImageNet models, waiting or running at 4/8/16 nodes, plus five
    distinct ImageNet jobs) on 3,000 nodes. The same instances as tests/test_milp.py's."""
    shuffle = _jobs(10)[0]
    imagenet = read_elastic_jobs(BF / "ImageNet-imgps-Jbnd-1001J.csv", BF / "ImageNet-imgps-JNPs-1001J.csv")

    def clone(t: ElasticJob, name: str) -> ElasticJob:
        return ElasticJob(name, 0.0, t.jmin, t.jmax, t.curve, t.total_samples, t.scale_up_s, t.scale_down_s)

    identical = Problem(tuple(MilpJob(clone(shuffle, f"j{i}")) for i in range(300)),
                        tuple(f"n{k}" for k in range(2000)), 10.0)
    pool = [f"n{k}" for k in range(3000)]
    free, states = list(pool), []
    templates = [shuffle, imagenet[0], imagenet[1]]
    for i in range(295):
        c = (0, 0, 4, 8, 16)[(i // 3) % 5]
        states.append(MilpJob(clone(templates[i % 3], f"m{i}"), tuple(free[:c])))
        free = free[c:]
    for i, j in enumerate(imagenet[10:15]):
        states.append(MilpJob(j, tuple(free[:i + 1])))
        free = free[i + 1:]
    mixed = Problem(tuple(states), tuple(pool), 10.0)
    return {"300 identical, 2,000 nodes": identical, "300 mixed, 3,000 nodes": mixed}


def symmetric(time_limit: float) -> None:
    """Before/after on one command: the per-job model (as before issue 17, ``per_job_up_to`` past the job
    count) and the class model (the default), both through ``solve_highs`` with the greedy warm start as
    ``allocate`` does; then ``allocate`` itself with HiGHS and the DP."""
    print("| decision | model | classes | variables | status (3 runs) | objective | = DP | wall s (median of 3) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, p in _symmetric_cases().items():
        values, size = job_values(p), len(p.pool)
        dp = allocate(p, "dp")
        for label, per_job in (("per job (before)", 10**9), ("classes (after)", None)):
            model = build(values, size) if per_job is None else build(values, size, per_job_up_to=per_job)
            runs = []
            for _ in range(3):
                t0 = time.perf_counter()
                sol = solve_highs(model, time_limit, model.vector(greedy(values, size, from_current=True)))
                runs.append((time.perf_counter() - t0, sol))
            sol = runs[0][1]
            obj = objective_value(values, model.counts(sol.x)) if sol is not None else float("nan")
            status = ", ".join("none" if r is None else "optimal" if r.optimal else "time_limit" for _, r in runs)
            print(f"| {name} | {label} | {len(model.classes)} | {model.n_vars} | {status} | {obj:,.0f} | "
                  f"{abs(obj - dp.objective) <= 1e-9 * abs(dp.objective)} | "
                  f"{statistics.median(r[0] for r in runs):.3f} |", flush=True)
        for solver in ("highs", "dp"):
            t0 = time.perf_counter()
            d = allocate(p, solver, time_limit=time_limit)
            print(f"| {name} | allocate({solver}) | | {d.n_vars or '-'} | {d.status} | {d.objective:,.0f} | "
                  f"{abs(d.objective - dp.objective) <= 1e-9 * abs(dp.objective)} | {time.perf_counter() - t0:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["decision", "replay40", "extensions", "full", "ricc", "symmetric"])
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--tfwd", type=float, default=10.0)
    ap.add_argument("--time-limit", type=float, default=10.0, help="symmetric: HiGHS's limit per solve (s)")
    a = ap.parse_args()
    if a.part == "decision":
        decision()
    elif a.part == "replay40":
        replay40(a.solver)
    elif a.part == "extensions":
        extensions(a.solver)
    elif a.part == "full":
        full(a.solver, a.tfwd)
    elif a.part == "symmetric":
        symmetric(a.time_limit)
    else:
        ricc()


if __name__ == "__main__":
    main()
