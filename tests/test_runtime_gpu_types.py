"""GPU types in the runtime (issue 19: "workers advertise their GPU type and count; the controller's plans use the same
policies; `hpcsched workers` shows the types").

Real processes where a user sees it: a controller on port 0 with throughput-aware placement and three workers (a
CPU-only one that detects its type, a V100 and a P100 one given with ``--gpu-type``); ``hpcsched workers --json``
and its table show the types; a job asking for P100 lands there although first fit would take the CPU worker; a
Recommendation job (fastest on P100 in Gavel's table) lands on the P100 worker; a job asking for K80 waits, saying
no live worker has that type. Then the pure parts: type detection from nvidia-smi names, the worker file's key, the
registration bound, and a state file from before types opened by a new controller.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_procs import TOKEN, client, controller_config, start_controller, start_worker, stop, wait_for

from hpcsched.errors import InputError
from hpcsched.runtime import gputype
from hpcsched.runtime.controller_members import registration_problem
from hpcsched.runtime.jobfile import parse_job_spec
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.store import Store
from hpcsched.runtime.store_rows import WorkerRow
from hpcsched.runtime.worker_config import read_worker_config


def _cli(address: str, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"HPCSCHED_TOKEN": TOKEN, "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "hpcsched.runtime", *args, "--controller", address],
                          capture_output=True, text=True, env=env, timeout=120)


def _job(d: Path, name: str, extra: str) -> str:
    return f"name: {name}\nlauncher: direct\nworkdir: {d}\ncommand: [sleep, '120']\n{extra}"


@pytest.mark.slow
def test_workers_advertise_types_and_jobs_land_on_theirs(tmp_path: Path) -> None:
    proc, address = start_controller(tmp_path, controller_config(tmp_path, placement="throughput-aware"))
    procs = [proc]
    c = client(address)
    try:
        procs.append(start_worker(tmp_path, address, "w0-cpu", slots=1))  # first in worker order; type detected
        procs.append(start_worker(tmp_path, address, "w1-v100", slots=2, extra=("--gpu-type", "V100")))
        procs.append(start_worker(tmp_path, address, "w2-p100", slots=2, extra=("--gpu-type", "p100")))
        wait_for("three live workers", lambda: sum(w.alive for w in c.workers()) == 3, 90)

        out = _cli(address, "workers", "--json")
        assert out.returncode == 0, out.stderr
        listed = {w["worker_id"]: w for w in json.loads(out.stdout)}
        assert {k: w["gpu_type"] for k, w in listed.items()} == {"w0-cpu": "cpu", "w1-v100": "v100",
                                                                 "w2-p100": "p100"}
        assert {"host", "slots", "used", "alive", "last_seen", "gpus"} <= set(listed["w1-v100"])  # keys kept
        table = _cli(address, "workers").stdout
        assert "GPU TYPE" in table and "p100" in table and "v100" in table
        assert "GPU type cpu (this worker offers no GPUs)" in (tmp_path / "w0-cpu.log").read_text()
        assert "GPU type v100 (from --gpu-type)" in (tmp_path / "w1-v100.log").read_text()

        typed = c.submit(_job(tmp_path, "typed", "gpu_type: P100\n"), "typed.yaml")
        wait_for("the typed job on the P100 worker", lambda: [j for j in c.jobs() if j.job_id == typed
                                                               and j.state == "running" and j.workers], 60)
        rec = c.submit(_job(tmp_path, "rec", "model: Recommendation (batch size 512)\n"), "rec.yaml")
        wait_for("the Recommendation job running", lambda: [j for j in c.jobs() if j.job_id == rec
                                                            and j.state == "running" and j.workers], 60)
        k80 = c.submit(_job(tmp_path, "k80", "gpu_type: [k80]\n"), "k80.yaml")
        want = "waiting: no live worker with direct has GPU type k80 (their types: cpu, p100, v100)"
        wait_for("the k80 note", lambda: [j for j in c.jobs() if j.job_id == k80 and j.message == want], 60)
        jobs = {j.job_id: j for j in c.jobs()}
        assert list(jobs[typed].workers) == ["w2-p100"]  # first fit would have taken w0-cpu
        assert list(jobs[rec].workers) == ["w2-p100"]  # P100 48.9 > V100 23.3 steps/s: not w0-cpu, not w1-v100
        assert jobs[k80].state == "pending"
        for j in (typed, rec, k80):
            c.cancel(j)
    finally:
        c.close()
        for p in reversed(procs):
            stop(p)


def test_detection_from_nvidia_smi_names() -> None:
    names = {"Tesla V100-SXM2-16GB": "v100", "NVIDIA H100 80GB HBM3": "h100", "Tesla T4": "t4",
             "NVIDIA A100-SXM4-80GB": "a100", "Tesla K80": "k80", "Tesla P100-PCIE-16GB": "p100",
             "NVIDIA RTX A6000": "a6000", "Quadro RTX 8000": "quadro-rtx-8000", "": "unknown"}
    assert {n: gputype.type_from_name(n) for n in names} == names
    assert gputype.detect(0, lambda: (["Tesla V100"], "")) == ("cpu", "this worker offers no GPUs")
    t, how = gputype.detect(2, lambda: (["Tesla P100-PCIE-16GB", "Tesla P100-PCIE-16GB"], ""))
    assert t == "p100" and "nvidia-smi reports 2 GPUs" in how
    t, how = gputype.detect(2, lambda: (["Tesla V100", "Tesla K80"], ""))
    assert t == "v100" and "mixes types (k80, v100)" in how
    t, how = gputype.detect(4, lambda: ([], "nvidia-smi is not installed here"))
    assert t == "unknown" and "not installed" in how and "--gpu-type" in how


def test_worker_file_gpu_type_and_registration_bound(tmp_path: Path) -> None:
    good = tmp_path / "w.yaml"
    good.write_text("controller: h:1\ngpus: 4\ngpu_type: A100\n")
    assert read_worker_config(good)["gpu_type"] == "a100"
    bad = tmp_path / "b.yaml"
    bad.write_text("controller: h:1\ngpu_type: \"a 100\"\n")
    with pytest.raises(InputError, match=r"b.yaml:2: gpu_type: 'a 100' is not a GPU type"):
        read_worker_config(bad)
    req = pb.RegisterRequest(worker_id="w", host="h", slots=1, gpu_type="v100")
    assert registration_problem(req) == ""
    req.gpu_type = "x" * 33
    assert "gpu_type" in registration_problem(req)
    req.gpu_type = ""  # an older worker: allowed, it takes no typed job
    assert registration_problem(req) == ""


def test_job_file_gpu_type_and_model() -> None:
    spec = parse_job_spec("command: [a]\ngpu_type: [V100, p100, v100]\nmodel: ResNet-50 (batch size 64)\n", "j.yaml")
    assert spec.gpu_types == ("v100", "p100") and spec.model == "ResNet-50 (batch size 64)"
    assert parse_job_spec("command: [a]\ngpu_type: k80\n", "j.yaml").gpu_types == ("k80",)
    assert parse_job_spec("command: [a]\n", "j.yaml").gpu_types == ()
    for text, line, what in (("gpu_type: []", 2, "an empty list"), ("gpu_type: [v100, 'x y']", 2, "not a GPU type"),
                             ("gpu_type: {a: 1}", 2, "must be a single value"),
                             ("model: \"\"", 2, "model: 1 to 128 printable"),
                             ("gpu_type: [" + ", ".join(f"t{i}" for i in range(17)) + "]", 2, "at most 16 types")):
        with pytest.raises(InputError, match=rf"^j.yaml:{line}: .*{what}"):
            parse_job_spec(f"command: [a]\n{text}\n", "j.yaml")


def test_a_state_file_from_before_gpu_types_is_migrated(tmp_path: Path) -> None:
    """The first release's workers table has no gpu_type: a new controller adds the column (old rows read as not
    advertised) and stores the types of workers that register after; jobs stored before read as any type."""
    path = tmp_path / "state.db"
    st = Store(path)
    job = st.add_job(parse_job_spec("command: [a]\n", "j.yaml"), 0.0)
    st.close()
    db = sqlite3.connect(path)  # make it the old shape: no gpu_type column, a job spec without the new keys
    db.execute("DROP TABLE workers")
    db.execute("CREATE TABLE workers (id TEXT PRIMARY KEY, host TEXT NOT NULL, slots INTEGER NOT NULL, gpus INTEGER "
               "NOT NULL, cpus INTEGER NOT NULL, launchers TEXT NOT NULL, registered REAL NOT NULL, alive INTEGER "
               "NOT NULL)")
    db.execute("INSERT INTO workers VALUES ('old', 'h', 2, 2, 8, 'torchrun', 1.0, 1)")
    spec = json.loads(db.execute("SELECT spec FROM jobs").fetchone()[0])
    del spec["gpu_types"], spec["model"]
    db.execute("UPDATE jobs SET spec = ?", (json.dumps(spec),))
    db.commit()
    db.close()
    st = Store(path, owner=True)
    try:
        assert [(w.id, w.gpu_type) for w in st.workers()] == [("old", "")]
        st.upsert_worker(WorkerRow("new", "h", 4, 4, 8, ("torchrun",), 2.0, True, "v100"))
        assert {w.id: w.gpu_type for w in st.workers_page("", 10)} == {"old": "", "new": "v100"}
        j = st.job(job)
        assert j is not None and j.spec.gpu_types == () and j.spec.model is None
    finally:
        st.close()
