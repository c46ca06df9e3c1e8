"""The spare task guard (``Sandbox(spare=True)``, ``task_guard.py --spare``): a guard started ahead of the next
launch is handed the task over a socket (its options, command, environment and descriptors) instead of a Python
starting for it. Real processes: the task runs in the spare with what the cold path would give it, a spare that
died is replaced by a cold start, and a spare whose worker closes its socket exits."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from hpcsched.runtime.sandbox import Sandbox

ENV = {"PATH": os.defpath, "X": "from-the-request"}


def _run(sb: Sandbox, out: Path, script: str | list[str], **kw: object) -> subprocess.Popen:
    with open(out, "ab") as f:
        proc = sb.spawn(["sh", "-c", script] if isinstance(script, str) else script, ENV, stdout=f, **kw)
    proc.wait(timeout=60)
    return proc


def test_a_spare_guard_runs_the_task_it_is_handed(tmp_path: Path) -> None:
    sb = Sandbox("spare-test", cgroups="off", spare=True)
    try:
        assert sb.spare is not None
        spare_pid = sb.spare[0].pid
        proc = _run(sb, tmp_path / "out", "echo x=$X; echo to-stderr >&2; pwd; exit 3", cwd=str(tmp_path))
        assert proc.pid == spare_pid and sb.spares_used == 1
        assert proc.returncode == 3
        assert (tmp_path / "out").read_text().split() == ["x=from-the-request", "to-stderr", str(tmp_path)]
        # no spare until the next refill: the next start is cold, and as good
        proc = _run(sb, tmp_path / "out2", "echo again=$X; exit 0")
        assert proc.returncode == 0 and sb.spares_used == 1
        assert (tmp_path / "out2").read_text() == "again=from-the-request\n"
        sb.refill()
        proc = _run(sb, tmp_path / "out3", "kill -TERM $$")
        assert proc.returncode == -signal.SIGTERM and sb.spares_used == 2  # it ends as its task did
        sb.refill()
        proc = _run(sb, tmp_path / "out4", ["no-such-program-hpcs"])
        assert proc.returncode == 127 and "cannot start no-such-program-hpcs" in (tmp_path / "out4").read_text()
    finally:
        sb.close()


def test_a_dead_spare_is_replaced_by_a_cold_start(tmp_path: Path) -> None:
    sb = Sandbox("spare-test", cgroups="off", spare=True)
    try:
        assert sb.spare is not None
        dead = sb.spare[0]
        dead.kill()
        dead.wait()
        proc = _run(sb, tmp_path / "out", "echo cold=$X")
        assert proc.pid != dead.pid and proc.returncode == 0 and sb.spares_used == 0 and sb.spares_lost == 1
        assert (tmp_path / "out").read_text() == "cold=from-the-request\n"
    finally:
        sb.close()


def test_spares_that_keep_ending_unused_are_given_up(tmp_path: Path) -> None:
    """A Python that cannot start as a spare (here: one that exits at once) must not cost a process per poll."""
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    sb = Sandbox("spare-test", python=str(broken), cgroups="off", spare=True)
    try:
        for _ in range(5):
            if sb.spare is not None:
                sb.spare[0].wait(timeout=30)
            with open(tmp_path / "out", "ab") as f:
                sb.spawn(["true"], ENV, stdout=f).wait(timeout=30)  # the broken python, cold: exits 1
            sb.refill()
        assert not sb.use_spare and sb.spare is None and sb.spares_lost == 3
    finally:
        sb.close()


def test_a_spare_whose_worker_closes_its_socket_exits() -> None:
    sb = Sandbox("spare-test", cgroups="off", spare=True)
    assert sb.spare is not None
    proc = sb.spare[0]
    sb.close()
    assert proc.wait(timeout=30) == 0
