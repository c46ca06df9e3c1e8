"""Jobs isolated from the runtime and from each other (the worker side): each test runs the attack a hostile job
ran against a real controller and worker daemons over real gRPC (``runtime_procs``), first showing the attack
is live (the escaping process exists, the worker is stopped while its task trains), then that the fix holds.

- A task's tree escapes no kill: a ``setsid()`` daemon and a ``sleep`` under ``sh`` are gone after ``cancel``,
  the worker's SIGTERM and ``kill -9`` of the worker, with cgroup v2 leaves and with process groups plus
  subreapers (``cgroups: off``), for every launcher (``direct``, ``torchrun``, ``mpirun``, ``horovodrun``), each
  launch through the worker's spare guard.
- The lease: a worker SIGSTOPped until the controller counts it lost kills its task on SIGCONT before anything
  else; a worker whose controller stops answering stops its tasks itself, escaped daemon included, under every
  launcher.
- Credentials: the token is not in the daemon's ``/proc/PID/environ``; tasks run as their owners' mapped users
  (with a ``task_python`` they can run) and cannot read the token file, the daemon's environ or another user's
  checkpoint folder (0700, theirs), nor write into it, under every launcher; an unmapped owner and ``workdir:
  /etc`` are refused with the reason; a worker whose task users cannot run its Python says so at start.
- Disk: a launch under the free-space floor is refused with the reason; a worker started on a full disk says so in
  one line and exits non-zero.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import task_users
from runtime_procs import TOKEN, client, controller_config, start_controller, start_worker, stop, wait_for, write_secret

from hpcsched.runtime import launchers
from hpcsched.runtime.auth import metadata
from hpcsched.runtime.sandbox import Cgroups

HEARTBEAT_S, LEASE_S, CTL_GRACE_S, WORKER_GRACE_S = 0.3, 3.0, 10.0, 3.0
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="switching users, mounts and cgroups need root")


def _cgroups_writable() -> bool:
    cg, _ = Cgroups.open(f"probe-{os.getpid()}")
    if cg is None:
        return False
    cg.close()
    return True


CGROUPS = _cgroups_writable()
LAUNCHERS = ["direct", "torchrun", "mpirun", "horovodrun"]


def _sleepers(mark: str) -> list[int]:
    """Live (not zombie) processes running ``sleep <mark>``."""
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            argv = Path(f"/proc/{e}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{e}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if argv[:2] == [b"sleep", mark.encode()] and state != "Z":
            out.append(int(e))
    return out


def _guard_argv(pid: int) -> list[bytes]:
    """The command line of the task guard above ``pid`` (its parents, up to the guard)."""
    while pid > 1:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if any(a.endswith(b"task_guard.py") for a in argv):
            return argv
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError("no task guard above the task")


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _session(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def _job(d: Path, name: str, command: str, launcher: str = "direct", workdir: Path | str | None = None) -> str:
    return (f"name: {name}\nlauncher: {launcher}\nprocs: 1\nworkdir: {workdir or d}\n"
            f"command: [sh, -c, {command!r}]\n")


def _cluster(d: Path, worker_args: tuple[str, ...] = (), **ctl: object):
    cfg = controller_config(d, heartbeat_interval_s=HEARTBEAT_S, worker_timeout_s=LEASE_S, stop_grace_s=CTL_GRACE_S,
                            **ctl)
    ctl_proc, addr = start_controller(d, cfg)
    worker = start_worker(d, addr, "w0", extra=("--stop-grace", str(WORKER_GRACE_S), *worker_args))
    c = client(addr)
    wait_for("the worker registered", lambda: any(w.alive for w in c.workers()), 60)
    return ctl_proc, worker, c


def _gone(mark: str, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not _sleepers(mark):
            return True
        time.sleep(0.1)
    return not _sleepers(mark)


# -------------------------------------------------------------------------------- whole trees, every kill
KILLS = [("cgroup", "cancel", "direct"), ("cgroup", "sigterm", "direct"), ("cgroup", "kill9", "direct"),
         ("fallback", "cancel", "direct"), ("fallback", "sigterm", "direct"), ("fallback", "kill9", "direct"),
         ("fallback", "cancel", "mpirun"), ("cgroup", "kill9", "mpirun"), ("fallback", "kill9", "mpirun"),
         ("cgroup", "sigterm", "mpirun"), ("fallback", "cancel", "torchrun"), ("cgroup", "kill9", "torchrun"),
         ("fallback", "sigterm", "torchrun"), ("cgroup", "cancel", "horovodrun"), ("fallback", "kill9", "horovodrun"),
         ("cgroup", "sigterm", "horovodrun")]


@pytest.mark.parametrize(("mode", "kill", "launcher"), KILLS, ids=["-".join(k) for k in KILLS])
def test_a_task_tree_escapes_no_kill(tmp_path: Path, mode: str, kill: str, launcher: str) -> None:
    if mode == "cgroup" and not CGROUPS:
        pytest.skip("cgroup v2 is not writable here: only the process-group path can be tested")
    if launcher not in launchers.available():
        pytest.skip(f"{launcher} is not installed here")
    a, b = str(9000 + secrets.randbelow(50000)), str(60000 + secrets.randbelow(5000))
    orphan = str(65000 + secrets.randbelow(500))  # a double fork: its parent, a subshell, exits at once
    args = ("--cgroups", "off") if mode == "fallback" else ()
    ctl, worker, c = _cluster(tmp_path, args)
    try:
        log = (tmp_path / "w0.log").read_text()
        assert ("cgroup v2" if mode == "cgroup" else "process groups + subreaper") in log, log[-2000:]
        jid = c.submit(_job(tmp_path, "escape", f"(setsid sleep {orphan} &); setsid sleep {a} & sleep {b} & wait",
                                launcher), "escape.yaml")
        wait_for("the sleeps started", lambda: _sleepers(a) and _sleepers(b) and _sleepers(orphan), 60)
        (escaped,) = _sleepers(a)
        assert _session(escaped) == escaped, "the attack: setsid() left the task's session"
        (double,) = _sleepers(orphan)
        # orphaned, yet still in the task's tree (reparented to a subreaper there, the guard), not to init
        assert _parent(double) != 1 and _guard_argv(_parent(double))
        guard = _guard_argv(_sleepers(b)[0])
        assert b"--spare" in guard, f"the launch did not go through the worker's spare guard: {guard}"
        if kill == "cancel":
            assert c.cancel(jid).cancelled
            within = CTL_GRACE_S + 10 * HEARTBEAT_S + 10
        elif kill == "sigterm":
            worker.send_signal(signal.SIGTERM)
            within = WORKER_GRACE_S + 10
        else:
            worker.send_signal(signal.SIGKILL)
            within = 10.0
        assert _gone(a, within) and _gone(b, 1.0) and _gone(orphan, 1.0), (
            f"left after {kill}: {_sleepers(a)} {_sleepers(b)} {_sleepers(orphan)}",
            (tmp_path / "w0.log").read_text()[-3000:])
    finally:
        for p in (*_sleepers(a), *_sleepers(b), *_sleepers(orphan)):
            os.kill(p, signal.SIGKILL)
        c.close()
        stop(worker)
        stop(ctl)


def test_remote_commands_of_a_job_across_workers_die_with_it(tmp_path: Path) -> None:
    """mpirun across two workers: the rank on the second node is started by that worker's agent (the rsh agent,
    no ssh) under a guard; a cancel takes it, and kill -9 of that worker takes it too."""
    if "mpirun" not in launchers.available():
        pytest.skip("mpirun is not installed here")
    a, b = str(9000 + secrets.randbelow(50000)), str(60000 + secrets.randbelow(5000))
    ctl, w0, c = _cluster(tmp_path)
    w1 = start_worker(tmp_path, c.address, "w1", extra=("--stop-grace", str(WORKER_GRACE_S)))
    try:
        wait_for("two workers", lambda: sum(w.alive for w in c.workers()) == 2, 60)
        text = _job(tmp_path, "two", f"setsid sleep {a} & sleep {b} & wait", "mpirun").replace("procs: 1", "procs: 2")
        jid = c.submit(text, "two.yaml")
        wait_for("a rank on each worker", lambda: len(_sleepers(a)) == 2 and len(_sleepers(b)) == 2, 90)
        w1.send_signal(signal.SIGKILL)  # the remote node's worker dies: its orted's tree goes with it
        assert wait_for("the remote rank gone", lambda: len(_sleepers(a)) <= 1 and len(_sleepers(b)) <= 1, 15)
        c.cancel(jid)  # (it may have failed already, its peer gone) the first node's tree goes either way
        assert _gone(a, CTL_GRACE_S + 10 * HEARTBEAT_S + 10) and _gone(b, 1.0), (_sleepers(a), _sleepers(b))
    finally:
        for p in (*_sleepers(a), *_sleepers(b)):
            os.kill(p, signal.SIGKILL)
        c.close()
        stop(w1)
        stop(w0)
        stop(ctl)


# ------------------------------------------------------------------------------------------------- lease
def test_a_stopped_worker_resumed_after_it_was_lost_kills_its_task_first(tmp_path: Path) -> None:
    mark = str(9000 + secrets.randbelow(50000))
    ctl, worker, c = _cluster(tmp_path, max_restarts=3)
    try:
        jid = c.submit(_job(tmp_path, "hung", f"sleep {mark}"), "hung.yaml")
        wait_for("the task runs", lambda: _sleepers(mark), 60)
        worker.send_signal(signal.SIGSTOP)
        lost = wait_for("the controller counts the worker lost", lambda: (j := {x.job_id: x for x in c.jobs()}[jid])
                        .restarts >= 1 and j, LEASE_S * 4 + 20)
        assert "silent" in lost.message and "lease" in lost.message, lost.message
        assert _sleepers(mark), "the attack: the lost worker's task still runs while the worker is stopped"
        worker.send_signal(signal.SIGCONT)
        assert _gone(mark, 5.0), "a worker resumed past its lease kept its task"
        log = (tmp_path / "w0.log").read_text()
        assert "past this worker's lease" in log and "SIGKILL" in log, log[-2000:]
        # the fence says where the silence was: here, this worker's own loop (stopped), not an unanswered heartbeat
        gap = re.search(r"the lease was last checked (\d+\.\d) s before", log)
        assert gap is not None and float(gap.group(1)) >= LEASE_S / 2, log[-2000:]
        assert "last looked for silent workers" in (tmp_path / "controller.log").read_text()
    finally:
        with_sigcont(worker)
        c.close()
        stop(worker)
        stop(ctl)


def with_sigcont(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_worker_its_controller_stops_answering_stops_its_tasks_itself(tmp_path: Path, launcher: str) -> None:
    """A hung controller (SIGSTOP: connections open, no answer) is a partition to the worker: not a controller
    that is down (which would count no one lost), so the lease runs out and the worker stops its task: the
    launcher's whole tree, an escaped ``setsid`` daemon included."""
    if launcher not in launchers.available():
        pytest.skip(f"{launcher} is not installed here")
    mark, escaped = str(9000 + secrets.randbelow(50000)), str(60000 + secrets.randbelow(5000))
    ctl, worker, c = _cluster(tmp_path)
    try:
        c.submit(_job(tmp_path, "cut", f"setsid sleep {escaped} & sleep {mark}", launcher), "cut.yaml")
        wait_for("the task runs", lambda: _sleepers(mark) and _sleepers(escaped), 90)
        ctl.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        assert _gone(mark, LEASE_S + WORKER_GRACE_S + 10), "the task outlived its worker's lease"
        assert time.monotonic() - t0 >= LEASE_S - 1.0, "stopped before the lease ran out"
        assert _gone(escaped, 5.0), "the escaped daemon outlived its worker's lease"
        log = (tmp_path / "w0.log").read_text()
        # the fence says where the silence was: here, a heartbeat the stopped controller never answered
        assert "past this worker's lease" in log and "is still unanswered" in log, log[-2000:]
    finally:
        with_sigcont(ctl)
        for p in (*_sleepers(mark), *_sleepers(escaped)):
            os.kill(p, signal.SIGKILL)
        c.close()
        stop(worker)
        stop(ctl)


# ------------------------------------------------------------------------------------------- credentials
@pytest.fixture
def two_users():
    with task_users.throwaway_users(2) as users:
        yield users


@pytest.fixture
def open_dir():
    with task_users.open_folder() as d:
        yield d


def _log_of(d: Path, jid: str) -> str:
    return "\n".join(p.read_text() for p in (d / "run" / "w0").glob(f"{jid}.g*/output.log"))


@pytest.fixture(scope="module")
def task_python():
    with task_users.task_python() as python:
        yield python


LAUNCHER_MARK = {"direct": "LOCAL_WORLD_SIZE", "torchrun": "TORCHELASTIC_RUN_ID", "mpirun": "OMPI_COMM_WORLD_SIZE",
                 "horovodrun": "HOROVOD_SIZE"}  # a variable only that launcher sets: the job did run under it


@needs_root
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_tasks_run_as_their_owners_and_cannot_read_credentials_or_each_other(open_dir: Path, two_users, task_python,
                                                                            launcher: str) -> None:
    if launcher not in launchers.available():
        pytest.skip(f"{launcher} is not installed here")
    alice_u, bob_u = two_users
    d = open_dir
    jobs_dir = d / "jobs"
    jobs_dir.mkdir(mode=0o755)
    write_secret(d / "worker.token", "worker-tok-9z")
    alice_t, bob_t, carol_t = (write_secret(d / f"{n}.token", f"{n}-tok-{secrets.token_hex(4)}")
                               for n in ("alice", "bob", "carol"))
    cfg = controller_config(d, heartbeat_interval_s=HEARTBEAT_S, worker_timeout_s=LEASE_S, max_restarts=0,
                            worker_token_file="worker.token")
    cfg.write_text(cfg.read_text() + f"user_tokens:\n  alice: {alice_t}\n  bob: {bob_t}\n  carol: {carol_t}\n")
    wcfg = d / "worker.yaml"
    wcfg.write_text(f"users:\n  alice: {alice_u.pw_name}\n  bob: {bob_u.pw_name}\n"
                    f"allowed_workdirs: [{jobs_dir}]\ntask_python: {task_python}\n")
    ctl, addr = start_controller(d, cfg)
    worker = start_worker(d, addr, "w0", token="worker-tok-9z", extra=("--config", str(wcfg)))
    users = {n: client(addr) for n in ("alice", "bob", "carol")}
    for n, c in users.items():
        c.md = metadata((d / f"{n}.token").read_text().strip())
    try:
        wait_for("the worker registered", lambda: "registered with" in (d / "w0.log").read_text(), 60)
        assert "cannot run" not in (d / "w0.log").read_text(), "the task users can run task_python"
        assert b"worker-tok-9z" not in Path(f"/proc/{worker.pid}/environ").read_bytes(), "token in /proc environ"
        ckpt_root = d / "run" / "ckpt"
        mark = LAUNCHER_MARK[launcher]
        a = users["alice"].submit(_job(d, "a", "id -un; echo alice-secret > $HPCSCHED_CHECKPOINT_DIR/s", launcher,
                                       jobs_dir), "a.yaml")
        final = ("completed", "failed", "cancelled")
        wait_for("alice's job ended", lambda: {j.job_id: j for j in users["alice"].jobs()}[a].state in final, 90)
        attack = (f"id -un; echo under=${{{mark}+yes}}; cat {ckpt_root}/{a}/s; echo x > {ckpt_root}/{a}/evil; "
                  f"cat /proc/{worker.pid}/environ; cat {d}/worker.token; cat {d}/token; exit 0")
        b = users["bob"].submit(_job(d, "b", attack, launcher, jobs_dir), "b.yaml")
        carol = users["carol"].submit(_job(d, "c", "exit 0", launcher, jobs_dir), "c.yaml")
        etc = users["alice"].submit(_job(d, "etc", "cat shadow", launcher, "/etc"), "etc.yaml")
        admin = client(addr)
        done = wait_for("every job ended", lambda: (js := {j.job_id: j for j in admin.jobs()}) and all(
            js[x].state in final for x in (b, carol, etc)) and js, 120)
        assert done[a].state == "completed" and alice_u.pw_name in _log_of(d, a), (done[a].message, _log_of(d, a))
        out = _log_of(d, b)
        assert done[b].state == "completed" and bob_u.pw_name in out, (done[b].message, out)
        assert "under=yes" in out, f"not run under {launcher}: {out}"
        assert "alice-secret" not in out and "worker-tok-9z" not in out and TOKEN not in out, out
        assert out.count("Permission denied") >= 5, out
        assert not (ckpt_root / a / "evil").exists()
        st = (ckpt_root / a).stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (alice_u.pw_uid, 0o700)
        assert done[carol].state == "failed" and "not in this worker's user map" in done[carol].message
        assert done[etc].state == "failed" and "workdir: /etc is outside" in done[etc].message, done[etc].message
        admin.close()
    finally:
        for c in users.values():
            c.close()
        stop(worker)
        stop(ctl)


@needs_root
def test_a_worker_says_when_its_task_users_cannot_run_its_python(open_dir: Path, two_users) -> None:
    """The suite's interpreter is under /root (0700 here): a worker mapping users without a task_python they can
    run says so at start, naming the user and the folder, instead of every job failing with a bare denial."""
    private = next((p for p in Path(os.path.realpath(sys.executable)).parents if stat.S_IMODE(p.stat().st_mode)
                    & 0o001 == 0), None)
    if private is None:
        pytest.skip(f"{sys.executable} is open to every user here: nothing to warn about")
    user = two_users[0]
    ctl, worker, c = _cluster(open_dir, ("--run-as", user.pw_name))
    try:
        log = (open_dir / "w0.log").read_text()
        assert f"tasks run as {user.pw_name} cannot run" in log and f"{private} is not open to" in log, log[-2000:]
        assert "task_python" in log
    finally:
        c.close()
        stop(worker)
        stop(ctl)


@needs_root
def test_run_as_one_unprivileged_user(open_dir: Path, two_users) -> None:
    """``--run-as``: every task of the worker as that user, even where the worker's token file sits beside it; its
    workdir may be the user's home (allowed by default), not the folder of the worker's token."""
    user = two_users[0]
    tmp_path = open_dir
    mark = str(9000 + secrets.randbelow(50000))
    ctl, worker, c = _cluster(tmp_path, ("--run-as", user.pw_name))
    try:
        refused = c.submit(_job(tmp_path, "r", "exit 0", "mpirun"), "refused.yaml")
        jid = c.submit(_job(tmp_path, "r", f"cat {tmp_path}/token; sleep {mark}", "mpirun", user.pw_dir), "r.yaml")
        (pid,) = wait_for("the task runs", lambda: _sleepers(mark), 60)
        assert os.stat(f"/proc/{pid}").st_uid == user.pw_uid
        assert c.cancel(jid).cancelled
        assert _gone(mark, CTL_GRACE_S + 10)
        out = _log_of(tmp_path, jid)
        assert "Permission denied" in out and TOKEN not in out, out
        why = {j.job_id: j for j in c.jobs()}[refused].message
        assert "is outside the folders this worker allows" in why, why
    finally:
        c.close()
        stop(worker)
        stop(ctl)


# -------------------------------------------------------------------------------------------------- disk
@pytest.fixture
def small_disk(tmp_path: Path):
    if not ROOT:
        pytest.skip("mounting a small file system needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_launch_under_the_free_space_floor_is_refused(tmp_path: Path, small_disk: Path) -> None:
    wcfg = tmp_path / "worker.yaml"
    wcfg.write_text("min_free_mb: 20\n")
    cfg = controller_config(tmp_path, heartbeat_interval_s=HEARTBEAT_S, max_restarts=0,
                            checkpoint_root=str(small_disk / "ckpt"))
    ctl, addr = start_controller(tmp_path, cfg)
    worker = start_worker(tmp_path, addr, "w0", extra=("--config", str(wcfg)))
    c = client(addr)
    try:
        wait_for("the worker registered", lambda: any(w.alive for w in c.workers()), 60)
        with open(small_disk / "filler", "wb") as f:  # what a dd job did to a shared checkpoint disk
            f.write(b"\0" * (30 << 20))
        jid = c.submit(_job(tmp_path, "full", "exit 0"), "full.yaml")
        j = wait_for("the job failed", lambda: (x := {y.job_id: y for y in c.jobs()}[jid]).state == "failed" and x, 60)
        assert "MB free at" in j.message and "min_free_mb" in j.message, j.message
        assert worker.poll() is None
    finally:
        c.close()
        stop(worker)
        stop(ctl)


def test_a_worker_started_on_a_full_disk_says_so_and_exits(tmp_path: Path, small_disk: Path) -> None:
    with open(small_disk / "filler", "wb") as f:
        f.write(b"\0" * (39 << 20))
    done = subprocess.run([sys.executable, "-m", "hpcsched.runtime", "worker", "--controller", "127.0.0.1:9",
                           "--name", "w0", "--work-dir", str(small_disk / "w0")], capture_output=True, text=True,
                          timeout=120, env=os.environ | {"HPCSCHED_TOKEN": TOKEN})
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "MB free" in done.stderr, done.stderr
    assert len([ln for ln in done.stderr.splitlines() if "error" in ln.lower()]) == 1, done.stderr


@needs_root
def test_a_worker_refuses_identities_it_cannot_use_in_one_line(tmp_path: Path) -> None:
    """An unknown ``run_as`` user, or a ``users`` entry naming none, stops the worker at start with the key."""
    bad = tmp_path / "worker.yaml"
    bad.write_text("users:\n  alice: no-such-user-hpcs\n")
    for extra in (["--run-as", "no-such-user-hpcs"], ["--config", str(bad)]):
        done = subprocess.run([sys.executable, "-m", "hpcsched.runtime", "worker", "--controller", "127.0.0.1:9",
                               "--name", "w0", "--work-dir", str(tmp_path / "w0"), *extra], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
        assert "no local user 'no-such-user-hpcs'" in line and ("run_as" in line or "users: alice" in line), line
