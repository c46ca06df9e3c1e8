"""Issue 6: the controller resizes an elastic Horovod job in place, end to end.

A real controller and worker (processes, gRPC on loopback, heartbeat 0.3 s) run an elastic Horovod job
(``workloads/horovod_train.py``, CNN, 300 steps, 50 ms emulated I/O per step, min 1 / max 2 processes) on a
2-slot worker; a second job (1 process, ``direct``) arrives, the first shrinks 2 -> 1 in place, and grows back
1 -> 2 in place when the second ends. Each resize is timed by the controller itself (``last_resize_s``:
scheduling decision -> first progress report at the new size). The scenario is the one
``tests/test_runtime_horovod_controller.py`` checks; this prints its figures, with wall and CPU seconds
(this process and every waited child: controller, worker, launchers, ranks).

    .venv/bin/python bench/bench_horovod_controller.py [--json]

``--across-hosts`` (issue 18, as root: network namespaces) runs the scenario of
``tests/test_runtime_netns.py::test_controller_resizes_elastic_horovod_in_place_across_hosts`` instead: a
controller and three workers on namespace hosts, an elastic Horovod job (min 1 / max 3, a scaling curve: the
MILP sizes it) started on two hosts, grown 2 -> 3 in place when the third worker joins, shrunk 3 -> 2 in place
when the third host is killed (kill -9 of every process there), 2 -> 1 when another worker leaves; each resize
timed from the decision to the ``resized`` event, and the kill from the kill to the controller's decision and to
the job's first progress report after it.

    .venv/bin/python bench/bench_horovod_controller.py --across-hosts [--runs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_runtime_horovod_controller import horovod_missing, in_place_scenario  # noqa: E402


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    ap.add_argument("--across-hosts", action="store_true",
                    help="the issue-18 scenario on three network-namespace hosts (root), grow and shrink across them")
    ap.add_argument("--runs", type=int, default=1, help="--across-hosts: runs, one cluster each (default 1)")
    args = ap.parse_args()
    if horovod_missing:
        print("Horovod with PyTorch is not installed (make horovod): nothing to measure", file=sys.stderr)
        return 1
    if args.across_hosts:
        return across_hosts(args.runs, args.json)
    wall0, cpu0 = time.perf_counter(), _cpu_s()
    with tempfile.TemporaryDirectory(prefix="bench-hvd-ctl-") as tmp:
        jobs, e, s, ev = in_place_scenario(Path(tmp))
    out = {
        "job_state": jobs[e].state, "generation": jobs[e].generation,
        "resizes": [{"kind": x["resize_kind"], "to_procs": x["procs"], "seconds": round(x["seconds"], 3)}
                    for x in ev["resized"]],
        "relaunches": len(ev["stop"]), "restores": len(ev["resume"]),
        "wall_s": round(time.perf_counter() - wall0, 2), "cpu_s": round(_cpu_s() - cpu0, 2),
        "target_s": 10.0,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for r in out["resizes"]:
            print(f"resize to {r['to_procs']} ({r['kind']}): {r['seconds']:.2f} s "
                  f"(target < {out['target_s']:.0f} s: ratio {r['seconds'] / out['target_s']:.2f})")
        print(f"job {out['job_state']}, generation {out['generation']}, relaunches {out['relaunches']}, "
              f"checkpoint restores {out['restores']}")
        print(f"whole run: {out['wall_s']:.1f} s wall, {out['cpu_s']:.1f} s CPU (this process and its children)")
    ok = jobs[e].state == "completed" and [r["kind"] for r in out["resizes"]] == ["in-place", "in-place"]
    return 0 if ok else 1


def across_hosts(runs: int, as_json: bool) -> int:
    """``--across-hosts``: run the netns scenario ``runs`` times and print each resize's seconds."""
    from netns_hosts import why_not
    from test_runtime_netns import elastic_across_hosts, start_cluster

    why = why_not()
    if why is not None:
        print(f"no network-namespace hosts here: {why}", file=sys.stderr)
        return 1
    out = []
    ok = True
    for _ in range(runs):
        wall0, cpu0 = time.perf_counter(), _cpu_s()
        with tempfile.TemporaryDirectory(prefix="bench-hvd-hosts-") as tmp, start_cluster(Path(tmp)) as cluster:
            run = elastic_across_hosts(cluster)
        row = {
            "job_state": run.job["state"], "generation": int(run.job["generation"]),
            "resizes": [{"kind": x["resize_kind"], "to_procs": x["procs"], "seconds": round(x["seconds"], 3)}
                        for x in run.events["resized"]],
            "relaunches": len(run.events["stop"]), "restores": len(run.events["resume"]),
            "kill_to_decision_s": round(run.events["resize"][1]["time"] - run.killed_at, 2),
            "kill_to_progress_s": round(run.progress_after_kill - run.killed_at, 2),
            "wall_s": round(time.perf_counter() - wall0, 2), "cpu_s": round(_cpu_s() - cpu0, 2),
            "load_1min": round(os.getloadavg()[0], 2),
        }
        ok &= row["job_state"] == "completed" and [r["kind"] for r in row["resizes"]] == ["in-place"] * 3
        out.append(row)
        if not as_json:
            sizes = ", ".join(f"-> {r['to_procs']} ({r['kind']}) {r['seconds']:.2f} s" for r in row["resizes"])
            print(f"across hosts: {sizes}; kill -> decision {row['kill_to_decision_s']:.2f} s, -> progress "
                  f"{row['kill_to_progress_s']:.2f} s; job {row['job_state']}, generation {row['generation']}, "
                  f"relaunches {row['relaunches']}, restores {row['restores']}; {row['wall_s']:.1f} s wall, "
                  f"{row['cpu_s']:.1f} s CPU, load {row['load_1min']}")
    if as_json:
        print(json.dumps({"runs": out}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
