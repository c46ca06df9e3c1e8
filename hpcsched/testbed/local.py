"""A controller and its workers on this machine, started as a user would start them.

``hpcsched testbed --local`` and the tests use it so a testbed run needs one command. Real processes
(``python -m hpcsched.cli controller|worker``), real gRPC on loopback, a fresh token, port 0: nothing
here is simulated. The workers get one slot per GPU of the cluster spec's nodes.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpcsched.model import ClusterSpec


class LocalCluster:
    """``with LocalCluster(root, spec, policy) as c:`` -> ``c.address``, ``c.token``, ``c.state``."""

    def __init__(self, root: Path, spec: ClusterSpec, policy: str, heartbeat_s: float = 0.3,
                 schedule_s: float = 0.3, start_timeout_s: float = 120.0) -> None:
        self.root = root.resolve()
        self.spec = spec
        self.policy = policy
        self.heartbeat_s = heartbeat_s
        self.schedule_s = schedule_s
        self.start_timeout_s = start_timeout_s
        self.token = secrets.token_hex(16)
        self.state = self.root / "state.db"
        self.ckpt_root = self.root / "ckpt"
        self.address = ""
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / "token", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # others' are refused
        with os.fdopen(fd, "w") as f:
            f.write(self.token + "\n")
        addr_file = self.root / "controller.addr"
        addr_file.unlink(missing_ok=True)
        cfg = {"listen": "127.0.0.1:0", "address_file": str(addr_file), "state": str(self.state),
               "checkpoint_root": str(self.ckpt_root), "token_file": str(self.root / "token"),
               "policy": self.policy, "heartbeat_interval_s": self.heartbeat_s, "worker_timeout_s": 30,
               "schedule_interval_s": self.schedule_s, "stop_grace_s": 30}
        conf = self.root / "controller.yaml"
        conf.write_text("".join(f"{k}: {v}\n" for k, v in cfg.items()))
        self.procs.append(self._spawn(["controller", "--config", str(conf)], "controller.log"))
        deadline = time.time() + self.start_timeout_s
        while not addr_file.exists() or not addr_file.read_text().strip():
            if self.procs[0].poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"controller did not start; see {self.root / 'controller.log'}")
            time.sleep(0.1)
        self.address = addr_file.read_text().split()[0]
        for i in range(self.spec.nodes):
            name = f"w{i + 1}"
            self.procs.append(self._spawn(
                ["worker", "--controller", self.address, "--name", name, "--slots", str(self.spec.gpus_per_node),
                 "--gpus", "0", "--work-dir", str(self.root / name)], f"{name}.log"))

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen:
        out = open(self.root / log, "ab")  # noqa: SIM115 - open while the child lives, closed by stop()
        self.logs.append(out)
        env = os.environ | {"HPCSCHED_TOKEN": self.token}
        return subprocess.Popen([sys.executable, "-m", "hpcsched.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=self.root, env=env, start_new_session=True)

    def wait_workers(self, client, timeout_s: float | None = None) -> None:
        """Block until every worker has registered (they import torch first: seconds on a busy machine)."""
        deadline = time.time() + (timeout_s or self.start_timeout_s)
        while time.time() < deadline:
            alive = [w for w in client.workers() if w.alive]
            if len(alive) >= self.spec.nodes:
                return
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a runtime process exited; see the logs in {self.root}")
            time.sleep(0.3)
        raise RuntimeError(f"workers did not register within {timeout_s or self.start_timeout_s:.0f} s")

    def stop(self) -> None:
        """SIGTERM workers first (they kill their tasks), then the controller."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        self.procs.clear()
        for f in self.logs:
            f.close()
        self.logs.clear()
