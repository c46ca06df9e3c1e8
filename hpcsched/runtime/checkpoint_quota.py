"""Per-job checkpoint quotas (worker config ``checkpoint_quota_mb``): a job that fills its checkpoint folder gets a
write error there while the other jobs on the same disk keep writing, where the file system can enforce it.

- btrfs with quotas enabled (``btrfs quota enable MOUNT``, by the operator): the worker creates each job's folder as
  a subvolume and limits its qgroup (``btrfs qgroup limit``); a write past it fails with EDQUOT ("Disk quota
  exceeded").
- XFS mounted with ``prjquota`` (``pquota``): the folder becomes an XFS project (its id derived from the folder's
  path) with a hard block limit (``xfs_quota -x``); a write past it fails with ENOSPC.

Anything else (ext4, tmpfs, NFS, Lustre, a btrfs without quotas, an XFS without ``prjquota``, a kernel built
without quota support, a worker that is not root, a folder made before quotas were on) gets no quota: the worker
says so once per file system with the reason, and every launch line counts the folders left without one. Limits
are set by the programs of btrfs-progs and xfsprogs, which the operator installs with the file system.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("hpcsched.runtime.worker")

BTRFS_SUBVOLUME_INODE = 256  # a btrfs subvolume's root directory has this inode number
_TOOL_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Mount:
    point: str
    fstype: str
    options: frozenset[str]


def mount_of(path: Path) -> Mount | None:
    """The mount holding ``path`` (or the nearest existing folder above it), from /proc/self/mountinfo."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    real = os.path.realpath(p)
    best: Mount | None = None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or len(tail) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        if real != point and not real.startswith(point.rstrip("/") + "/"):
            continue
        if best is None or len(point) >= len(best.point):
            best = Mount(point, tail[0], frozenset(fields[5].split(",")) | frozenset(tail[2].split(",")))
    return best


def _run(argv: list[str]) -> str:
    """'' when ``argv`` succeeded, else its error (the tool's last line)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{argv[0]}: {e}"
    if done.returncode == 0:
        return ""
    lines = (done.stderr or done.stdout).strip().splitlines()
    return f"{' '.join(argv[:3])}: {lines[-1] if lines else f'exit {done.returncode}'}"


def project_id(folder: Path) -> int:
    """An XFS project id for a folder: from its path (stable across the job's attempts), never 0 (no project)."""
    return zlib.crc32(str(folder).encode()) % 0x7FFFFFFE + 1


class CheckpointQuota:
    """The worker's per-job checkpoint limit (module docstring). ``limit_mb`` None: off, nothing is said."""

    def __init__(self, limit_mb: float | None) -> None:
        self.limit_mb = limit_mb
        self.why_not: dict[str, str] = {}  # mount point -> why it cannot hold quotas (said once)
        self.btrfs_ready: set[str] = set()
        self.unlimited = 0  # checkpoint folders handed out without the configured quota

    def make(self, folder: Path) -> None:
        """Create a job's checkpoint folder: a btrfs subvolume where its quota needs one, else a plain folder."""
        if folder.exists():
            return
        folder.parent.mkdir(parents=True, exist_ok=True)
        mount = mount_of(folder) if self.limit_mb else None
        if mount is not None and self._backend(mount) == "btrfs":
            err = _run(["btrfs", "subvolume", "create", str(folder)])
            if not err:
                return
            log.error("cannot create %s as a btrfs subvolume (%s): a plain folder, without a quota", folder, err)
        folder.mkdir(parents=True, exist_ok=True)

    def apply(self, folder: Path) -> str:
        """Limit an existing checkpoint folder; returns what the launch line says about it ('' when off)."""
        if not self.limit_mb:
            return ""
        mount = mount_of(folder)
        backend = self._backend(mount) if mount is not None else ""
        if mount is None:
            err = f"cannot find the mount of {folder}"
        elif backend == "btrfs":
            err = self._btrfs(folder)
        elif backend == "xfs":
            err = self._xfs(folder, mount)
        else:
            err = self.why_not[mount.point]
        if not err:
            return f"checkpoint quota {self.limit_mb:g} MB ({backend})"
        self.unlimited += 1
        return f"no checkpoint quota: {err} ({self.unlimited} folder(s) without one so far)"

    def _backend(self, mount: Mount) -> str:
        """'btrfs' or 'xfs' when ``mount`` can hold the limits, else '' (and why, said once per mount)."""
        if mount.point in self.btrfs_ready:
            return "btrfs"
        if mount.point in self.why_not:
            return ""
        why = ""
        if os.geteuid() != 0:
            why = "setting quotas needs a worker that runs as root"
        elif mount.fstype == "btrfs":
            err = _run(["btrfs", "qgroup", "show", mount.point])
            if not err:
                self.btrfs_ready.add(mount.point)
                return "btrfs"
            why = f"btrfs at {mount.point} without quotas (`btrfs quota enable {mount.point}`): {err}"
        elif mount.fstype == "xfs":
            if mount.options & {"prjquota", "pquota"}:
                return "xfs"
            why = f"XFS at {mount.point} is not mounted with prjquota"
        else:
            why = f"{mount.fstype} at {mount.point} has no per-folder quotas hpcsched can set (btrfs, XFS prjquota)"
        self.why_not[mount.point] = why
        log.warning("checkpoint_quota_mb %g is not enforced on %s: %s; each launch line counts the folders left "
                    "without a quota (docs/runtime.md, isolation)", self.limit_mb, mount.point, why)
        return ""

    def _btrfs(self, folder: Path) -> str:
        try:
            st = os.stat(folder)
        except OSError as e:
            return f"{folder}: {e.strerror or e}"
        if st.st_ino != BTRFS_SUBVOLUME_INODE:
            return f"{folder} is a plain folder, not a btrfs subvolume (made before the quota was set)"
        return _run(["btrfs", "qgroup", "limit", f"{int(self.limit_mb * 1024 * 1024)}", str(folder)])

    def _xfs(self, folder: Path, mount: Mount) -> str:
        pid = project_id(folder)
        return _run(["xfs_quota", "-x", "-c", f"project -s -p {folder} {pid}", "-c",
                     f"limit -p bhard={math.ceil(self.limit_mb)}m {pid}", mount.point])
