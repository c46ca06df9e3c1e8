"""docs/extending.md held to its word: adding a policy, a Gavel policy, an admission or placement step, a trace
format, a node source and a launcher is each ONE module. The package is copied, every example module of the page
is written into the copy exactly as the page shows it (and nothing else is edited), and a fresh interpreter on
the copy finds and uses each one; the architecture test passes on the copy too."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
BLOCK = re.compile(r"```python\n# (hpcsched/\S+\.py)\n(.*?)```", re.S)
EXPECTED = {"hpcsched/policies/oldest_small_first.py", "hpcsched/hetero/policies/equal_share.py",
            "hpcsched/placements/last_fit.py", "hpcsched/admission/small_only.py", "hpcsched/traces/jobarray.py",
            "hpcsched/fixed/node_source.py", "hpcsched/runtime/launchers/plain.py"}

# Run in the copy: each added module found by its registry and used through the public entry points.
CHECK = r'''
import json, sys, contextlib, io
from pathlib import Path
out, work = {}, Path(sys.argv[1])

# a policy: simulated by name from the command line
trace = work / "t.csv"
trace.write_text("job_id,num_gpu,submit_time,duration\n1,2,0,100\n2,1,10,50\n3,1,20,30\n")
from hpcsched.cli import main
buf = io.StringIO()
sys.argv = ["hpcsched", "simulate", "--trace", str(trace), "--cluster", sys.argv[2], "--policy", "oldest-small-first",
            "--out", str(work / "sim"), "--json"]
with contextlib.redirect_stdout(buf):
    try:
        main()
    except SystemExit as e:
        assert not e.code, e.code
out["policy"] = json.loads(buf.getvalue())

# a Gavel policy, an admission step, a placement step: by name from their registries
from hpcsched.hetero.policies import make_policy
from hpcsched.admission import get_admission
from hpcsched.placements import get_placement
out["gavel"] = type(make_policy("equal-share")).__name__
out["steps"] = [get_admission("small-only").__name__, get_placement("last-fit").__name__]

# a trace format: sniffed and read, a bad row counted
from hpcsched.traces import DISCOVERED, open_trace
log = work / "jobs.csv"
log.write_text("name,gpus,arrive_s,run_s\na,1,0,60\nb,x,5,60\nc,2,9,120\n")
tr = open_trace(log)
jobs = list(tr)
out["trace"] = [tr.format.name, [(j.id, j.gpus, j.submit, j.duration) for j in jobs], dict(tr.report.anomalies),
                list(DISCOVERED)]

# a node source: accepted by a controller file, its section read, built by name and stepped
from hpcsched.errors import InputError
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.node_source import NODE_SOURCES, build
ctl = work / "controller.yaml"
ctl.write_text(f"state: {work / 'state.db'}\nnode_source: fixed\nfixed: {{hosts: [gpu01, gpu02]}}\n")
cfg = read_controller_config(ctl)
class View:
    def demand_slots(self): return 0
    def workers(self): return {"gpu01": (True, 4, 0)}
src = build(cfg.node_source, cfg.pilots, View(), "127.0.0.1:1", None, work / "state.db")
src.start(); src.step(); src.stop()
bad = work / "bad.yaml"
bad.write_text("node_source: fixed\nfixed: {hosts: 3}\n")
try:
    read_controller_config(bad)
    err = None
except InputError as e:
    err = str(e)
out["source"] = [list(NODE_SOURCES), cfg.node_source, list(cfg.pilots), dict(src.view().nodes), err]

# a launcher: accepted by a job file, offered here, building node 0's command
from hpcsched.runtime import launchers
from hpcsched.runtime.jobfile import parse_job_spec
from hpcsched.runtime.rpc import pb
spec = parse_job_spec("name: a\ncommand: [train.py]\nlauncher: plain\nprocs: 2\n", "j.yaml")
task = dict(job_id="j", generation=1, launcher="plain", command=["train.py"], nnodes=2, nprocs=1, world_size=2,
            master_addr="127.0.0.1", master_port=29400)
argv0 = launchers.build(pb.LaunchTask(task_id="j.n0", node_rank=0, **task), "/py", "")[0]
argv1 = launchers.build(pb.LaunchTask(task_id="j.n1", node_rank=1, **task), "/py", "")[0]
out["launcher"] = [list(launchers.names()), spec.launcher, "plain" in launchers.available(), argv0, argv1]
print(json.dumps(out))
'''


def _blocks() -> dict[str, str]:
    return {path: code for path, code in BLOCK.findall(DOC.read_text())}


def test_the_page_shows_one_module_for_each_walk_through() -> None:
    assert set(_blocks()) == EXPECTED


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package copied, the page's example modules written into it, nothing else changed."""
    base = tmp_path_factory.mktemp("extending")
    shutil.copytree(ROOT / "hpcsched", base / "hpcsched", ignore=shutil.ignore_patterns("__pycache__"))
    for path, code in _blocks().items():
        target = base / path
        assert not target.exists(), f"{path} is an example: it must be new"
        target.parent.mkdir(parents=True, exist_ok=True)  # the node source's package: a directory, no __init__
        target.write_text(code)
    (base / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "test_architecture.py", base / "tests")
    return base


def _env(copy: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}


@pytest.fixture(scope="module")
def found(copy: Path) -> dict:
    work = copy / "work"
    work.mkdir()
    cluster = ROOT / "cluster_spec" / "n8g8.csv"
    r = subprocess.run([sys.executable, "-c", CHECK, str(work), str(cluster)], cwd=copy, env=_env(copy),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_copy_runs_the_new_modules_not_this_checkout(copy: Path) -> None:
    r = subprocess.run([sys.executable, "-c", "import hpcsched.cli; print(hpcsched.cli.__file__)"], cwd=copy,
                       env=_env(copy), capture_output=True, text=True, timeout=60)
    assert Path(r.stdout.strip()).parent == copy / "hpcsched"


def test_a_policy_module_is_simulated_by_name(found: dict) -> None:
    res = found["policy"]
    assert res["policy"] == "oldest-small-first" and res["jobs"] == 3 and res["unfinished"] == 0


def test_gavel_policy_admission_and_placement_modules_are_found_by_name(found: dict) -> None:
    assert found["gavel"] == "EqualShare"
    assert found["steps"] == ["small_only", "last_fit"]


def test_a_trace_format_module_is_sniffed_and_read(found: dict) -> None:
    name, jobs, counts, discovered = found["trace"]
    assert name == "jobarray" and discovered == ["jobarray"]
    assert jobs == [["a", 1, 0.0, 60.0], ["c", 2, 9.0, 120.0]]
    assert counts.get("malformed_row") == 1  # row b's GPUs are not a number: counted, not silently dropped


def test_a_node_source_module_is_configured_built_and_stepped(found: dict) -> None:
    names, chosen, hosts, nodes, err = found["source"]
    assert names == ["static", "slurm", "fixed", "pbs"] and chosen == "fixed" and hosts == ["gpu01", "gpu02"]
    assert nodes == {"gpu01": ["up", ""], "gpu02": ["expected", ""]}
    assert err is not None and "bad.yaml:2" in err and "fixed: needs hosts" in err


def test_a_launcher_module_is_accepted_offered_and_builds_node_0s_command(found: dict) -> None:
    names, chosen, offered, argv0, argv1 = found["launcher"]
    assert names[-1] == "plain" and chosen == "plain" and offered
    assert argv0 == ["/py", "train.py"] and argv1 is None


def test_the_architecture_test_passes_on_the_copy(copy: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                        "tests/test_architecture.py"], cwd=copy, env=_env(copy), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]


def test_this_checkout_discovers_only_what_it_ships() -> None:
    """Discovery adds nothing in the shipped tree: every module of the trace package is a shipped format or a
    listed helper, the launchers are the four, and the one discovered node source is PBS's."""
    from hpcsched.runtime import launchers, node_source
    from hpcsched.traces import DISCOVERED

    assert DISCOVERED == ()
    assert launchers.names() == ("torchrun", "direct", "mpirun", "horovodrun")
    assert node_source.PLUGINS == ("pbs",)
