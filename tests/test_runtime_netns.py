"""The runtime across hosts that are not localhost: a controller and three workers, each in its own network
namespace with its own address and host name (``tests/netns_hosts.py``), real processes, real gRPC.

Jobs that span the three workers must find each other at the namespace addresses the controller hands out:
a ``direct`` job (torch-free TCP sums), a ``torchrun`` job (Gloo), an ``mpirun`` job whose remote daemons
are started by the hpcsched rsh agent through the workers (no ssh). Each job's ranks record the host name
and address they ran at, so a rank that fell back to loopback or to one host fails the test.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from netns_hosts import NetnsHosts, NsClient, why_not
from runtime_procs import ROOT, TOKEN, controller_config, wait_for

WHY_NOT = why_not()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=f"no namespace hosts: {WHY_NOT}")]
HOSTS = ("h1", "h2", "h3")


@dataclass
class Cluster:
    hosts: NetnsHosts
    client: NsClient
    address: str
    dir: Path
    env: dict[str, str] = field(default_factory=dict)  # the workers' environment (token, the fake ssh first)
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start_worker(self, h: str) -> None:
        """A worker daemon on host ``h`` (no --name, no --host: the host name and the route to the controller say)."""
        self.workers[h] = self.hosts.popen(h, [sys.executable, "-m", "hpcsched.runtime", "worker", "--controller",
                                               self.address, "--slots", "1", "--gpus", "0", "--work-dir",
                                               str(self.dir / "run" / h)], self.dir / f"{h}.log", cwd=self.dir,
                                           env=self.env)

    def alive(self) -> set[str]:
        return {w["worker_id"] for w in self.client.workers() if w["alive"]}

    def job(self, name: str, launcher: str, procs: int, command: str, steps: int, extra: str = "") -> str:
        p = self.dir / f"{name}.yaml"
        p.write_text(f"name: {name}\nlauncher: {launcher}\nprocs: {procs}\nsteps: {steps}\nworkdir: {ROOT}\n"
                     f"command: [{command}]\n{extra}")
        return self.client.submit(p)

    def finished(self, jid: str, timeout: float) -> dict:
        return wait_for(f"job {jid} to end", lambda: (j := self.client.jobs()[jid])["state"] in (
            "completed", "failed", "cancelled") and j, timeout, poll=0.5)

    def result(self, jid: str) -> dict:
        return json.loads((self.dir / "run" / "ckpt" / jid / "result.json").read_text())

    def ran_on(self, jid: str) -> set[str]:
        """The hosts whose worker ran (or held slots for) a task of the job: their work dirs have its task dir."""
        return {h for h in HOSTS if any((self.dir / "run" / h).glob(f"{jid}.g*"))}

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.dir.glob("*.log")))


@contextlib.contextmanager
def start_cluster(d: Path, resolvable: bool = True) -> Iterator[Cluster]:
    """A controller on the hub and a worker on each of h1..h3 (see the module docstring)."""
    with NetnsHosts(len(HOSTS), resolvable=resolvable) as hosts:
        cfg = controller_config(d, listen=f"{hosts.hub_addr}:0", min_runtime_s=2)  # an elastic job resizes soon
        (d / "token").chmod(0o600)
        ctl = hosts.popen("hub", [sys.executable, "-m", "hpcsched.runtime", "controller", "--config", str(cfg)],
                          d / "controller.log", cwd=d)
        addr_file = d / "run" / "controller.addr"

        def listening() -> bool:
            if ctl.poll() is not None:
                raise RuntimeError(f"the controller exited {ctl.returncode}: {(d / 'controller.log').read_text()}")
            return addr_file.exists()

        wait_for("the controller's address", listening, 60, poll=0.1)
        address = addr_file.read_text().strip()
        # ssh and rsh on the workers' PATH only record that they were called: nothing may use them
        fake = d / "fakebin"
        fake.mkdir()
        for tool in ("ssh", "rsh"):
            (fake / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {d}/ssh-called\nexit 255\n')
            (fake / tool).chmod(0o755)
        env = os.environ | {"HPCSCHED_TOKEN": TOKEN, "PATH": f"{fake}:{os.environ['PATH']}"}
        c = NsClient(hosts, "hub", address, TOKEN, d / "client.log")
        cl = Cluster(hosts, c, address, d, env)
        for h in HOSTS:
            cl.start_worker(h)
        try:
            wait_for("3 workers", lambda: sum(w["alive"] for w in c.workers()) == 3, 60)
            yield cl
        except BaseException:
            print(cl.logs())
            raise


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(tmp_path_factory.mktemp("netns")) as cl:
        yield cl


def test_workers_register_with_their_own_names_and_addresses(cluster: Cluster) -> None:
    got = {w["worker_id"]: w["host"] for w in cluster.client.workers()}
    assert got == {h: cluster.hosts.addr[h] for h in HOSTS}


def _assert_spread(cluster: Cluster, result: dict, world: int) -> None:
    hosts = result["hosts"]
    assert len(hosts) == world
    assert sorted(h["hostname"] for h in hosts) == sorted(HOSTS), hosts
    assert {h["addr"] for h in hosts} == {cluster.hosts.addr[h] for h in HOSTS}, hosts


def test_direct_job_spans_three_hosts(cluster: Cluster) -> None:
    """A torch-free ``direct`` job on the three hosts: ranks meet at the controller-given MASTER_ADDR (node 0's
    namespace address) and each rank's connection comes from its own host's address."""
    jid = cluster.job("direct3", "direct", 3, "tests/netns_job.py, --comm, tcp", steps=60)
    j = cluster.finished(jid, 120)
    assert j["state"] == "completed", (j["message"], cluster.logs())
    assert int(j["steps_done"]) == 60
    result = cluster.result(jid)
    assert result["steps"] == 60 and result["world_size"] == 3
    _assert_spread(cluster, result, 3)
    assert cluster.ran_on(jid) == set(HOSTS)


torch_missing = importlib.util.find_spec("torch") is None


@pytest.mark.skipif(torch_missing, reason="torch is not installed in this venv (pip install -e '.[torch]')")
def test_torchrun_job_spans_three_hosts(cluster: Cluster) -> None:
    """``torchrun`` with Gloo across the three hosts: the rendezvous is node 0's namespace address, and Gloo is
    pointed at the interface that carries it (it would fall back to loopback: the host names do not resolve)."""
    jid = cluster.job("ddp3", "torchrun", 3, "workloads/ddp_train.py, --model, cnn, --batch, '48', "
                      "--checkpoint-every, '10'", steps=30)
    j = cluster.finished(jid, 240)
    assert j["state"] == "completed", (j["message"], cluster.logs())
    result = cluster.result(jid)
    assert result["steps"] == 30 and result["world_size"] == 3
    assert result["final_loss"] < result["first_loss"]
    assert cluster.ran_on(jid) == set(HOSTS)


@pytest.mark.skipif(torch_missing, reason="torch is not installed in this venv (pip install -e '.[torch]')")
def test_torchrun_job_when_host_names_do_not_resolve(tmp_path: Path) -> None:
    """Host names that resolve nowhere: Gloo then falls back to loopback unless told the interface (the launcher
    sets GLOO_SOCKET_IFNAME to the one carrying the node's placed address); the job still spans the hosts."""
    with start_cluster(tmp_path, resolvable=False) as cluster:
        jid = cluster.job("ddp3", "torchrun", 3, "workloads/ddp_train.py, --model, cnn, --batch, '48'", steps=10)
        j = cluster.finished(jid, 240)
        assert j["state"] == "completed", (j["message"], cluster.logs())
        assert cluster.ran_on(jid) == set(HOSTS)


mpi_missing = shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None


@pytest.mark.mpi
@pytest.mark.skipif(mpi_missing, reason="needs Open MPI (apt-get install openmpi-bin libopenmpi-dev) and mpi4py")
def test_mpirun_job_spans_three_hosts_without_ssh(cluster: Cluster) -> None:
    """``mpirun`` on h1 starts Open MPI's daemons on h2 and h3 through hpcsched's rsh agent (each host's worker
    runs it: there is no ssh here at all), and the three ranks sum over MPI at their namespace addresses."""
    jid = cluster.job("mpi3", "mpirun", 3, "tests/netns_job.py, --comm, mpi", steps=60)
    j = cluster.finished(jid, 120)
    assert j["state"] == "completed", (j["message"], cluster.logs())
    result = cluster.result(jid)
    assert result["steps"] == 60 and result["world_size"] == 3
    _assert_spread(cluster, result, 3)
    assert cluster.ran_on(jid) == set(HOSTS)
    # the daemons on the two other hosts were started by their workers' agent service
    started = [h for h in HOSTS if "for a remote launcher" in (cluster.dir / f"{h}.log").read_text()]
    assert len(started) == 2, started
    assert not (cluster.dir / "ssh-called").exists(), (cluster.dir / "ssh-called").read_text()


def test_mpirun_job_across_hosts_stops_with_a_checkpoint_and_leaves_nothing(cluster: Cluster) -> None:
    """Cancel a running 3-host mpirun job: SIGTERM reaches every rank through mpirun and the daemons the agents
    started, the ranks agree to stop and rank 0 checkpoints; no daemon or rank is left on any host."""
    if mpi_missing:
        pytest.skip("needs Open MPI and mpi4py")
    jid = cluster.job("mpi-long", "mpirun", 3, "tests/netns_job.py, --comm, mpi, --checkpoint-every, '10'",
                      steps=100000)
    wait_for("a checkpoint", lambda: int(cluster.client.jobs()[jid]["last_checkpoint_step"]) >= 10, 120, poll=0.5)
    assert cluster.client.cancel(jid)["cancelled"]
    j = cluster.finished(jid, 60)
    assert j["state"] == "cancelled", j["message"]
    saved = json.loads((cluster.dir / "run" / "ckpt" / jid / "ckpt.json").read_text())["step"]
    assert saved > int(j["last_checkpoint_step"]) - 1  # the stop's own checkpoint, at the step it stopped

    def leftovers() -> list[str]:
        out = []
        for h in HOSTS:
            pids = subprocess.run(["ip", "netns", "pids", cluster.hosts.namespace(h)], capture_output=True, text=True)
            for pid in pids.stdout.split():
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if "orted" in cmd or "netns_job.py" in cmd:
                    out.append(f"{h}: {cmd[:100]}")
        return out

    wait_for("no daemon or rank left on any host", lambda: not leftovers(), 30)


horovod_missing = importlib.util.find_spec("horovod") is None or torch_missing


@pytest.mark.horovod
@pytest.mark.skipif(horovod_missing, reason="needs Horovod with PyTorch (make horovod)")
def test_horovodrun_job_spans_three_hosts_without_ssh(cluster: Cluster) -> None:
    """``horovodrun`` (Gloo) on h1 runs ``ssh`` for its host check and its remote ranks: the worker's PATH shim
    makes that the rsh agent, so h2's and h3's workers start them; the fake ssh is never called."""
    jid = cluster.job("hvd3", "horovodrun", 3, "workloads/horovod_train.py, --model, cnn, --batch, '48', "
                      "--checkpoint-every, '10'", steps=20)
    j = cluster.finished(jid, 300)
    assert j["state"] == "completed", (j["message"], cluster.logs())
    result = cluster.result(jid)
    assert result["steps"] == 20 and result["world_size"] == 3
    assert cluster.ran_on(jid) == set(HOSTS)
    started = [h for h in ("h2", "h3") if f"job {jid} attempt 1: started" in (cluster.dir / f"{h}.log").read_text()]
    assert started == ["h2", "h3"]
    assert not (cluster.dir / "ssh-called").exists()


def _processes(cluster: Cluster, host: str, needle: str) -> list[str]:
    """Command lines of the processes in ``host``'s namespace that contain ``needle``."""
    out = []
    pids = subprocess.run(["ip", "netns", "pids", cluster.hosts.namespace(host)], capture_output=True, text=True)
    for pid in pids.stdout.split():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmd:
            out.append(cmd[:100])
    return out


def _reports(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


GLOO_TIMEOUT_S = 30  # the elastic job's HOROVOD_GLOO_TIMEOUT_SECONDS: Horovod's default, which the runtime keeps


def _kill_host(cluster: Cluster, host: str) -> None:
    """``host`` dies as a node does: SIGKILL to every process in its namespace at once (the worker daemon, the
    ranks and their launchers), nothing drained, nothing told to the controller."""
    pids = subprocess.run(["ip", "netns", "pids", cluster.hosts.namespace(host)], capture_output=True, text=True)
    for pid in pids.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    proc = cluster.workers.pop(host)
    proc.wait(timeout=10)


@dataclass
class ElasticRun:
    """What ``elastic_across_hosts`` saw: the job as listed at its end, its events by kind, its tasks (store rows),
    the host of its first node, the host whose worker left (drained) and the unix times of the kill of h3 and of
    the first progress report after it."""

    jid: str
    steps: int
    first: str
    leaver: str
    job: dict
    events: dict[str, list[dict]]
    tasks: list
    progress: Path
    killed_at: float = 0.0
    progress_after_kill: float = 0.0


def _resized_to(cluster: Cluster, jid: str, procs: int, after: float) -> bool:
    """Whether the controller has recorded the end of a resize of ``jid`` to ``procs`` since ``after``."""
    from hpcsched.runtime.store import Store

    store = Store(cluster.dir / "run" / "state.db", query_only=True)
    try:
        return any(e["procs"] == procs and e["time"] > after for e in store.events(jid, "resized"))
    finally:
        store.close()


def elastic_across_hosts(cluster: Cluster, steps: int = 200) -> ElasticRun:
    """The issue-18 scenario on the three hosts (also run by ``bench/bench_horovod_controller.py --across-hosts``):
    h3's worker leaves; an elastic Horovod job (min 1, max 3, a scaling curve: the MILP sizes it) starts on the two
    others; h3's worker joins again (the MILP grows the job to 3); once it trains at 3, h3 dies (``_kill_host``:
    kill -9 of every process there; the controller hears nothing until ``worker_timeout_s`` of silence) and the
    job shrinks to the two others; then the worker of those two that is not the job's first node leaves (SIGTERM:
    drain), the job shrinks to 1, and it ends. The workers that left are started again at the end, so the
    module's cluster is whole for the next test."""
    from hpcsched.runtime.store import Store

    cluster.workers.pop("h3").send_signal(signal.SIGTERM)
    leaver = ""
    killed_at = after_kill = 0.0
    try:
        wait_for("h3's worker gone", lambda: "h3" not in cluster.alive(), 30, poll=0.2)
        jid = cluster.job("hvd-elastic", "horovodrun", 2, "workloads/horovod_train.py, --model, cnn, --batch, '48', "
                          "--commit-every, '2', --io-latency-ms, '40'", steps=steps,
                          # Horovod's Gloo timeout bounds two waits (docs/runtime.md): the survivors' wait on the
                          # killed rank, and their wait at the grow for the new rank, whose start (torch and Horovod
                          # imported) took over 5 s at load 13 and over 15 s at load 14-34 (the job then failed).
                          # The runtime's value (Horovod's 30 s): the kill's waits below are derived from it.
                          extra=f"min_procs: 1\nmax_procs: 3\n"
                          f"env: {{HOROVOD_GLOO_TIMEOUT_SECONDS: '{GLOO_TIMEOUT_S}'}}\n"
                          "scaling: {procs: [1, 2, 3], rates: [10, 19, 27], resize_s: 1}\n")
        first = wait_for("the job's first node", lambda: [
            h for h in HOSTS if (cluster.dir / "run" / h / f"{jid}.g1.n0").is_dir()], 60, poll=0.2)[0]
        progress = cluster.dir / "run" / first / f"{jid}.g1.n0" / "progress.jsonl"
        wait_for("2 ranks training", lambda: any(r.get("world_size") == 2 and r["step"] >= 4
                                                 for r in _reports(progress)), 120, poll=0.2)
        cluster.start_worker("h3")  # a third worker joins
        wait_for("the grow to 3 in place", lambda: (j := cluster.client.jobs()[jid])["procs"] == 3 and float(
            j.get("last_resize_s", 0)) > 0 and any(r.get("world_size") == 3 for r in _reports(progress)), 120, poll=0.2)
        wait_for("a step at 3", lambda: any(r.get("world_size") == 3 and not r.get("resized_in_place")
                                            for r in _reports(progress)), 60, poll=0.2)
        killed_at = time.time()
        _kill_host(cluster, "h3")  # a node dies under the job: no Leave, its ranks gone mid-step
        wait_for("the shrink to 2 after the kill", lambda: cluster.client.jobs()[jid]["procs"] == 2 and any(
            r.get("world_size") == 2 and r["time"] > killed_at for r in _reports(progress)), 2 * GLOO_TIMEOUT_S,
                 poll=0.2)  # a survivor waits out the Gloo timeout, then Horovod re-forms at 2 and steps
        after_kill = min(r["time"] for r in _reports(progress) if r["time"] > killed_at)
        wait_for("a step at 2 after the kill", lambda: any(r["time"] > killed_at and r.get("world_size") == 2 and not
                                                           r.get("resized_in_place") for r in _reports(progress)),
                 60, poll=0.2)
        # Horovod re-forms at 2 before the controller hears of the kill: the shrink ends (``resized``) only at the
        # first report the controller reads after its own resize; a leave before that would replace it.
        wait_for("the shrink to 2 ended", lambda: _resized_to(cluster, jid, 2, killed_at), 60, poll=0.2)
        leaver = next(h for h in ("h1", "h2") if h != first)
        cluster.workers.pop(leaver).send_signal(signal.SIGTERM)  # drain: it leaves, the job shrinks onto the rest
        wait_for("the shrink to 1 in place", lambda: any(r.get("world_size") == 1 and r.get("resized_in_place")
                                                         for r in _reports(progress)), 60, poll=0.2)
        j = cluster.finished(jid, 120)
    finally:
        for h in ("h3", leaver):
            if h and h not in cluster.workers:
                cluster.start_worker(h)
    store = Store(cluster.dir / "run" / "state.db", query_only=True)
    try:
        ev = {k: store.events(jid, k) for k in ("start", "stop", "resize", "resized", "resume", "task_failed")}
        ev["worker_lost"] = [e for e in store.events(None, "worker_lost") if e["time"] > killed_at]
        tasks = store.allocations(job_id=jid, live_only=False)
    finally:
        store.close()
    return ElasticRun(jid, steps, first, leaver, j, ev, tasks, progress, killed_at, after_kill)


@pytest.mark.horovod
@pytest.mark.skipif(horovod_missing, reason="needs Horovod with PyTorch (make horovod)")
def test_controller_resizes_elastic_horovod_in_place_across_hosts(cluster: Cluster) -> None:
    """Issue 18: the controller grows and shrinks an elastic Horovod job across hosts in place
    (``elastic_across_hosts``). The grow to 3: h3 gets a slot-holding task and node 0's horovodrun starts the new
    rank there through h3's worker (Horovod runs ssh: the agent; h3 was no host of the launch). h3 killed (-9, the
    whole host): Horovod's survivors re-form without its rank at once, and the controller, once h3 is silent for
    ``worker_timeout_s``, shrinks the job in place onto them (its task released, nothing lost). The shrink when a
    worker leaves: its rank is removed by Horovod and its task ends by itself. One attempt throughout (no stop,
    no relaunch, no checkpoint restored), the step counter goes back at most to the last commit (only at the kill:
    Horovod restores the committed state), the job ends at exactly its steps."""
    run = elastic_across_hosts(cluster)
    j, ev, jid, leaver, first = run.job, run.events, run.jid, run.leaver, run.first
    assert j["state"] == "completed", (j["message"], ev, cluster.logs())
    assert int(j["steps_done"]) == run.steps and cluster.result(jid)["steps"] == run.steps
    assert int(j["generation"]) == 1 and int(j.get("restarts", 0)) == 0, j
    assert [(e["resize_kind"], e["from_procs"], e["procs"]) for e in ev["resize"]] == [
        ("in-place", 2, 3), ("in-place", 3, 2), ("in-place", 2, 1)], ev["resize"]
    assert [(e["resize_kind"], e["procs"]) for e in ev["resized"]] == [
        ("in-place", 3), ("in-place", 2), ("in-place", 1)], ev
    assert len(ev["start"]) == 1 and not ev["stop"] and not ev["resume"] and not ev["task_failed"], ev
    assert ev["resize"][1]["released"] == ["h3"] and ev["resize"][1]["reason"] == "worker h3 lost"
    assert ev["resize"][2]["released"] == [leaver] and ev["resize"][2]["reason"] == f"worker {leaver} left"
    assert [e["worker"] for e in ev["worker_lost"]] == ["h3"], ev["worker_lost"]
    reports = _reports(run.progress)
    for a, b in zip(reports, reports[1:], strict=False):  # back to the last commit (every 2 steps) at the kill only
        assert b["step"] >= a["step"] or (a["step"] - b["step"] <= 2 and b["time"] > run.killed_at), (a, b)
    assert all(r.get("resumed_from", -1) == -1 for r in reports)
    # Rank 0 may move to another process when Horovod re-forms; the one that ended the job lived through all.
    history = cluster.result(jid)["history"]
    assert [h["resumed_from"] for h in history if "resumed_from" in h] == [-1], history  # one start, no restore
    sizes = [h["world_size"] for h in history if "in_place_at" in h]
    assert [w for k, w in enumerate(sizes) if k == 0 or sizes[k - 1] != w] == [3, 2, 1], history
    assert len({h["pid"] for h in history if "in_place_at" in h}) == 1, history
    # h3's slot-holding task (node rank 2) ran the new rank and was released when h3 was lost; the leaver's task
    # was released and ended by itself
    assert {(t.worker_id, t.node_rank, t.exit_code) for t in run.tasks} == {
        (first, 0, 0), (leaver, 1, 0), ("h3", 2, 0)}, run.tasks
    assert not (cluster.dir / "ssh-called").exists()
    assert not _processes(cluster, leaver, "horovod_train.py")  # the removed rank is gone from the host it left
    grow, lost, shrink = (e["seconds"] for e in ev["resized"])
    decided = ev["resize"][1]["time"] - run.killed_at
    print(f"\ncontroller in place across hosts: 2 -> 3 in {grow:.2f} s, 3 -> 1 by a drain in {shrink:.2f} s "
          f"(decision to report); h3 killed: first progress after {run.progress_after_kill - run.killed_at:.2f} s, "
          f"worker lost and resize decided after {decided:.2f} s, reported at 2 {lost:.2f} s later")
