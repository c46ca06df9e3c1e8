"""The ``pbs`` node source (hpcsched.pbs) against the fake PBS Pro of tests/fake_pbs.py: PBS's JSON read as PBS
prints it, free nodes claimed for the queue's demand with one ``qsub`` each, nodes given back (``qdel``) when other
users' batch jobs wait for them, and a live controller with ``node_source: pbs`` that harvests the fake cluster's
free nodes, runs a job on its pilots' real workers and gives a node back to a batch job."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fake_pbs import FakePbs, edit, install, kill_all, load, save
from fake_slurm import View
from runtime_procs import client, controller_config, start_controller, stop, wait_for

from hpcsched.errors import InputError
from hpcsched.pbs.commands import PbsError
from hpcsched.pbs.config import PbsConfig, read_pbs_config
from hpcsched.pbs.pilots import PbsPilots
from hpcsched.pbs.read import parse_jobs, parse_nodes
from hpcsched.runtime.config import read_controller_config

# What PBS Pro 2022 printed for two nodes of a reserved machine (trimmed): one free in a reservation, one running
# a job, and a node that is down; and qstat's job record.
NODES = """{"timestamp":1699630815, "pbs_version":"2022.1.1.20220926110806", "pbs_server":"pbs-01",
 "nodes":{
  "x3006c0s13b1n0":{"Mom":"x3006c0s13b1n0.hsn","ntype":"PBS","state":"free","pcpus":64,
    "resv":"M1150389.pbs-01","resources_available":{"host":"x3006c0s13b1n0","ncpus":64,"ngpus":4},
    "resources_assigned":{},"sharing":"force_exclhost"},
  "x3008c0s37b1n0":{"Mom":"x3008c0s37b1n0.hsn","ntype":"PBS","state":"job-exclusive","pcpus":64,
    "jobs":["1147579.pbs-01"],"resources_available":{"host":"x3008c0s37b1n0","ncpus":64,"ngpus":4}},
  "x3009c0s1b0n0":{"Mom":"x3009c0s1b0n0.hsn","ntype":"PBS","state":"down,offline","pcpus":64},
  "x3009c0s1b1n0":{"Mom":"x3009c0s1b1n0.hsn","ntype":"PBS","state":"free","pcpus":64,
    "resources_available":{"host":"x3009c0s1b1n0","ncpus":64}}}}"""
JOBS = """{"timestamp":1682496699, "pbs_version":"2021.1.3", "pbs_server":"hn1",
 "Jobs":{"3472664.pbshpc":{"Job_Name":"STDIN","Job_Owner":"u1@login01","job_state":"R","queue":"standard",
   "exec_host":"khas024/4*2+khas025/0*2","exec_vnode":"(khas024:ncpus=2)+(khas025:ncpus=2)",
   "Resource_List":{"ncpus":4,"nodect":2,"place":"free","select":"2:ncpus=2","walltime":"01:00:00"}},
  "3472665.pbshpc":{"Job_Name":"big","Job_Owner":"u2@login01","job_state":"Q","queue":"standard",
   "Resource_List":{"ncpus":64,"nodect":8,"select":"8:ncpus=8"}}}}"""


def test_pbs_json_is_read_as_pbs_prints_it() -> None:
    free, why = parse_nodes(NODES)
    assert free == ("x3009c0s1b1n0",)
    assert why == {"x3006c0s13b1n0": "free, but in a reservation", "x3008c0s37b1n0": "job-exclusive",
                   "x3009c0s1b0n0": "down,offline"}
    run, queued = parse_jobs(JOBS)
    assert (run.state, run.nodes, run.nodect) == ("RUNNING", ("khas024", "khas025"), 2)
    assert (queued.state, queued.nodes, queued.nodect) == ("PENDING", (), 8)
    assert parse_jobs('{"timestamp":1, "pbs_version":"2022.1", "pbs_server":"s"}') == []  # no jobs: no "Jobs" key
    with pytest.raises(PbsError, match="qstat -f -F json: not JSON"):
        parse_jobs("qstat: cannot connect to server pbs-01 (errno=111)")


def test_the_pbs_section_is_checked_with_the_file_and_line(tmp_path: Path) -> None:
    cfg = read_pbs_config({"queue": "preemptable", "max_pilots": 8, "walltime_s": 1800}, "c.yaml", 7, tmp_path)
    assert (cfg.queue, cfg.max_pilots, cfg.walltime_s) == ("preemptable", 8, 1800)
    for bad, says in (({"partition": "x"}, "unknown key 'partition'"), ({"max_pilots": 0}, "max_pilots: must be > 0"),
                      ({"walltime_s": 60, "leave_before_s": 60}, "below walltime_s"),
                      ({"poll_s": "fast"}, "poll_s: expected float")):
        with pytest.raises(InputError, match=says) as e:
            read_pbs_config(bad, "c.yaml", 7, tmp_path)
        assert e.value.line == 7
    (tmp_path / "c.yaml").write_text("state: s.db\nnode_source: pbs\npbs:\n  max_pilots: 2\n")
    c = read_controller_config(tmp_path / "c.yaml")
    assert c.source_name() == "pbs" and isinstance(c.pilots, PbsConfig) and c.pilots.max_pilots == 2
    (tmp_path / "c.yaml").write_text("state: s.db\nnode_source: slurm\npbs:\n  max_pilots: 2\n")
    with pytest.raises(InputError, match="a pbs: section needs node_source: pbs") as e:
        read_controller_config(tmp_path / "c.yaml")
    assert e.value.line == 3


def _source(tmp_path: Path, fake: FakePbs, demand: int, **cfg: object) -> tuple[PbsPilots, View]:
    view = View(demand)
    cfg = {"work_dir": tmp_path / "pilots", "max_pilots": 3, "slots": 2, "poll_s": 0.2} | cfg
    return PbsPilots(PbsConfig(**cfg), view, "127.0.0.1:1", "tok", tmp_path / "s.db", run=fake.run), view


def test_free_nodes_are_claimed_for_the_queue_and_given_back_to_batch_jobs(tmp_path: Path) -> None:
    fake = FakePbs(nodes=4, ncpus=2, run_scripts=False)
    src, view = _source(tmp_path, fake, demand=5)
    src.step()  # 5 slots wanted, 2 per pilot: 3 pilots, one qsub each, each pinned to a free node
    qsubs = [c for c in fake.calls if c[0] == "qsub"]
    assert len(qsubs) == 3 and all(c[c.index("-N") + 1] == src.job_name for c in qsubs)
    assert sorted(c[c.index("-l") + 1] for c in qsubs) == [f"select=1:host=n{i}:ncpus=2" for i in (1, 2, 3)]
    assert '--name "pilot-$PBS_JOBID"' in src.script.read_text() and "--token-file" in src.script.read_text()
    for p in src.pilots.values():
        view.w[p.worker] = (True, 2, 2)  # their workers registered and busy
    n0 = len(fake.calls)
    src.step()  # steady: one pbsnodes and one qstat, nothing else
    assert [c[0] for c in fake.calls[n0:]] == ["pbsnodes", "qstat"]
    assert {p.state for p in src.pilots.values()} == {"RUNNING"}
    assert src.view().nodes["n4"] == ("free", "") and src.view().workers.keys() == {p.worker for p in
                                                                                   src.pilots.values()}
    batch = fake.add_batch("sim", nodect=3)  # 3 nodes wanted, 1 free: two pilots give their node back
    (idle,) = [p.worker for p in src.pilots.values()][:1]
    view.w[idle] = (True, 2, 0)  # idle: given back first
    src.step()
    (qdel,) = [c for c in fake.calls if c[0] == "qdel"]
    assert len(qdel) == 3 and f"{idle.removeprefix('pilot-')}" in qdel
    assert fake.jobs[batch]["state"] == "R" and "n4" in fake.jobs[batch]["nodes"]
    src.step()  # the deleted pilots left qstat: gone, and no pilot is asked for a node the batch job holds
    assert len(src.pilots) == 1 and not [c for c in fake.calls[n0:] if c[0] == "qsub"]
    fake.finish(batch)
    src.stop()  # every pilot deleted, once
    assert fake.calls[-1][0] == "qdel" and not fake.jobs


def test_a_pilot_that_never_serves_is_deleted(tmp_path: Path) -> None:
    fake = FakePbs(nodes=2, ncpus=1, run_scripts=False)
    now = [0.0]
    src, view = _source(tmp_path, fake, demand=1, slots=1, register_timeout_s=5.0)
    src.clock = lambda: now[0]
    src.step()
    (jid,) = src.pilots
    now[0] = 1.0  # seen running: its worker is on its way, no second pilot for the same demand
    src.step()
    assert len(src.pilots) == 1 and src.arriving(set()) == [f"pilot-{jid}"]
    now[0] = 7.0  # running for register_timeout_s, its worker never registered
    src.step()
    assert ["qdel", jid] in fake.calls
    assert src.arriving(set()) == []


@pytest.mark.slow
def test_a_controller_harvests_pbs_nodes_runs_a_job_and_gives_a_node_back(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole path on the fake PBS's programs: the controller's source claims two free nodes for a 2-process job,
    the pilots' real workers register and run it; a batch job that needs the node the job does not use plus one more
    gets one pilot deleted (its worker checkpoints the job's task and leaves: the job goes back to pending) and
    starts on the two nodes."""
    state = tmp_path / "pbs.json"
    save(FakePbs(nodes=3, ncpus=1), state)
    install(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    poll_s = 0.3
    pbs = {"poll_s": poll_s, "max_pilots": 2, "slots": 1, "stop_grace_s": 2, "settle_s": 5, "idle_release_s": 600,
           "work_dir": "pilots", "orphan_timeout_s": 60}
    ctl, address = start_controller(tmp_path, controller_config(tmp_path, worker_timeout_s=10, node_source="pbs",
                                                                pbs=json.dumps(pbs)))
    try:
        c = client(address)
        quick = c.submit("name: quick\nlauncher: direct\nprocs: 2\ncommand: [sh, -c, 'sleep 1']\n", "quick.yaml")
        # a worker's start (a Python importing grpc) takes seconds on a loaded machine: generous, from the polls
        budget = 120 + 100 * poll_s
        done = wait_for("the job to complete on two pilots' workers", lambda: [
            j for j in c.jobs() if j.job_id == quick and j.state == "completed"], budget)
        assert done
        ws = {w.worker_id: w for w in c.workers() if w.worker_id.startswith("pilot-") and w.alive}
        pilots = set(ws)
        assert len(pilots) == 2 and all(w.pilot and w.pilot_state == "RUNNING" and w.source_node in ("n1", "n2", "n3")
                                        and w.worker_id == f"pilot-{w.source_job_id}" for w in ws.values())
        nodes = c.nodes()  # `hpcsched workers --nodes`: the PBS nodes as the source saw them at its last poll
        assert nodes.node_source == "pbs" and sorted(n.node for n in nodes.nodes) == ["n1", "n2", "n3"]
        assert sorted(n.source_job_id for n in nodes.nodes if n.source_job_id) == sorted(
            w.source_job_id for w in ws.values())
        long = c.submit("name: long\nlauncher: direct\nprocs: 2\ncommand: [sh, -c, 'sleep 600']\n", "long.yaml")
        wait_for("the long job to run", lambda: [j for j in c.jobs() if j.job_id == long and j.state == "running"],
                 budget)
        batch = edit(state, lambda f: f.add_batch("sim", nodect=2))  # one node free: one pilot must go
        wait_for("the batch job to start", lambda: load(state).jobs[batch]["state"] == "R", budget)
        j = wait_for("the long job back in the queue", lambda: [
            j for j in c.jobs() if j.job_id == long and j.state == "pending"], budget)[0]
        assert j.restarts == 0, j.message  # preempted by the leaving worker, not failed
        left = {w.worker_id for w in c.workers() if w.worker_id.startswith("pilot-") and w.alive}
        assert len(left) == 1 and left < pilots
        log = (tmp_path / "controller.log").read_text()
        assert "its node is given back: batch job(s)" in log and f"{batch}" in log
    finally:
        stop(ctl)
        kill_all(load(state))
