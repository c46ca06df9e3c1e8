"""The runtime's pure parts on hand-checkable cases: the scheduling step, config and job files, the store."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from hpcsched.errors import InputError
from hpcsched.runtime import launchers
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.jobfile import parse_job_spec
from hpcsched.runtime.launchers import direct
from hpcsched.runtime.launchers.common import merged_hosts
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.scheduler import ClusterState, JobState, WorkerState, plan
from hpcsched.runtime.store import Store


def _w(*slots: int) -> tuple[WorkerState, ...]:
    return tuple(WorkerState(f"w{i}", s, ("torchrun", "mpirun")) for i, s in enumerate(slots))


def test_fifo_places_in_order_and_consolidates() -> None:
    jobs = (JobState("a", 0, False, 0, 2, 2), JobState("b", 1, False, 0, 1, 1), JobState("c", 2, False, 0, 1, 1))
    p = plan(ClusterState(0, jobs, _w(2, 1)))
    assert p.starts == {"a": [("w0", 2)], "b": [("w1", 1)]}  # a on one node, not split
    assert "c" in p.waiting and not p.stops


def test_large_job_spans_whole_nodes() -> None:
    p = plan(ClusterState(0, (JobState("a", 0, False, 0, 4, 4),), _w(2, 2, 2)))
    assert p.starts == {"a": [("w0", 2), ("w1", 2)]}


def test_higher_priority_pending_job_preempts_running_one() -> None:
    jobs = (JobState("a", 0, False, 0, 2, 2), JobState("b", 5, True, 1, 1, 1))
    p = plan(ClusterState(10, jobs, _w(1, 1), used={"w1": 1}))
    assert p.stops == {"b": "preempt"}
    assert "a" not in p.starts  # its slots are still held until b has checkpointed and stopped


def test_elastic_job_grows_into_free_slots_and_shrinks_for_a_newcomer() -> None:
    grown = plan(ClusterState(0, (JobState("e", 0, False, 0, 1, 4),), _w(2, 2)))
    assert grown.sizes == {"e": 4} and grown.starts == {"e": [("w0", 2), ("w1", 2)]}
    jobs = (JobState("e", 0, True, 4, 1, 4), JobState("r", 1, False, 0, 2, 2))
    shrunk = plan(ClusterState(1, jobs, _w(2, 2), used={"w0": 2, "w1": 2}))
    assert shrunk.sizes == {"e": 2, "r": 2} and shrunk.stops == {"e": "resize"}


def test_job_waits_for_a_worker_with_its_launcher() -> None:
    workers = (WorkerState("w0", 2, ("torchrun",)), WorkerState("w1", 2, ("torchrun", "mpirun")))
    p = plan(ClusterState(0, (JobState("m", 0, False, 0, 2, 2, launcher="mpirun"),), workers))
    assert p.starts == {"m": [("w1", 2)]}


def test_job_spec_errors_name_the_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"job.yaml:3: procs: need min_procs <= procs"):
        parse_job_spec("name: x\ncommand: [a.py]\nprocs: 4\nmax_procs: 2\n", "job.yaml")
    with pytest.raises(InputError, match=r"job.yaml:2: launcher: unknown launcher 'slurm'"):
        parse_job_spec("command: a.py --x 1\nlauncher: slurm\n", "job.yaml")
    with pytest.raises(InputError, match="command: missing"):
        parse_job_spec("procs: 1\n", "job.yaml")
    spec = parse_job_spec("command: a.py --steps 5\nprocs: 2\nmin_procs: 1\nmax_procs: 4\nenv: {A: 1}\n", "j.yaml")
    assert spec.command == ("a.py", "--steps", "5") and spec.elastic and spec.env == {"A": "1"}


def test_controller_config_paths_relative_to_file(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("s3cret\n")
    (tmp_path / "tok").chmod(0o600)  # a token file others can read is refused (test_runtime_roles.py)
    p = tmp_path / "c.yaml"
    p.write_text("listen: 127.0.0.1:0\nstate: run/s.db\ntoken_file: tok\npolicy: fifo\n")
    cfg = read_controller_config(p)
    assert cfg.state == tmp_path / "run/s.db" and cfg.token == "s3cret"
    p.write_text("listen: 127.0.0.1:0\nheartbeat_interval_s: -1\n")
    with pytest.raises(InputError, match=r"c.yaml:2: heartbeat_interval_s: must be > 0"):
        read_controller_config(p)
    p.write_text("listen: nowhere\n")
    with pytest.raises(InputError, match="expected HOST:PORT"):
        read_controller_config(p)
    p.write_text("tls_cert: a.pem\n")
    with pytest.raises(InputError, match="TLS needs both"):
        read_controller_config(p)


def test_store_survives_reopen(tmp_path: Path) -> None:
    """What one controller wrote, the next one reads back (the restart path, without the processes)."""
    s = Store(tmp_path / "s.db")
    jid = s.add_job(parse_job_spec("command: [t.py]\nprocs: 2\nsteps: 10\n", "j.yaml"), 100.0)
    s.update_job(jid, state="running", generation=1, ckpt_step=5)
    s.close()
    s = Store(tmp_path / "s.db")
    (job,) = s.jobs()
    assert (job.id, job.state, job.generation, job.ckpt_step, job.spec.steps) == (jid, "running", 1, 5, 10)
    assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test certificate")
def test_tls_with_token(tmp_path: Path) -> None:
    """With tls_cert/tls_key the controller speaks TLS only: a client trusting the certificate and holding
    the token gets through; a plaintext client does not."""
    from hpcsched.runtime.client import Client, ClientError
    from hpcsched.runtime.server import ControllerServer

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(tmp_path / "c.pem")], check=True, capture_output=True)
    (tmp_path / "c.yaml").write_text("listen: 127.0.0.1:0\nstate: s.db\ntoken: t0k\ntls_cert: c.pem\ntls_key: k.pem\n")
    (tmp_path / "c.yaml").chmod(0o600)  # it holds a token inline
    srv = ControllerServer(read_controller_config(tmp_path / "c.yaml"))
    addr = srv.start()
    try:
        ok = Client(addr, "t0k", tls_ca=tmp_path / "c.pem")
        assert ok.workers() == []
        ok.close()
        plain = Client(addr, "t0k", timeout=3)
        with pytest.raises(ClientError, match="UNAVAILABLE"):
            plain.workers()
        plain.close()
    finally:
        srv.stop()


def _launch(launcher: str, node_rank: int = 0) -> pb.LaunchTask:
    return pb.LaunchTask(task_id="j1.g2.n0", job_id="j1", generation=2, launcher=launcher, command=["train.py", "-x"],
                         env={"HPCSCHED_JOB_ID": "j1", "HPCSCHED_CHECKPOINT_DIR": "/ck/j1", "MINE": "1"},
                         node_rank=node_rank, nnodes=2, nprocs=2, world_size=3, master_addr="10.0.0.1",
                         master_port=29400, hosts=["10.0.0.1:2", "10.0.0.2:1"], rank_offset=0)


def test_launchers_give_each_task_its_environment() -> None:
    argv, env = launchers.build(_launch("torchrun", node_rank=1), "/py", "0,1")
    assert argv[:3] == ["/py", "-m", "torch.distributed.run"]
    assert {"--nnodes=2", "--node-rank=1", "--nproc-per-node=2", "--master-addr=10.0.0.1",
            "--master-port=29400"} <= set(argv)
    assert argv[-2:] == ["train.py", "-x"]
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["WORLD_SIZE"] == "3" and env["MINE"] == "1"
    assert env["HPCSCHED_CHECKPOINT_DIR"] == "/ck/j1" and env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"

    with pytest.raises(ValueError, match="without their worker agents"):  # would need ssh: refused, not tried
        launchers.build(_launch("mpirun"), "/py", "")
    t = _launch("mpirun")
    t.agents.update({"10.0.0.1": "10.0.0.1:4001", "10.0.0.2": "10.0.0.2:4002"})
    argv, env = launchers.build(t, "/py", "")
    assert argv[:2] == ["mpirun", "--allow-run-as-root"] and "10.0.0.1:2,10.0.0.2:1" in argv
    assert "/py -m hpcsched.runtime.rsh_agent" == argv[argv.index("plm_rsh_agent") + 1]  # remote daemons: no ssh
    assert json.loads(env["HPCSCHED_AGENTS"]) == {"10.0.0.1": "10.0.0.1:4001", "10.0.0.2": "10.0.0.2:4002"}
    assert ["-x", "MINE"] == argv[argv.index("MINE") - 1: argv.index("MINE") + 1]
    assert argv[-3:] == ["/py", "train.py", "-x"] and "RANK=$OMPI_COMM_WORLD_RANK" in " ".join(argv)
    assert launchers.build(_launch("mpirun", node_rank=1), "/py", "")[0] is None  # holds its slots only
    # Workers at their own loopback addresses (the loopback Slurm's pilots): Open MPI counts 127.0.0.11 another
    # node unless an interface holds it, so the launching node is named localhost and only 127.0.0.12 is remote.
    t = _launch("mpirun")
    t.hosts[:] = ["127.0.0.11:1", "127.0.0.12:1"]
    t.master_addr = "127.0.0.11"
    t.agents.update({"127.0.0.11": "127.0.0.11:4001", "127.0.0.12": "127.0.0.12:4002"})
    assert "localhost:1,127.0.0.12:1" in launchers.build(t, "/py", "")[0]

    argv, env = launchers.build(_launch("direct", node_rank=1), "/py", "1")
    assert argv[:3] == ["/py", "-P", direct.RANKS_SCRIPT] and argv[-4:] == ["--", "/py", "train.py", "-x"]
    assert {"--nprocs=2", "--rank-offset=0"} <= set(argv) and Path(direct.RANKS_SCRIPT).is_file()
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == \
        ("10.0.0.1", "29400", "3", "2")
    assert env["HPCSCHED_NODE_RANK"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "1" and env["MINE"] == "1"
    assert "direct" in launchers.available()
    assert merged_hosts(["127.0.0.1:1", "127.0.0.1:1", "b:2"]) == "127.0.0.1:2,b:2"


def _ctl(tmp_path: Path, **kw: object):
    from hpcsched.runtime.config import ControllerConfig
    from hpcsched.runtime.controller import Controller

    c = Controller(ControllerConfig(state=tmp_path / "s.db", checkpoint_root=tmp_path / "ck", **kw))
    c.started()
    return c


def _beat(c, wid: str, tasks: list[pb.TaskStatus] = ()) -> pb.HeartbeatReply:
    return c.heartbeat(pb.HeartbeatRequest(worker_id=wid, spare_port=40000, tasks=list(tasks)))


def _status(t: pb.LaunchTask, running: bool = True, code: int = 0, **progress: object) -> pb.TaskStatus:
    ps = [pb.Progress(time=1.0, world_size=t.world_size, **progress)] if progress else []
    return pb.TaskStatus(task_id=t.task_id, job_id=t.job_id, generation=t.generation, running=running,
                         exit_code=code, progress=ps)


def test_controller_reconciles_after_restart_and_fails_over(tmp_path: Path) -> None:
    """The state machine without gRPC: launch via heartbeat, a restart that keeps the running task, a lost
    task that restarts the job at a new generation, and completion when every task exits 0."""
    c = _ctl(tmp_path)
    for w in ("w0", "w1"):
        c.register(pb.RegisterRequest(worker_id=w, host="127.0.0.1", slots=1, launchers=["torchrun"]))
    jid = c.submit("command: [t.py]\nprocs: 2\nsteps: 10\n", "j.yaml")
    for w in ("w0", "w1"):
        _beat(c, w)
    c.tick()
    (t0,), (t1,) = _beat(c, "w0").launch, _beat(c, "w1").launch
    assert (t0.node_rank, t1.node_rank, t0.master_port, t0.world_size) == (0, 1, 40000, 2)
    _beat(c, "w0", [_status(t0, step=4, loss=2.0, checkpoint="/ck/x")])
    _beat(c, "w1", [_status(t1)])
    c.store.close()

    c = _ctl(tmp_path)  # a restarted controller: same database, workers keep their tasks
    r = _beat(c, "w0", [_status(t0)])
    assert not r.reregister and not r.launch and not r.kill  # the running task is still wanted
    (job,) = c.store.jobs()
    assert (job.state, job.generation, job.ckpt_step, job.first_loss) == ("running", 1, 4, 2.0)
    r = _beat(c, "w1", [])  # w1 came back without its task (it restarted): the attempt is lost
    assert c.store.job(jid).state == "stopping"
    assert [k.checkpoint for k in _beat(c, "w0", [_status(t0)]).kill] == [False]
    _beat(c, "w0", [_status(t0, running=False, code=-9)])
    job = c.store.job(jid)
    assert (job.state, job.restarts) == ("pending", 1)
    c.tick()
    (n0,), (n1,) = _beat(c, "w0").launch, _beat(c, "w1").launch
    assert n0.generation == n1.generation == 2
    _beat(c, "w0", [_status(n0, running=False, step=10, loss=0.5, done=True, first=False)])
    assert c.store.job(jid).state == "running"  # node 1 still runs
    r = _beat(c, "w1", [_status(n1, running=False)])
    assert list(r.forget) == [n1.task_id]
    job = c.store.job(jid)
    assert (job.state, job.steps_done, job.first_loss, job.last_loss) == ("completed", 10, 2.0, 0.5)
    c.store.close()


def test_every_registered_policy_drives_the_runtime_step() -> None:
    """The controller takes its order from the simulator's policies: each one places a fitting job set."""
    from hpcsched.model import ResourceProfile
    from hpcsched.policies import REGISTRY

    prof = ResourceProfile(0.01, 0.02, 0.005)
    jobs = (
        JobState("a", 0, True, 1, 1, 1, steps_total=100, steps_done=50, iteration_s=0.035, profile=prof,
                 attained_s=5, executed_s=5, first_start=0),
        JobState("b", 1, False, 0, 2, 2, steps_total=40, iteration_s=0.05, profile=prof),
        JobState("c", 2, False, 0, 1, 1, steps_total=10, iteration_s=0.02, profile=prof),
    )
    for name in REGISTRY.names():
        p = plan(ClusterState(10, jobs, _w(2, 2), used={"w0": 1}), name)
        placed = {j: sum(k for _, k in where) for j, where in p.starts.items()}
        kept = {j: 1 for j in ("a",) if j not in p.stops}
        assert sum(placed.values()) + sum(kept.values()) <= 4, name
        assert placed or kept, f"{name} ran nothing on an idle cluster"


def _groups(*gs: tuple[str, ...]):
    """A fixed policy: these groups, this order (pure: ignores the snapshot)."""
    from hpcsched.allocator import Group

    return lambda snap: [Group(g) for g in gs]


def test_interleaving_group_shares_slots_and_counts_once() -> None:
    """4 slots, four 2-proc jobs, policy groups (a, b): a and b share w0's two slots, c gets w1, d waits.
    Flattened, a and b would take both nodes and c would wait."""
    jobs = tuple(JobState(i, n, False, 0, 2, 2) for n, i in enumerate("abcd"))
    p = plan(ClusterState(0, jobs, _w(2, 2)), _groups(("a", "b"), ("c",), ("d",)))
    assert p.starts == {"a": [("w0", 2)], "b": [("w0", 2)], "c": [("w1", 2)]}
    assert p.groups == {"a": "a+b", "b": "a+b", "c": "c"}
    assert "d" in p.waiting and not p.stops


def test_a_colocated_group_never_passes_four_jobs() -> None:
    """a runs with two co-located mates (x, y); the policy now groups a with three queued jobs. Only one of them
    can join (four on the slots: Muri's largest group); the other two wait for slots of their own."""
    here = tuple(JobState(i, 0, True, 1, 1, 1, group="a", placement=(("w0", 1),)) for i in "axy")
    queued = tuple(JobState(i, 1, False, 0, 1, 1) for i in "bcd")
    p = plan(ClusterState(5, here + queued, _w(1), used={"w0": 1}), _groups(("a", "b", "c", "d"), ("x", "y")))
    assert p.starts == {"b": [("w0", 1)]} and p.groups["b"] == "a" and not p.stops
    assert "c" in p.waiting and "d" in p.waiting


def test_pending_member_joins_its_running_anchor_and_colocated_jobs_stay_together() -> None:
    a = JobState("a", 0, True, 2, 2, 2, group="a", placement=(("w0", 2),))
    jobs = (a, JobState("b", 1, False, 0, 1, 1), JobState("c", 2, False, 0, 2, 2))
    p = plan(ClusterState(5, jobs, _w(2, 2), used={"w0": 2}), _groups(("a", "b"), ("c",)))
    assert p.starts == {"b": [("w0", 1)], "c": [("w1", 2)]} and p.groups["b"] == "a" and not p.stops
    # a and b now share w0 (used counts the group once); FIFO no longer groups them, yet they stay together
    # (moving one would need a stop) and both keep running next to c.
    b = JobState("b", 1, True, 1, 1, 1, group="a", placement=(("w0", 1),))
    c = JobState("c", 2, True, 2, 2, 2, group="c", placement=(("w1", 2),))
    p = plan(ClusterState(6, (a, b, c), _w(2, 2), used={"w0": 2, "w1": 2}), "fifo")
    assert not p.stops and not p.starts


def test_worker_gives_group_mates_the_same_devices(tmp_path: Path) -> None:
    from hpcsched.runtime.worker import Task, Worker
    from hpcsched.runtime.worker_config import WorkerConfig

    w = Worker(WorkerConfig(controller="127.0.0.1:9", name="w", gpus=4, work_dir=tmp_path))
    try:
        w.tasks["a"] = Task(pb.LaunchTask(task_id="a", group="a+b", nprocs=2), None, tmp_path / "p", [1, 2])
        w.tasks["x"] = Task(pb.LaunchTask(task_id="x", group="x", nprocs=1), None, tmp_path / "p", [0])
        assert w._devices(pb.LaunchTask(task_id="b", group="a+b", nprocs=2)) == [1, 2]
        assert w._devices(pb.LaunchTask(task_id="b", group="a+b", nprocs=3)) == [1, 2, 3]
        assert w._devices(pb.LaunchTask(task_id="y", group="y", nprocs=1)) == [3]
    finally:
        w.shutdown()


def test_min_runtime_protects_a_fresh_attempt_from_preemption() -> None:
    """LAS on one slot: b has had less service than the running a, so LAS preempts a, unless a's attempt
    is younger than min_runtime_s."""
    def jobs(started: float) -> tuple[JobState, ...]:
        return (JobState("a", 0, True, 1, 1, 1, attained_s=50, executed_s=50, first_start=0, group="a",
                         placement=(("w0", 1),), attempt_start=started),
                JobState("b", 1, False, 0, 1, 1, attained_s=10))
    assert plan(ClusterState(100, jobs(95), _w(1), used={"w0": 1}), "las").stops == {"a": "preempt"}
    young = plan(ClusterState(100, jobs(95), _w(1), used={"w0": 1}), "las", min_runtime_s=10)
    assert not young.stops and "b" in young.waiting
    old = plan(ClusterState(100, jobs(85), _w(1), used={"w0": 1}), "las", min_runtime_s=10)
    assert old.stops == {"a": "preempt"}


def _churn(min_runtime_s: float, policy: str = "las", ticks: int = 120) -> int:
    """Replays the controller loop on a tiny case (2 equal jobs, 1 slot, a tick per second, stops take effect
    at once): how many times a job is stopped."""
    attained = {"a": 0.0, "b": 0.0}
    running: dict[str, float] = {}  # job -> attempt start
    stops = 0
    for now in range(ticks):
        for j in running:
            attained[j] += 1.0
        jobs = tuple(JobState(j, n, j in running, 1 if j in running else 0, 1, 1, steps_total=1000,
                              steps_done=int(attained[j]), iteration_s=1.0, attained_s=attained[j],
                              executed_s=attained[j], first_start=0 if attained[j] else None, group=j,
                              placement=(("w0", 1),) if j in running else (), attempt_start=running.get(j))
                     for n, j in enumerate(attained))
        p = plan(ClusterState(now, jobs, _w(1), used={"w0": len(running)}), policy, min_runtime_s)
        for j in p.stops:
            running.pop(j)
            stops += 1
        if not running:  # the stopped job's slot is free on the next tick
            for j in p.starts:
                running[j] = now
    return stops


def test_hysteresis_bounds_churn() -> None:
    """LAS swaps two equal jobs whenever their service crosses: without the brake every ~tick, with
    min_runtime_s = 10 at most once per 10 s (120 ticks -> at most 12 stops)."""
    assert _churn(0) > 40
    assert _churn(10) <= 12


def test_milp_sizes_jobs_that_declare_a_scaling_curve() -> None:
    """4 slots, two elastic 1..4 jobs. a (first in FIFO) barely scales: 100, 110, 115, 118 samples/s at 1..4;
    b scales linearly: 100..400. Greedy growth in priority order gives a 3 and b its minimum 1 (215 samples/s);
    the MILP maximises total throughput: a 1 (100) + b 3 (300) = 400, the best split."""
    from hpcsched.model import ScalingCurve

    flat, linear = ScalingCurve((1, 2, 3, 4), (100, 110, 115, 118)), ScalingCurve((1, 2, 3, 4), (100, 200, 300, 400))
    jobs = (JobState("a", 0, False, 0, 1, 4, curve=flat), JobState("b", 1, False, 0, 1, 4, curve=linear))
    p = plan(ClusterState(0, jobs, _w(2, 2)))
    assert p.sizes == {"a": 1, "b": 3}
    assert p.sizing == {"a": "optimal", "b": "optimal"}
    greedy = plan(ClusterState(0, tuple(replace(j, curve=None) for j in jobs), _w(2, 2)))
    assert greedy.sizes == {"a": 3, "b": 1}
    assert greedy.sizing == {}
    # a running a at 3 pays its resize cost: over a short look-ahead shrinking it is not worth it
    running = (replace(jobs[0], running=True, procs=3, resize_s=30, placement=(("w0", 2), ("w1", 1))), jobs[1])
    assert plan(ClusterState(0, running, _w(2, 2), used={"w0": 2, "w1": 1}), tfwd_s=5).sizes == {"a": 3, "b": 1}
    assert plan(ClusterState(0, running, _w(2, 2), used={"w0": 2, "w1": 1}), tfwd_s=600).stops == {"a": "resize"}


def test_job_spec_scaling_curve(tmp_path: Path) -> None:
    spec = parse_job_spec("command: [t.py]\nmin_procs: 1\nmax_procs: 4\n"
                          "scaling: {procs: [1, 2, 4], rates: [10, 19, 30], resize_s: 5}\n", "j.yaml")
    assert (spec.curve_procs, spec.curve_rates, spec.resize_s) == ((1, 2, 4), (10.0, 19.0, 30.0), 5.0)
    with pytest.raises(InputError, match=r"j.yaml:2: .*scaling"):
        parse_job_spec("command: [t.py]\nscaling: {procs: [2, 1], rates: [1, 2]}\n", "j.yaml")
    s = Store(tmp_path / "s.db")
    jid = s.add_job(spec, 0.0)
    assert s.job(jid).spec == spec
    s.close()


def test_declared_profile_feeds_the_policy_until_the_job_measures_its_own(tmp_path: Path) -> None:
    """An interleaving policy needs stage times before a job's first report: the spec may declare them."""
    from hpcsched.runtime.controller_step import job_state

    spec = parse_job_spec("command: [t.py]\nsteps: 10\nprofile: {data_s: 0.03, compute_s: 0.01}\n", "j.yaml")
    assert spec.profile == (0.03, 0.01, 0.0)
    for bad in ("{data_s: -1}", "{data_s: 0}", "{gpu_s: 1}", "{data_s: fast}", "[1, 2]"):
        with pytest.raises(InputError, match=r"j.yaml:2: .*profile"):
            parse_job_spec(f"command: [t.py]\nprofile: {bad}\n", "j.yaml")
    s = Store(tmp_path / "s.db")
    jid = s.add_job(spec, 0.0)
    row = s.job(jid)
    assert row.spec == spec  # survives the store (and so a controller restart)
    st = job_state(row)
    assert (st.profile.data_s, st.profile.compute_s, st.profile.network_s) == (0.03, 0.01, 0.0)
    assert st.iteration_s == pytest.approx(0.04)  # remaining service is known before the first report
    s.update_job(jid, iteration_s=0.05, data_s=0.01, compute_s=0.03, comm_s=0.01)
    st = job_state(s.job(jid))
    assert (st.profile.data_s, st.profile.compute_s, st.iteration_s) == (0.01, 0.03, 0.05)  # measured wins
    s.close()


def test_in_place_resize_the_worker_never_applies_falls_back_to_relaunch(tmp_path: Path) -> None:
    """The controller re-sends a resized task's LaunchTask until the job reports at its new size; if the worker
    cannot resize it (it refused, or its host file vanished), that report never comes: after
    IN_PLACE_TIMEOUT_S the job is stopped with a checkpoint and relaunched, not re-sent forever."""
    import time

    from hpcsched.runtime.lifecycle import IN_PLACE, IN_PLACE_TIMEOUT_S

    c, jid, t = _launched(tmp_path, "launcher: horovodrun\nmin_procs: 1\nmax_procs: 2\n", "horovodrun", slots=2)
    with c.lock, c.store.tx():  # what an in-place resize leaves: still running, waiting for the new size
        c.store.update_job(jid, stop_reason=IN_PLACE, stop_time=time.time() - 1.0)
    reply = _beat(c, "w0", [_status(t)])
    assert [x.task_id for x in reply.launch] == [t.task_id] and not reply.kill  # re-sent while in time
    with c.lock, c.store.tx():
        c.store.update_job(jid, stop_time=time.time() - IN_PLACE_TIMEOUT_S - 1.0)
    reply = _beat(c, "w0", [_status(t)])
    assert [(k.task_id, k.checkpoint) for k in reply.kill] == [(t.task_id, True)] and not reply.launch
    job = c.store.job(jid)
    assert (job.state, job.stop_reason) == ("stopping", "resize")
    c.store.close()


def _launched(tmp_path: Path, spec: str = "", launcher: str = "torchrun", slots: int = 1):
    """A controller with one worker whose only job (10 steps, ``spec`` lines added) has been launched."""
    c = _ctl(tmp_path)
    c.register(pb.RegisterRequest(worker_id="w0", host="127.0.0.1", slots=slots, launchers=[launcher]))
    jid = c.submit(f"command: [t.py]\nsteps: 10\n{spec}", "j.yaml")
    _beat(c, "w0")
    c.tick()
    (t,) = _beat(c, "w0").launch
    return c, jid, t


def _launched_then_stopping(tmp_path: Path, reason: str):
    """The launched job now being stopped for `reason`, as tick() leaves it when the policy preempts or
    resizes it."""
    c, jid, t = _launched(tmp_path)
    with c.lock, c.store.tx():
        c.store.update_job(jid, state="stopping", stop_reason=reason, stop_time=1.0)
    return c, jid, t


def test_job_that_finished_as_it_was_preempted_completes(tmp_path: Path) -> None:
    """Seen in the e2e run: a job reached its last step just as a preempt's SIGTERM landed; torchrun, stopped
    by the signal, exited non-zero, and the job was queued again and rerun from its final checkpoint."""
    c, jid, t = _launched_then_stopping(tmp_path, "preempt")
    _beat(c, "w0", [_status(t, running=False, code=1, step=10, loss=0.5, done=True, checkpoint="/ck/x")])
    assert c.store.job(jid).state == "completed"
    c.store.close()


def test_controller_colocates_a_muri_s_pair_on_one_slot(tmp_path: Path) -> None:
    """muri-s pairs a compute-heavy and an IO-heavy job (stage times as the controller learns them from
    progress reports): both run on w0's single slot, with one co-location key, and the slot counts once."""
    c = _ctl(tmp_path, policy="muri-s", min_runtime_s=0)
    c.register(pb.RegisterRequest(worker_id="w0", host="127.0.0.1", slots=1, launchers=["torchrun"]))
    a = c.submit("command: [t.py]\nsteps: 100\n", "a.yaml")
    b = c.submit("command: [t.py]\nsteps: 100\n", "b.yaml")
    with c.lock, c.store.tx():
        c.store.update_job(a, data_s=0.01, compute_s=0.08, comm_s=0.01, iteration_s=0.1)
        c.store.update_job(b, data_s=0.08, compute_s=0.01, comm_s=0.01, iteration_s=0.1)
    _beat(c, "w0")
    p = c.tick()
    assert p.starts == {a: [("w0", 1)], b: [("w0", 1)]} and p.groups[a] == p.groups[b] == f"{a}+{b}"
    launched = list(_beat(c, "w0").launch)  # one spare port per heartbeat: the second member starts next tick
    c.tick()
    launched += _beat(c, "w0", [_status(t) for t in launched]).launch  # the first one now runs
    assert sorted((t.job_id, t.group) for t in launched) == [(a, f"{a}+{b}"), (b, f"{a}+{b}")]
    used, groups, _ = c._slot_use()
    assert used == {"w0": 1} and groups == {a: f"{a}+{b}", b: f"{a}+{b}"}
    # the key is stored with each job (the group column), not read back out of the tasks' LaunchTasks
    assert (c.store.job(a).group, c.store.job(b).group) == (f"{a}+{b}", f"{a}+{b}")
    assert {j.job_id: (j.group, list(j.interleaved_with)) for j in c.list_jobs()} == {
        a: (f"{a}+{b}", [b]), b: (f"{a}+{b}", [a])}
    c.store.close()
    # A state file from before the column (the shape of the last release): the controller opening it fills the key
    # of the jobs with live tasks from their LaunchTasks, once, and still counts the group's slot once.
    db = sqlite3.connect(tmp_path / "s.db")
    db.execute('ALTER TABLE jobs DROP COLUMN "group"')
    db.commit()
    db.close()
    c = _ctl(tmp_path, policy="muri-s", min_runtime_s=0)
    try:
        assert (c.store.job(a).group, c.store.job(b).group) == (f"{a}+{b}", f"{a}+{b}")
        used, groups, _ = c._slot_use()
        assert used == {"w0": 1} and groups == {a: f"{a}+{b}", b: f"{a}+{b}"}
    finally:
        c.store.close()


def test_step_planned_outside_the_lock_drops_a_plan_the_world_changed_under(tmp_path: Path) -> None:
    """tick() plans without the lock. A job cancelled while its start was being planned is not started (the
    plan is dropped and the step re-runs); when changes keep landing mid-plan, the step falls back to
    planning under the lock, so scheduling is never starved."""
    from hpcsched.runtime import controller_step as ctl_mod

    c = _ctl(tmp_path)
    c.register(pb.RegisterRequest(worker_id="w0", host="127.0.0.1", slots=2, launchers=["torchrun"]))
    a = c.submit("command: [t.py]\nsteps: 10\n", "a.yaml")
    _beat(c, "w0")
    real_plan = c._plan
    interrupted = []

    def plan_with_a_concurrent_change(state):  # what an RPC thread can do while the scheduler plans
        p = real_plan(state)
        if len(interrupted) < ctl_mod._MAX_STALE:  # cancel the job being started, submit another
            for jid in p.starts:
                assert c.cancel(jid)[0]  # takes the lock: it must not be held while planning
            interrupted.append(c.submit("command: [t.py]\nsteps: 10\n", "b.yaml"))
        return p

    c._plan = plan_with_a_concurrent_change
    c.wakeup.clear()
    p = c.tick()
    assert not p.starts and c.wakeup.is_set()  # a's start was planned, a was cancelled meanwhile: dropped
    assert c.store.job(a).state == "cancelled" and not c.store.allocations()
    for _ in range(ctl_mod._MAX_STALE - 1):
        assert not c.tick().starts  # each plan is invalidated by the cancel of the job it starts
    assert c._stale == ctl_mod._MAX_STALE
    p = c.tick()  # under the lock now: nothing can change mid-plan, and the remaining job starts
    assert list(p.starts) == [interrupted[-1]] and c._stale == 0
    assert [t.job_id for t in _beat(c, "w0").launch] == [interrupted[-1]]
    c.store.close()


def test_rpc_timings_quantiles() -> None:
    from hpcsched.runtime.server import RpcTimings

    t = RpcTimings()
    for _ in range(98):
        t.add("Heartbeat", 0.001)
    t.add("Heartbeat", 0.030)
    t.add("Heartbeat", 0.200)
    t.add("Register", 0.002)
    s = t.summary()
    hb = s["Heartbeat"]
    assert hb["calls"] == 100 and s["Register"]["calls"] == 1
    assert 1.0 <= hb["p50_ms"] <= 1.05 and 30.0 <= hb["p99_ms"] <= 31.5 and hb["max_ms"] == pytest.approx(200.0)


def test_wal_is_checkpointed_off_the_commit_path(tmp_path: Path) -> None:
    """Commits no longer run SQLite's automatic checkpoint; the background thread moves the log into the
    database file (read here with ``immutable=1``, which ignores the WAL) while the store keeps writing."""

    import time

    s = Store(tmp_path / "s.db")
    s.start_checkpointer(interval_s=0.05)
    assert s.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    spec = parse_job_spec("command: [t.py]\n", "j.yaml")
    ids = [s.add_job(spec, float(k)) for k in range(50)]

    def in_db_file() -> int:
        db = sqlite3.connect(f"file:{tmp_path / 's.db'}?immutable=1", uri=True)
        try:
            return db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
        except sqlite3.DatabaseError:  # the file may have no tables yet
            return 0
        finally:
            db.close()

    deadline = time.time() + 10
    while in_db_file() < 50 and time.time() < deadline:
        time.sleep(0.05)
    assert in_db_file() == 50
    s.close()
    assert [j.id for j in Store(tmp_path / "s.db").jobs()] == ids


def test_many_starts_are_applied_in_batches_each_checked(tmp_path: Path) -> None:
    """40 starts in one step go in lock holds of ``_START_BATCH``; a job cancelled between two batches is
    not started, the batches before it stand, and the step re-runs for the rest."""
    from hpcsched.runtime import controller_step as ctl_mod

    c = _ctl(tmp_path)
    for i in range(40):
        c.register(pb.RegisterRequest(worker_id=f"w{i:02d}", host="127.0.0.1", slots=1, launchers=["torchrun"]))
        _beat(c, f"w{i:02d}")
    ids = [c.submit("command: [t.py]\nsteps: 10\n", "j.yaml") for _ in range(40)]
    real_apply, batches = c._apply, []

    def apply_then_cancel_a_later_job(plan, state, workers, stops, starts, *endpoints):
        real_apply(plan, state, workers, stops, starts, *endpoints)
        batches.append(list(starts))
        if len(batches) == 1:  # as if an RPC thread cancelled it between two batches (we hold the lock here)
            c.store.update_job(ids[-1], state="cancelled")

    c._apply = apply_then_cancel_a_later_job
    c.wakeup.clear()
    p = c.tick()
    n = ctl_mod._START_BATCH
    assert [len(b) for b in batches] == [n, n]  # the third batch holds the cancelled job: dropped
    assert sorted(p.starts) == ids[:2 * n] and c.wakeup.is_set()
    assert {j.id for j in c.store.jobs(("running",))} == set(ids[:2 * n])
    c._apply = real_apply
    for i in range(40):
        _beat(c, f"w{i:02d}")  # fresh spare ports
    assert sorted(c.tick().starts) == ids[2 * n:-1]  # the rest, in the next step
    assert c.store.job(ids[-1]).state == "cancelled"
    c.store.close()


def test_resize_time_counts_from_the_new_attempt_not_a_late_first_report(tmp_path: Path) -> None:
    """Seen on a fast node with torchrun: an attempt stopped for a resize before its first report (its start-up
    outlived min_runtime_s) reported 'first' while stopping; that was booked as the resize's end (0.6 s) and
    cleared the stop reason. Only the next attempt's first report ends the resize."""
    c, jid, t = _launched_then_stopping(tmp_path, "resize")
    _beat(c, "w0", [_status(t, step=0, first=True)])  # the stopped attempt's late first report
    assert c.store.events(jid, "resized") == [] and c.store.job(jid).stop_reason == "resize"
    _beat(c, "w0", [_status(t, running=False, code=0, step=3, checkpoint="/ck/x")])
    assert (c.store.job(jid).state, c.store.job(jid).stop_reason) == ("pending", "resize")
    _beat(c, "w0", [])
    c.tick()
    (n,) = _beat(c, "w0").launch
    _beat(c, "w0", [_status(n, step=3, first=True, resumed_from=3)])
    (ev,) = c.store.events(jid, "resized")
    job = c.store.job(jid)
    assert ev["seconds"] > 0 and job.last_resize_s == ev["seconds"] and job.stop_reason is None
    c.store.close()


def test_a_sizing_that_is_not_optimal_is_counted_logged_and_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """The MILP's real decision, reported as having hit its time limit: the controller counts the step, logs
    it once (not at every tick) and `hpcsched jobs` gets it in the job's ``sizing``."""
    import dataclasses

    import hpcsched.milp

    real = hpcsched.milp.allocate
    monkeypatch.setattr(hpcsched.milp, "allocate",
                        lambda *a, **k: dataclasses.replace(real(*a, **k), status="time_limit"))
    from hpcsched.runtime import controller_step as controller_mod

    monkeypatch.setattr(controller_mod, "_REPLAN_S", 0.0)  # every step plans (else a step with no news does not)
    c = _ctl(tmp_path)
    c.register(pb.RegisterRequest(worker_id="w0", host="127.0.0.1", slots=4, launchers=["torchrun"]))
    job = "command: [t.py]\nmin_procs: 1\nmax_procs: 4\nscaling: {procs: [1, 2, 4], rates: [10, 19, 30]}\n"
    ids = [c.submit(job, "j.yaml"), c.submit(job, "j.yaml")]
    _beat(c, "w0")
    with caplog.at_level("WARNING", logger="hpcsched.runtime.controller"):
        c.tick()
        c.tick()
    assert c.nonoptimal_decisions == 2
    assert len([r for r in caplog.records if "not optimal" in r.getMessage()]) == 1
    assert {j.job_id: j.sizing for j in c.list_jobs()} == dict.fromkeys(ids, "highs time_limit")
    monkeypatch.setattr(hpcsched.milp, "allocate", real)
    c.tick()
    assert c.nonoptimal_decisions == 2
    c.store.close()


def test_a_wall_clock_step_does_not_lose_healthy_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Liveness runs on the monotonic clock (issue 15): a +30 s step of the wall clock declared both healthy
    workers lost; now only real silence, as the monotonic clock measures it, loses a worker."""
    import time as time_module

    from hpcsched.runtime.config import ControllerConfig
    from hpcsched.runtime.controller import Controller

    mono = [1000.0]
    c = Controller(ControllerConfig(state=tmp_path / "s.db", checkpoint_root=tmp_path / "ck", worker_timeout_s=3),
                   clock=lambda: mono[0])
    c.started()
    for w in ("w0", "w1"):
        c.register(pb.RegisterRequest(worker_id=w, host="127.0.0.1", slots=1, launchers=["torchrun"]))
        _beat(c, w)
    wall = time_module.time
    monkeypatch.setattr(time_module, "time", lambda: wall() + 30.0)  # an NTP or operator step
    c.tick()
    assert sorted(c.last_seen) == ["w0", "w1"]
    assert all(w.alive for w in c.list_workers())
    mono[0] += 10.0  # ten real seconds without a heartbeat
    c.tick()
    assert c.last_seen == {}
    assert not any(w.alive for w in c.list_workers())
    c.store.close()


def test_a_worker_backs_off_a_busy_controller_with_jitter() -> None:
    """liveness.retry_after: half to all of the back-off, doubling; up to 10 s when the controller is busy (calls
    past their deadline), up to two intervals otherwise."""
    import random

    from hpcsched.runtime.liveness import BUSY_BACKOFF_S, retry_after

    rng = random.Random(1)
    backoff, waits = 0.2, []
    for _ in range(12):
        wait, nxt = retry_after(backoff, "DEADLINE_EXCEEDED", 1.0, rng)
        assert backoff / 2 <= wait <= backoff
        waits.append(wait)
        backoff = nxt
    assert backoff == BUSY_BACKOFF_S and len(set(waits)) == len(waits)  # capped, and no two alike
    assert retry_after(8.0, "UNAVAILABLE", 1.0, rng)[1] == 2.0  # not busy: two intervals, as before


def test_only_a_late_heartbeat_keeps_a_worker_registered() -> None:
    """liveness.keeps_registration: a Heartbeat a busy controller did not answer (timed out, cancelled, shed) keeps
    the registration; a failed Register, or a heartbeat refused for another reason, registers again."""
    from hpcsched.runtime.liveness import keeps_registration

    assert all(keeps_registration("Heartbeat", c) for c in ("DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED"))
    assert not any(keeps_registration("Register", c) for c in ("DEADLINE_EXCEEDED", "CANCELLED", "UNAVAILABLE"))
    assert not any(keeps_registration("Heartbeat", c) for c in ("UNAVAILABLE", "UNAUTHENTICATED", "INTERNAL"))
