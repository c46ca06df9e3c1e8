"""Controller and worker daemons as real processes for the runtime tests, started exactly as a user would
(``python -m hpcsched.runtime controller|worker``), and the job files they run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpcsched.runtime.client import Client

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "test-token-7f3a"


def write_secret(path: Path, text: str) -> Path:
    """A credential file as an operator must make one: readable by its owner only (others' are refused)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.chmod(path, 0o600)
    return path


def controller_config(d: Path, listen: str = "127.0.0.1:0", **extra: object) -> Path:
    write_secret(d / "token", TOKEN)
    cfg = {"listen": listen, "address_file": "run/controller.addr", "state": "run/state.db",
           "checkpoint_root": "run/ckpt", "token_file": "token", "heartbeat_interval_s": 0.3,
           "worker_timeout_s": 3, "schedule_interval_s": 0.2, "stop_grace_s": 10} | extra
    p = d / "controller.yaml"
    p.write_text("".join(f"{k}: {v}\n" for k, v in cfg.items()))
    return p


def start_controller(d: Path, config: Path, timeout_s: float = 60.0,
                     python_args: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """A controller process in ``d`` and its address, once it has written it; one that does not within
    ``timeout_s`` is killed (no controller is left behind a failed start) and its log raised. ``python_args``:
    put before ``-m`` (a wrapper script that runs the module, such as bench/stack_sampler.py and its output)."""
    addr_file = d / "run" / "controller.addr"
    addr_file.unlink(missing_ok=True)
    log = open(d / "controller.log", "a")
    cmd = [sys.executable, *python_args, "-m", "hpcsched.runtime", "controller", "--config", str(config)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=d, start_new_session=True)
    deadline = time.time() + timeout_s
    while not addr_file.exists():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"controller did not start:\n{(d / 'controller.log').read_text()[-3000:]}")
        time.sleep(0.1)
    return proc, addr_file.read_text().strip()


def start_worker(d: Path, address: str | None, name: str, slots: int = 1, token: str = TOKEN,
                 extra: tuple[str, ...] = (), log_name: str | None = None, gpus: int = 0) -> subprocess.Popen:
    """A worker daemon; ``address`` None: it finds the controller through ``extra``'s --address-file."""
    log = open(d / (log_name or f"{name}.log"), "a")
    env = os.environ | {"HPCSCHED_TOKEN": token}
    where = ["--controller", address] if address else []
    return subprocess.Popen(
        [sys.executable, "-m", "hpcsched.runtime", "worker", *where, "--name", name, "--slots",
         str(slots), "--gpus", str(gpus), "--work-dir", str(d / "run" / name), *extra],
        stdout=log, stderr=subprocess.STDOUT, cwd=d, env=env, start_new_session=True,
    )


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children first found first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process and everything below it, as a node failure would."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill_tree(proc)


def wait_for(what: str, pred, timeout: float, poll: float = 0.3):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def client(address: str) -> Client:
    return Client(address, TOKEN)


def job_file(d: Path, name: str, procs: int, steps: int, model: str | None = "cnn", launcher: str = "torchrun",
          program: str = "workloads/ddp_train.py", extra: str = "", min_procs: int | None = None) -> Path:
    p = d / f"{name}.yaml"
    p.write_text(
        f"name: {name}\nlauncher: {launcher}\nprocs: {procs}\nsteps: {steps}\nworkdir: {ROOT}\n"
        f"min_procs: {min_procs or procs}\n"
        f"command: [{program}, {f'--model, {model}, --batch, 64, ' if model else ''}--checkpoint-every, '10', "
        f"--io-latency-ms, '25'"
        f"{extra}]\n"
    )
    return p


def submit(c: Client, path: Path) -> str:
    return c.submit(path.read_text(), str(path))


def jobs_by_id(c: Client) -> dict:
    return {j.job_id: j for j in c.jobs()}


def no_horovod() -> bool:
    """Whether the Horovod tests cannot run here: they need Horovod with PyTorch and the runtime's horovodrun
    launcher (``make horovod``)."""
    import importlib.util

    from hpcsched.runtime import launchers

    return importlib.util.find_spec("horovod") is None or importlib.util.find_spec("torch") is None \
        or "horovodrun" not in launchers.available()
