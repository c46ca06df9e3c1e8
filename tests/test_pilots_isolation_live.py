"""Job isolation on pilots of a REAL Slurm (the loopback cluster of scripts/slurm_cluster.sh): a root controller's
pilots run as root, so their workers are given a worker config (``slurm: worker_config``) that runs every task as
an unprivileged user with a Python it can run. Under each launcher, a pilot's task cannot read the pilot's token
file nor its worker's ``/proc`` environ, and a pilot killed by Slurm (``scancel --signal=KILL --full``) takes its
task's whole tree with it, a ``setsid`` escapee included.

Skipped with the reason when no Slurm controller answers, or users cannot be made here (not root).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
from pathlib import Path

import pytest
import task_users
from runtime_procs import TOKEN, client, controller_config, jobs_by_id, start_controller, stop, wait_for
from slurm_cluster import clean_cluster, sh, squeue  # noqa: F401 (clean_cluster: autouse fixture)

from hpcsched.runtime import launchers
from hpcsched.slurm import commands

WHY_NOT = commands.available()
pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no real Slurm: {WHY_NOT}")]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _sleepers(mark: str) -> list[int]:
    out = []
    for e in Path("/proc").iterdir():
        if e.name.isdigit():
            try:
                argv = (e / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:2] == [b"sleep", mark.encode()] and _alive(int(e.name)):
                out.append(int(e.name))
    return out


LAUNCHER_MARK = {"direct": "LOCAL_WORLD_SIZE", "torchrun": "TORCHELASTIC_RUN_ID", "mpirun": "OMPI_COMM_WORLD_SIZE",
                 "horovodrun": "HOROVOD_SIZE"}  # a variable only that launcher sets: the job did run under it


@pytest.mark.parametrize("launcher", list(LAUNCHER_MARK))
def test_a_pilots_task_cannot_read_its_credential_and_dies_with_the_pilot(tmp_path: Path, launcher: str) -> None:
    if launcher not in launchers.available():
        pytest.skip(f"{launcher} is not installed here")
    a, b = str(9000 + secrets.randbelow(50000)), str(60000 + secrets.randbelow(5000))
    with task_users.throwaway_users(1) as (user,), task_users.task_python() as python, \
            task_users.open_folder() as d:
        pilots = d / "pilots"
        attack = Path(user.pw_dir) / "attack.sh"  # the user's own script, in the user's home (an allowed workdir)
        attack.write_text(
            f"id -un\necho under=${{{LAUNCHER_MARK[launcher]}+yes}}\n"
            f"for f in {pilots}/worker-token-*; do echo \"reading $f\"; cat \"$f\"; done\n"
            "for p in /proc/[0-9]*; do\n"
            "  if grep -q hpcsched.runtime $p/cmdline 2>/dev/null && grep -q worker $p/cmdline; then\n"
            "    echo \"reading $p/environ\"; cat $p/environ\n  fi\ndone\n"
            f"echo attack-done\nsetsid sleep {a} &\nsleep {b} &\nwait\n")
        subprocess.run(["chown", f"{user.pw_uid}:{user.pw_gid}", str(attack)], check=True)
        wcfg = d / "pilot-worker.yaml"
        wcfg.write_text(f"run_as: {user.pw_name}\ntask_python: {python}\n")
        cfg = controller_config(d, min_runtime_s=2, stop_grace_s=4, max_restarts=0)
        with cfg.open("a") as f:
            f.write("node_source: slurm\nslurm:\n  partition: scavenger\n  max_pilots: 1\n  slots: 1\n"
                    "  stop_grace_s: 3\n  poll_s: 1\n  time_limit_s: 600\n  leave_before_s: 30\n"
                    "  start_timeout_s: 120\n  register_timeout_s: 60\n  work_dir: pilots\n"
                    f"  worker_config: {wcfg}\n")
        ctl, addr = start_controller(d, cfg)
        c = client(addr)
        try:
            jid = c.submit(f"name: hostile\nlauncher: {launcher}\nprocs: 1\nworkdir: {user.pw_dir}\n"
                           "command: [sh, attack.sh]\n", "hostile.yaml")
            escaped, plain = wait_for("the task's sleeps on a pilot", lambda: (x := _sleepers(a)) and
                                      (y := _sleepers(b)) and (x[0], y[0]), 180, poll=0.5)
            assert Path(f"/proc/{escaped}").stat().st_uid == user.pw_uid
            (pilot,) = [i for i, (name, _) in squeue().items() if name.startswith("hpcsched-pilot-")]
            out = wait_for("the attack's output", lambda: "attack-done" in (t := "".join(
                p.read_text() for p in pilots.glob(f"{pilot}/{jid}*/output.log"))) and t, 30)
            assert "under=yes" in out, f"not run under {launcher}: {out}"
            assert user.pw_name in out and "reading /proc/" in out and "reading " + str(pilots) in out, out
            assert out.count("Permission denied") >= 2 and TOKEN not in out, out
            assert list(pilots.glob("worker-token-*")), "the pilots' token file it tried"
            # Slurm kills the pilot outright (every process of its batch step, the worker first among them)
            sh("scancel", "--signal=KILL", "--full", pilot)
            assert wait_for("the task's tree gone with its pilot", lambda: not _alive(escaped) and
                            not _alive(plain), 30), (escaped, plain)
            wait_for("the pilot gone from Slurm", lambda: pilot not in squeue(), 60)
            j = wait_for("the job no longer running", lambda: (j := jobs_by_id(c)[jid]).state != "running" and j,
                         60)
            assert j.state in ("failed", "pending"), j.message
        finally:
            c.close()
            ctl.send_signal(signal.SIGTERM)  # the controller cancels its pilots, waits for them to leave, then exits
            try:
                ctl.wait(timeout=60)
            except subprocess.TimeoutExpired:
                stop(ctl)
            for p in (*_sleepers(a), *_sleepers(b)):
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
