"""Node source ``slurm`` without a Slurm: the controller file's section, the pilots' batch script and how many
pilots to claim (the live behaviour is in tests/test_pilots_live.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_slurm import FakeSlurm, View
from runtime_procs import TOKEN, client, controller_config, kill_tree, start_controller, stop, wait_for

from hpcsched.errors import InputError
from hpcsched.runtime.config import read_controller_config
from hpcsched.slurm.pilot_config import PilotConfig, pilot_script, pilots_wanted
from hpcsched.slurm.pilots import PilotManager


def _cfg(tmp_path: Path, text: str):
    p = tmp_path / "controller.yaml"
    p.write_text(text)
    return read_controller_config(p)


def test_node_source_slurm_section(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "node_source: slurm\nslurm:\n  partition: scavenger\n  qos: low\n  account: proj1\n"
                         "  time_limit_s: 1800\n  leave_before_s: 120\n  signal: USR1\n  max_pilots: 8\n"
                         "  sbatch_args: [--constraint=cpu]\n")
    p = cfg.pilots
    assert p is not None
    assert (p.partition, p.qos, p.account, p.time_limit_s, p.leave_before_s, p.signal, p.max_pilots) == \
        ("scavenger", "low", "proj1", 1800, 120, "USR1", 8)
    assert p.sbatch_args == ("--constraint=cpu",) and p.work_dir == (tmp_path / "pilots").resolve()
    assert not p.worker_step  # the worker is the batch shell unless the site asks for a step (docs/runtime.md)
    assert _cfg(tmp_path, "node_source: slurm\nslurm:\n  worker_step: true\n").pilots.worker_step is True
    assert _cfg(tmp_path, "policy: fifo\n").pilots is None  # static: workers register themselves


@pytest.mark.parametrize("text, message", [
    ("node_source: lsf\n", "node_source: expected one of static, slurm, pbs, got 'lsf'"),
    ("slurm:\n  partition: x\n", "a slurm: section needs node_source: slurm"),
    ("node_source: slurm\nslurm:\n  partitoin: x\n", "slurm: unknown key 'partitoin'"),
    ("node_source: slurm\nslurm:\n  max_pilots: 0\n", "slurm: max_pilots: expected a positive int, got 0"),
    ("node_source: slurm\nslurm:\n  time_limit_s: 60\n  leave_before_s: 60\n",
     "leave_before_s (60) must be below time_limit_s (60)"),
    ("node_source: slurm\nslurm: [a]\n", "slurm: expected a mapping"),
    ("node_source: slurm\nslurm:\n  worker_step: 1\n", "slurm: worker_step: expected a bool, got 1"),
])
def test_node_source_mistakes_name_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        _cfg(tmp_path, text)
    assert "controller.yaml" in str(e.value)


def test_pilot_script_runs_the_worker_named_after_its_job(tmp_path: Path) -> None:
    cfg = PilotConfig(slots=2, gpus=1, stop_grace_s=4.0, work_dir=tmp_path / "pilot dir", python="/opt/py/bin/python")
    worker = ("/opt/py/bin/python -m hpcsched.runtime worker --controller ctl.example:5000 --slots 2 --gpus 1 "
              "--stop-grace 4.0 --orphan-timeout 600.0 --token-file ")
    name = f'--name "pilot-$id" --work-dir \'{tmp_path}/pilot dir\'/"$id"'
    step = pilot_script(dataclasses.replace(cfg, worker_step=True), "ctl.example:5000", tmp_path / "tok", "ab")
    last = step.strip().splitlines()[-1]
    assert last.startswith('exec srun --ntasks=1 --nodes=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}" --mpi=none '
                           '--quiet ' + worker) and last.endswith(name), last
    text = pilot_script(cfg, "ctl.example:5000", tmp_path / "tok", "ab")
    assert text.startswith("#!/bin/bash\n")
    (line,) = [x for x in text.splitlines() if x.startswith(worker)]
    assert line.endswith(name + " &")  # beside the sentinel step, not in it
    assert "srun --ntasks=1 --nodes=1 --cpus-per-task=1 --overlap" in text
    # the pilot's id, as squeue lists it: ARRAYID_TASK for an array element, the job id otherwise
    for env, want in (({"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_ID": "9"}, "7_3"),
                      ({"SLURM_JOB_ID": "9"}, "9")):
        head = "\n".join(text.splitlines()[:3]) + '\necho "$id"\n'
        out = subprocess.run(["bash", "-c", head], env={"PATH": os.environ["PATH"]} | env, capture_output=True,
                             text=True, check=True).stdout.strip()
        assert out == want


def test_pilot_script_passes_a_preemption_on_to_the_worker_at_once(tmp_path: Path) -> None:
    """The sentinel step ends on Slurm's SIGTERM to the job's steps; the script then signals the worker alone,
    which leaves, and records when it was signalled and when the worker had left. Run with stand-ins for srun
    and the worker (a shell that traps SIGTERM and takes 0.3 s to leave)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n')
    worker = tmp_path / "py"
    out_file = tmp_path / "worker.out"
    worker.write_text(f"#!/bin/bash\necho started > {out_file}\n"
                      f"trap 'sleep 0.3; echo left >> {out_file}; exit 0' TERM\n"
                      "while :; do sleep 0.05; done\n")
    for p in (bin_dir / "srun", worker):
        p.chmod(0o755)
    cfg = PilotConfig(work_dir=tmp_path / "w", python=str(worker))
    script = tmp_path / "pilot.sh"
    script.write_text(pilot_script(cfg, "ctl:1", None, "ab"))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42"}
    p = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        wait_for("the sentinel running", lambda: (tmp_path / "w" / "42" / "sentinel").exists(), 10, poll=0.05)
        pids = [int(x) for x in subprocess.run(["pgrep", "-s", str(p.pid), "-f", "sleep 2147483647"],
                                               capture_output=True, text=True).stdout.split()]
        assert len(pids) == 2  # the sentinel's shell and its sleep
        for pid in pids:
            os.kill(pid, 15)  # what Slurm does to every process of a preempted job's steps
        assert p.wait(timeout=10) == 0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
    out = p.stdout.read() if p.stdout else ""
    assert "the worker leaves now" in out, out
    assert (tmp_path / "worker.out").read_text().split() == ["started", "left"]
    held = float((tmp_path / "w" / "42" / "released").read_text()) - \
        float((tmp_path / "w" / "42" / "preempted").read_text())
    assert 0.3 <= held < 5, held


def test_pilots_wanted_table() -> None:
    cfg = PilotConfig(max_pilots=3, slots=2)
    # (demand slots, live slots, pilots on their way, pilots serving, idle nodes) -> new pilots
    for args, want in [((0, 0, 0, 0, 4), 0), ((4, 0, 0, 0, 4), 2), ((5, 0, 0, 0, 4), 3), ((8, 0, 0, 0, 4), 3),
                       ((4, 0, 1, 0, 4), 1), ((4, 4, 0, 2, 4), 0), ((8, 2, 0, 1, 1), 1), ((8, 2, 0, 1, 0), 0),
                       ((6, 0, 0, 3, 4), 0)]:
        assert pilots_wanted(*args, cfg) == want, args


def test_a_worker_leaves_once_its_controller_is_gone_for_orphan_timeout(tmp_path: Path) -> None:
    """A pilot's worker (``--orphan-timeout``) must not hold its node for a controller that is gone: killed with
    kill -9 and not restarted, the worker leaves after the timeout and exits 0."""
    ctl, addr = start_controller(tmp_path, controller_config(tmp_path))
    log = tmp_path / "p1.log"
    with log.open("ab") as out:
        w = subprocess.Popen([sys.executable, "-m", "hpcsched.runtime", "worker", "--controller", addr, "--name", "p1",
                              "--gpus", "0", "--orphan-timeout", "2", "--stop-grace", "3",  # as a pilot's worker
                              "--work-dir", str(tmp_path / "p1")],
                             env=os.environ | {"HPCSCHED_TOKEN": TOKEN}, stdout=out, stderr=subprocess.STDOUT)
    c = client(addr)
    try:
        wait_for("the worker registered", lambda: any(x.alive for x in c.workers()), 60)
        kill_tree(ctl)
        t0 = time.monotonic()
        assert w.wait(timeout=60) == 0
        took = time.monotonic() - t0
        assert 2 - 0.3 <= took < 30, took  # from the last answered heartbeat (every 0.3 s) before the kill
        assert "unreachable for" in log.read_text() and "orphan_timeout_s 2" in log.read_text()
    finally:
        c.close()
        if w.poll() is None:
            kill_tree(w)
        stop(ctl)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _manager(tmp_path: Path, slurm: FakeSlurm, view: View, clock: Clock, **cfg: object) -> PilotManager:
    c = PilotConfig(partition="scavenger", max_pilots=3, start_timeout_s=60, register_timeout_s=30,
                    idle_release_s=20, leave_before_s=60, time_limit_s=1800, work_dir=tmp_path / "pilots")
    return PilotManager(dataclasses.replace(c, **cfg), view, "10.0.0.1:5000", "tok", tmp_path / "state.db",
                        clock=clock, run=slurm.run)


def test_manager_claims_idle_nodes_for_the_queue_and_no_more(tmp_path: Path) -> None:
    slurm, view, clock = FakeSlurm(), View(demand=2), Clock()
    m = _manager(tmp_path, slurm, view, clock)
    m.step()
    # one sbatch for both: a job array of one-node pilots, placed by Slurm on the partition's idle nodes
    assert [c[0] for c in slurm.calls] == ["sinfo", "squeue", "sbatch"]
    assert sorted(slurm.jobs) == ["100_0", "100_1"]
    a = slurm.jobs["100_0"]["argv"]
    assert {"--partition", "scavenger"} <= set(a) and "--signal=B:TERM@60" in a and a[a.index("--time") + 1] == "30"
    assert "--array=0-1" in a and "--nodelist" not in a
    assert ["sinfo", "-N", "-h", "-p", "scavenger", "-o", "%N %T"] in slurm.calls  # only the partition's nodes
    m.step()
    assert len(slurm.jobs) == 2  # on their way: not submitted again
    status = json.loads(m.status_path.read_text())  # what each node does for the controller, or why not
    assert status["nodes"] == {n: "idle, not needed: the queue wants 2 slots, live workers have 0, 2 pilots coming"
                               for n in ("n1", "n2", "n3", "n4")}
    assert [(p["job_id"], p["state"], p["node"]) for p in status["pilots"]] == [("100_0", "PENDING", ""),
                                                                                ("100_1", "PENDING", "")]
    assert [e["kind"] for e in status["events"]] == ["submit", "submit"]
    for jid in list(slurm.jobs):
        slurm.start(jid)
        view.w[f"pilot-{jid}"] = (True, 1, 1)
    view.demand = 3  # one more slot wanted: one more pilot
    clock.t += 1
    m.step()
    assert len(slurm.jobs) == 3 and slurm.jobs["101_0"]["state"] == "PENDING"
    assert slurm.start("101_0") == "n3"
    slurm.nodes["n4"] = "drained"
    m.step()
    nodes = json.loads(m.status_path.read_text())["nodes"]
    assert nodes["n1"] == "pilot 100_0 (running, worker alive)" and nodes["n4"] == "drained"
    assert nodes["n3"] == "pilot 101_0 (running, no worker yet)"
    assert (tmp_path / "pilots" / f"worker-token-{m.tag}").stat().st_mode & 0o777 == 0o600
    # a steady poll: one sinfo and one squeue whatever the node count, and the status file is not rewritten
    slurm.calls.clear()
    before = m.status_path.stat().st_mtime_ns
    m.step()
    assert [c[0] for c in slurm.calls] == ["sinfo", "squeue"]
    assert m.status_path.stat().st_mtime_ns == before
    # pilots ended in one poll are cancelled with one scancel (here: running, their workers never registered)
    view.w = {}
    clock.t += 31
    slurm.calls.clear()
    m.step()
    assert [c for c in slurm.calls if c[0] == "scancel"] == [["scancel", "100_0", "100_1", "101_0"]]


def test_manager_cancels_pilots_that_never_start_and_backs_off(tmp_path: Path) -> None:
    slurm, view, clock = FakeSlurm(), View(demand=1), Clock()
    m = _manager(tmp_path, slurm, view, clock)
    m.step()
    (jid,) = slurm.jobs
    clock.t += 61
    m.step()
    assert jid not in slurm.jobs and any(e.kind == "cancel" and e.detail.startswith("never started") for e in m.events)
    clock.t += 1
    m.step()  # it has left the queue: gone; the back-off (start_timeout_s) holds the next one
    assert not slurm.jobs and any(e.kind == "gone" for e in m.events)
    clock.t += 60
    m.step()
    assert len(slurm.jobs) == 1  # tried again after the back-off


def test_manager_cancels_a_hung_pilot_and_releases_idle_ones(tmp_path: Path) -> None:
    slurm, view, clock = FakeSlurm(), View(demand=2), Clock()
    m = _manager(tmp_path, slurm, view, clock)
    m.step()
    a, b = slurm.jobs
    slurm.start(a)
    slurm.start(b)
    view.w[f"pilot-{a}"] = (True, 1, 1)  # b's worker never registers
    m.step()
    clock.t += 31
    m.step()
    assert b not in slurm.jobs and any(e.kind == "cancel" and "never registered" in e.detail for e in m.events)
    # the queue empties: a's worker idles; after idle_release_s it is given back (not a failure: no back-off)
    view.demand, view.w[f"pilot-{a}"] = 0, (True, 1, 0)
    m.step()
    clock.t += 21
    m.step()
    assert a not in slurm.jobs and any(e.kind == "cancel" and e.detail.startswith("idle") for e in m.events)


def test_a_restarted_manager_adopts_its_predecessors_pilots(tmp_path: Path) -> None:
    slurm, view, clock = FakeSlurm(), View(demand=2), Clock()
    _manager(tmp_path, slurm, view, clock).step()
    assert len(slurm.jobs) == 2
    again = _manager(tmp_path, slurm, view, clock)  # same state file: same pilot name
    again.step()
    assert len(slurm.jobs) == 2 and [e.kind for e in again.events] == ["adopt", "adopt"]
    other = _manager(tmp_path / "other", slurm, View(demand=1), clock)  # another controller's state: its own
    other.step()
    assert len(slurm.jobs) == 3


# ---------------------------------------------------------------------------------------- fit-idle-window
# Recorded from the loopback Slurm (slurm-wlm 22.05.8, tests/slurm_cluster.py) at the times given.
# scontrol -o show reservation, at 2026-11-27T06:24:06: maint1 (MAINT) on n[1-2] from +5 min, now3 active on n3
RESV_ONE_LINE = (
    "ReservationName=maint1 StartTime=2026-11-27T06:29:05 EndTime=2026-11-27T06:39:05 Duration=00:10:00 Nodes=n[1-2] "
    "NodeCnt=2 CoreCnt=4 Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES TRES=cpu=4 Users=root "
    "Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
    "ReservationName=now3 StartTime=2026-11-27T06:24:05 EndTime=2026-11-27T06:25:05 Duration=00:01:00 Nodes=n3 "
    "NodeCnt=1 CoreCnt=2 Features=(null) PartitionName=(null) Flags=SPEC_NODES TRES=cpu=2 Users=root Groups=(null) "
    "Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n")
# the same reservations, scontrol show reservation (multi-line)
RESV_MULTI_LINE = """ReservationName=maint1 StartTime=2026-11-27T06:29:05 EndTime=2026-11-27T06:39:05 Duration=00:10:00
   Nodes=n[1-2] NodeCnt=2 CoreCnt=4 Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES
   TRES=cpu=4
   Users=root Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a
   MaxStartDelay=(null)

ReservationName=now3 StartTime=2026-11-27T06:24:05 EndTime=2026-11-27T06:25:05 Duration=00:01:00
   Nodes=n3 NodeCnt=1 CoreCnt=2 Features=(null) PartitionName=(null) Flags=SPEC_NODES
   TRES=cpu=2
   Users=root Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a
   MaxStartDelay=(null)

"""
# squeue -h -t PD -o '%i|%P|%j|%S|%Y' at 2026-11-27T06:30:40: a job on n1,n3,n4 until 06:32:37 (-t 2), a 4-node job
# backfill planned after it (sinfo: n2 planned), and one held by --begin (a start, no nodes yet)
PENDING = "88|batch|site-wide|2026-11-27T06:32:37|n[1-4]\n89|batch|site-later|2026-11-27T06:31:07|(null)\n"
SINFO_PLANNED = "n1 allocated\nn1 allocated\nn2 planned\nn2 planned\nn3 allocated\nn3 allocated\nn4 allocated\n"


def test_idle_windows_from_recorded_slurm_output() -> None:
    from hpcsched.slurm.idle_windows import estimate, parse_planned, parse_reservations, slurm_time

    resv = parse_reservations(RESV_ONE_LINE)
    assert parse_reservations(RESV_MULTI_LINE) == resv and parse_reservations("No reservations in the system\n") == []
    assert [(r.name, r.nodes, r.state, r.end - r.start) for r in resv] == [
        ("maint1", ("n1", "n2"), "INACTIVE", 600), ("now3", ("n3",), "ACTIVE", 60)]
    t = slurm_time("2026-11-27T06:24:06")
    w = estimate(t, resv, [])
    assert {n: (c.at - t, c.what) for n, c in w.claims.items()} == {
        "n1": (299, "reservation maint1"), "n2": (299, "reservation maint1"),
        "n3": (0, "in reservation now3 (until 06:25:05)")}
    assert (w.seconds("n1", 900), w.seconds("n3", 900), w.seconds("n4", 900)) == (299, 0, 900)  # n4: the cap
    assert estimate(slurm_time("2026-11-27T06:40:00"), resv, []).claims == {}  # both have ended
    planned = parse_planned(PENDING)
    assert [(j.id, j.nodes) for j in planned] == [("88", ("n1", "n2", "n3", "n4")), ("89", ())]
    t2 = slurm_time("2026-11-27T06:30:40")
    w2 = estimate(t2, [], planned)
    assert {n: (c.at - t2, c.what) for n, c in w2.claims.items()} == {n: (117, "job 88 (batch)")
                                                                       for n in ("n1", "n2", "n3", "n4")}
    assert w2.unplaced == ("89",)  # a start but no nodes: said by the manager, not guessed
    assert estimate(t2, [], planned, lambda j: j.name == "site-wide").claims == {}  # our own pilots claim nothing
    both = estimate(t, resv, planned)  # each node's earliest claim
    assert (both.claims["n1"].what, both.claims["n4"].what) == ("reservation maint1", "job 88 (batch)")
    with pytest.raises(ValueError, match="not in the format"):
        parse_planned("88|batch|x\n")
    with pytest.raises(ValueError, match="not a Slurm time: 'soon'"):
        parse_reservations("ReservationName=x StartTime=soon EndTime=N/A Nodes=n1")


def test_fit_idle_window_section(tmp_path: Path) -> None:
    p = _cfg(tmp_path, "node_source: slurm\nslurm:\n  partition: batch\n  time_limit: fit-idle-window\n"
                       "  min_window_s: 300\n  window_margin_s: 30\n  time_limit_s: 7200\n").pilots
    assert p is not None and (p.time_limit, p.min_window_s, p.window_margin_s, p.time_limit_s) == \
        ("fit-idle-window", 300, 30, 7200)
    assert _cfg(tmp_path, "node_source: slurm\n").pilots.time_limit == "fixed"
    for text, message in [
        ("  time_limit: fit\n", "slurm: time_limit: expected one of fixed, fit-idle-window, got 'fit'"),
        ("  min_window_s: 300\n", "slurm: min_window_s is read only with time_limit: fit-idle-window"),
        ("  time_limit: fit-idle-window\n  signal: USR1\n", "slurm: signal is not read with time_limit: fit-idle"),
        ("  time_limit: fit-idle-window\n  min_window_s: 100\n  window_margin_s: 60\n",
         r"min_window_s \(100\) minus window_margin_s \(60\) must give a time limit of at least one whole minute"),
        ("  time_limit: fit-idle-window\n  min_window_s: 110\n  window_margin_s: 30\n  leave_before_s: 60\n",
         r"above leave_before_s \(60\); it gives 60 s")]:
        with pytest.raises(InputError, match=message) as e:
            _cfg(tmp_path, "node_source: slurm\nslurm:\n" + text)
        assert "controller.yaml" in str(e.value) and ":2" in str(e.value)  # the slurm: section's line


def test_manager_fits_pilots_into_idle_windows(tmp_path: Path) -> None:
    """Recorded reservations: n1, n2 claimed in 299 s, n3 in an active reservation, n4 unclaimed. Each pilot's
    --time is its node's window less the margin in whole minutes, longest window first, no --signal (the script's
    deadline instead); a node whose window is below min_window_s gets none and says why."""
    from hpcsched.slurm.idle_windows import slurm_time

    slurm, view, clock = FakeSlurm(), View(demand=3), Clock()
    slurm.reservations = RESV_ONE_LINE
    t = slurm_time("2026-11-27T06:24:06")
    m = _manager(tmp_path, slurm, view, clock, partition=None, time_limit="fit-idle-window", min_window_s=240,
                 window_margin_s=60)
    m.wall = lambda: t
    m.step()
    subs = {j["node"]: j["argv"] for j in slurm.jobs.values()}
    assert list(subs) == ["n4", "n1", "n2"]  # longest window first; n3 is in a reservation now
    assert [a[a.index("--time") + 1] for a in subs.values()] == ["30", "3", "3"]  # 1800 s cap; 239 s -> 3 min
    assert not any(x.startswith("--signal") for a in subs.values() for x in a)
    assert subs["n4"][-2:] == [str(int(t + 1800 - 60)), "1740"] and subs["n1"][-2:] == [str(int(t + 179)), "120"]
    nodes = json.loads(m.status_path.read_text())["nodes"]
    assert nodes["n3"] == "idle window too short (0 s: in reservation now3 (until 06:25:05); min_window_s 240)"
    assert nodes["n1"] == "pilot 101 (pending, no worker yet; leaves by 06:26:06, before reservation maint1 at " \
                          "06:29:05)"
    assert any(e.detail.startswith("on n1: queue wants 3 slots") and "idle window 299 s until reservation maint1 at "
               "06:29:05: --time 3 min, leaves by 06:26:06" in e.detail for e in m.events)
    other = FakeSlurm()
    other.reservations = RESV_ONE_LINE
    strict = _manager(tmp_path / "strict", other, View(demand=3), clock, partition=None,
                      time_limit="fit-idle-window", min_window_s=600)
    strict.wall = lambda: t
    strict.step()
    assert [j["node"] for j in other.jobs.values()] == ["n4"]
    nodes = json.loads(strict.status_path.read_text())["nodes"]
    assert nodes["n1"] == "idle window too short (299 s until reservation maint1 at 06:29:05; min_window_s 600)"


def test_planned_nodes_serve_until_backfill_needs_them_and_pilots_are_replaced_at_their_windows_end(
        tmp_path: Path) -> None:
    """n2 is planned (recorded sinfo and squeue): its window is job 88's expected start; the pilot there leaves by
    then, and once its worker has left at its window's end a replacement is claimed at once, before Slurm has let
    the old pilot go; its going is said as the end of its window."""
    from hpcsched.slurm.idle_windows import slurm_time

    slurm, view, clock = FakeSlurm(), View(demand=1), Clock()
    slurm.nodes = dict(line.split() for line in SINFO_PLANNED.splitlines())
    t = [slurm_time("2026-11-27T06:30:40")]
    m = _manager(tmp_path, slurm, view, clock, partition=None, time_limit="fit-idle-window", min_window_s=100,
                 window_margin_s=30, leave_before_s=20)
    m.wall = lambda: t[0]
    m.step()  # n2 planned, but squeue gives no start for it: not used
    assert not slurm.jobs
    assert json.loads(m.status_path.read_text())["nodes"]["n2"].startswith("planned by backfill for a pending job")
    slurm.pending = PENDING
    m.step()
    ((jid, job),) = slurm.jobs.items()
    assert job["node"] == "n2" and job["argv"][job["argv"].index("--time") + 1] == "1"  # 117 - 30 s -> 1 min
    status = json.loads(m.status_path.read_text())
    assert status["idle_windows"]["pending_jobs_without_nodes"] == ["89"]
    slurm.start(jid)
    view.w[f"pilot-{jid}"] = (True, 1, 1)
    m.step()
    assert m.pilots[jid].leave_by == t[0] + 40  # its time limit (60 s) less leave_before_s, from its start
    t[0] += 41
    view.w[f"pilot-{jid}"] = (False, 1, 0)  # its worker left (Leave); Slurm still lists the pilot
    slurm.nodes["n1"], slurm.pending = "idle", ""
    m.step()
    assert len(slurm.jobs) == 2 and slurm.jobs[str(int(jid) + 1)]["node"] == "n1"  # replaced at once
    del slurm.jobs[jid]
    m.step()
    assert any(e.kind == "gone" and e.detail.startswith("left at the end of its idle window (by ")
               and e.detail.endswith("before job 88 (batch) at 06:32:37)") for e in m.events), m.events


def test_fit_window_script_leaves_at_its_deadline(tmp_path: Path) -> None:
    """The pilot script runs the worker under timeout: SIGTERM at the earlier of its two limits, the worker's exit
    status kept (a clean leave ends the job COMPLETED); a window already over starts no worker."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\ntrap 'echo left; exit 0' TERM\necho \"$@\" > \"$(dirname $0)/args\"\n"
                    "sleep 30 & wait\n")
    fake.chmod(0o755)
    cfg = PilotConfig(time_limit="fit-idle-window", leave_before_s=20, work_dir=tmp_path, python=str(fake),
                      worker_step=False)
    script = tmp_path / "pilot.sh"
    script.write_text(pilot_script(cfg, "ctl:1", None, "t"))
    bin_dir = tmp_path / "bin"  # outside Slurm: an srun that fails, as one outside an allocation does
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\necho 'srun: error: no allocation' >&2\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    env = os.environ | {"SLURM_JOB_ID": "7", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    t0 = time.monotonic()
    p = subprocess.run(["bash", str(script), str(int(time.time()) + 100), "1"], env=env, capture_output=True,
                       text=True, timeout=20)
    assert p.returncode == 0 and p.stdout.splitlines() == [
        "hpcsched pilot: the worker leaves in 1 s",
        "hpcsched pilot: the sentinel step did not run: a preemption reaches the worker at GraceTime's end",
        "left"], p
    assert 0.9 < time.monotonic() - t0 < 5
    assert "--name pilot-7" in (tmp_path / "args").read_text()
    (tmp_path / "args").unlink()
    p = subprocess.run(["bash", str(script), str(int(time.time()) - 1), "100"], env=env, capture_output=True,
                       text=True, timeout=20)
    assert p.returncode == 0 and "its idle window ended" in p.stdout and not (tmp_path / "args").exists()


def test_arriving_names_pilot_workers_not_registered_yet_for_at_most_settle_s(tmp_path: Path) -> None:
    """What the controller holds its decisions for (Controller.arriving): pilots submitted or started whose workers
    have not registered, each for at most settle_s after it was submitted (pending) or first seen running."""
    slurm, view, clock = FakeSlurm(), View(demand=2), Clock()
    m = _manager(tmp_path, slurm, view, clock, settle_s=5.0)
    m.step()
    assert m.arriving(set()) == ["pilot-100_0", "pilot-100_1"]  # just submitted to idle nodes: about to start
    assert m.arriving({"pilot-100_0"}) == ["pilot-100_1"]
    clock.t += 4.0
    slurm.start("100_0")
    m.step()  # seen running now: its 5 s count from here
    clock.t += 2.0
    assert m.arriving(set()) == ["pilot-100_0"]  # 100_1 still pending, 6 s after its submit: not waited for
    clock.t += 3.5
    assert m.arriving(set()) == []  # a worker that does not come within settle_s holds nothing more


def test_a_poll_that_finds_nothing_changed_decides_nothing(tmp_path: Path) -> None:
    """Every pilot running with a busy worker and Slurm, the workers and the demand as the last poll left them:
    the poll reads Slurm (two calls) and stops there, counted; any change, or a timer's state, decides again."""
    slurm, view, clock = FakeSlurm(), View(demand=2), Clock()
    m = _manager(tmp_path, slurm, view, clock)
    m.step()
    for jid in list(slurm.jobs):
        slurm.start(jid)
        view.w[f"pilot-{jid}"] = (True, 1, 1)
    m.step()
    assert m.quiet_polls == 0
    slurm.calls.clear()
    clock.t += 100  # timers are not what a settled poll waits on
    m.step()
    m.step()
    assert m.quiet_polls == 2 and [c[0] for c in slurm.calls] == ["sinfo", "squeue"] * 2
    view.w["pilot-100_0"], view.demand = (True, 1, 0), 1  # nothing to run there: its idle timer runs, polls decide
    m.step()
    m.step()
    assert m.quiet_polls == 2
    clock.t += 21
    m.step()
    assert any(e.kind == "cancel" and e.detail.startswith("idle") for e in m.events)
    del slurm.jobs["100_1"]  # Slurm ended a pilot: the next poll sees it gone
    m.step()
    assert any(e.kind == "gone" and e.job_id == "100_1" for e in m.events)


def test_a_node_a_pilot_was_preempted_from_is_left_to_the_preemptor_for_a_moment(tmp_path: Path) -> None:
    """Slurm ends a pilot (preemption) and shows its node idle until the preempting job starts there: the manager
    does not claim it back at once (a new pilot would only wait behind that job and hold the controller's decisions
    for its worker), says why, and claims it again after the hold if it is still idle."""
    slurm, view, clock = FakeSlurm(nodes=2), View(demand=2), Clock()
    m = _manager(tmp_path, slurm, view, clock, poll_s=1.0)
    m.step()
    for jid in list(slurm.jobs):
        slurm.start(jid)
        view.w[f"pilot-{jid}"] = (True, 1, 1)
    m.step()
    slurm.end("100_0")  # preempted: its node n1 idle for a moment
    del view.w["pilot-100_0"]
    clock.t += 1
    m.step()
    assert len(slurm.jobs) == 1 and "just ended its pilot" in json.loads(m.status_path.read_text())["nodes"]["n1"]
    clock.t += 5  # the hold (5 polls, at least 5 s) is over and n1 is still idle: claimed again
    m.step()
    assert len(slurm.jobs) == 2
