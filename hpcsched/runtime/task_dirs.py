"""Where a worker's tasks run and write: what they inherit, their checkpoint folder (bound to the job and private to
its user), their workdir (limited to the roots a site allows), their co-location folder, and the free-space floor
below which no checkpoint folder is handed out."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from hpcsched.runtime.sandbox import Identity

log = logging.getLogger("hpcsched.runtime.worker")

CREDENTIAL_ENV = ("HPCSCHED_TOKEN",)  # never passed on to a task

def task_base_env(environ: dict[str, str] | os._Environ, token: str | None) -> dict[str, str]:
    """What a task inherits from the worker's environment: everything but credentials (CREDENTIAL_ENV, and any
    variable whose value is the worker's token): with the token in its environment any job could act as a
    worker."""
    return {k: v for k, v in environ.items() if k not in CREDENTIAL_ENV and not (token and v == token)}


UID_FILE = "job-uid"


def bind_checkpoint_dir(ckpt: Path, uid: str, make: Callable[[Path], None] | None = None) -> None:
    """Bind a job's checkpoint folder to its uid before its first launch there. A folder holding anything but
    this job's marker (another job's, or files without a marker: a job of a lost state with the same id) is moved
    aside to ``.lost-<name>-<its uid or 'unmarked'>-<time>`` in the same parent, kept for the operator, never
    resumed. ``uid`` empty (a job stored before uids): the folder is used as is. ``make`` creates a missing folder
    (a quota may need it made a particular way: ``checkpoint_quota``)."""
    if not uid:
        return
    marker = ckpt / UID_FILE
    try:
        owner = marker.read_text().strip()
    except FileNotFoundError:
        owner = ""
    if owner == uid:
        return
    if ckpt.is_dir() and any(ckpt.iterdir()):
        aside = ckpt.with_name(f".lost-{ckpt.name}-{safe(owner) if owner else 'unmarked'}-{int(time.time())}")
        os.replace(ckpt, aside)
        log.warning("checkpoint folder %s belonged to another job (%s): moved to %s; job uid %s starts fresh", ckpt,
                    owner or "no uid marker", aside, uid)
    (make or _mkdir)(ckpt)
    tmp = ckpt / f".{UID_FILE}.{os.getpid()}.tmp"
    tmp.write_text(uid + "\n")
    os.replace(tmp, marker)


def _mkdir(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)


def interleave_dir(work_dir: Path, worker: str, group: str) -> Path:
    """Where the tasks of one co-location group on this worker keep their stage locks: interleaved jobs take
    turns per stage through them (``workloads/_common.StageTurns``); a job alone has them to itself. The
    worker's name keeps workers apart when their work dirs are one path on a shared file system."""
    return work_dir / "interleave" / safe(worker) / safe(group)


def safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"

def private_checkpoint_dir(ckpt: Path, user: Identity | None) -> None:
    """The job's checkpoint folder is its user's alone: owned by the task's user (where the worker can give it
    away: root), mode 0700, so another job (another user) can neither read nor write it. The markers the worker
    writes there stay readable by that user."""
    ckpt.mkdir(parents=True, exist_ok=True)
    if user is not None and os.getuid() == 0:
        os.chown(ckpt, user.uid, user.gid)
        for name in (UID_FILE, "generation"):
            if (ckpt / name).exists():
                os.chmod(ckpt / name, 0o644)
    os.chmod(ckpt, 0o700)


def workdir_problem(cwd: str, roots: tuple[Path, ...] | None, work_dir: Path, user: Identity | None) -> str:
    """Why a job may not run in ``cwd`` on this worker ('' when it may): it must be inside one of ``roots``
    (None: the worker's work dir and the task user's home; with neither a run-as user nor roots, anywhere, as
    before: the task then has the worker's own rights anyway). ``/etc`` with ``cat shadow`` was accepted."""
    if roots is None:
        if user is None:
            return ""
        roots = (work_dir, Path(user.home))
    real = Path(os.path.realpath(cwd))
    for r in roots:
        root = Path(os.path.realpath(r))
        if real == root or root in real.parents:
            return ""
    return (f"the job file's workdir: {cwd} is outside the folders this worker allows "
            f"({', '.join(str(r) for r in roots)}; worker config allowed_workdirs)")


def free_mb(path: Path) -> float:
    """Free megabytes (for an unprivileged user: root's reserve not counted) on ``path``'s file system, or on the
    nearest existing folder above it."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize / 1e6


def space_problem(paths: list[Path], floor_mb: float) -> str:
    """'' when every path's file system has ``floor_mb`` free, else which one is short: a job filling a shared disk
    made another's attempts fail in a loop, and the state database with them."""
    for p in paths:
        try:
            have = free_mb(p)
        except OSError as e:
            return f"cannot tell the free space at {p}: {e.strerror or e}"
        if have < floor_mb:
            return (f"only {have:.0f} MB free at {p}, under this worker's floor of {floor_mb:.0f} MB "
                    "(worker config min_free_mb)")
    return ""


def task_run_dir(run_dir: Path, user: Identity | None) -> Path:
    """The task's folder in the worker's work dir, owned by the worker (0711: the task cannot swap the files the
    worker reads back, its output log, for links to others' files) with its progress file owned by the task's
    user. Returns the progress file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    progress = run_dir / "progress.jsonl"
    if user is not None and os.getuid() == 0:
        os.chmod(run_dir.parent, 0o711)
        os.chmod(run_dir, 0o711)
        for f in (progress, run_dir / "output.log"):  # the task (a warm supervisor too) writes both
            fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            os.fchown(fd, user.uid, user.gid)
            os.close(fd)
    return progress
