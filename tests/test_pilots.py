"""Node source ``slurm`` without a Slurm: the controller file's section, the pilots' batch script and how many
pilots to claim (the live behaviour is in tests/test_pilots_live.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_procs import TOKEN, client, controller_config, kill_tree, start_controller, stop, wait_for

from hpcsched.errors import InputError
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.pilots import PilotConfig, pilot_script, pilots_wanted


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
        assert 2 <= took < 30, took
        assert "unreachable for" in log.read_text() and "orphan_timeout_s 2" in log.read_text()
    finally:
        c.close()
        if w.poll() is None:
            kill_tree(w)
        stop(ctl)
