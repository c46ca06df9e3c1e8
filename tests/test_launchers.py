"""Every registered launcher through one contract (``hpcsched.runtime.launchers``), and the callers deciding on a
launcher's traits, not its name: a launcher added as one module plus a registry line is accepted by the job file,
offered by a worker and handled by the controller by what it declares."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest

from hpcsched.errors import InputError
from hpcsched.runtime import launchers
from hpcsched.runtime.config import ControllerConfig
from hpcsched.runtime.controller import Controller
from hpcsched.runtime.jobfile import parse_job_spec
from hpcsched.runtime.launchers import Launcher
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.task_report import launch_problem

NAMES = launchers.names()
HOSTS = ["10.0.0.1:2", "10.0.0.2:2"]
AGENTS = {"10.0.0.1": "10.0.0.1:7001", "10.0.0.2": "10.0.0.2:7002"}
TRAITS = [f.name for f in dataclasses.fields(Launcher) if f.type == "bool"]


def _task(launcher: str, node_rank: int = 0) -> pb.LaunchTask:
    return pb.LaunchTask(task_id=f"j1.g1.n{node_rank}", job_id="j1", generation=1, launcher=launcher,
                         command=["train.py", "-x"], env={"MINE": "1"}, node_rank=node_rank, nnodes=2, nprocs=2,
                         world_size=4, rank_offset=2 * node_rank, master_addr="10.0.0.1", master_port=29400,
                         hosts=HOSTS, agents=AGENTS)


def test_the_registry_holds_the_four_launchers_and_traits_are_declared() -> None:
    assert NAMES == ("torchrun", "direct", "mpirun", "horovodrun")
    assert set(TRAITS) == {"one_command", "via_agents", "agent_as_ssh", "elastic_in_place", "warm_start"}
    assert [n for n in NAMES if launchers.get(n).one_command] == ["mpirun", "horovodrun"]
    assert [n for n in NAMES if launchers.get(n).elastic_in_place] == ["horovodrun"]
    assert [n for n in NAMES if launchers.get(n).warm_start] == ["direct"]


@pytest.mark.parametrize("name", NAMES)
def test_a_registered_launcher_declares_itself(name: str) -> None:
    lau = launchers.get(name)
    assert isinstance(lau, Launcher) and lau.name == name
    assert all(isinstance(getattr(lau, t), bool) for t in TRAITS)
    assert isinstance(lau.available(), bool) and (name in launchers.available()) == lau.available()
    # the traits' implications the callers rely on: the worker puts the ssh shim in place only for a task that has
    # agents; an in-place resize is driven by node 0's one command (the other nodes only hold slots)
    assert not lau.agent_as_ssh or lau.via_agents
    assert not lau.elastic_in_place or lau.one_command


@pytest.mark.parametrize("name", NAMES)
def test_node_0_runs_the_job_with_the_rendezvous_in_its_environment(name: str) -> None:
    argv, env = launchers.build(_task(name), "/py", "0,1")
    assert argv and all(isinstance(a, str) for a in argv)
    assert argv[-2:] == ["train.py", "-x"] and "/py" in argv  # the job's .py, run by the tasks' Python, last
    assert env["MINE"] == "1" and env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "29400"
    assert env["WORLD_SIZE"] == "4" and env["HPCSCHED_NODE_RANK"] == "0" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert json.loads(env["HPCSCHED_AGENTS"]) == AGENTS  # where the rsh agent finds each host's worker


@pytest.mark.parametrize("name", NAMES)
def test_the_other_nodes_run_their_ranks_or_hold_slots_as_declared(name: str) -> None:
    argv, env = launchers.build(_task(name, node_rank=1), "/py", "2,3")
    assert (argv is None) == launchers.get(name).one_command
    assert env["HPCSCHED_NODE_RANK"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_the_job_file_takes_every_registered_launcher_and_names_them_when_refusing() -> None:
    for name in NAMES:
        assert parse_job_spec(f"name: a\ncommand: [x]\nlauncher: {name}\n", "j.yaml").launcher == name
    with pytest.raises(InputError) as e:
        parse_job_spec("name: a\ncommand: [x]\nlauncher: srun\n", "j.yaml")
    assert e.value.line == 3 and all(n in str(e.value) for n in NAMES)
    with pytest.raises(ValueError, match="unknown launcher 'srun'; expected one of torchrun, direct"):
        launchers.get("srun")
    assert "launcher 'srun' is not one this worker knows" in launch_problem(_task("srun"))


def test_a_registry_line_naming_another_launchers_module_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(launchers.REGISTRY, "torchrun2", "hpcsched.runtime.launchers.direct:LAUNCHER")
    with pytest.raises(ValueError, match="defines 'direct'"):
        launchers.get("torchrun2")


PLUGIN = '''
from hpcsched.runtime.launchers.base import Launcher
from hpcsched.runtime.launchers.common import program, rank_env


def build(t, python, devices):
    env = rank_env(t, devices)
    return (program(list(t.command), python) if t.node_rank == 0 else None), env


LAUNCHER = Launcher("{name}", build, lambda: True, one_command={one_command})
'''


def _plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, one_command: bool) -> None:
    """A launcher added the documented way: one module defining LAUNCHER, one registry line."""
    module = f"hpcsched_test_launcher_{name}_{one_command}".lower()  # one module per variant: imports are cached
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(PLUGIN.format(name=name, one_command=one_command)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(launchers.REGISTRY, name, f"{module}:LAUNCHER")


@pytest.mark.parametrize("one_command", [True, False])
def test_a_plugin_launcher_is_handled_by_its_traits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    one_command: bool) -> None:
    """A launcher added as a module: the job file accepts it, a worker here offers it, and the controller ends a
    two-node attempt when node 0's task exits exactly when the launcher declares ``one_command`` (the other node
    only held slots); otherwise node 1's task is still expected to run."""
    _plugin(tmp_path, monkeypatch, "solo", one_command)
    assert "solo" in launchers.available()
    assert launchers.build(_task("solo"), "/py", "")[0] == ["/py", "train.py", "-x"]
    c = Controller(ControllerConfig(state=tmp_path / "s.db", checkpoint_root=tmp_path / "ck"))
    c.started()
    for w in ("w0", "w1"):
        c.register(pb.RegisterRequest(worker_id=w, host="127.0.0.1", slots=1, launchers=["solo"]))
    jid = c.submit("name: two\ncommand: [t.py]\nlauncher: solo\nprocs: 2\n", "j.yaml")
    for w in ("w0", "w1"):
        c.heartbeat(pb.HeartbeatRequest(worker_id=w, spare_port=40000))
    c.tick()
    launched = {w: c.heartbeat(pb.HeartbeatRequest(worker_id=w, spare_port=40000)).launch for w in ("w0", "w1")}
    tasks = {t.node_rank: (w, t) for w, ts in launched.items() for t in ts}
    assert sorted(tasks) == [0, 1]
    (w0, t0), (w1, t1) = tasks[0], tasks[1]
    c.heartbeat(pb.HeartbeatRequest(worker_id=w1, tasks=[pb.TaskStatus(
        task_id=t1.task_id, job_id=jid, generation=t1.generation, running=True)]))
    c.heartbeat(pb.HeartbeatRequest(worker_id=w0, tasks=[pb.TaskStatus(
        task_id=t0.task_id, job_id=jid, generation=t0.generation, running=False, exit_code=0)]))
    live = [a.task_id for a in c.store.allocations(job_id=jid)]
    assert live == ([] if one_command else [t1.task_id])
    assert c.store.job(jid).state == ("completed" if one_command else "running")
