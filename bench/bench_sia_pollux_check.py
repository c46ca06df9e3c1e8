"""Is ``--compat sia --policy pollux`` the Sia artifact's Pollux baseline? One scheduling round, both sides.

Runs our heterogeneity-unaware Pollux (``hpcsched.sia.pollux_unaware``) on a saturn workload (or a cut) to the
round at ``--at`` seconds and takes that round's search problem: the jobs in the search's order, each one's
learned model, batch limits, GPU cap, age and restarts, and its current virtual-node allocation. Then:

1. the artifact's own objective (``pollux_unaware.Problem._evaluate`` with its ``SpeedupFunction`` built from the
   same model) scores the states our search chose, beside our score of them: the two must be equal;
2. our search (seeded, ``--seeds``) and the artifact's pymoo NSGA-II (``PolluxPolicyUnaware.optimize``, numpy's
   global RNG seeded the same way) each solve the round from scratch: the best objective each reaches, and CPU.

The artifact side runs in its own environment (``--reference-python``: numpy < 2, pymoo 0.4.2.1 on
``--pymoo-path``), reading the artifact's code where it lies (``--artifact``); none of it is copied here.

    python bench/bench_sia_pollux_check.py --trace /work/ref/sia-runs/cuts/saturn_w1_first1800s.csv --at 1800
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REFERENCE_SIDE = r'''
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from pollux_unaware import PolluxPolicyUnaware, Problem
from goodput import GoodputFunction
from speedup import SpeedupFunction
from utils import JobInfoUnaware, NodeInfo
d = json.load(open(sys.argv[2])); ours = json.load(open(sys.argv[3])); seeds = int(sys.argv[4])
names = [j["name"] for j in d["jobs"]]
def jobs():
    out = {}
    for i, j in enumerate(d["jobs"]):
        fn = (lambda n, r: r) if j["grad"] is None else SpeedupFunction(
            GoodputFunction(j["perf"], j["grad"], j["init"]), j["maxb"], (j["minl"], j["maxl"]), accumulation=True)
        ji = JobInfoUnaware(resources={"nvidia.com/gpu": 1}, speedup_fn=fn, creation_timestamp=d["now"] - j["age"],
                            attained_service=float(i), min_replicas=0, max_replicas=j["maxrep"], preemptible=True)
        ji.num_restarts, ji.num_migrations, ji.age = j["restarts"], 0, j["age"]
        out[j["name"]] = ji
    return out
nodes = {i: NodeInfo({"nvidia.com/gpu": d["gpn"]}, preemptible=False) for i in range(d["nodes"])}
base = {j["name"]: j["prev"] for j in d["jobs"]}
def score(states):
    js = jobs()
    b = np.zeros((len(names), d["nodes"]), dtype=int)
    for i, k in enumerate(names):
        for n in base[k]:
            b[i, n] += 1
    out = {}
    Problem([js[k] for k in names], list(nodes.values()), b, -1)._evaluate(
        np.array(states).reshape(len(states), -1), out)
    return out["F"].tolist()
res = {"their_score_of_ours": score([r["state"] for r in ours]), "runs": []}
for s in range(seeds):
    np.random.seed(s)
    t0 = time.process_time()
    alloc, _ = PolluxPolicyUnaware(-1).optimize(jobs(), nodes, base, None)
    st = np.zeros((len(names), d["nodes"]), dtype=int)
    for i, k in enumerate(names):
        for n in alloc.get(k, []):
            st[i, n] += 1
    res["runs"].append({"seed": s, "F": score([st])[0], "gpus": st.sum(axis=1).tolist(),
                        "cpu": time.process_time() - t0})
print(json.dumps(res))
'''


def snapshot(trace: Path, at: float, profiles: str, seed: int) -> dict:
    """Our run to the first round at or after ``at``: that round's search problem (before it is solved)."""
    from hpcsched.compat.pollux_ga import max_replicas
    from hpcsched.sia import pollux_unaware as pu
    from hpcsched.sia.simulate import read_cluster, read_workload, run

    got: dict = {}

    class Done(Exception):
        pass

    real = pu.UnawarePollux.optimize

    def grab(self: pu.UnawarePollux, jobs: list, now: float) -> dict:
        if now < at:
            return real(self, jobs, now)
        views = {j.name: pu.JobView(j) for j in jobs}
        order = sorted(views, key=lambda k: (views[k].attained_service, views[k].submission_time))
        rows = []
        for k in order:
            v, a = views[k], views[k].app
            rows.append({"name": k, "perf": None if v.perf_params is None else list(v.perf_params),
                         "grad": None if v.grad_params is None else list(v.grad_params),
                         "init": a.init_batch_size, "maxb": a.max_batch_size, "minl": a.min_local_bsz,
                         "maxl": a.max_local_bsz, "ncf": a.name == "ncf",
                         "maxrep": int(max_replicas(v, self.ga.max_replicas_cap)),  # type: ignore[arg-type]
                         "age": now - v.submission_time, "restarts": v.num_restarts or 0,
                         "prev": self.prev.get(k, [])})
        got.update(now=now, nodes=len(self.vnodes), gpn=self.vnode_gpus, jobs=rows)
        raise Done

    pu.UnawarePollux.optimize = grab  # type: ignore[method-assign]
    try:
        nodes, gpus = read_cluster(ROOT / "cluster_spec" / "saturn.csv")
        run(read_workload(trace), nodes, gpus, "pollux", profiles, seed=seed)
    except Done:
        pass
    finally:
        pu.UnawarePollux.optimize = real  # type: ignore[method-assign]
    if not got:
        raise SystemExit(f"{trace}: every job finished before {at} s")
    return got


def solve_ours(d: dict, seeds: int) -> list[dict]:
    """Our search on the snapshot, from scratch (no warm start), one run per seed."""
    from hpcsched.compat.pollux_ga import PolluxGAPolicy

    jobs = {}
    for i, j in enumerate(d["jobs"]):
        app = SimpleNamespace(name="ncf" if j["ncf"] else "app", init_batch_size=j["init"],
                              max_batch_size=j["maxb"], min_local_bsz=j["minl"], max_local_bsz=j["maxl"])
        jobs[j["name"]] = SimpleNamespace(
            app=app, perf_params=tuple(j["perf"]) if j["perf"] else None,
            grad_params=tuple(j["grad"]) if j["grad"] else None,
            max_profiled_replicas=j["maxrep"] // 2 if j["maxrep"] > 1 else 0,  # gives the same cap back
            attained_service=float(i), submission_time=d["now"] - j["age"], num_restarts=j["restarts"])
    prev = {j["name"]: j["prev"] for j in d["jobs"] if j["prev"]}
    out = []
    for s in range(seeds):
        ga = PolluxGAPolicy(nodes=d["nodes"], gpus_per_node=d["gpn"], seed=s, max_replicas_cap=16)
        t0 = time.process_time()
        alloc = ga.optimize(jobs, prev, d["now"])  # type: ignore[arg-type]
        cpu = time.process_time() - t0
        if list(ga.max_rep) != [j["maxrep"] for j in d["jobs"]]:
            raise SystemExit("the rebuilt jobs do not give the snapshot's GPU caps")
        st = np.zeros((1, len(d["jobs"]), d["nodes"]), dtype=int)
        for i, j in enumerate(d["jobs"]):
            for n in alloc.get(j["name"], []):
                st[0, i, n] += 1
        f = ga._evaluate(st)[0]  # our objective of the chosen state (the same call the search ranks with)
        out.append({"seed": s, "F": f.tolist(), "state": st[0].tolist(), "gpus": st[0].sum(axis=1).tolist(),
                    "cpu": cpu})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, required=True, help="a saturn workload CSV or a cut of one")
    ap.add_argument("--at", type=float, required=True, help="the round (simulated seconds) to take")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--artifact", type=Path, default=Path(os.environ.get("HPCSCHED_SIA_ARTIFACT",
                                                                         "/work/ref/sia/sia-simulator")))
    ap.add_argument("--reference-python", default=os.environ.get("SIA_PYTHON", "/work/ref/venv-sia/bin/python"))
    ap.add_argument("--pymoo-path", default="/work/ref/sia-runs/pymoo_only",
                    help="a directory holding pymoo 0.4.2.1 (PYTHONPATH of the artifact side)")
    args = ap.parse_args()
    d = snapshot(args.trace, args.at, str(args.artifact / "traces"), 0)
    ours = solve_ours(d, args.seeds)
    with tempfile.TemporaryDirectory() as tmp:
        p, o, s = Path(tmp) / "problem.json", Path(tmp) / "ours.json", Path(tmp) / "side.py"
        p.write_text(json.dumps(d))
        o.write_text(json.dumps(ours))
        s.write_text(REFERENCE_SIDE)
        env = dict(os.environ, PYTHONPATH=args.pymoo_path, OPENBLAS_NUM_THREADS="1")
        r = subprocess.run([args.reference_python, str(s), str(args.artifact), str(p), str(o), str(args.seeds)],
                           capture_output=True, text=True, env=env, cwd=args.artifact)
        if r.returncode:
            raise SystemExit(f"the artifact side failed: {r.stderr.strip()[-800:]}")
        ref = json.loads(r.stdout.strip().splitlines()[-1])
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"round t={d['now']:.0f} s, {len(d['jobs'])} jobs, load {load}")
    same = all(np.allclose(a["F"], b, rtol=1e-12, atol=0) for a, b in zip(ours, ref["their_score_of_ours"],
                                                                          strict=True))
    print(f"objective of our chosen states, ours vs the artifact's Problem: {'equal' if same else 'DIFFERENT'}")
    for a, b in zip(ours, ref["their_score_of_ours"], strict=True):
        print(f"  seed {a['seed']}: ours {a['F'][0]:.12g}  artifact {b[0]:.12g}")
    print("| seed | ours: power mean (p=-1) | GPUs per job | CPU s | artifact NSGA-II: power mean | GPUs per job "
          "| CPU s |\n|---|---|---|---|---|---|---|")
    for a, b in zip(ours, ref["runs"], strict=True):
        print(f"| {a['seed']} | {-a['F'][0]:.6f} | {a['gpus']} | {a['cpu']:.2f} | {-b['F'][0]:.6f} | {b['gpus']} "
              f"| {b['cpu']:.2f} |")


if __name__ == "__main__":
    main()
