"""Opening the controller's state file safely: what is checked before SQLite (or a chmod) touches it.

The state holds every job's command and environment: it is created 0600 and tightened when found wider. A path that
is not a plain file of this user with a single name is refused before anything changes it: two names for one
state (a hard link, a symlink) let two controllers each take their own name's lock and corrupt it, and a wrong
``state:`` path was chmod'ed, through a symlink, before it was refused. One controller per state: the owner holds an
exclusive lock on ``PATH.lock`` (``take_owner_lock``). A file SQLite cannot read is named with a way to recover.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.runtime.diskspace import is_disk_full

log = logging.getLogger("hpcsched.runtime.store")


def make_private(path: Path) -> None:
    """Create the state file 0600 before SQLite does (SQLite creates it, and its -wal and -shm, with the
    process umask, 0644 usually, and later files copy the database's mode); tighten an existing one, loudly.

    An existing file is checked before anything changes it (``_check_state_file``), and it is tightened through a
    descriptor opened without following links: a wrong ``state:`` path (a symlink to another file) was chmod'ed to
    0600 before it was refused."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)
    except FileExistsError:
        pass
    except OSError as e:
        raise InputError(path, f"cannot create the state file: {e.strerror or e}") from None
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            before = check_state_file(p, path)
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise InputError(p, f"cannot open the state file: {e.strerror or e}") from None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
                raise InputError(p, "the state file was replaced while it was checked; start again")
            mode = stat.S_IMODE(st.st_mode)
            if mode & 0o077:
                os.fchmod(fd, 0o600)
                log.warning("%s was readable by others (mode %04o): made it 0600 (it holds every job's command and "
                            "environment)", p, mode)
        except OSError as e:
            raise InputError(p, f"cannot make the state file private: {e.strerror or e}") from None
        finally:
            os.close(fd)


def check_state_file(p: Path, state: Path) -> os.stat_result:
    """``p`` (the state or its -wal / -shm) as it is, refused unless it is a regular file of this user with one
    name. Two names (a hard link, a symlink) let two controllers each take their own name's lock on one state, and
    that corrupted it ("database disk image is malformed"); a file of another user is not this controller's."""
    st = os.lstat(p)  # FileNotFoundError: nothing to check
    if stat.S_ISLNK(st.st_mode):
        raise InputError(p, f"is a symbolic link (to {os.readlink(p)!r}); name the state file itself in state: (two "
                            f"names for one state let two controllers share it)" if p == state else
                            "is a symbolic link; the state's -wal and -shm must be plain files beside it")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(p, "is not a regular file; state: must name a SQLite file (or a path to create one at)")
    if st.st_uid != os.geteuid():
        raise InputError(p, f"belongs to uid {st.st_uid}, not to this controller's user (uid {os.geteuid()}); "
                            "a controller opens only its own state")
    if st.st_nlink > 1:
        raise InputError(p, f"has {st.st_nlink} hard links: one state with several names lets two controllers share "
                            "it (each locks its own name) and corrupt it; keep one name (remove the other links)")
    return st


class StateNotReady(InputError):
    """A reader opened a state file that has no tables yet: a controller starting up creates the file before its
    schema, and a reader (``hpcsched jobs``, ``calc``, a test polling the state) that comes in between must be told
    to try again, not to restore a backup over a healthy state."""


def not_ready(path: Path) -> StateNotReady:
    return StateNotReady(path, "has no tables yet: a controller is creating it (try again in a moment), or it is not "
                               "an hpcsched state")


def damaged(path: Path, e: Exception) -> InputError:
    """What to tell the operator about a SQLite error opening the state: a full disk is not a damaged file."""
    if is_disk_full(e):
        return InputError(path, f"cannot write the state: its filesystem is full ({e}); free space on it")
    return InputError(path, f"not a readable hpcsched state ({e}); it may be damaged. Restore the latest backup "
                            "(the controller's backup_dir, or one made with `python -m hpcsched.runtime backup`) over "
                            "it, or move it aside to start with an empty state")


def take_owner_lock(path: Path) -> int:
    """An exclusive, non-blocking ``flock`` on ``PATH.lock`` holding our pid; InputError if it is held."""
    import fcntl

    lock = path.with_name(path.name + ".lock")
    try:  # never through a link: a planted PATH.lock symlink would have this process truncate its target
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise InputError(lock, f"cannot open the state's lock file: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise InputError(path, f"another controller (pid {holder}) holds this state (lock {lock}); run one "
                               "controller per state file, or stop that one first") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:  # a full disk: said as such, not as a traceback
        os.close(fd)
        raise InputError(lock, f"cannot write the state's lock file: {e.strerror or e}") from None
    return fd
