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
from runtime_procs import TOKEN, client, controller_config, kill_tree, start_controller, stop, wait_for

from hpcsched.errors import InputError
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.pilots import PilotConfig, PilotManager, pilot_script, pilots_wanted


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
    assert _cfg(tmp_path, "policy: fifo\n").pilots is None  # static: workers register themselves


@pytest.mark.parametrize("text, message", [
    ("node_source: pbs\n", "node_source: expected one of static, slurm, got 'pbs'"),
    ("slurm:\n  partition: x\n", "a slurm: section needs node_source: slurm"),
    ("node_source: slurm\nslurm:\n  partitoin: x\n", "slurm: unknown key 'partitoin'"),
    ("node_source: slurm\nslurm:\n  max_pilots: 0\n", "slurm: max_pilots: expected a positive int, got 0"),
    ("node_source: slurm\nslurm:\n  time_limit_s: 60\n  leave_before_s: 60\n",
     "leave_before_s (60) must be below time_limit_s (60)"),
    ("node_source: slurm\nslurm: [a]\n", "slurm: expected a mapping"),
])
def test_node_source_mistakes_name_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        _cfg(tmp_path, text)
    assert "controller.yaml" in str(e.value)


def test_pilot_script_execs_the_worker_named_after_its_job(tmp_path: Path) -> None:
    cfg = PilotConfig(slots=2, gpus=1, stop_grace_s=4.0, work_dir=tmp_path / "pilot dir", python="/opt/py/bin/python")
    text = pilot_script(cfg, "ctl.example:5000", tmp_path / "tok", "abcd1234")
    assert text.startswith("#!/bin/sh\n")
    last = text.strip().splitlines()[-1]
    assert last.startswith("exec /opt/py/bin/python -m hpcsched.runtime worker --controller ctl.example:5000 "
                           "--slots 2 --gpus 1 --stop-grace 4.0 --orphan-timeout 600.0 --token-file ")
    assert '--name "pilot-$SLURM_JOB_ID"' in last and f"'{tmp_path}/pilot dir'/\"$SLURM_JOB_ID\"" in last


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
                              "--gpus", "0", "--orphan-timeout", "2", "--work-dir", str(tmp_path / "p1")],
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


class FakeSlurm:
    """sinfo / squeue / sbatch / scancel over a few nodes, as the manager calls them (its ``run``)."""

    def __init__(self, nodes: int = 4) -> None:
        self.nodes = {f"n{i}": "idle" for i in range(1, nodes + 1)}
        self.jobs: dict[str, dict] = {}  # id -> name, state, node, argv
        self.next_id = 100
        self.calls: list[list[str]] = []

    def run(self, argv: list[str]) -> str:
        self.calls.append(argv)
        tool = argv[0]
        if tool == "sinfo":
            return "".join(f"{n} {st}\n" for n, st in self.nodes.items())
        if tool == "squeue" and "--name" in argv:
            name = argv[argv.index("--name") + 1]
            return "".join(f"{jid}|{j['state']}|{j['node'] if j['state'] == 'RUNNING' else ''}\n"
                           for jid, j in self.jobs.items() if j["name"] == name)
        if tool == "squeue":
            return "".join(f"{jid}|scavenger|{j['name']}|RUNNING|{j['node']}\n"
                           for jid, j in self.jobs.items() if j["state"] == "RUNNING")
        if tool == "sbatch":
            jid = str(self.next_id)
            self.next_id += 1
            self.jobs[jid] = {"name": argv[argv.index("--job-name") + 1], "state": "PENDING",
                              "node": argv[argv.index("--nodelist") + 1], "argv": argv}
            return f"{jid}\n"
        if tool == "scancel":
            for jid in argv[1:]:
                self.jobs.pop(jid, None)
            return ""
        raise AssertionError(f"unexpected {argv}")

    def start(self, jid: str) -> None:
        self.jobs[jid]["state"] = "RUNNING"
        self.nodes[self.jobs[jid]["node"]] = "allocated"


class View:
    def __init__(self, demand: int) -> None:
        self.demand, self.w = demand, {}

    def demand_slots(self) -> int:
        return self.demand

    def workers(self) -> dict[str, tuple[bool, int, int]]:
        return dict(self.w)


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
    subs = [j["argv"] for j in slurm.jobs.values()]
    assert [a[a.index("--nodelist") + 1] for a in subs] == ["n1", "n2"]
    a = subs[0]
    assert {"--partition", "scavenger"} <= set(a) and "--signal=B:TERM@60" in a and a[a.index("--time") + 1] == "30"
    assert ["sinfo", "-N", "-h", "-p", "scavenger", "-o", "%N %T"] in slurm.calls  # only the partition's nodes
    m.step()
    assert len(slurm.jobs) == 2  # on their way: not submitted again
    status = json.loads(m.status_path.read_text())  # what each node does for the controller, or why not
    assert status["nodes"] == {"n1": "pilot 100 (pending, no worker yet)", "n2": "pilot 101 (pending, no worker yet)",
                               "n3": "idle, not needed: the queue wants 2 slots, live workers have 0, 2 pilots coming",
                               "n4": "idle, not needed: the queue wants 2 slots, live workers have 0, 2 pilots coming"}
    assert [e["kind"] for e in status["events"]] == ["submit", "submit"]
    for jid in list(slurm.jobs):
        slurm.start(jid)
        view.w[f"pilot-{jid}"] = (True, 1, 1)
    view.demand = 3  # one more slot wanted: one more pilot, on a node still idle
    clock.t += 1
    m.step()
    assert len(slurm.jobs) == 3 and slurm.jobs["102"]["node"] == "n3"
    slurm.nodes["n4"] = "drained"
    m.step()
    nodes = json.loads(m.status_path.read_text())["nodes"]
    assert nodes["n1"] == "pilot 100 (running, worker alive)" and nodes["n4"] == "drained"
    assert (tmp_path / "pilots" / f"worker-token-{m.tag}").stat().st_mode & 0o777 == 0o600


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
