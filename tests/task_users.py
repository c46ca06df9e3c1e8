"""Local users for isolation tests: throwaway accounts made with useradd (removed after), a folder they may
traverse, and a Python they can run. The suite's own interpreter lives under /root (0700 here), which another uid
cannot execute: what a site gives its workers as ``task_python`` is such a second Python.

Each helper yields or returns, or calls ``pytest.skip`` with the reason where the machine cannot do it (not root, no
useradd, no system python3 of this version)."""

from __future__ import annotations

import fcntl
import os
import pwd
import secrets
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ACCOUNTS_LOCK = "/tmp/hpcsched-test-accounts.lock"  # machine-wide, as /etc/passwd is


@contextmanager
def throwaway_users(n: int) -> Iterator[list[pwd.struct_passwd]]:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("creating users needs root and useradd")
    names = [f"hpcsiso{secrets.token_hex(3)}" for _ in range(n)]
    try:
        for name in names:
            _accounts(["useradd", "-m", name], check=True)
        yield [pwd.getpwnam(name) for name in names]
    finally:
        for name in names:
            _accounts(["userdel", "-r", name], check=False)


def _accounts(argv: list[str], check: bool) -> None:
    """useradd / userdel one at a time on this machine: two at once (pytest-xdist's workers) fail with "cannot lock
    /etc/passwd"."""
    with open(ACCOUNTS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(argv, check=check, capture_output=True)


@contextmanager
def open_folder(prefix: str = "hpcsiso-") -> Iterator[Path]:
    """A folder other users may traverse (pytest's own base folder is private to root): their jobs' workdirs and
    checkpoint folders go below it."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextmanager
def task_python() -> Iterator[Path]:
    """A venv of the system's Python of this suite's version whose site loads this interpreter's site-packages
    (torch, Horovod, gRPC), with the ``horovodrun`` beside it: runnable by any user."""
    system = shutil.which("python3", path="/usr/bin:/usr/local/bin")
    if os.geteuid() != 0 or system is None:
        pytest.skip("needs root and a system python3 other users can run")
    version = subprocess.run([system, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                             text=True).stdout.strip()
    if version != str(sys.version_info[:2]):
        pytest.skip(f"the system python3 is {version}, not this suite's {sys.version_info[:2]}")
    d = Path(tempfile.mkdtemp(prefix="hpcsiso-py-", dir="/tmp"))
    try:
        d.chmod(0o755)
        venv = d / "venv"
        if subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], capture_output=True).returncode:
            pytest.skip(f"{system} -m venv failed (no venv module?)")
        purelib = subprocess.run([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                  "['purelib'])"], capture_output=True, text=True).stdout.strip()
        (Path(purelib) / "suite.pth").write_text(f"import site; site.addsitedir({site.getsitepackages()[0]!r})\n")
        hvd = Path(sysconfig.get_path("scripts")) / "horovodrun"
        if hvd.exists():
            (venv / "bin/horovodrun").symlink_to(hvd)
        yield venv / "bin/python"
    finally:
        shutil.rmtree(d, ignore_errors=True)
