"""Issue 18, "Operable": which workers are harvested pilots and why a node is not used (``hpcsched workers``,
``workers --nodes``, ``jobs``), and ``hpcsched calc`` on a controller run (harvested node-hours, the pool's
utilisation, preemptions, lost steps). No Slurm: stores written as the controller writes them, and a real
in-process controller whose pilot manager runs over the fake Slurm of tests/test_pilots.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import typer
from runtime_procs import TOKEN, client, controller_config, wait_for
from test_pilots import Clock, FakeSlurm, View, _manager
from typer.testing import CliRunner

from hpcsched.calc_cli import register as register_calc
from hpcsched.metrics.pilots import pilot_metrics
from hpcsched.runtime.auth import metadata
from hpcsched.runtime.cli import register as register_runtime
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.credentials import credential_metadata
from hpcsched.runtime.jobfile import parse_job_spec
from hpcsched.runtime.node_source import ControllerDemand
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.server import ControllerServer
from hpcsched.runtime.store import Store
from hpcsched.slurm.pilots import PilotManager


def _cli(*args: str) -> str:
    app = typer.Typer()
    register_calc(app)
    register_runtime(app)
    r = CliRunner().invoke(app, list(args), env={"HPCSCHED_TOKEN": TOKEN, "COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    return r.output


def _pilot(store: Store, t: float, event: str, jid: str, node: str, state: str = "", **extra: object) -> None:
    """A ``pilot`` event as ``PilotManager._event`` records it through ``ControllerDemand.record``."""
    store._event(t, None, "pilot", {"event": event, "slurm_job": jid, "node": node, "worker": f"pilot-{jid}",
                                    "state": state, "detail": "", **extra})


def _harvested_run(state: Path) -> None:
    """Pilots 100 (n1, running 102-202, then gone: preempted by Slurm), 101 (n2, running 103, cancelled by the
    controller at 250, gone 252) and 102 (n3, never started, cancelled). Job a on pilots 100+101 from 110, stopped
    by the preemption (202, stopped 204; last step 35, checkpoint 30), again on 101 from 210 (resumed from 30) to
    240; job b on 101 (beside a) 120-150."""
    store = Store(state)
    try:
        for jid, node in (("100", "n1"), ("101", "n2"), ("102", "n3")):
            _pilot(store, 100.0, "submit", jid, node, "PENDING")
        _pilot(store, 102.0, "running", "100", "n1", "RUNNING")
        _pilot(store, 103.0, "running", "101", "n2", "RUNNING")
        _pilot(store, 160.0, "cancel", "102", "n3", "PENDING")
        _pilot(store, 161.0, "gone", "102", "n3", "PENDING", cancelled=True)
        spec = "command: [x.py]\nsteps: 60\nmin_procs: 1\nmax_procs: 2\n"
        a = store.add_job(parse_job_spec(f"name: a\n{spec}", "a.yaml"), 105.0)
        b = store.add_job(parse_job_spec("name: b\ncommand: [x.py]\nsteps: 10\n", "b.yaml"), 115.0)
        store._event(110.0, a, "start", {"generation": 1, "procs": 2, "workers": ["pilot-100", "pilot-101"],
                                         "group": a})
        for t, step, ckpt in ((112.0, 0, None), (150.0, 10, "c10"), (180.0, 30, "c30"), (190.0, 35, None)):
            store.add_progress(a, 1, {"time": t, "step": step, "checkpoint": ckpt, "resumed_from": -1})
        store._event(120.0, b, "start", {"generation": 1, "procs": 1, "workers": ["pilot-101"], "group": a})
        store.add_progress(b, 1, {"time": 125.0, "step": 0})
        store.add_progress(b, 1, {"time": 149.0, "step": 10})
        store._event(150.0, b, "completed", {"steps": 10})
        store.update_job(b, state="completed", start_time=120.0, end_time=150.0, steps_done=10)
        store._event(202.0, a, "stop", {"reason": "preempt", "worker_left": "pilot-100"})
        _pilot(store, 202.0, "gone", "100", "n1", "RUNNING", cancelled=False)
        store._event(204.0, a, "stopped", {"reason": "preempt"})
        store._event(210.0, a, "start", {"generation": 2, "procs": 1, "workers": ["pilot-101"], "group": a})
        for t, step in ((212.0, 30), (239.0, 60)):
            store.add_progress(a, 2, {"time": t, "step": step, "resumed_from": 30})
        store._event(240.0, a, "completed", {"steps": 60})
        store.update_job(a, state="completed", start_time=110.0, end_time=240.0, steps_done=60)
        _pilot(store, 250.0, "cancel", "101", "n2", "RUNNING")
        _pilot(store, 252.0, "gone", "101", "n2", "RUNNING", cancelled=True)
    finally:
        store.close()


def test_calc_reports_harvested_node_hours_pool_utilisation_preemptions_and_lost_steps(tmp_path: Path) -> None:
    _harvested_run(tmp_path / "state.db")
    s = json.loads(_cli("calc", str(tmp_path / "state.db"), "--json"))
    held = (202 - 102) + (252 - 103)  # pilot 102 never ran: no node time
    busy = (202 - 110) + (204 - 110) + (240 - 210)  # on 101: a's attempts; b (120-150) overlaps a's first
    assert s["harvested_node_hours"] == pytest.approx(held / 3600)
    assert s["pilot_busy_node_hours"] == pytest.approx(busy / 3600)
    assert s["pilot_utilization"] == pytest.approx(busy / held)
    assert (s["pilots"], s["pilots_preempted"], s["preemptions"]) == (2, 1, 1)
    assert (s["lost_steps"], s["max_lost_steps"]) == (5, 5)  # last step 35, resumed from 30
    assert (s["jobs"], s["unfinished"], s["tool"]) == (2, 0, "controller")
    assert s["avg_jct"] == pytest.approx(((240 - 105) + (150 - 115)) / 2)
    assert "harvested_node_hours" not in s.get("unavailable", {})
    # the same from the folder holding the state, and in the table
    assert json.loads(_cli("calc", str(tmp_path), "--json"))["pilots"] == 2
    table = _cli("calc", str(tmp_path))
    assert "harvested_node_hours" in table and "pilot_utilization" in table and "pilots_preempted" in table


def test_calc_on_a_static_controller_run_says_why_pilot_figures_are_unavailable(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    jid = store.add_job(parse_job_spec("name: a\ncommand: [x.py]\nsteps: 10\n", "a.yaml"), 10.0)
    store._event(11.0, jid, "start", {"generation": 1, "procs": 1, "workers": ["w1"], "group": jid})
    store.add_progress(jid, 1, {"time": 12.0, "step": 10})
    store._event(13.0, jid, "completed", {"steps": 10})
    store.update_job(jid, state="completed", start_time=11.0, end_time=13.0)
    store.close()
    s = json.loads(_cli("calc", str(tmp_path / "state.db"), "--json"))
    assert (s["preemptions"], s["lost_steps"], s["jobs"]) == (0, 0, 1)
    assert "harvested_node_hours" not in s and "pilot_utilization" not in s
    assert s["unavailable"]["harvested_node_hours"].startswith("no pilot ran in this controller run")
    assert "harvested_node_hours: unavailable: no pilot ran" in _cli("calc", str(tmp_path / "state.db"))


class RecordingView(View):
    def __init__(self, demand: int) -> None:
        super().__init__(demand)
        self.recorded: list[dict] = []

    def record(self, detail: dict) -> None:
        self.recorded.append({"time": time.time(), "job_id": None, "kind": "pilot", **detail})


def test_the_manager_records_what_calc_reads(tmp_path: Path) -> None:
    """The manager's events, as recorded, give calc a pilot's node time and tell a preempted pilot (Slurm ended
    it) from one the controller cancelled."""
    slurm, view, clock = FakeSlurm(), RecordingView(demand=2), Clock()
    m = _manager(tmp_path, slurm, view, clock)
    m.step()
    a, b = slurm.jobs
    slurm.start(a)
    slurm.start(b)
    m.step()
    del slurm.jobs[a]  # preempted: Slurm ends it
    view.demand = 0  # (not replaced)
    m.step()
    m.stop(wait_s=1)  # cancels b: gone, cancelled
    kinds = [(e["event"], e["slurm_job"], e["node"]) for e in view.recorded]
    assert kinds == [("submit", a, ""), ("submit", b, ""), ("running", a, "n1"), ("running", b, "n2"),
                     ("gone", a, "n1"), ("cancel", b, "n2"), ("gone", b, "n2")]
    assert [e.get("cancelled") for e in view.recorded if e["event"] == "gone"] == [False, True]
    assert {e["worker"] for e in view.recorded} == {f"pilot-{a}", f"pilot-{b}"}
    got = pilot_metrics(view.recorded, [])
    assert (got["pilots"], got["pilots_preempted"]) == (2, 1) and got["pilot_utilization"] == 0.0
    assert m.known == {f"pilot-{a}": (a, "n1"), f"pilot-{b}": (b, "n2")}


def test_workers_and_jobs_show_pilots_and_why_nodes_are_unused(tmp_path: Path) -> None:
    """A real controller (in-process, gRPC) whose pilot manager runs over the fake Slurm: a job of two slots gets
    two pilots; one pilot's worker registers and runs it. `workers` names it a pilot with its Slurm job and node,
    `workers --nodes` says what every node does or why it is unused, `jobs` says the job runs on a pilot."""
    srv = ControllerServer(read_controller_config(controller_config(tmp_path)))
    addr = srv.start()
    slurm = FakeSlurm()
    m = PilotManager(_manager(tmp_path, slurm, View(0), Clock()).cfg, ControllerDemand(srv.ctl), addr, TOKEN,
                     tmp_path / "run" / "state.db", clock=Clock(), run=slurm.run)
    srv.service.source = m  # as ControllerServer.start does for node_source slurm
    c = client(addr)
    try:
        out = json.loads(_cli("workers", "--controller", addr, "--nodes", "--json"))
        assert out == {"node_source": "slurm", "time": 0.0, "nodes": []}  # not polled yet
        spec = parse_job_spec(f"name: j\nlauncher: direct\nprocs: 2\nsteps: 10\nworkdir: {tmp_path}\n"
                              "command: [x.py]\n", "j.yaml")
        from hpcsched.runtime.jobfile import job_spec_yaml

        jid = c.submit(job_spec_yaml(spec), "j.yaml")
        m.step()
        p1, p2 = slurm.jobs
        slurm.start(p1)
        stub, md = pb_grpc.ControllerStub(c.channel), metadata(TOKEN)
        cred = stub.Register(pb.RegisterRequest(worker_id=f"pilot-{p1}", host="127.0.0.1", slots=2,
                                                launchers=["direct"], instance="i"), metadata=md, timeout=10).credential
        stub.Register(pb.RegisterRequest(worker_id="static1", host="127.0.0.1", slots=1, launchers=["direct"],
                                         instance="i"), metadata=md, timeout=10)
        stub.Heartbeat(pb.HeartbeatRequest(worker_id=f"pilot-{p1}", spare_port=40000, instance="i"),
                       metadata=md + credential_metadata(cred), timeout=10)
        wait_for("the job placed on the pilot", lambda: c.jobs()[0].workers == [f"pilot-{p1}"], 30, poll=0.1)
        m.step()
        rows = {w["worker_id"]: w for w in json.loads(_cli("workers", "--controller", addr, "--json"))}
        assert (rows[f"pilot-{p1}"]["pilot"], rows[f"pilot-{p1}"]["source_job_id"], rows[f"pilot-{p1}"]["source_node"],
                rows[f"pilot-{p1}"]["pilot_state"]) == (True, p1, "n1", "RUNNING")
        # the keys of the first release stay, with the same values (a --json key is a contract)
        assert (rows[f"pilot-{p1}"]["slurm_job_id"], rows[f"pilot-{p1}"]["slurm_node"]) == (p1, "n1")
        assert (rows["static1"]["pilot"], rows["static1"]["source_job_id"], rows["static1"]["slurm_job_id"]) == (
            False, "", "")
        table = _cli("workers", "--controller", addr)
        assert f"{p1}@n1 running" in table and "PILOT" in table  # Slurm job @ node, its state: one line
        nodes = json.loads(_cli("workers", "--controller", addr, "--nodes", "--json"))
        assert nodes["node_source"] == "slurm" and nodes["time"] > 0
        by_node = {n["node"]: n for n in nodes["nodes"]}
        assert by_node["n1"]["source_job_id"] == by_node["n1"]["slurm_job_id"] == p1
        assert by_node["n1"]["use"].startswith(f"pilot {p1} (running, worker")
        # p2 pending: an array element Slurm has not placed yet holds no node; the idle ones say why not used
        assert by_node["n2"]["source_job_id"] == "" and by_node["n2"]["use"].startswith("idle, not needed")
        assert by_node["n3"]["use"].startswith("idle, not needed") and by_node["n3"]["source_job_id"] == ""
        assert "WHY NOT USED" in _cli("workers", "--controller", addr, "--nodes")
        (job,) = json.loads(_cli("jobs", "--controller", addr, "--json"))
        assert job["job_id"] == jid and job["pilot_jobs"] == [p1]
        # the pilot leaves Slurm: its worker is still named a pilot (state GONE)
        del slurm.jobs[p1]
        m.step()
        rows = {w.worker_id: w for w in c.workers()}
        assert rows[f"pilot-{p1}"].pilot and rows[f"pilot-{p1}"].pilot_state == "GONE"
        # and the store holds the manager's events (what calc reads)
        rd = Store(tmp_path / "run" / "state.db", query_only=True)
        try:
            recorded = [(e["event"], e["slurm_job"]) for e in rd.events(kind="pilot")]
        finally:
            rd.close()
        assert ("running", p1) in recorded and ("gone", p1) in recorded
    finally:
        c.close()
        srv.stop()


def test_a_static_controller_says_it_watches_no_nodes(tmp_path: Path) -> None:
    srv = ControllerServer(read_controller_config(controller_config(tmp_path)))
    addr = srv.start()
    try:
        assert json.loads(_cli("workers", "--controller", addr, "--nodes", "--json"))["node_source"] == "static"
        assert "node source static" in _cli("workers", "--controller", addr, "--nodes")
    finally:
        srv.stop()


def test_a_pilot_leaving_at_its_idle_window_end_is_not_counted_preempted() -> None:
    """``time_limit: fit-idle-window``: a pilot that leaves by itself before its window ends did what was planned;
    calc counts it apart (``pilots_window_end``), so ``pilots_preempted`` keeps meaning pilots Slurm took back."""
    def ev(t: float, event: str, jid: str, **extra: object) -> dict:
        return {"time": t, "job_id": None, "kind": "pilot", "event": event, "slurm_job": jid, "node": "n1",
                "worker": f"pilot-{jid}", "state": "RUNNING", "detail": "", **extra}

    events = [ev(0.0, "running", "7"), ev(100.0, "gone", "7", cancelled=False, window_end=True),
              ev(0.0, "running", "8"), ev(50.0, "gone", "8", cancelled=False, window_end=False),
              ev(0.0, "running", "9"), ev(60.0, "gone", "9")]  # a store from before window_end was recorded
    got = pilot_metrics(events, [], end=100.0)
    assert (got["pilots"], got["pilots_preempted"], got["pilots_window_end"]) == (3, 2, 1)


def test_decisions_wait_for_pilots_about_to_register_so_an_elastic_job_starts_once_at_its_size(
        tmp_path: Path) -> None:
    """Two pilots start together; their workers register apart. The controller holds its decisions until the second
    one is in (Controller.arriving, as node_source slurm wires it), so the elastic job (1-2 procs) starts once on
    both, instead of at 1 proc on the first and a relaunch at 2 when the second registers."""
    srv = ControllerServer(read_controller_config(controller_config(tmp_path)))
    addr = srv.start()
    slurm, clock = FakeSlurm(), Clock()
    m = PilotManager(_manager(tmp_path, slurm, View(0), clock).cfg, ControllerDemand(srv.ctl), addr, TOKEN,
                     tmp_path / "run" / "state.db", clock=clock, run=slurm.run)
    srv.ctl.arriving = m.arriving
    c = client(addr)
    try:
        spec = parse_job_spec(f"name: e\nlauncher: direct\nprocs: 2\nmin_procs: 1\nmax_procs: 2\nsteps: 10\n"
                              f"workdir: {tmp_path}\ncommand: [x.py]\n", "e.yaml")
        from hpcsched.runtime.jobfile import job_spec_yaml

        c.submit(job_spec_yaml(spec), "e.yaml")
        m.step()
        p1, p2 = slurm.jobs
        slurm.start(p1)
        slurm.start(p2)
        m.step()
        stub, md = pb_grpc.ControllerStub(c.channel), metadata(TOKEN)

        def register(p: str) -> None:
            cred = stub.Register(pb.RegisterRequest(worker_id=f"pilot-{p}", host="127.0.0.1", slots=1,
                                                    launchers=["direct"], instance="i"), metadata=md,
                                 timeout=10).credential
            stub.Heartbeat(pb.HeartbeatRequest(worker_id=f"pilot-{p}", spare_port=40000, instance="i"),
                           metadata=md + credential_metadata(cred), timeout=10)

        register(p1)
        wait_for("steps held", lambda: srv.ctl.held_steps >= 3, 30, poll=0.1)
        assert c.jobs()[0].state == "pending"  # not started at 1 proc on the first pilot
        register(p2)
        wait_for("the job placed on both pilots", lambda: sorted(c.jobs()[0].workers) == sorted(
            [f"pilot-{p1}", f"pilot-{p2}"]), 30, poll=0.1)
        assert c.jobs()[0].procs == 2
    finally:
        c.close()
        srv.stop()


def test_a_job_stopped_because_the_controller_cancelled_its_pilot_is_no_preemption() -> None:
    """The controller stopping (or releasing an idle or hung pilot) cancels its pilots; a job stopped because such a
    pilot's worker left was not preempted by Slurm, whichever of the worker's Leave (the stop) and the manager's
    cancel record reached the store first."""
    def pilot(t: float, event: str, jid: str, **extra: object) -> dict:
        return {"time": t, "job_id": None, "kind": "pilot", "event": event, "slurm_job": jid, "node": "n1",
                "worker": f"pilot-{jid}", "state": "RUNNING", "detail": "", **extra}

    def stop(t: float, worker: str) -> dict:
        return {"time": t, "job_id": "j1", "kind": "stop", "reason": "preempt", "worker_left": worker}

    events = [pilot(0.0, "running", "7"), pilot(0.0, "running", "8"),
              stop(50.0, "pilot-7"), pilot(50.5, "gone", "7", cancelled=False),  # Slurm took it back
              stop(80.0, "pilot-8"), pilot(80.011, "cancel", "8"), pilot(81.0, "gone", "8", cancelled=True)]
    got = pilot_metrics(events, [], end=100.0)
    assert (got["preemptions"], got["pilots_preempted"]) == (1, 1), got
