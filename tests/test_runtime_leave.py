"""A worker stopped with SIGTERM (as Slurm stops it): its task checkpoints, the controller hears of it at once
and resumes the job on another worker, well before the worker timeout could have noticed."""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import time
from pathlib import Path

import pytest
from runtime_procs import client, controller_config, kill_tree, start_controller, start_worker, stop, wait_for

# Reports step 1, then idles; on SIGTERM writes a checkpoint at step 3 and exits 0 (what a workload does).
PROGRAM = (
    'F="$HPCSCHED_PROGRESS_FILE"; '
    'trap \'echo "{\\"step\\": 3, \\"checkpoint\\": \\"ck-3\\"}" >> "$F"; exit 0\' TERM; '
    'echo "{\\"step\\": 1, \\"loss\\": 2.0}" >> "$F"; '
    "while true; do sleep 0.1; done"
)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (torchrun launches)")
def test_sigterm_worker_checkpoints_and_leaves(tmp_path: Path) -> None:
    timeout_s = 120  # worker_timeout_s: far longer than the test waits, so only the Leave RPC can explain it
    ctl, address = start_controller(tmp_path, controller_config(tmp_path, worker_timeout_s=timeout_s))
    procs = [ctl]
    try:
        a = start_worker(tmp_path, address, "a")
        procs.append(a)
        c = client(address)
        spec = f"name: idle\nprocs: 1\nsteps: 10\ncommand: {json.dumps(['sh', '-c', PROGRAM])}\n"
        jid = c.submit(spec, "j.yaml")
        wait_for("the job to report on worker a", lambda: [j for j in c.jobs() if j.job_id == jid and
                                                           j.steps_done == 1 and list(j.workers) == ["a"]], 90)
        b = start_worker(tmp_path, address, "b")
        procs.append(b)
        wait_for("worker b", lambda: any(w.worker_id == "b" and w.alive for w in c.workers()), 60)

        t0 = time.time()
        a.send_signal(signal.SIGTERM)
        assert a.wait(timeout=60) == 0
        left_s = time.time() - t0
        (w_a,) = [w for w in c.workers() if w.worker_id == "a"]
        assert not w_a.alive
        job = wait_for("the job on worker b", lambda: [j for j in c.jobs() if j.job_id == jid and
                                                       j.state == "running" and list(j.workers) == ["b"]], 60)[0]
        moved_s = time.time() - t0
        assert moved_s < timeout_s / 2, moved_s
        assert (job.generation, job.restarts, job.last_checkpoint_step) == (2, 0, 3)  # preempted, not failed
        log = (tmp_path / "controller.log").read_text()
        assert "worker a is leaving" in log and "worker a left" in log
        # the worker says how long each stage of its leaving took, so a slow pilot release can be placed
        said = re.search(r"left ([0-9.]+) s after the stop: tasks stopped in ([0-9.]+) s, goodbye said in "
                         r"([0-9.]+) s, shutdown tasks [0-9.]+ s, agent .* channel [0-9.]+ s",
                         (tmp_path / "a.log").read_text())
        assert said, (tmp_path / "a.log").read_text()
        total, tasks, goodbye = (float(x) for x in said.groups())
        assert tasks + goodbye <= total + 0.02 and total <= left_s  # each rounded to 0.01 s
        print(f"worker exited {left_s:.1f} s after SIGTERM; job running on b {moved_s:.1f} s after it")
    finally:
        for p in reversed(procs):
            stop(p)


@pytest.mark.slow
def test_a_worker_leaving_while_its_controller_restarts_is_heard(tmp_path: Path) -> None:
    """A pilot preempted while its controller is down (kill -9, restarted a moment later): the worker's Leave
    notice reaches the new controller, so the job stops as preempted (no failed attempt), not timed out as lost.
    The notice has one ``worker_timeout_s`` from the restart to arrive: the new controller's start-up, then the
    worker's Leave, refused (its credential died with the old controller), its registration and the Leave again. At
    3 s that failed beside other suites (load 16+); 10 s is the default and what a site runs with. The worker keeps
    telling for ``leave_notice_s`` after its task stopped: its default (5 s) was shorter than a controller's start
    at load 20+, so it is given the worker timeout here (the task exits at once on SIGTERM: the grace costs nothing)."""
    timeout_s = 10.0
    ctl, address = start_controller(tmp_path, controller_config(tmp_path, worker_timeout_s=timeout_s))
    wcfg = tmp_path / "worker-a.yaml"
    wcfg.write_text(f"leave_notice_s: {timeout_s}\n")
    a = start_worker(tmp_path, address, "a", extra=("--stop-grace", str(timeout_s), "--config", str(wcfg)))
    procs = [a]
    try:
        c = client(address)
        jid = c.submit(f"name: idle\nprocs: 1\nsteps: 10\ncommand: {json.dumps(['sh', '-c', PROGRAM])}\n", "j.yaml")
        wait_for("the job to report", lambda: [j for j in c.jobs() if j.job_id == jid and j.steps_done == 1], 60)
        c.close()
        kill_tree(ctl)
        a.send_signal(signal.SIGTERM)  # its task checkpoints and exits at once: nobody to tell yet
        time.sleep(0.5)
        ctl, _ = start_controller(tmp_path, controller_config(tmp_path, listen=address, worker_timeout_s=timeout_s))
        assert a.wait(timeout=30) == 0
        c = client(address)
        time.sleep(timeout_s + 1)  # past worker_timeout_s: a worker not heard from would be lost by now
        (job,) = [j for j in c.jobs() if j.job_id == jid]
        assert (job.state, job.restarts, job.last_checkpoint_step) == ("pending", 0, 3), job.message
        assert "worker a is leaving" in (tmp_path / "controller.log").read_text()
    finally:
        for p in [*procs, ctl]:
            stop(p)

def _stage_program(data_s: float, compute_s: float) -> str:
    """Reports a step with these stage times every 0.2 s; checkpoints and exits 0 on SIGTERM."""
    fields = {"step": 1, "loss": 2.0, "data_s": data_s, "compute_s": compute_s, "comm_s": 0.01}
    line = json.dumps(fields).replace('"', '\\"')
    return ('F="$HPCSCHED_PROGRESS_FILE"; '
            'trap \'echo "{\\"step\\": 1, \\"checkpoint\\": \\"ck-1\\"}" >> "$F"; exit 0\' TERM; '
            f'while true; do echo "{line}" >> "$F"; sleep 0.2; done')


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (torchrun launches)")
def test_muri_s_colocates_a_job_displaced_by_a_leaving_worker(tmp_path: Path) -> None:
    """Live: two 1-slot workers run an IO-heavy and a compute-heavy job side by side; one worker leaves
    (SIGTERM); muri-s now pairs the displaced job with the other, and it runs co-located on the remaining
    worker's single slot (one co-location key, the slot counted once)."""
    from hpcsched.runtime.store import Store

    ctl, address = start_controller(tmp_path, controller_config(tmp_path, policy="muri-s", worker_timeout_s=120))
    procs = [ctl]
    try:
        workers = {n: start_worker(tmp_path, address, n) for n in ("w0", "w1")}
        procs += workers.values()
        c = client(address)
        wait_for("2 workers", lambda: sum(w.alive for w in c.workers()) == 2, 60)
        ids = [c.submit(f"name: {n}\nprocs: 1\nsteps: 10\ncommand: {json.dumps(['sh', '-c', _stage_program(d, k)])}\n",
                        f"{n}.yaml") for n, d, k in (("io", 0.08, 0.01), ("compute", 0.01, 0.08))]
        jobs = wait_for("both jobs reporting", lambda: (js := [j for j in c.jobs() if j.steps_done == 1
                                                                and j.state == "running"]) and len(js) == 2 and js, 90)
        where = {j.job_id: j.workers[0] for j in jobs}
        assert sorted(where.values()) == ["w0", "w1"]
        leaving = where[ids[1]]
        stay = next(w for w in ("w0", "w1") if w != leaving)
        workers[leaving].send_signal(signal.SIGTERM)
        assert workers[leaving].wait(timeout=60) == 0
        wait_for("the displaced job co-located", lambda: [j for j in c.jobs() if j.job_id == ids[1]
                                                          and j.state == "running" and list(j.workers) == [stay]], 60)
        (w,) = [w for w in c.workers() if w.worker_id == stay]
        assert w.used == 1  # two jobs on one slot: the group counts once
        shown = {j.job_id: j for j in c.jobs()}  # what `hpcsched jobs` prints
        assert list(shown[ids[1]].interleaved_with) == [ids[0]] and list(shown[ids[0]].interleaved_with) == [ids[1]]
        assert shown[ids[0]].group == shown[ids[1]].group == ids[0]
        st = Store(tmp_path / "run" / "state.db")
        starts = [e for e in st.events(ids[1]) if e["kind"] == "start"]
        st.close()
        assert starts[-1]["group"] == ids[0] and starts[-1]["workers"] == [stay]  # joined the running job's slot
    finally:
        for p in reversed(procs):
            stop(p)
