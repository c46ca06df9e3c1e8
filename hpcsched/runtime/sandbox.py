"""How a worker confines its tasks: whom they run as, which cgroup holds each, how they start and how they die.

Every task (and every command a remote launcher starts through the worker's agent) is started through the task
guard (``task_guard.py``, exec'd: no Python between the worker's fork and exec), which drops to the task's user,
is a child subreaper for the task's tree and kills that tree when the task ends, when it is told to, and when the
worker dies (even by ``kill -9``).

Two ways to hold a task's processes, chosen when the worker starts and said on its console:

- cgroup v2, where the worker can write under its own cgroup (root on a host with the unified hierarchy, or a
  systemd unit with ``Delegate=yes``): a sub-tree ``hpcsched-<worker>-<pid>`` with one leaf per task; a kill is
  ``cgroup.kill`` on the leaf, which no fork, ``setsid`` or double fork escapes.
- otherwise a process group per task, the guard as its subreaper, and the worker itself a child subreaper
  (``PR_SET_CHILD_SUBREAPER``): a descendant that left the group (``setsid``) and lost its parents is reparented
  to the guard or the worker, which kills it (``Sandbox.sweep``).

Identities (``Identity``): where the worker runs as root, a task runs as the user the site maps its job's owner to
(``users:`` in the worker config; an owner not in the map is refused) or as the worker's one dedicated user
(``run_as:``); such a task cannot read the worker's token file, its ``/proc`` or other users' checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from hpcsched.runtime import task_guard

log = logging.getLogger("hpcsched.runtime.worker")

GUARD = str(Path(__file__).with_name("task_guard.py"))
_SPARES_LOST_MAX = 3
SWEEP_S = 0.5  # how often the worker looks for strays reparented to it
MARKER_ENV = "HPCSCHED_TASK_ID"  # in every task's environment: how a stray of a task tree is told from others


@dataclass(frozen=True, slots=True)
class Identity:
    """A local user a task runs as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def arg(self) -> str:
        return f"{self.uid}:{self.gid}:{','.join(map(str, self.groups))}"


def lookup_user(name: str) -> Identity:
    """The local user ``name`` (or a numeric uid); ValueError saying which name is unknown."""
    try:
        pw = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError):
        raise ValueError(f"no local user {name!r} on this worker") from None
    groups = tuple(sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid))))
    return Identity(pw.pw_name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir)


def runnable_problem(path: str, user: Identity) -> str:
    """Why ``user`` cannot execute ``path`` ('' when it can), from the mode bits of the file and of every folder
    above it (ACLs not read): the worker's own Python in a venv under a 0700 /root is what a task user cannot run."""
    real = os.path.realpath(path)
    chain = [str(p) for p in reversed(Path(real).parents)] + [real]
    for p in chain:
        try:
            st = os.stat(p)
        except OSError as e:
            return f"{p}: {e.strerror or e}"
        if st.st_uid == user.uid:
            bits = st.st_mode >> 6
        elif st.st_gid == user.gid or st.st_gid in user.groups:
            bits = st.st_mode >> 3
        else:
            bits = st.st_mode
        if not bits & 0o1:
            return f"{p} is not open to {user.name} (mode {stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid})"
    return ""


def cgroup2_base() -> tuple[Path | None, str]:
    """This process's own cgroup v2 folder, or None and why not (no unified hierarchy mounted)."""
    mount = None
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split()[:1] == ["cgroup2"]:
                mount = left.split()[4]
                break
        own = next((ln[3:] for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln.startswith("0::")), None)
    except OSError as e:
        return None, f"cannot read /proc: {e}"
    if mount is None or own is None:
        return None, "no cgroup v2 (unified) hierarchy is mounted"
    return Path(mount) / own.lstrip("/"), ""


class Cgroups:
    """This worker's cgroup v2 sub-tree: one leaf per task (module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def open(cls, worker: str) -> tuple[Cgroups | None, str]:
        """The sub-tree, created; or None and why it cannot be (read-only cgroupfs, not root, no v2)."""
        base, why = cgroup2_base()
        if base is None:
            return None, why
        stem = f"hpcsched-{_safe(worker)}-"
        _remove_stale(base, stem)
        root = base / f"{stem}{os.getpid()}"
        try:
            root.mkdir(exist_ok=True)
            probe = root / "probe"
            probe.mkdir(exist_ok=True)
            writable = os.access(probe / "cgroup.procs", os.W_OK)
            probe.rmdir()
        except OSError as e:
            return None, f"cannot create a cgroup under {base}: {e.strerror or e}"
        if not writable:
            with contextlib.suppress(OSError):
                root.rmdir()
            return None, f"cannot move processes into cgroups under {base}"
        return cls(root), ""

    def leaf(self, name: str) -> str:
        path = self.root / _safe(name)
        path.mkdir(exist_ok=True)
        return str(path)

    def remove(self, leaf: str) -> None:
        """Drop an emptied leaf (one still populated stays, killed again at close)."""
        with contextlib.suppress(OSError):
            os.rmdir(leaf)

    def close(self) -> None:
        for leaf in _leaves(self.root):
            task_guard.kill_cgroup(str(leaf))
        _rmdir_tree(self.root)


def _leaves(root: Path) -> list[Path]:
    try:
        return [p for p in root.iterdir() if p.is_dir()]
    except OSError:
        return []


def _rmdir_tree(root: Path) -> None:
    """rmdir the leaves then the root; a leaf whose processes are still dying is retried briefly."""
    for _ in range(50):
        for leaf in _leaves(root):
            with contextlib.suppress(OSError):
                leaf.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()
            return
        threading.Event().wait(0.02)


def _remove_stale(base: Path, stem: str) -> None:
    """Sub-trees of this worker's name whose daemon is gone (it was kill -9'd with its guards): kill what is left
    in them and remove them, so a node's cgroups do not pile up across restarts."""
    try:
        found = [p for p in base.iterdir() if p.name.startswith(stem)]
    except OSError:
        return
    for p in found:
        pid = p.name[len(stem):]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for leaf in _leaves(p):
                task_guard.kill_cgroup(str(leaf))
            _rmdir_tree(p)
            log.warning("removed the cgroups of a dead worker daemon (pid %s): %s", pid, p)


class Sandbox:
    """Starts and kills one worker's tasks (module docstring). ``cgroups``: "auto" (use them where writable) or
    "off" (process groups and subreapers only)."""

    def __init__(self, worker: str, python: str = sys.executable, cgroups: str = "auto", spare: bool = False) -> None:
        self.python = python
        # A guard started ahead of the next task (task_guard.py, --spare): a launch hands it the task over a socket
        # instead of waiting for a Python to start. Only where asked (the worker daemon), for tasks whose stdin is
        # /dev/null and whose stdout and stderr are one file (a task's launch).
        self.use_spare = spare
        self.spare: tuple[subprocess.Popen, socket.socket] | None = None
        self.spares_used = 0
        self.spares_lost = 0  # ended before they were handed a task; spares are given up after _SPARES_LOST_MAX
        self.lock = threading.Lock()
        self.leaf_of: dict[int, str | None] = {}  # pid of each guard started -> its cgroup leaf
        self.strays_killed = 0
        self.next_sweep = 0.0
        self.cgroups: Cgroups | None = None
        why = "cgroups: off in the worker config"
        if cgroups != "off":
            self.cgroups, why = Cgroups.open(worker)
        self.mode = (f"cgroup v2 ({self.cgroups.root})" if self.cgroups else
                     f"process groups + subreaper (no cgroups: {why})")
        if spare:
            self.spare = self._start_spare()
        self.subreaper = False

    def become_subreaper(self) -> None:
        """Make this process the reaper of its tasks' orphans (the daemon does; in-process tests need not)."""
        with contextlib.suppress(OSError):
            task_guard.prctl(task_guard.PR_SET_CHILD_SUBREAPER, 1)
            self.subreaper = True

    @classmethod
    def plain(cls) -> Sandbox:
        """One without cgroups, sweeping nothing: a task guard for a caller that is not a worker daemon."""
        return cls("", cgroups="off")

    def spawn(self, argv: list[str], env: dict[str, str], *, cwd: str | None = None,
              stdin: int | IO = subprocess.DEVNULL, stdout: int | IO | None = None,
              stderr: int | IO | None = subprocess.STDOUT, leaf: str | None = None,
              user: Identity | None = None) -> subprocess.Popen:
        """Start ``argv`` under a guard: in the cgroup leaf named ``leaf`` (when cgroups are on), as ``user``
        (None: the worker's own), in ``cwd`` entered as that user."""
        path = self.cgroups.leaf(leaf) if self.cgroups is not None and leaf else None
        opts = [f"--parent={os.getpid()}"]
        if path:
            opts.append(f"--cgroup={path}")
        if user is not None and user.uid != os.getuid():
            opts.append(f"--user={user.arg()}")
        if cwd:
            opts.append(f"--cwd={cwd}")
        with self.lock:
            proc = self._hand_to_spare(opts, argv, env, stdin, stdout, stderr)
            if proc is None:
                proc = subprocess.Popen([self.python, "-I", "-S", GUARD, *opts, "--", *argv], env=env, stdin=stdin,
                                        stdout=stdout, stderr=stderr, start_new_session=True)
            self.leaf_of[proc.pid] = path
        return proc

    def refill(self) -> None:
        """Start the next spare guard when the last one was used: between launches (the worker's poll loop), so a
        launch does not also pay for starting the next one."""
        if self.use_spare and self.spare is None:
            with self.lock:
                if self.spare is None:
                    self.spare = self._start_spare()

    def _start_spare(self) -> tuple[subprocess.Popen, socket.socket] | None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = subprocess.Popen([self.python, "-I", "-S", GUARD, f"--parent={os.getpid()}", "--spare", "--"],
                                    stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            log.warning("cannot start a spare task guard (%s): tasks start without one", e.strerror or e)
            ours.close()
            self.use_spare = False
            return None
        finally:
            theirs.close()
        return proc, ours

    def _hand_to_spare(self, opts: list[str], argv: list[str], env: dict[str, str], stdin: int | IO,
                       stdout: int | IO | None, stderr: int | IO | None) -> subprocess.Popen | None:
        """The spare guard, given this task (its options, command, environment and descriptors), or None when there
        is none, it is gone, or the task's descriptors are not a launch's (the caller then starts a guard)."""
        if self.spare is None or stdin != subprocess.DEVNULL or stderr != subprocess.STDOUT or stdout is None \
                or isinstance(stdout, int):
            return None
        proc, sock = self.spare
        self.spare = None
        if proc.poll() is not None:  # it ended unused: a Python that cannot start here, or killed
            sock.close()
            self.spares_lost += 1
            if self.spares_lost >= _SPARES_LOST_MAX:
                self.use_spare = False
                log.warning("%d spare task guards ended before their task (the last with %s): tasks now start a "
                            "guard each", self.spares_lost, proc.returncode)
            return None
        try:
            with open(os.devnull, "rb") as null:
                out = stdout.fileno()
                request = task_guard.encode_request([o for o in opts if not o.startswith("--parent=")], argv, env)
                socket.send_fds(sock, [request[:8]], [null.fileno(), out, out])
                sock.sendall(request[8:])
        except OSError as e:  # it died meanwhile: start a guard the usual way
            log.warning("the spare task guard (pid %s) is gone (%s): starting one", proc.pid, e.strerror or e)
            self.spares_lost += 1
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait()
            return None
        finally:
            sock.close()
        self.spares_used += 1
        return proc

    def kill_leaf(self, name: str) -> None:
        """Kill and remove a task's leaf by name, if it has one (a slot-holding task's agent-started commands)."""
        if self.cgroups is None:
            return
        path = self.cgroups.root / _safe(name)
        if path.is_dir():
            task_guard.kill_cgroup(str(path))
            self.cgroups.remove(str(path))

    def kill(self, proc: subprocess.Popen | None, leaf: str | None = None) -> None:
        """SIGKILL a task's whole tree: its cgroup leaf when it has one, else the guard's descendants and group
        (what escapes the group is reparented to a subreaper and swept)."""
        leaf = leaf or (self.leaf_of.get(proc.pid) if proc is not None else None)
        if leaf:
            task_guard.kill_cgroup(leaf)
        if proc is None or proc.returncode is not None:
            return
        for pid in task_guard.descendants(proc.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def kill_tree(self, proc: subprocess.Popen) -> None:
        """SIGKILL one guard's tree only (a remote launcher's command), not the rest of its task's cgroup."""
        if proc.returncode is not None or proc.poll() is not None:
            return
        for pid in task_guard.descendants(proc.pid):  # what left the group is reparented to a subreaper: swept
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def release(self, proc: subprocess.Popen | None, leaf: str | None = None) -> None:
        """Forget an ended task's guard and remove its emptied leaf."""
        if proc is not None:
            leaf = leaf or self.leaf_of.pop(proc.pid, None)
        if leaf and self.cgroups is not None:
            self.cgroups.remove(leaf)

    def sweep(self) -> int:
        """Kill and reap orphans of task trees reparented to this process (it is their subreaper): children it
        did not start whose environment names a task, or whose process group or session is one of its
        guards'. Returns how many it killed."""
        if not self.subreaper or time.monotonic() < self.next_sweep:
            return 0
        self.next_sweep = time.monotonic() + SWEEP_S  # a worker has dozens of threads: each one's children list read
        killed = 0
        with self.lock:
            known = set(self.leaf_of)
            for pid in task_guard.descendants_direct(os.getpid()):
                if pid in known or not _of_a_task(pid, known):
                    continue
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, 0)
        if killed:
            self.strays_killed += killed
            log.warning("killed %d process(es) that had left their task's process group (%d so far)", killed,
                        self.strays_killed)
        return killed

    def close(self) -> None:
        if self.spare is not None:
            proc, sock = self.spare
            self.spare = None
            sock.close()  # the spare reads the end of its socket and exits
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self.cgroups is not None:
            self.cgroups.close()


def _of_a_task(pid: int, guards: set[int]) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        pgid, sid = int(fields[2]), int(fields[3])
        if pgid in guards or sid in guards:
            return True
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (OSError, IndexError, ValueError):
        return False
    return any(e.startswith(f"{MARKER_ENV}=".encode()) for e in env)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"
