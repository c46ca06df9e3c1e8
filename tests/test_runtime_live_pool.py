"""The bounded set of workers a scheduling step plans over (``live_pool``) decides what every worker would.

A step at 10,000 workers gives the decision core the workers that hold slots plus, per shape of worker, the first
``demand + 1`` idle ones: the claim (module docstring) is that consolidated placement then decides exactly as over
the whole pool. Checked here with the real decision core on random pools (several shapes, GPU types, launchers,
busy and idle workers) and random queues (rigid and elastic, running and pending, typed and untyped), and at the
controller: a real step at 2,000 workers hands the planner a bounded set and still starts its jobs.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from runtime_procs import controller_config

from hpcsched.runtime import controller as controller_mod
from hpcsched.runtime import scheduler
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.live_pool import LivePool
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.store_rows import WorkerRow

SHAPES = [(("direct",), "", 4), (("direct", "torchrun"), "v100", 4), (("direct",), "a100", 8), (("torchrun",), "", 2)]


def _pool(rng: random.Random, n: int) -> list[WorkerRow]:
    rows = []
    for i in rng.sample(range(10 * n), n):  # ids not in shape order
        launchers, gpu, slots = rng.choice(SHAPES)
        rows.append(WorkerRow(id=f"w{i:05d}", host="h", slots=slots, gpus=0, cpus=slots, launchers=launchers,
                              registered=0.0, alive=True, gpu_type=gpu))
    return rows


def _case(rng: random.Random, workers: list[WorkerRow]) -> scheduler.ClusterState:
    """Running jobs placed on some workers (first fit over a shuffled order), pending ones of every kind."""
    used: dict[str, int] = {}
    jobs = []
    order = workers[:]
    rng.shuffle(order)
    for k in range(rng.randint(0, 40)):
        w = order[k % len(order)]
        take = rng.randint(1, w.slots)
        if used.get(w.id, 0) + take > w.slots:
            continue
        used[w.id] = used.get(w.id, 0) + take
        hi = take + rng.choice((0, 0, 2, 6))
        jobs.append(scheduler.JobState(id=f"r{k}", submit=float(k), running=True, procs=take, min_procs=1,
                                       max_procs=hi, launcher=w.launchers[0], placement=((w.id, take),),
                                       gpu_types=(w.gpu_type,) if w.gpu_type else ()))
    for k in range(rng.randint(1, 25)):
        lo = rng.choice((1, 1, 2, 3, 4, 6, 9))
        hi = lo + rng.choice((0, 0, 0, 3))
        gpu = rng.choice(((), (), ("v100",), ("a100",), ("v100", "a100")))
        jobs.append(scheduler.JobState(id=f"p{k}", submit=100.0 + k, running=False, procs=0, min_procs=lo,
                                       max_procs=hi, launcher=rng.choice(("direct", "direct", "torchrun")),
                                       gpu_types=gpu))
    views = tuple(scheduler.WorkerState(w.id, w.slots, w.launchers, gpu_type=w.gpu_type) for w in workers)
    return scheduler.ClusterState(now=1000.0, jobs=tuple(jobs), workers=views, used=used)


@pytest.mark.parametrize("seed", range(40))
def test_the_bounded_set_decides_as_the_whole_pool(seed: int) -> None:
    rng = random.Random(seed)
    workers = _pool(rng, rng.choice((12, 200, 800)))
    state = _case(rng, workers)
    pool = LivePool()
    pool.rebuild(workers)
    demand = sum(j.max_procs - (j.procs if j.running else 0) for j in state.jobs)
    shown = pool.for_step(state.used, demand)
    whole = scheduler.plan(state, "fifo")
    bounded = scheduler.plan(scheduler.ClusterState(state.now, state.jobs, shown, state.used), "fifo")
    assert (bounded.starts, bounded.stops, bounded.sizes, bounded.resizes, bounded.groups) == \
        (whole.starts, whole.stops, whole.sizes, whole.resizes, whole.groups)
    assert pool.free_slots(state.used) == sum(w.slots - state.used.get(w.id, 0) for w in workers)
    # the busy workers, and per shape at most demand + 1 idle ones (on the 800-worker pools: a fraction of them)
    assert len(shown) <= min(len(workers), len(state.used) + len(SHAPES) * (demand + 1))


def test_a_step_at_2000_workers_plans_over_a_bounded_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real controller: its planner sees the busy workers plus a bounded number of idle ones, not 2,000, and the
    live set is read again only when it changes."""
    seen: list[int] = []
    real_plan = controller_mod.scheduler.plan

    def counting_plan(state, *a, **k):  # noqa: ANN001, ANN002, ANN003
        seen.append(len(state.workers))
        return real_plan(state, *a, **k)

    monkeypatch.setattr(controller_mod.scheduler, "plan", counting_plan)
    cfg = read_controller_config(controller_config(tmp_path, worker_timeout_s=600))
    ctl = controller_mod.Controller(cfg)
    try:
        ctl.started()
        for i in range(2000):
            w = f"w{i:04d}"
            ctl.register(pb.RegisterRequest(worker_id=w, host="127.0.0.1", slots=4, cpus=4, launchers=["direct"],
                                            instance=w))
            ctl.heartbeat(pb.HeartbeatRequest(worker_id=w, instance=w, spare_port=41000))
        ctl.tick()
        reads = ctl.counters()["live_set_reads"]
        for k in range(5):
            ctl.submit(f"name: j{k}\ncommand: [t.py]\nlauncher: direct\nprocs: 4\n", "j.yaml")
        ctl.tick()
        assert len(ctl.store.jobs(("running",))) == 5
        assert seen[-1] <= 5 * 4 + 1, seen  # a shape's first demand + 1 idle workers
        assert ctl.counters()["live_set_reads"] == reads  # nobody joined or left: not read again
    finally:
        ctl.store.close()
