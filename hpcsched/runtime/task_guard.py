"""The task guard: the one process a worker starts for each task (and each remote launcher's command), which then
starts the task and makes sure nothing of it outlives its end, its kill or its worker.

Run as a file (``python -I -S task_guard.py [options] -- ARGV...``), standard library only: it is exec'd by the
worker (no Python runs in the worker's forked child, whose gRPC threads hold locks), and it is single-threaded,
so it may fork and drop privileges itself. What it does, in order:

1. ``PR_SET_PDEATHSIG`` (SIGUSR1) towards the worker, then checks the worker is still its parent: a worker that
   dies, even by ``kill -9``, tells its guards. ``PR_SET_PDEATHSIG`` on the task alone is not enough: a task's
   grandchildren (a ``sleep`` under ``sh``) and anything that called ``setsid()`` never got it.
2. ``PR_SET_CHILD_SUBREAPER``: every orphan of the task's tree (a double fork, a ``setsid`` daemon) is reparented
   to the guard, so the guard can always find and kill the whole tree.
3. ``--cgroup DIR``: joins that cgroup (v2) before the fork, so the task and everything it starts are in it and
   ``cgroup.kill`` takes them all, whatever they do with sessions and process groups.
4. Forks the task: the child drops to ``--user UID:GID[:GROUPS]`` (after the cgroup join, which needs root),
   enters ``--cwd`` as that user (a root ``chdir`` would let it start in a folder it may not enter) and execs.
5. Forwards SIGTERM, SIGINT and SIGHUP to the task (the launcher forwards them to its programs: a checkpoint
   request), reaps orphans, and when the task ends kills whatever of its tree is left and exits as it did (the
   same code, or the same signal).

On SIGUSR1 (its worker died) or SIGUSR2 (the worker's hard kill) it SIGKILLs the whole tree, and its cgroup too
(``cgroup.kill``), itself included.

A *spare* guard (``--spare``, no command) is started by a worker ahead of its next task, so that the task's start
does not wait for a Python to start (tens of ms on a loaded node): it does steps 1 and 2, then waits on its stdin,
a Unix socket, for the task (``receive``: its options, command and environment, and its stdin, stdout and stderr
as descriptors), and goes on from step 3. The worker closing the socket (it stopped, or died) ends it.
"""

from __future__ import annotations

import _signal as signal  # the C module: ``signal`` imports enum, 40-90 ms of every task's start on a busy node
import ctypes
import os
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CANNOT_START = 127
WORKER_DIED = signal.SIGUSR1
KILL_TREE = signal.SIGUSR2
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def descendants_direct(pid: int) -> list[int]:
    """The children of ``pid`` (all its threads'), from /proc."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            continue
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, read from /proc's children lists (parents before their children)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = descendants_direct(todo.pop())
        out += kids
        todo += kids
    return out


def kill_tree(root: int, cgroup: str | None) -> None:
    """SIGKILL everything below ``root`` until nothing is left (a process may fork while it is walked), then the
    cgroup as a whole. Stopping each first keeps a forking process from adding children behind the walk."""
    for _ in range(50):
        pids = descendants(root)
        if not pids:
            break
        _signal_each(pids, signal.SIGSTOP)
        _signal_each(pids, signal.SIGKILL)
        _reap_all()
    if cgroup:
        kill_cgroup(cgroup)


def kill_cgroup(path: str) -> None:
    """``cgroup.kill`` (Linux 5.14+), else SIGKILL of every member listed in ``cgroup.procs`` until it is empty."""
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
        return
    except OSError:
        pass
    for _ in range(50):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(x) for x in f.read().split() if int(x) != os.getpid()]
        except OSError:
            return
        if not pids:
            return
        _signal_each(pids, signal.SIGKILL)


def _signal_each(pids: list[int], sig: int) -> None:
    """Signal each process; one that is already gone is no error."""
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    if "--" not in argv:
        raise SystemExit("task_guard: usage: task_guard.py [--parent PID] [--cgroup DIR] [--user UID:GID[:G,..]] "
                         "[--cwd DIR] [--spare] -- ARGV...")
    k = argv.index("--")
    opts: dict[str, str] = {}
    for a in argv[:k]:
        name, _, value = a.partition("=")
        opts[name.lstrip("-")] = value
    if not argv[k + 1:] and "spare" not in opts:
        raise SystemExit("task_guard: empty command")
    return opts, argv[k + 1:]


def encode_request(opts: list[str], argv: list[str], env: dict[str, str]) -> bytes:
    """What a worker sends a spare guard (``receive``): the options, the command and the environment as NUL-separated
    fields after their counts, behind an 8-byte length."""
    fields = [str(len(opts)), *opts, str(len(argv)), *argv, *(f"{k}={v}" for k, v in env.items())]
    body = "\0".join(fields).encode("utf-8", "surrogateescape")
    return len(body).to_bytes(8, "big") + body


def receive(fd: int) -> tuple[list[str], list[str], dict[str, str], list[int]] | None:
    """A spare guard's task, from the socket on ``fd``: options, command, environment and the task's stdin, stdout,
    stderr; None when the worker closed it (stopped or died) before sending one."""
    import socket  # only spares pay for it, before their task is asked for

    sock = socket.socket(fileno=fd)
    data, fds, _, _ = socket.recv_fds(sock, 8, 3)
    if not data:
        return None
    while len(data) < 8:
        more = sock.recv(8 - len(data))
        if not more:
            return None
        data += more
    size, chunks = int.from_bytes(data, "big"), []
    while size > 0:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    sock.close()
    fields = b"".join(chunks).decode("utf-8", "surrogateescape").split("\0")
    n = int(fields[0])
    opts = fields[1:1 + n]
    m = int(fields[1 + n])
    argv = fields[2 + n:2 + n + m]
    env = dict(f.partition("=")[::2] for f in fields[2 + n + m:] if f)
    return opts, argv, env, fds


def _execvpe(argv: list[str], env: dict[str, str]) -> None:
    """``os.execvpe`` without its lazy imports (``warnings``: unreadable after the drop to a user, and slow)."""
    if "/" in argv[0]:
        os.execve(argv[0], argv, env)
    first: OSError | None = None
    for d in (env.get("PATH") or os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(d or ".", argv[0]), argv, env)
        except OSError as e:
            first = first or (e if not isinstance(e, FileNotFoundError | NotADirectoryError) else None)
    raise first or FileNotFoundError(2, "No such file or directory", argv[0])


def _exec_task(opts: dict[str, str], argv: list[str], env: dict[str, str]) -> None:
    """In the forked child: drop privileges, enter the workdir, exec; never returns."""
    try:
        for s in (*FORWARDED, WORKER_DIED, KILL_TREE, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        if opts.get("user"):
            uid, gid, *rest = opts["user"].split(":")
            groups = [int(g) for g in rest[0].split(",") if g] if rest else []
            os.setgroups(groups)
            os.setgid(int(gid))
            os.setuid(int(uid))
        if opts.get("cwd"):
            os.chdir(opts["cwd"])
        _execvpe(argv, env)
    except OSError as e:
        what = f"cannot enter the workdir {opts.get('cwd')}" if e.filename == opts.get("cwd") and opts.get("cwd") \
            else f"cannot start {argv[0]}"
        os.write(2, f"task_guard: {what}: {e.strerror or e}\n".encode())
    os._exit(CANNOT_START)


def main(argv: list[str]) -> int:
    opts, command = _parse(argv)
    cgroup = opts.get("cgroup") or None
    signal.pthread_sigmask(signal.SIG_BLOCK, {*FORWARDED, WORKER_DIED, KILL_TREE, signal.SIGCHLD})
    prctl(PR_SET_PDEATHSIG, WORKER_DIED)
    if opts.get("parent") and os.getppid() != int(opts["parent"]):
        return CANNOT_START  # the worker died before the death signal was set: start nothing
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    env = dict(os.environ)
    if "spare" in opts:
        got = receive(0)
        if got is None:
            return 0  # its worker stopped before giving it a task
        more, command, env, fds = got
        opts, _ = _parse([*more, "--", *command])
        cgroup = opts.get("cgroup") or None
        for target, fd in enumerate(fds):  # the task's stdin, stdout, stderr; the guard's own messages go there too
            os.dup2(fd, target)
            os.close(fd)
    if cgroup:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    child = os.fork()
    if child == 0:
        _exec_task(opts, command, env)
    status: int | None = None
    while status is None:
        sig = signal.sigwaitinfo({*FORWARDED, WORKER_DIED, KILL_TREE, signal.SIGCHLD}).si_signo
        if sig in FORWARDED:
            try:
                os.kill(child, sig)
            except OSError:
                pass
        elif sig in (WORKER_DIED, KILL_TREE):
            kill_tree(os.getpid(), cgroup)
            status = -signal.SIGKILL
            break
        while True:  # SIGCHLD (or any wake-up): reap the task and any orphan handed to this subreaper
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == child:
                status = os.waitstatus_to_exitcode(st)
    kill_tree(os.getpid(), None)  # what the task left behind (its cgroup, when any, empties with it)
    if status < 0:
        if -status not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-status, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))  # no interpreter teardown: it only delays the task's end being seen
