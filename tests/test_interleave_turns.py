"""Interleaved jobs take turns per stage: real processes holding the worker's stage locks, never two members
of a group in the same stage at once (Muri's executor), while different stages and different groups overlap."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hpcsched.runtime.rpc import pb

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
STALE_S = 2.0  # workloads/_common.StageTurns.STALE_S: a mate silent this long is not waited for

# Each process runs STEPS stages of SECONDS each, in its own stage name (argv; collective: the stage waits on other
# ranks, so it takes no turn), and prints the intervals it held. They start together (a file barrier): on a loaded
# machine one interpreter's start can take longer than another's whole run, and holders that never ran at the same
# time would say nothing about turns.
HOLDER = """
import json, os, sys, time
sys.path.insert(0, {workloads!r})
from _common import StageTurns
stage, steps, seconds, collective = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
barrier, count = sys.argv[5], int(sys.argv[6])
turns = StageTurns(0, (stage,) if collective else ())
open(os.path.join(barrier, str(os.getpid())), "w").close()
deadline = time.time() + 60
while len(os.listdir(barrier)) < count and time.time() < deadline:
    time.sleep(0.005)
held = []
for _ in range(steps):
    with turns.turn(stage):
        t = time.time()
        time.sleep(seconds)
        held.append((t, time.time()))
print(json.dumps({{"held": held, "waited": turns.take_waits()[stage]}}))
"""


def _run(procs: list[tuple[str, str | None, bool]], steps: int = 6, seconds: float = 0.04) -> list[dict]:
    """Start every (stage, lock dir, collective) holder at once; their intervals and waits."""
    code = HOLDER.format(workloads=str(WORKLOADS))
    barrier = tempfile.mkdtemp(prefix="turns-barrier-")
    running = []
    for stage, lock_dir, collective in procs:
        env = {k: v for k, v in os.environ.items() if k != "HPCSCHED_INTERLEAVE_DIR"}
        if lock_dir is not None:
            env["HPCSCHED_INTERLEAVE_DIR"] = lock_dir
        running.append(subprocess.Popen([sys.executable, "-c", code, stage, str(steps), str(seconds),
                                         "1" if collective else "0", barrier, str(len(procs))],
                                        env=env, stdout=subprocess.PIPE, text=True))
    try:
        return [json.loads(p.communicate(timeout=120)[0]) for p in running]
    finally:
        shutil.rmtree(barrier, ignore_errors=True)


def _overlaps(a: list, b: list) -> bool:
    return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)


def test_group_members_never_share_a_stage(tmp_path: Path) -> None:
    group = str(tmp_path / "g")
    one, two, three = _run([("data", group, False)] * 3)
    for x, y in ((one, two), (one, three), (two, three)):
        assert not _overlaps(x["held"], y["held"])
    # 18 stages of 40 ms one at a time: the three of them waited for turns, and the waits were counted
    span = max(e for r in (one, two, three) for _, e in r["held"]) - min(s for r in (one, two, three)
                                                                          for s, _ in r["held"])
    assert span >= 18 * 0.04
    assert sum(r["waited"] for r in (one, two, three)) > 6 * 0.04


def test_different_stages_groups_and_collectives_run_free(tmp_path: Path) -> None:
    group, other = str(tmp_path / "g"), str(tmp_path / "h")
    data, compute, elsewhere = _run([("data", group, False), ("compute", group, False), ("data", other, False)])
    assert _overlaps(data["held"], compute["held"])  # one in data, one in compute: the point of interleaving
    assert _overlaps(data["held"], elsewhere["held"])  # another group's slots
    # a stage that waits on other ranks is never locked (a rank must not wait on another rank while holding a
    # turn): a multi-process job's all-reduce, and with DDP its backward (compute)
    for stage in ("comm", "compute"):
        a, b = _run([(stage, group, True), (stage, group, True)])
        assert _overlaps(a["held"], b["held"]) and a["waited"] == b["waited"] == 0.0
    free_a, free_b = _run([("data", None, False), ("data", None, False)])  # no worker, no turns
    assert _overlaps(free_a["held"], free_b["held"])


def test_worker_gives_a_group_one_lock_dir(tmp_path: Path) -> None:
    """Real launches by the worker: members of one co-location group get the same lock dir, a job alone its own."""
    from hpcsched.runtime.worker import Worker
    from hpcsched.runtime.worker_config import WorkerConfig

    script = tmp_path / "env.py"
    script.write_text("import os, pathlib\npathlib.Path(os.environ['OUT'], os.environ['HPCSCHED_TASK_ID'])"
                      ".write_text(os.environ['HPCSCHED_INTERLEAVE_DIR'])\n")
    w = Worker(WorkerConfig(controller="127.0.0.1:9", name="w", gpus=0, work_dir=tmp_path / "work"))
    try:
        for task, group in (("a.g1.n0", "a"), ("b.g1.n0", "a"), ("c.g1.n0", "c/x")):
            w.launch(pb.LaunchTask(task_id=task, job_id=task[0], group=group, launcher="direct", nprocs=1,
                                   world_size=1, command=[str(script)], env={"OUT": str(tmp_path)},
                                   master_addr="127.0.0.1", master_port=1,
                                   checkpoint_dir=str(tmp_path / "ckpt" / task)))
        deadline = time.time() + 60
        while not all((tmp_path / t).exists() for t in ("a.g1.n0", "b.g1.n0", "c.g1.n0")):
            assert time.time() < deadline, "the tasks never ran"
            time.sleep(0.1)
        dirs = {t: (tmp_path / t).read_text() for t in ("a.g1.n0", "b.g1.n0", "c.g1.n0")}
        assert dirs["a.g1.n0"] == dirs["b.g1.n0"] == str(tmp_path / "work" / "interleave" / "w" / "a")
        assert dirs["c.g1.n0"] == str(tmp_path / "work" / "interleave" / "w" / "c_x")
    finally:
        w.shutdown()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (the runtime's extra)")
def test_two_trainers_in_a_group_take_turns_and_report_their_own_stage_times(tmp_path: Path) -> None:
    """Two real ddp_train.py processes, data-bound (30 ms of emulated storage a step), in one group: their data
    stages run one at a time, so each steps at about twice its storage time; the data stage they report is
    still their own 30 ms, not the wait for a turn."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCSCHED_")} | {
        "OMP_NUM_THREADS": "1", "HPCSCHED_INTERLEAVE_DIR": str(tmp_path / "g")}
    procs = [subprocess.Popen([sys.executable, str(WORKLOADS / "ddp_train.py"), "--model", "cnn", "--batch", "8",
                               "--io-latency-ms", "30", "--steps", "60", "--report-every", "10",
                               "--checkpoint-every", "1000"],
                              env=env | {"HPCSCHED_PROGRESS_FILE": str(tmp_path / f"p{i}"),
                                         "HPCSCHED_CHECKPOINT_DIR": str(tmp_path / f"c{i}")}, cwd=WORKLOADS)
             for i in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    reports = [[json.loads(line) for line in (tmp_path / f"p{i}").read_text().splitlines()] for i in range(2)]
    # training spans: first report (step 0, before any step) to the last one
    spans = [(r[0]["time"], r[-1]["time"]) for r in reports]
    for i in range(2):
        lo, hi = spans[1 - i]
        both = [b for a, b in zip(reports[i], reports[i][1:], strict=False)
                if "data_s" in b and lo <= a["time"] and b["time"] <= hi]  # windows while the other trained too
        assert both, "the two trainers never ran at the same time"
        # medians over the windows: on a loaded machine one window's 30 ms sleep can overrun by tens of ms, while a
        # data stage that counted the wait for the mate's turn would put every window near 60 ms
        assert 0.029 < statistics.median(r["data_s"] for r in both) < 0.045
        assert min(r["data_s"] for r in both) > 0.029
        assert statistics.median(8 / r["samples_per_s"] for r in both) > 0.055  # two 30 ms data stages per step


# An iteration: a data turn, a compute turn, then time outside any stage (checkpoints, reports); prints starts.
STEPPER = """
import json, sys, time
sys.path.insert(0, {workloads!r})
from _common import StageTurns
outside, steps = float(sys.argv[1]), int(sys.argv[2])
turns = StageTurns(0)
starts = []
for _ in range(steps):
    with turns.turn("data"):
        starts.append(time.time())
        time.sleep(0.01)
    with turns.turn("compute"):
        time.sleep(0.01)
    time.sleep(outside)
turns.close()
print(json.dumps(starts))
"""


def test_group_members_keep_in_lock_step(tmp_path: Path) -> None:
    """One member spends 20 ms a step outside its stages, its mate none. Locks alone let the mate run twice as
    many iterations; in lock step it never starts an iteration two ahead of the slow one."""
    code = STEPPER.format(workloads=str(WORKLOADS))
    env = os.environ | {"HPCSCHED_INTERLEAVE_DIR": str(tmp_path / "g")}
    procs = [subprocess.Popen([sys.executable, "-c", code, outside, "40"], env=env, stdout=subprocess.PIPE, text=True)
             for outside in ("0.02", "0")]
    slow, fast = (json.loads(p.communicate(timeout=60)[0]) for p in procs)
    both = max(slow[0], fast[0])  # from when both were training (the later one joins level with the other)
    slow, fast = [t for t in slow if t >= both], [t for t in fast if t >= both]
    assert len(fast) > 20

    def stale(t: float) -> bool:
        """The rule's exception: a mate that has not started an iteration for STALE_S is not waited for (a
        descheduled process on a loaded machine must not stall its group), so running ahead of it is right."""
        last = max((s for s in slow if s <= t), default=None)
        return last is None or t - last > STALE_S

    ahead = [n for n in range(2, len(fast)) if n - 2 < len(slow) and fast[n] < slow[n - 2] and not stale(fast[n])]
    assert not ahead, f"the fast member started iterations {ahead[:5]} two ahead of its live mate"


def test_a_turn_ends_after_its_device_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the stage's kernels run after the Python call returns: ``sync`` (torch.cuda.synchronize) runs
    while the turn is still held, so a mate's turn starts only after the device work is done."""
    import fcntl

    monkeypatch.setenv("HPCSCHED_INTERLEAVE_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(WORKLOADS))
    from _common import StageTurns

    held_at_sync = []

    def sync() -> None:
        probe = os.open(tmp_path / "compute.0", os.O_RDWR)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held_at_sync.append(False)
        except BlockingIOError:
            held_at_sync.append(True)
        finally:
            os.close(probe)

    turns = StageTurns(0, sync=sync)
    with turns.turn("compute"):
        pass
    turns.close()
    assert held_at_sync == [True]


def test_a_slow_mate_is_waited_for_and_a_gone_one_is_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mate is not waited for once its file has not moved for 2 s or three of its own iterations, whichever is
    longer: a mate with 2 s iterations last seen 3 s ago is still training; one with 0.1 s iterations is gone."""
    import threading

    monkeypatch.setenv("HPCSCHED_INTERLEAVE_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(WORKLOADS))
    from _common import StageTurns

    mate = tmp_path / "turns.0.999999"
    for last, waits in (("2.0", True), ("0.1", False)):
        mate.write_text(f"5 {last}")
        os.utime(mate, (time.time() - 3, time.time() - 3))
        turns = StageTurns(0)
        with turns.turn("data"):  # joins level with the mate (5), starts its 6th
            pass
        threading.Timer(0.3, mate.write_text, (f"6 {last}",)).start()  # the mate starts its 6th
        t = time.perf_counter()
        with turns.turn("data"):  # its 7th: only once the mate has started its 6th, if the mate counts
            pass
        waited = time.perf_counter() - t
        turns.close()
        time.sleep(0.4)
        assert (waited >= 0.25) is waits, (last, waited)


def test_a_group_member_does_not_wait_for_the_warm_supervisor_s_imports(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Why a Muri-S pair once took 0 of 250 steps in turn: the pilot's first ``direct`` launch (the first member)
    starts cold and sets off the warm supervisor's imports (torch); the second member, launched a heartbeat later,
    was handed to it and began only once they were done (2-13 s at load), once after its mate had finished. Real
    launches by the worker, the supervisor's imports taking 3 s here: a member beside its running mate starts cold
    at once; a lone launch still takes the importing supervisor (for a torch program the rest of its imports is
    less than a cold start) and starts when they are done, forked from it."""
    from hpcsched.runtime.worker import WarmRanks, Worker
    from hpcsched.runtime.worker_config import WorkerConfig

    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "slowimport.py").write_text("import time\ntime.sleep(3)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path / "mods"),
                                                                  os.environ.get("PYTHONPATH")])))
    prog = tmp_path / "started.py"  # when the program began
    prog.write_text("import os, pathlib, time\n"
                    "pathlib.Path(os.environ['OUT'], os.environ['HPCSCHED_TASK_ID']).write_text(str(time.time()))\n")
    w = Worker(WorkerConfig(controller="127.0.0.1:9", name="w", gpus=0, work_dir=tmp_path / "work"))
    w.warm = WarmRanks(sys.executable, tmp_path / "warm.log", delay_s=0, preload="json,slowimport")  # not torch

    def launch(task: str, group: str) -> None:
        w.launch(pb.LaunchTask(task_id=task, job_id=task.split(".")[0], group=group, launcher="direct", nprocs=1,
                               world_size=1, command=[str(prog)], env={"OUT": str(tmp_path)},
                               master_addr="127.0.0.1", master_port=1, checkpoint_dir=str(tmp_path / "ck" / task)))

    try:
        launch("a.g1.n0", "a_b")  # the node's first direct launch: cold, and the supervisor is wanted from now on
        w.warm.ensure()  # (the worker loop's call) it starts importing
        importing = w.warm.proc
        launch("b.g1.n0", "a_b")  # its mate a is running: cold, at once
        launch("c.g1.n0", "c")  # alone: handed to the importing supervisor
        assert w.warm.passed_over == 1 and w.tasks["b.g1.n0"].proc is not importing
        assert w.tasks["c.g1.n0"].proc is importing and w.warm.took_importing
        deadline = time.time() + 60
        while not all((tmp_path / t).exists() for t in ("a.g1.n0", "b.g1.n0", "c.g1.n0")):
            assert time.time() < deadline, "the tasks never ran"
            time.sleep(0.05)
        began = {t: float((tmp_path / t).read_text()) for t in ("a.g1.n0", "b.g1.n0", "c.g1.n0")}
        assert began["b.g1.n0"] < began["c.g1.n0"], began  # b did not wait for the imports; c did
    finally:
        w.shutdown()


# One member of a group: StageTurns' turns for STEPS steps of 5 ms data and 5 ms compute (tests/netns_job.py, the
# e2e pair's program), resuming from the checkpoint it finds.
def _member(group: Path, ckpt: Path, steps: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCSCHED_")} | {
        "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0",
        "HPCSCHED_INTERLEAVE_DIR": str(group), "HPCSCHED_CHECKPOINT_DIR": str(ckpt),
        "HPCSCHED_PROGRESS_FILE": str(ckpt / "progress.jsonl")}
    ckpt.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, str(Path(__file__).with_name("netns_job.py")), "--steps", str(steps),
                             "--checkpoint-every", "10", "--stage-ms", "5,5"], env=env)


def test_steps_with_mate_counts_live_mates_over_the_whole_run(tmp_path: Path) -> None:
    """``steps_with_mate`` (the e2e pair's figure) counts the steps a member began with a live mate (StageTurns'
    own rule), over the job's whole run. A turn file left by a member killed long ago is no mate (the program's
    old count took any other ``turns.*`` file: all 30 steps here), and a resumed member adds its checkpoint's
    count (the old one started again from 0). Two members running at once count the steps they overlapped."""
    group = tmp_path / "g"
    group.mkdir()
    dead = group / "turns.0.999999"  # a mate SIGKILLed 10 s ago, mid-iteration
    dead.write_text("40 0.010000")
    os.utime(dead, (time.time() - 10, time.time() - 10))
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / "ckpt.json").write_text(json.dumps({"step": 10, "steps_with_mate": 7}))  # an earlier attempt's
    assert _member(group, resumed, 40).wait(timeout=60) == 0
    assert json.loads((resumed / "result.json").read_text())["steps_with_mate"] == 7

    a, b = (_member(group, tmp_path / x, 60) for x in "ab")
    assert a.wait(timeout=60) == b.wait(timeout=60) == 0
    reports = {x: [json.loads(line) for line in (tmp_path / x / "progress.jsonl").read_text().splitlines()]
               for x in "ab"}
    for me, mate in (("a", "b"), ("b", "a")):
        lo, hi = reports[mate][0]["time"], reports[mate][-1]["time"]  # the mate's training, first to last report
        # a step begins at the report before it: those begun inside the mate's span had a live mate
        overlapped = sum(lo <= r["time"] < hi for r in reports[me][:-1])
        counted = json.loads((tmp_path / me / "result.json").read_text())["steps_with_mate"]
        assert abs(counted - overlapped) <= 2, (me, counted, overlapped)
    assert sum(json.loads((tmp_path / x / "result.json").read_text())["steps_with_mate"] for x in "ab") > 0
