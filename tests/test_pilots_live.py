"""Node source ``slurm`` against a REAL Slurm (the 4-node loopback cluster of scripts/slurm_cluster.sh): the
controller claims idle nodes with pilot jobs running ``hpcsched worker``, runs a job across two of them, loses
them to a high-priority batch job (Slurm preempts the scavenger pilots: SIGTERM within GraceTime), and claims
them back when the batch job ends; pilots that never start or hang are cancelled; none outlives the controller.

Skipped with the reason when no Slurm controller answers (run ``scripts/slurm_cluster.sh up`` as root).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from fake_slurm import View
from prometheus_client.parser import text_string_to_metric_families
from runtime_procs import (
    ROOT,
    TOKEN,
    client,
    controller_config,
    jobs_by_id,
    kill_tree,
    start_controller,
    stop,
    submit,
    wait_for,
)
from slurm_cluster import NODES, clean_cluster, sh, squeue  # noqa: F401 (clean_cluster: autouse fixture)

from hpcsched.slurm import commands
from hpcsched.slurm.pilot_config import PilotConfig
from hpcsched.slurm.pilots import PilotManager

WHY_NOT = commands.available()
pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no real Slurm: {WHY_NOT}")]


def test_pilots_that_never_start_or_hang_are_cancelled(tmp_path: Path) -> None:
    """A pilot Slurm will not start (held by --begin an hour away) and one whose worker never registers (its
    'python' only sleeps) are both cancelled after their timeouts, with the reason in the manager's events."""
    hang = tmp_path / "sleeping-python"
    hang.write_text("#!/bin/sh\nexec sleep 600\n")
    hang.chmod(0o755)
    never = PilotManager(PilotConfig(partition="scavenger", max_pilots=1, start_timeout_s=3, poll_s=0.5,
                                     work_dir=tmp_path / "a", sbatch_args=("--begin=now+3600",)),
                         View(1), "127.0.0.1:1", None, tmp_path / "a.db")
    hung = PilotManager(PilotConfig(partition="scavenger", max_pilots=1, register_timeout_s=3, poll_s=0.5,
                                    work_dir=tmp_path / "b", python=str(hang)),
                        View(1), "127.0.0.1:1", None, tmp_path / "b.db")
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not all(
                any(e.kind == "cancel" for e in m.events) for m in (never, hung)):
            never.step()
            hung.step()
            time.sleep(0.5)
        kinds = {m: [(e.kind, e.detail) for e in m.events] for m in (never, hung)}
        assert any(k == "cancel" and d.startswith("never started: pending") for k, d in kinds[never]), kinds[never]
        assert any(k == "cancel" and d.startswith("hung: running") and "never registered" in d
                   for k, d in kinds[hung]), kinds[hung]
        # the cancelled pilots are gone from Slurm, and the next step says so
        wait_for("the pilots to leave Slurm", lambda: not squeue(), 30)
        for m in (never, hung):
            m.step()
            assert any(e.kind == "gone" for e in m.events)
    finally:
        never.stop(wait_s=10)
        hung.stop(wait_s=10)


def pilot_controller(d: Path) -> Path:
    cfg = controller_config(d, min_runtime_s=2, stop_grace_s=4, metrics_listen="127.0.0.1:0",
                            metrics_address_file="run/metrics.addr")
    with cfg.open("a") as f:
        f.write("node_source: slurm\nslurm:\n  partition: scavenger\n  max_pilots: 2\n  slots: 1\n"
                "  stop_grace_s: 3\n  poll_s: 1\n  time_limit_s: 600\n  leave_before_s: 30\n"
                "  idle_release_s: 5\n  start_timeout_s: 120\n  register_timeout_s: 60\n  work_dir: pilots\n")
    return cfg


def http_get(url: str) -> str:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the controller's /metrics: (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(http_get(url + "/metrics")) for s in fam.samples}


def pilots_listed() -> list[str]:
    return [jid for jid, (name, _) in squeue().items() if name.startswith("hpcsched-pilot-")]


def test_controller_harvests_nodes_with_pilots_loses_them_to_preemption_and_gets_them_back(tmp_path: Path) -> None:
    ctl, addr = start_controller(tmp_path, pilot_controller(tmp_path))
    c = client(addr)
    try:
        steps = 400
        job = tmp_path / "tcp2.yaml"
        job.write_text(f"name: tcp2\nlauncher: direct\nprocs: 2\nsteps: {steps}\nworkdir: {ROOT}\n"
                       "command: [tests/netns_job.py, --comm, tcp, --checkpoint-every, '20', --step-ms, '50']\n")
        jid = submit(c, job)
        t0 = time.monotonic()
        j = wait_for("the job running on two pilots", lambda: (j := jobs_by_id(c)[jid]).state == "running" and
                     j.steps_done >= 20 and j, 120, poll=0.5)
        first_run_s = time.monotonic() - t0
        assert sorted(j.workers) == sorted(w.worker_id for w in c.workers() if w.alive)
        assert all(w.startswith("pilot-") for w in j.workers), j.workers
        assert len(pilots_listed()) == 2
        # Operable (issue 18): the listings say which workers are pilots, where, and what each node does
        ws = {w.worker_id: w for w in c.workers()}
        assert all(ws[w].pilot and ws[w].source_job_id == w.removeprefix("pilot-") and ws[w].source_node in
                   ("n1", "n2", "n3", "n4") for w in j.workers), ws
        assert sorted(jobs_by_id(c)[jid].pilot_jobs) == sorted(w.removeprefix("pilot-") for w in j.workers)
        nodes = c.nodes()
        assert nodes.node_source == "slurm" and len(nodes.nodes) == 4
        assert sorted(n.source_job_id for n in nodes.nodes if n.source_job_id) == sorted(pilots_listed())
        # ... and so do /metrics and the status page (issue 31)
        url = "http://" + (tmp_path / "run" / "metrics.addr").read_text().strip()
        m = wait_for("two running pilots in /metrics", lambda: (m := scrape(url)).get(
            ("hpcsched_pilots", (("state", "running"),))) == 2 and m, 30, poll=1)
        assert sum(v for (name, _), v in m.items() if name == "hpcsched_source_nodes") == 4, m
        assert m["hpcsched_slots", (("kind", "used"),)] == 2 and m["hpcsched_harvested_node_hours_total", ()] > 0
        page = http_get(url + "/")
        assert all(f"<td>{p}</td>" in page for p in pilots_listed()) and "node source: slurm" in page
        # A batch job wants all four nodes: Slurm preempts the two scavenger pilots (SIGTERM, GraceTime 5 s).
        batch = sh("sbatch", "--parsable", "-p", "batch", "-N4", "-J", "batch-hog", "--wrap", "sleep 10").strip()
        t1 = time.monotonic()
        wait_for("the job stopped by the preemption", lambda: jobs_by_id(c)[jid].state == "pending", 90, poll=0.3)
        stopped_s = time.monotonic() - t1
        ckpt = json.loads((tmp_path / "run" / "ckpt" / jid / "ckpt.json").read_text())["step"]
        done_at_stop = jobs_by_id(c)[jid].steps_done
        assert ckpt >= done_at_stop - 1, (ckpt, done_at_stop)  # checkpointed at the stop: nothing to redo
        wait_for("the batch job to end", lambda: batch not in squeue(), 90)
        t2 = time.monotonic()
        wait_for("the job running again on new pilots", lambda: jobs_by_id(c)[jid].state == "running", 120, poll=0.3)
        back_s = time.monotonic() - t2
        j = wait_for("the job done", lambda: (j := jobs_by_id(c)[jid]).state in ("completed", "failed") and j, 180,
                     poll=0.5)
        assert j.state == "completed", j.message
        result = json.loads((tmp_path / "run" / "ckpt" / jid / "result.json").read_text())
        assert result["steps"] == steps and j.steps_done == steps  # exact, across the preemption
        assert j.restarts == 0  # a preemption is not a failure
        m = scrape(url)
        log = (tmp_path / "controller.log").read_text()
        # two pilots, then two more after the batch job: elements of job arrays
        assert len(re.findall(r"pilot \d+_\d+: submit element", log)) >= 4, log[-3000:]
        assert "is leaving" in log  # the preempted pilots' workers said so (Leave), no timeout needed
        print(f"\nfirst start {first_run_s:.1f} s (pilots submitted, workers registered, job at step 20); "
              f"preemption to job stopped {stopped_s:.1f} s; batch end to job running again {back_s:.1f} s")
    finally:
        c.close()
        ctl.send_signal(signal.SIGTERM)  # the controller cancels its pilots, waits for them to leave, then exits
        try:
            ctl.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stop(ctl)
    assert pilots_listed() == []  # the controller cancelled its pilots when it stopped
    # hpcsched calc on the run's state: pilot node time, the pool's utilisation, the preemption, lost steps
    from hpcsched.calc_cli import controller_run

    _, _, figures = controller_run(tmp_path / "run" / "state.db")
    assert figures["pilots"] >= 4 and figures["pilots_preempted"] >= 2, figures
    assert figures["harvested_node_hours"] > 0 and 0 < figures["pilot_utilization"] <= 1, figures
    assert figures["preemptions"] >= 1 and figures["max_lost_steps"] <= 20, figures
    # /metrics, read once the job was done, counted what calc counts over the state afterwards
    assert m["hpcsched_preemptions_total", ()] == figures["preemptions"], (m, figures)
    assert m["hpcsched_lost_steps_total", ()] == figures["lost_steps"], (m, figures)
    print(f"calc: {figures}")


def test_controller_killed_and_restarted_adopts_its_pilots(tmp_path: Path) -> None:
    """kill -9 of the controller mid-run: the pilots (Slurm jobs) and their workers go on; a controller restarted on
    the same state and address adopts them by name, submits none twice, and the job finishes exactly."""
    cfg = pilot_controller(tmp_path)
    ctl, addr = start_controller(tmp_path, cfg)
    c = client(addr)
    try:
        steps = 300
        job = tmp_path / "tcp2.yaml"
        job.write_text(f"name: tcp2\nlauncher: direct\nprocs: 2\nsteps: {steps}\nworkdir: {ROOT}\n"
                       "command: [tests/netns_job.py, --comm, tcp, --checkpoint-every, '20', --step-ms, '50']\n")
        jid = submit(c, job)
        wait_for("the job running on two pilots", lambda: jobs_by_id(c)[jid].steps_done >= 20, 120, poll=0.5)
        before = sorted(pilots_listed())
        kill_tree(ctl)  # the controller only: its pilots are Slurm's processes, not its children
        assert sorted(pilots_listed()) == before
        ctl, addr2 = start_controller(tmp_path, pilot_controller_at(tmp_path, addr))
        assert addr2 == addr
        j = wait_for("the job done", lambda: (j := jobs_by_id(c)[jid]).state in ("completed", "failed") and j, 180,
                     poll=0.5)
        assert j.state == "completed" and j.steps_done == steps, j.message
        assert j.restarts == 0 and j.generation == 1  # it never stopped: the workers kept it running
        log = (tmp_path / "controller.log").read_text()
        assert log.count(": adopt ") == 2 and len(re.findall(r"pilot \d+_\d+: submit element", log)) == 2, \
            log[-3000:]
    finally:
        c.close()
        ctl.send_signal(signal.SIGTERM)
        try:
            ctl.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stop(ctl)
    assert pilots_listed() == []


def pilot_controller_at(d: Path, address: str) -> Path:
    """The same controller file, listening on the address the first one had (its workers dial it)."""
    cfg = pilot_controller(d)
    text = re.sub(r"(?m)^listen: 127\.0\.0\.1:0$", f"listen: {address}", cfg.read_text())  # not metrics_listen
    cfg.write_text(text)
    return cfg


def worker_pid(pilot_job: str) -> int:
    """The pid of the worker a pilot job runs (its command line names it pilot-<job id>; not the srun that runs it as
    the job's step)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"worker" in argv and f"pilot-{pilot_job}".encode() in argv and not argv[0].endswith(b"srun"):
                return int(entry.name)
    raise AssertionError(f"no worker process for pilot {pilot_job}")


def test_a_hung_pilot_is_cancelled_and_replaced(tmp_path: Path) -> None:
    """A pilot's worker stops answering (SIGSTOP: hung, while Slurm still runs the job): the controller loses it
    after worker_timeout_s, the manager cancels the pilot, claims another idle node, and the job (its attempt
    failed with the lost worker) resumes from its checkpoint and finishes exactly."""
    ctl, addr = start_controller(tmp_path, pilot_controller(tmp_path))
    c = client(addr)
    stopped = None
    try:
        steps = 300
        job = tmp_path / "tcp2.yaml"
        job.write_text(f"name: tcp2\nlauncher: direct\nprocs: 2\nsteps: {steps}\nworkdir: {ROOT}\n"
                       "command: [tests/netns_job.py, --comm, tcp, --checkpoint-every, '20', --step-ms, '50']\n")
        jid = submit(c, job)
        j = wait_for("the job running on two pilots", lambda: (j := jobs_by_id(c)[jid]).steps_done >= 20 and j, 120,
                     poll=0.5)
        victim = j.workers[1].removeprefix("pilot-")
        stopped = worker_pid(victim)
        os.kill(stopped, signal.SIGSTOP)
        wait_for("the hung pilot cancelled", lambda: victim not in pilots_listed(), 90, poll=0.5)
        j = wait_for("the job done", lambda: (j := jobs_by_id(c)[jid]).state in ("completed", "failed") and j, 180,
                     poll=0.5)
        assert j.state == "completed" and j.steps_done == steps, j.message
        assert j.restarts == 1  # the lost worker failed one attempt; it resumed from its checkpoint
        log = (tmp_path / "controller.log").read_text()
        assert f"pilot {victim}: cancel its worker pilot-{victim} is gone from the controller" in log, log[-3000:]
        assert len(re.findall(r"pilot \d+_\d+: submit element", log)) == 3  # the replacement
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        c.close()
        ctl.send_signal(signal.SIGTERM)
        try:
            ctl.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stop(ctl)
    assert pilots_listed() == []


def slurm_job(jid: str) -> dict[str, str]:
    """``scontrol -o show job`` as a mapping (Slurm keeps an ended job there for MinJobAge, 300 s)."""
    return dict(w.split("=", 1) for w in sh("scontrol", "-o", "show", "job", jid).split() if "=" in w)


def test_pilots_fit_idle_windows_without_a_scavenger_partition(tmp_path: Path) -> None:
    """A site without a scavenger partition (issue 18): pilots in ``batch`` (no preemption) with ``time_limit:
    fit-idle-window``. n1 is reserved from +45 s (window too short: no pilot), n2 from +100 s (a window: one pilot
    whose whole-minute time limit ends before the reservation), n3/n4 are held by a batch job for 12 s. The job runs
    on the n2 pilot, whose worker leaves at its own deadline (checkpoint, Leave) before Slurm's time limit, so the
    pilot ends COMPLETED, not TIMEOUT; the controller re-plans, a pilot on n3/n4 (free now, unbounded window) takes
    the job, which finishes with exact steps."""
    from hpcsched.slurm.idle_windows import slurm_time

    resv = {"hp-short": ("n1", 45), "hp-window": ("n2", 100)}
    ctl = None
    try:
        for name, (node, start) in resv.items():
            with contextlib.suppress(commands.SlurmError):  # left by an interrupted run
                sh("scontrol", "delete", f"ReservationName={name}")
            sh("scontrol", "create", "reservation", f"ReservationName={name}", f"StartTime=now+{start}",
               "Duration=2", f"Nodes={node}", "Users=root")
        hold = sh("sbatch", "--parsable", "-p", "batch", "-N2", "-w", "n3,n4", "-t", "1", "-J", "batch-hold",
                  "--wrap", "sleep 12").strip()
        wait_for("the batch job holding n3, n4", lambda: squeue().get(hold, ("", ""))[1] == "RUNNING", 20, poll=0.2)
        starts = {name: slurm_time(dict(w.split("=", 1) for w in sh("scontrol", "-o", "show", "reservation", name)
                                        .split() if "=" in w)["StartTime"]) for name in resv}
        cfg = controller_config(tmp_path, min_runtime_s=2, stop_grace_s=4)
        with cfg.open("a") as f:
            f.write("node_source: slurm\nslurm:\n  partition: batch\n  time_limit: fit-idle-window\n"
                    "  time_limit_s: 300\n  min_window_s: 70\n  window_margin_s: 5\n  leave_before_s: 45\n"
                    "  max_pilots: 2\n  slots: 1\n  stop_grace_s: 3\n  poll_s: 1\n  work_dir: pilots\n")
        ctl, addr = start_controller(tmp_path, cfg)
        c = client(addr)
        steps = 500
        job = tmp_path / "one.yaml"
        job.write_text(f"name: one\nlauncher: direct\nprocs: 1\nsteps: {steps}\nworkdir: {ROOT}\n"
                       "command: [tests/netns_job.py, --checkpoint-every, '20', --step-ms, '50']\n")
        jid = submit(c, job)
        j = wait_for("the job running on a pilot", lambda: (j := jobs_by_id(c)[jid]).steps_done >= 20 and j, 60,
                     poll=0.3)
        (first,) = j.pilot_jobs
        info = slurm_job(first)
        assert info["NodeList"] == "n2" and info["Partition"] == "batch" and info["TimeLimit"] == "00:01:00", info
        assert slurm_time(info["EndTime"]) < starts["hp-window"], (info["EndTime"], starts)  # ends before the claim
        use = {n.node: n.use for n in c.nodes().nodes}
        assert use["n1"].startswith("idle window too short (") and "until reservation hp-short" in use["n1"], use
        assert use["n2"].startswith(f"pilot {first} (running, worker alive; leaves by "), use
        wait_for("the job stopped when its pilot left", lambda: jobs_by_id(c)[jid].state == "pending", 60, poll=0.2)
        left_at = time.time()
        ckpt = json.loads((tmp_path / "run" / "ckpt" / jid / "ckpt.json").read_text())["step"]
        done_at_stop = jobs_by_id(c)[jid].steps_done
        assert ckpt >= done_at_stop - 1, (ckpt, done_at_stop)  # checkpointed as it left: nothing to redo
        assert left_at < starts["hp-window"] - 5, (left_at, starts)
        j = wait_for("the job running again", lambda: (j := jobs_by_id(c)[jid]).state == "running" and j, 30, poll=0.2)
        back_s = time.time() - left_at
        (second,) = j.pilot_jobs
        assert slurm_job(second)["NodeList"] in ("n3", "n4")
        ended = wait_for("the first pilot ended", lambda: (s := slurm_job(first))["JobState"] not in
                         ("RUNNING", "COMPLETING") and s, 30)
        assert ended["JobState"] == "COMPLETED", ended  # its worker left in time: no TIMEOUT, no kill
        assert slurm_time(ended["EndTime"]) < slurm_time(info["EndTime"]), (ended["EndTime"], info["EndTime"])
        j = wait_for("the job done", lambda: (j := jobs_by_id(c)[jid]).state in ("completed", "failed") and j, 90,
                     poll=0.5)
        assert j.state == "completed" and j.steps_done == steps and j.restarts == 0, j.message
        assert json.loads((tmp_path / "run" / "ckpt" / jid / "result.json").read_text())["steps"] == steps
        log = (tmp_path / "controller.log").read_text()
        assert ": submit on n1" not in log and log.count(": submit on n2") == 1, log[-3000:]
        assert f"pilot {first}: gone left at the end of its idle window" in log, log[-3000:]
        c.close()
        print(f"\npilot {first} on n2: --time 1 min, Slurm end {info['EndTime']} < reservation "
              f"{time.strftime('%H:%M:%S', time.localtime(starts['hp-window']))}; left "
              f"{starts['hp-window'] - left_at:.1f} s before it; job running again on {second} after {back_s:.1f} s")
    finally:
        if ctl is not None:
            ctl.send_signal(signal.SIGTERM)
            try:
                ctl.wait(timeout=60)
            except subprocess.TimeoutExpired:
                stop(ctl)
        for name in resv:
            with contextlib.suppress(commands.SlurmError):
                sh("scontrol", "delete", f"ReservationName={name}")
    assert pilots_listed() == []


def test_calls_per_poll_on_the_real_slurm_do_not_grow_with_the_pilots(tmp_path: Path) -> None:
    """On the real Slurm, every node of the partition claimed: one sbatch (a job array) for all four pilots, then
    one sinfo and one squeue per poll whatever runs, and one scancel for all of them at the stop."""
    calls: list[list[str]] = []

    def run(argv: list[str]) -> str:
        calls.append(argv)
        return commands.run(argv)

    m = PilotManager(PilotConfig(partition="scavenger", max_pilots=len(NODES), poll_s=0.5, work_dir=tmp_path / "p"),
                     View(len(NODES)), "127.0.0.1:1", None, tmp_path / "a.db", run=run)
    try:
        m.step()
        assert [c[0] for c in calls] == ["sinfo", "squeue", "sbatch"], calls
        base = next(iter(m.pilots)).split("_")[0]
        assert sorted(m.pilots) == [f"{base}_{i}" for i in range(4)]  # the elements of one array
        wait_for("the four pilots running", lambda: sum(1 for _, st in squeue().values() if st == "RUNNING") == 4, 60)
        for _ in range(3):
            calls.clear()
            m.step()
            assert [c[0] for c in calls] == ["sinfo", "squeue"], calls
        assert sorted(p.node for p in m.pilots.values()) == list(NODES)  # Slurm placed them, one per node
    finally:
        calls.clear()
        m.stop(wait_s=30)
    assert [c[0] for c in calls if c[0] in ("scancel", "sbatch")] == ["scancel"]
    assert not squeue()
