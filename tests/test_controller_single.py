"""One controller per state file (issue 15): a second controller on the same state is refused at start with
the holder's pid, and the state is free again once the first one is gone, even after kill -9."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runtime_procs import controller_config, kill_tree, start_controller, stop


def _second(d: Path, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcsched.runtime", "controller", "--config", str(config)],
                          cwd=d, capture_output=True, text=True, timeout=120)


def test_a_second_controller_on_the_same_state_is_refused(tmp_path: Path) -> None:
    config = controller_config(tmp_path)
    first, _ = start_controller(tmp_path, config)
    try:
        r = _second(tmp_path, config)
        assert r.returncode == 2
        assert f"another controller (pid {first.pid}) holds this state" in r.stderr
        assert "Traceback" not in r.stderr
        assert first.poll() is None, "the running controller is left alone"
    finally:
        kill_tree(first)  # as a crash would: the OS drops the lock with the process
    again, _ = start_controller(tmp_path, config)  # the state is free once its owner is gone
    stop(again)
