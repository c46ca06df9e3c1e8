"""The controller's own defences (issue 26, items 5, 6 and 8): each reproduced with real processes first.

Seen: a controller with no tokens on 0.0.0.0 started with one INFO line; a world-readable TLS key was accepted where a
token file of that mode was refused; two controllers on one state through a hard link corrupted it, and a wrong
``state:`` path was chmod'ed (through a symlink) before it was refused; a job filling the shared disk made every
submit fail with ``UNKNOWN: database or disk is full`` and the log fill with tracebacks, and a failing job spent
all its attempts in 20 s; ``submit`` of a named pipe hung, and an error quoted the first line of /etc/shadow.

Network: the off-loopback controller runs in a network namespace of its own (``unshare -n``: only its own
loopback exists there). Disk: the small disk is a tmpfs mounted in a mount namespace of the controller's own
(``unshare -m``), filled from here through ``/proc/PID/root``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_procs import client, controller_config, start_controller, start_worker, stop, wait_for

from hpcsched.runtime.client import Client, ClientError
from hpcsched.runtime.store import Store


def _can(*cmd: str) -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", *cmd, "true"], capture_output=True).returncode == 0


NETNS = pytest.mark.skipif(not _can("-n"), reason="needs unshare -n (root or user namespaces) for a private network")
MOUNTNS = pytest.mark.skipif(not _can("-m"), reason="needs unshare -m (root or user namespaces) for a small tmpfs")
CLI = [sys.executable, "-m", "hpcsched.runtime"]


def _config(d: Path, **keys: object) -> Path:
    cfg = {"listen": "127.0.0.1:0", "address_file": "run/controller.addr", "state": "run/state.db",
           "checkpoint_root": "run/ckpt", "schedule_interval_s": 0.2} | keys
    p = d / "controller.yaml"
    p.write_text("".join(f"{k}: {v}\n" for k, v in cfg.items()))
    return p


def _refused(d: Path, *args: str, prefix: tuple[str, ...] = ()) -> str:
    """Run ``controller`` expecting a refusal: exit 2, one clear line, no traceback. Its stderr."""
    r = subprocess.run([*prefix, *CLI, "controller", "--config", str(d / "controller.yaml"), *args], cwd=d,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.startswith("error: "), r.stderr
    return r.stderr


def _started(d: Path, *args: str, prefix: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """A controller process that must start: (process, its address)."""
    addr = d / "run" / "controller.addr"
    addr.unlink(missing_ok=True)
    log = open(d / "controller.log", "a")
    proc = subprocess.Popen([*prefix, *CLI, "controller", "--config", str(d / "controller.yaml"), *args], cwd=d,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for("the controller's address", lambda: addr.exists() or proc.poll() is not None, 90, poll=0.1)
    except AssertionError:
        stop(proc)
        raise
    assert proc.poll() is None, (d / "controller.log").read_text()
    return proc, addr.read_text().strip()


# ------------------------------------------------------------------------------------------ item 5: auth off
@NETNS
def test_no_tokens_off_loopback_is_refused_unless_insecure_and_then_warned(tmp_path: Path) -> None:
    _config(tmp_path, listen="0.0.0.0:0")
    netns = ("unshare", "-n")  # 0.0.0.0 here is this namespace's own loopback only
    err = _refused(tmp_path, prefix=netns)
    assert "0.0.0.0 is not a loopback address and no token is set" in err and "--insecure" in err
    proc, _ = _started(tmp_path, "--insecure", prefix=netns)
    stop(proc)
    log = (tmp_path / "controller.log").read_text()
    assert "WARNING INSECURE (--insecure): no tokens on 0.0.0.0:" in log, log


def test_a_tls_key_others_can_read_is_refused_like_a_token_file(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nnot-shown\n")
    key.chmod(0o644)
    _config(tmp_path, tls_cert="cert.pem", tls_key="key.pem", token_file="token")
    (tmp_path / "token").write_text("t0k\n")
    (tmp_path / "token").chmod(0o600)
    err = _refused(tmp_path)
    assert f"{key}: TLS private key is accessible by others (mode 0644)" in err and "chmod 600" in err
    assert "not-shown" not in err


# -------------------------------------------------------------------------------------- item 8: the state file
def test_a_state_with_two_names_or_another_owner_is_refused_before_any_chmod(tmp_path: Path) -> None:
    d = tmp_path
    _config(d)
    run = d / "run"
    run.mkdir()
    state = run / "state.db"
    state.write_bytes(b"")
    state.chmod(0o644)
    os.link(state, d / "other-name.db")  # a second controller's state: through this name it takes another lock
    assert "has 2 hard links" in _refused(d)
    assert (state.stat().st_mode & 0o777) == 0o644, "refused before it was changed"
    (d / "other-name.db").unlink()
    state.unlink()
    target = d / "someone-elses.txt"
    target.write_text("x\n")
    target.chmod(0o644)
    state.symlink_to(target)
    assert "is a symbolic link" in _refused(d)
    assert (target.stat().st_mode & 0o777) == 0o644, "chmod never follows the link"
    state.unlink()
    state.mkdir()
    assert "is not a regular file" in _refused(d)
    state.rmdir()
    if os.geteuid() == 0:
        state.write_bytes(b"")
        state.chmod(0o644)
        os.chown(state, 65534, 65534)
        assert "belongs to uid 65534" in _refused(d)
        assert (state.stat().st_mode & 0o777) == 0o644


# ------------------------------------------------------------------------------------------- item 6: the disk
def test_a_disk_under_the_floor_refuses_the_start(tmp_path: Path) -> None:
    _config(tmp_path, state_min_free="'99.9%'")
    err = _refused(tmp_path)
    assert "the controller does not start: only" in err and "under state_min_free (99.9% of the filesystem" in err
    assert not (tmp_path / "run" / "state.db").exists(), "nothing written on a disk under the floor"
    _config(tmp_path, state_min_free="lots")
    assert "state_min_free: expected bytes" in _refused(tmp_path)


def _small_disk(d: Path, size_mb: int) -> tuple[str, ...]:
    """The prefix that runs the controller with ``d/small`` a tmpfs of ``size_mb`` in its own mount namespace."""
    (d / "small").mkdir()
    return ("unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={size_mb}m tmpfs "$0" && exec "$@"', str(d / "small"))


def _fill(proc: subprocess.Popen, d: Path, leave_bytes: int) -> Path:
    """Fill the controller's small disk from here (through its mount namespace) until ``leave_bytes`` are free."""
    small = Path(f"/proc/{proc.pid}/root") / str(d / "small").lstrip("/")
    st = os.statvfs(small)
    fill = small / "filler"
    with open(fill, "ab") as f:
        left = st.f_bavail * st.f_frsize - leave_bytes
        try:
            while left > 0:
                left -= f.write(b"\0" * min(left, 1 << 20))
                f.flush()
        except OSError:  # ENOSPC: full
            pass
    return fill


def _job(d: Path) -> str:
    return f"name: j\nlauncher: direct\nworkdir: {d}\ncommand: [sh, -c, 'exit 0']\nenv: {{PAD: '{'x' * 4000}'}}\n"


@MOUNTNS
def test_submits_under_the_floor_are_refused_with_a_clear_message(tmp_path: Path) -> None:
    d = tmp_path
    _config(d, state="small/state.db", state_min_free="4MiB")
    proc, address = _started(d, prefix=_small_disk(d, 16))
    c = Client(address, None)
    try:
        assert c.submit(_job(d), "j.yaml") == "j0001"
        filler = _fill(proc, d, 2 << 20)
        time.sleep(1.1)  # the free space is measured at most once a second
        with pytest.raises(ClientError) as e:
            c.submit(_job(d), "j.yaml")
        msg = str(e.value)
        assert "RESOURCE_EXHAUSTED: submits are refused for now: only" in msg and "under state_min_free (4.0 MiB" in msg
        assert "database or disk is full" not in msg
        filler.unlink()
        assert wait_for("submits accepted again", lambda: _try_submit(c, d), 30) == "j0002"
    finally:
        c.close()
        stop(proc)


def _try_submit(c: Client, d: Path) -> str | None:
    try:
        return c.submit(_job(d), "j.yaml")
    except ClientError:
        return None


@MOUNTNS
def test_a_full_disk_is_one_clear_error_and_one_log_line_per_interval(tmp_path: Path) -> None:
    d = tmp_path
    _config(d, state="small/state.db", state_min_free=0)  # no floor: SQLite itself meets the full disk
    proc, address = _started(d, prefix=_small_disk(d, 8))
    c = Client(address, None)
    errors: list[str] = []
    try:
        _fill(proc, d, 0)
        for _ in range(60):  # the WAL may hold a few more before SQLite needs a new page
            try:
                c.submit(_job(d), "j.yaml")
            except ClientError as e:
                errors.append(str(e))
        time.sleep(2)  # the scheduling loop ticks on the full disk meanwhile
    finally:
        c.close()
        stop(proc)
    assert len(errors) >= 40, errors
    assert all("RESOURCE_EXHAUSTED: the controller's state disk is full" in e for e in errors), set(errors)
    log = (d / "controller.log").read_text()
    assert "Traceback" not in log and "Exception calling application" not in log
    full = [ln for ln in log.splitlines() if "its disk is full" in ln]
    assert 1 <= len(full) <= 3, full  # one per 10 s interval, with the count of those not logged


# --------------------------------------------------------------------------------------- item 6: the back-off
@pytest.mark.slow
def test_failed_attempts_back_off_exponentially_and_say_when(tmp_path: Path) -> None:
    d = tmp_path
    config = controller_config(d, max_restarts=3, retry_backoff_s=1.5, retry_backoff_max_s=3)
    ctl, address = start_controller(d, config)
    worker = start_worker(d, address, "w0")
    seen: set[str] = set()
    try:
        c = client(address)
        wait_for("the worker", lambda: any(w.alive for w in c.workers()), 90)
        jid = c.submit(f"name: f\nlauncher: direct\nworkdir: {d}\ncommand: [sh, -c, 'exit 1']\n", "f.yaml")

        def ended():
            j = next(j for j in c.jobs() if j.job_id == jid)
            seen.add(j.message)
            return j if j.state == "failed" else None

        job = wait_for("the job to fail", ended, 120, poll=0.2)
        c.close()
    finally:
        stop(worker)
        stop(ctl)
    assert job.restarts == 4 and "failed 4 attempts" in job.message
    st = Store(d / "run" / "state.db", query_only=True)
    try:
        events = st.events(jid)
    finally:
        st.close()
    stopped = [e["time"] for e in events if e["kind"] == "stopped"]
    starts = [e["time"] for e in events if e["kind"] == "start"]
    assert len(starts) == 4 and len(stopped) == 4, events
    gaps = [round(starts[k + 1] - stopped[k], 2) for k in range(3)]
    # retry 1 at once (a lost node resumes as before); retry 2 after 1.5 s; retry 3 after 3 s (the cap)
    assert gaps[1] >= 1.5 and gaps[2] >= 3.0, gaps
    assert any("retry 2 of 3 at" in m and "UTC (in 1.5 s)" in m for m in seen), seen


# ------------------------------------------------------------------------------------------ item 8: submit
def test_submit_refuses_a_pipe_or_device_at_once_and_never_quotes_what_it_refused(tmp_path: Path) -> None:
    d = tmp_path
    os.mkfifo(d / "pipe.yaml")
    secret = d / "shadow"
    secret.write_text("root:$6$SECRETHASH:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n")
    secret.chmod(0o600)
    (d / "job.yaml").symlink_to(secret)
    (d / "keys.yaml").write_text("name: j\n'SECRET value with spaces': 1\n")
    env = os.environ | {"HPCSCHED_CONTROLLER": "127.0.0.1:9"}  # never reached: refused before any RPC
    out = {}
    for name in ("pipe.yaml", "job.yaml", "keys.yaml", "/dev/zero"):
        t0 = time.monotonic()
        try:
            r = subprocess.run([*CLI, "submit", name], cwd=d, capture_output=True, text=True, timeout=60, env=env)
        except subprocess.TimeoutExpired:
            pytest.fail(f"submit {name} hung")
        out[name] = (r.returncode, r.stderr, time.monotonic() - t0)
    for name, (rc, err, _) in out.items():
        assert rc == 2 and "Traceback" not in err and "SECRET" not in err, (name, err)
    assert "pipe.yaml: is a named pipe (FIFO), not a job file" in out["pipe.yaml"][1]
    assert "/dev/zero: is a device, not a job file" in out["/dev/zero"][1]
    assert "job.yaml:1: a key that is not a key name (not shown): unknown key" in out["job.yaml"][1]
    assert "keys.yaml:2: a key that is not a key name (not shown)" in out["keys.yaml"][1]


def test_submit_still_names_a_misspelt_key(tmp_path: Path) -> None:
    (tmp_path / "j.yaml").write_text(json.dumps({"name": "j", "comand": ["x"]}))
    r = subprocess.run([*CLI, "submit", "j.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env=os.environ | {"HPCSCHED_CONTROLLER": "127.0.0.1:9"})
    assert r.returncode == 2 and "j.yaml:1: comand: unknown key" in r.stderr, r.stderr
