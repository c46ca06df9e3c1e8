"""The worker file: a node daemon's settings as keyword overrides the CLI merges under its own flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcsched.runtime.config import inline_secret, read_token
from hpcsched.runtime.jobfile import gpu_type_name
from hpcsched.runtime.yamldoc import Doc, read_doc


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """One node's daemon: whom to call, what it offers, where tasks write logs."""

    controller: str
    name: str
    host: str = "127.0.0.1"  # address other nodes use to reach this one (the rank-0 store)
    slots: int = 1
    gpus: int = 0
    gpu_type: str = ""  # advertised to the controller; the CLI gives or detects it (``runtime.gputype``); "": none
    cpus: int = 1
    token: str | None = None
    tls_ca: Path | None = None
    work_dir: Path = Path("hpcsched-worker")
    stop_grace_s: float = 30.0  # on SIGTERM: checkpoint -> SIGKILL of its tasks after this long
    warm_ranks: bool = True  # keep a torch-preloaded ``direct`` supervisor ready (fast relaunch on resize)
    address_file: Path | None = None  # re-read when the controller is unreachable: a restart on a new port
    orphan_timeout_s: float | None = None  # leave (checkpoint, stop) after the controller is unreachable this long
    # On SIGTERM, once its tasks have stopped: how long it keeps telling a controller that is away (restarting after a
    # kill -9) that it leaves, at most stop_grace_s. A pilot's node is free only when the worker is gone: short.
    leave_notice_s: float = 5.0
    # Isolation (docs/runtime.md, threat model): whom tasks run as where the worker is root, where they may run,
    # how their processes are held, and the free-space floor below which no checkpoint folder is handed out.
    run_as: str | None = None  # one dedicated unprivileged user for every task of this worker
    users: dict[str, str] = field(default_factory=dict)  # job owner (token name) -> local user; others refused
    allowed_workdirs: tuple[Path, ...] | None = None  # None: the worker's work_dir and the task user's home
    cgroups: str = "auto"  # "auto": cgroup v2 where writable, else process groups + subreaper; "off": never
    min_free_mb: float = 512.0  # below this on the work dir's or a checkpoint's file system: launches refused
    # The Python tasks run under (ranks.py, torchrun, horovodrun, a job's .py, the rsh agent); None: the worker's
    # own. A site whose worker Python is private to root (a venv under /root) gives its task users one they can run.
    task_python: Path | None = None
    checkpoint_quota_mb: float | None = None  # per-job checkpoint folder limit, where the file system has quotas


WORKER_KEYS = {"controller", "name", "host", "slots", "gpus", "gpu_type", "token", "token_file", "tls_ca", "work_dir",
               "stop_grace_s", "leave_notice_s", "warm_ranks", "address_file", "orphan_timeout_s", "run_as", "users",
               "allowed_workdirs", "cgroups", "min_free_mb", "task_python", "checkpoint_quota_mb"}


def read_worker_config(path: str | Path) -> dict[str, Any]:
    """The worker file as keyword overrides; the CLI merges them under its own flags."""
    doc, base = read_doc(path)
    doc.check_keys(WORKER_KEYS)
    inline_secret(doc, Path(path), ("token",))
    out: dict[str, Any] = {}
    for k in ("controller", "name", "host"):
        if k in doc.data:
            out[k] = doc.get(k, str, None)
    for k in ("slots", "gpus"):
        if k in doc.data:
            out[k] = doc.get(k, int, None)
    if "gpu_type" in doc.data:
        try:
            out["gpu_type"] = gpu_type_name(doc.get("gpu_type", str, None))
        except ValueError as e:
            raise doc.fail("gpu_type", str(e)) from None
    if "work_dir" in doc.data:
        out["work_dir"] = doc.path("work_dir", base, None)
    if "stop_grace_s" in doc.data:
        out["stop_grace_s"] = doc.positive("stop_grace_s", float, 30.0)
    if "leave_notice_s" in doc.data:
        out["leave_notice_s"] = doc.positive("leave_notice_s", float, 5.0)
    if "orphan_timeout_s" in doc.data:
        out["orphan_timeout_s"] = doc.positive("orphan_timeout_s", float, None)
    if "tls_ca" in doc.data:
        out["tls_ca"] = doc.path("tls_ca", base, None)
    if "address_file" in doc.data:
        out["address_file"] = doc.path("address_file", base, None)
    if "warm_ranks" in doc.data:
        out["warm_ranks"] = doc.get("warm_ranks", bool, True)
    token = read_token(doc.get("token", str, None), doc.path("token_file", base, None), doc.source)
    if token:
        out["token"] = token
    out |= _isolation_keys(doc, base)
    return out


def _isolation_keys(doc: Doc, base: Path) -> dict[str, Any]:
    """run_as, users, allowed_workdirs, cgroups, min_free_mb, task_python, checkpoint_quota_mb of a worker file
    (WorkerConfig says what each is)."""
    out: dict[str, Any] = {}
    if "run_as" in doc.data:
        out["run_as"] = doc.get("run_as", str, None)
    if "users" in doc.data:
        users = doc.get("users", dict, None) or {}
        for k, v in users.items():
            if not isinstance(k, str) or not isinstance(v, str | int) or isinstance(v, bool) or not str(v):
                raise doc.fail("users", f"expected job owner: local user name, got {k!r}: {v!r}")
        out["users"] = {k: str(v) for k, v in users.items()}
    if "allowed_workdirs" in doc.data:
        roots = doc.get("allowed_workdirs", list, None) or []
        if not all(isinstance(r, str) and r for r in roots):
            raise doc.fail("allowed_workdirs", f"expected a list of folders, got {roots!r}")
        out["allowed_workdirs"] = tuple((base / r).resolve() for r in roots)
    if "cgroups" in doc.data:
        out["cgroups"] = doc.get("cgroups", str, "auto")
        if out["cgroups"] not in ("auto", "off"):
            raise doc.fail("cgroups", f"expected auto or off, got {out['cgroups']!r}")
    if "min_free_mb" in doc.data:
        out["min_free_mb"] = doc.non_negative("min_free_mb", float, 512.0)
    if "task_python" in doc.data:
        out["task_python"] = doc.path("task_python", base, None)
    if "checkpoint_quota_mb" in doc.data:
        out["checkpoint_quota_mb"] = doc.positive("checkpoint_quota_mb", float, None)
    return out

