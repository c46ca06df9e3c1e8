"""Issue 6: a Horovod job resized in place (elastic, host-discovery script) vs checkpoint-stop-relaunch.

Both paths run the same program (``workloads/horovod_train.py``, CNN, 50 ms emulated I/O per step) through
the real worker code (``Worker.launch`` / ``resize_in_place`` / ``kill``) and a real ``horovodrun`` over gloo
on loopback, 2 -> 1 -> 2 processes. No controller: the times exclude heartbeat and scheduling delays
(add about one heartbeat interval each for the controller's ``last_resize_s``).

- in place: the worker rewrites the task's host list; time from the rewrite to the program's first report
  at the new size (the survivor's next commit, Horovod's re-rendezvous, a newcomer's start-up on a grow).
- stop/relaunch (the path of every other launcher, and of a Horovod job the controller moves): SIGTERM
  (checkpoint at the next step, exit), launch the next generation at the new size, restore; time from the
  SIGTERM to the new process's first report. The same elastic launch is used, which also checks that its
  disk checkpoint carries a full stop and restart (it must resume from the step it wrote).

    .venv/bin/python bench/bench_horovod_elastic.py [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_runtime_horovod_elastic import elastic_task, reports, wait_until  # noqa: E402  (the test's task builder)

from hpcsched.runtime import horovod_elastic  # noqa: E402
from hpcsched.runtime.worker import Worker, spare_port  # noqa: E402
from hpcsched.runtime.worker_config import WorkerConfig  # noqa: E402

STEPS = 200


def _worker(d: Path) -> Worker:
    return Worker(WorkerConfig(controller=f"127.0.0.1:{spare_port('127.0.0.1')}", name="bench", slots=2,
                               work_dir=d / "w"))


def in_place(d: Path) -> dict:
    w = _worker(d)
    t = elastic_task(d, steps=STEPS)
    task_dir = d / "w" / t.task_id
    progress = task_dir / "progress.jsonl"
    try:
        w.launch(t)
        proc = w.tasks[t.task_id].proc
        wait_until("training at 2", lambda: any(r["step"] >= 5 for r in reports(progress)), 180)
        w.resize_in_place(t.task_id, ["127.0.0.1:1"])
        wait_until("training at 1", lambda: any(r["world_size"] == 1 for r in reports(progress)), 120)
        w.resize_in_place(t.task_id, ["127.0.0.1:2"])
        wait_until("the end", lambda: proc.poll() is not None, 300)
    finally:
        w.shutdown()
    seen = reports(progress)
    assert proc.returncode == 0 and seen[-1]["step"] == STEPS and len({r["pid"] for r in seen}) == 1
    times = horovod_elastic.resize_times(task_dir)
    return {f"{r.from_size}->{r.to_size}": round(r.seconds, 2) for r in times}


def _relaunch(w: Worker, d: Path, old: str, gen: int, world: int) -> dict:
    """SIGTERM generation ``gen - 1``, wait for it to exit, launch ``gen`` at ``world``: phases in seconds."""
    t0 = time.time()
    w.kill(old, checkpoint=True)
    while w.tasks[old].exit_code is None:
        w._poll()  # what the daemon does every heartbeat: reap, or kill a launcher whose ranks are gone
        w.kill(old, checkpoint=True)  # escalates to SIGKILL past the grace
        time.sleep(0.05)
    t1 = time.time()
    t = elastic_task(d, world=world, generation=gen, steps=STEPS)
    w.launch(t)
    progress = d / "w" / t.task_id / "progress.jsonl"
    first = wait_until(f"generation {gen} reporting", lambda: next(iter(reports(progress)), None), 180)
    assert first["world_size"] == world and first["resumed_from"] > 0, first  # restored from its checkpoint
    return {"total_s": round(first["time"] - t0, 2), "checkpoint_and_exit_s": round(t1 - t0, 2),
            "relaunch_to_first_report_s": round(first["time"] - t1, 2), "resumed_from": first["resumed_from"],
            "task": t.task_id}


def stop_relaunch(d: Path) -> dict:
    w = _worker(d)
    t = elastic_task(d, steps=STEPS)  # elastic too: its disk checkpoint must carry a full stop and restart
    out = {}
    try:
        w.launch(t)
        progress = d / "w" / t.task_id / "progress.jsonl"
        wait_until("training at 2", lambda: any(r["step"] >= 5 for r in reports(progress)), 180)
        out["2->1"] = shrink = _relaunch(w, d, t.task_id, 2, 1)
        progress = d / "w" / shrink["task"] / "progress.jsonl"
        wait_until("training at 1", lambda: any(r["step"] >= shrink["resumed_from"] + 5 for r in reports(progress)),
                   120)
        out["1->2"] = grow = _relaunch(w, d, shrink["task"], 3, 2)
        proc = w.tasks[grow["task"]].proc
        wait_until("the end", lambda: proc.poll() is not None, 300)
        final = reports(d / "w" / grow["task"] / "progress.jsonl")[-1]
        assert proc.returncode == 0 and final["step"] == STEPS, final
    finally:
        w.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args()
    res: dict = {}
    for name, fn in (("in_place", in_place), ("stop_relaunch", stop_relaunch)):
        d = Path(tempfile.mkdtemp(prefix=f"hpcsched-bench-hvd-{name}-"))
        wall0, cpu0 = time.perf_counter(), time.process_time()
        ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            res[name] = fn(d)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        ch = resource.getrusage(resource.RUSAGE_CHILDREN)
        res[name]["run_wall_s"] = round(time.perf_counter() - wall0, 1)
        res[name]["run_cpu_s"] = round(time.process_time() - cpu0 + ch.ru_utime + ch.ru_stime
                                       - ch0.ru_utime - ch0.ru_stime, 1)  # this process + reaped launchers/ranks
        print(f"{name}: {json.dumps(res[name])}", file=sys.stderr, flush=True)
    for k in ("2->1", "1->2"):
        res.setdefault("ratio_stop_relaunch_over_in_place", {})[k] = \
            round(res["stop_relaunch"][k]["total_s"] / res["in_place"][k], 2)
    if args.json:
        print(json.dumps(res))
    else:
        for k in ("2->1", "1->2"):
            r = res["stop_relaunch"][k]
            print(f"resize {k}: in place {res['in_place'][k]:.2f} s | stop/relaunch {r['total_s']:.2f} s "
                  f"({r['checkpoint_and_exit_s']:.2f} s checkpoint + exit, {r['relaunch_to_first_report_s']:.2f} s "
                  f"relaunch to first report, resumed from step {r['resumed_from']}) | ratio "
                  f"{res['ratio_stop_relaunch_over_in_place'][k]:.1f}x")
        for name in ("in_place", "stop_relaunch"):
            print(f"{name} whole run (200 steps, 2 resizes): {res[name]['run_wall_s']} s wall, "
                  f"{res[name]['run_cpu_s']} s CPU")


if __name__ == "__main__":
    main()
