"""Controller, worker and job files: YAML in, typed and validated records out.

Every mistake is an ``InputError`` naming the file and the line of the offending key, because these
files are edited by hand on cluster login nodes where a traceback helps nobody. Relative paths are
taken relative to the file that names them, so a config works from any current directory.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpcsched.errors import InputError

LAUNCHERS = ("torchrun", "direct", "mpirun", "horovodrun")


class _Doc:
    """A YAML mapping plus the line of each top-level key, for errors that point at the right line."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = mark.line + 1 if mark else None
            raise InputError(source, f"not valid YAML: {getattr(e, 'problem', e)}", line) from None
        if data is None:
            data, node = {}, None
        if not isinstance(data, dict):
            raise InputError(source, "expected a mapping of key: value at the top level", 1)
        self.data: dict[str, Any] = data
        self.lines: dict[str, int] = {}
        if isinstance(node, yaml.MappingNode):
            for k, _v in node.value:
                self.lines[str(k.value)] = k.start_mark.line + 1

    def fail(self, key: str, message: str) -> InputError:
        return InputError(self.source, f"{key}: {message}", self.lines.get(key))

    def check_keys(self, allowed: set[str]) -> None:
        for k in self.data:
            if k not in allowed:
                raise self.fail(k, f"unknown key; expected one of {', '.join(sorted(allowed))}")

    def get(self, key: str, kind: type, default: Any) -> Any:
        v = self.data.get(key, default)
        if v is None or v is default:
            return v
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if kind is str and isinstance(v, int | float) and not isinstance(v, bool):
            v = str(v)
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise self.fail(key, f"expected {kind.__name__}, got {v!r}")
        return v

    def non_negative(self, key: str, kind: type, default: Any) -> Any:
        v = self.get(key, kind, default)
        if v is not None and v < 0:
            raise self.fail(key, f"must be >= 0, got {v}")
        return v

    def positive(self, key: str, kind: type, default: Any) -> Any:
        v = self.get(key, kind, default)
        if v is not None and v <= 0:
            raise self.fail(key, f"must be > 0, got {v}")
        return v

    def path(self, key: str, base: Path, default: str | None) -> Path | None:
        v = self.get(key, str, default)
        if v is None:
            return None
        p = Path(v).expanduser()
        return p if p.is_absolute() else (base / p)


def _read(path: str | Path) -> tuple[_Doc, Path]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(p, f"cannot read: {e.strerror or e}") from None
    return _Doc(text, str(p)), p.resolve().parent


def parse_address(text: str, source: str = "<address>") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); port 0 means 'pick a free one'."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InputError(source, f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def read_token(token: str | None, token_file: Path | None, source: str) -> str | None:
    """The shared secret from the file (first line) or inline; None means auth is off."""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as e:
            raise InputError(token_file, f"cannot read token file: {e.strerror or e}") from None
        if not token:
            raise InputError(token_file, "token file is empty")
    return token


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """How a controller listens, where it keeps state, and how it schedules."""

    listen: str = "127.0.0.1:0"  # loopback by default; port 0 picks a free port
    address_file: Path | None = None  # the bound HOST:PORT is written here for workers and clients
    state: Path = Path("hpcsched-state.db")
    checkpoint_root: Path = Path("checkpoints")
    token: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    policy: str = "fifo"
    heartbeat_interval_s: float = 1.0
    worker_timeout_s: float = 10.0
    schedule_interval_s: float = 0.5
    max_restarts: int = 5  # failed attempts of one job before it is marked failed
    stop_grace_s: float = 30.0  # SIGTERM -> SIGKILL on workers when a job is stopped
    min_runtime_s: float = 10.0  # a job attempt is not preempted or resized before it has run this long
    milp_tfwd_s: float = 60.0  # look-ahead of the MILP that sizes jobs with a scaling curve (BFTrainer's Tfwd)
    rpc_stats_file: Path | None = None  # per-RPC handler time quantiles (JSON), written when the controller stops


CONTROLLER_KEYS = {
    "listen", "address_file", "state", "checkpoint_root", "token", "token_file", "tls_cert", "tls_key",
    "policy", "heartbeat_interval_s", "worker_timeout_s", "schedule_interval_s", "max_restarts", "stop_grace_s",
    "min_runtime_s", "milp_tfwd_s", "rpc_stats_file",
}


def read_controller_config(path: str | Path) -> ControllerConfig:
    doc, base = _read(path)
    doc.check_keys(CONTROLLER_KEYS)
    listen = doc.get("listen", str, "127.0.0.1:0")
    parse_address(listen, doc.source)
    cert, key = doc.path("tls_cert", base, None), doc.path("tls_key", base, None)
    if (cert is None) != (key is None):
        raise doc.fail("tls_cert" if cert is None else "tls_key", "TLS needs both tls_cert and tls_key")
    return ControllerConfig(
        listen=listen,
        address_file=doc.path("address_file", base, None),
        state=doc.path("state", base, "hpcsched-state.db"),
        checkpoint_root=doc.path("checkpoint_root", base, "checkpoints"),
        token=read_token(doc.get("token", str, None), doc.path("token_file", base, None), doc.source),
        tls_cert=cert,
        tls_key=key,
        policy=doc.get("policy", str, "fifo"),
        heartbeat_interval_s=doc.positive("heartbeat_interval_s", float, 1.0),
        worker_timeout_s=doc.positive("worker_timeout_s", float, 10.0),
        schedule_interval_s=doc.positive("schedule_interval_s", float, 0.5),
        max_restarts=doc.get("max_restarts", int, 5),
        stop_grace_s=doc.positive("stop_grace_s", float, 30.0),
        min_runtime_s=doc.non_negative("min_runtime_s", float, 10.0),
        milp_tfwd_s=doc.positive("milp_tfwd_s", float, 60.0),
        rpc_stats_file=doc.path("rpc_stats_file", base, None),
    )


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """One node's daemon: whom to call, what it offers, where tasks write logs."""

    controller: str
    name: str
    host: str = "127.0.0.1"  # address other nodes use to reach this one (the rank-0 store)
    slots: int = 1
    gpus: int = 0
    cpus: int = 1
    token: str | None = None
    tls_ca: Path | None = None
    work_dir: Path = Path("hpcsched-worker")
    stop_grace_s: float = 30.0  # on SIGTERM: checkpoint -> SIGKILL of its tasks after this long
    warm_ranks: bool = True  # keep a torch-preloaded ``direct`` supervisor ready (fast relaunch on resize)


WORKER_KEYS = {"controller", "name", "host", "slots", "gpus", "token", "token_file", "tls_ca", "work_dir",
               "stop_grace_s", "warm_ranks"}


def read_worker_config(path: str | Path) -> dict[str, Any]:
    """The worker file as keyword overrides; the CLI merges them under its own flags."""
    doc, base = _read(path)
    doc.check_keys(WORKER_KEYS)
    out: dict[str, Any] = {}
    for k in ("controller", "name", "host"):
        if k in doc.data:
            out[k] = doc.get(k, str, None)
    for k in ("slots", "gpus"):
        if k in doc.data:
            out[k] = doc.get(k, int, None)
    if "work_dir" in doc.data:
        out["work_dir"] = doc.path("work_dir", base, None)
    if "stop_grace_s" in doc.data:
        out["stop_grace_s"] = doc.positive("stop_grace_s", float, 30.0)
    if "tls_ca" in doc.data:
        out["tls_ca"] = doc.path("tls_ca", base, None)
    if "warm_ranks" in doc.data:
        out["warm_ranks"] = doc.get("warm_ranks", bool, True)
    token = read_token(doc.get("token", str, None), doc.path("token_file", base, None), doc.source)
    if token:
        out["token"] = token
    return out


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a user submits. ``procs`` is the size it starts at; [min_procs, max_procs] is where it may be
    resized to (equal to procs for a rigid job)."""

    name: str
    command: tuple[str, ...]
    launcher: str = "torchrun"
    procs: int = 1
    min_procs: int = 1
    max_procs: int = 1
    steps: int | None = None  # total training steps, when the program reports them
    workdir: str = "."
    env: dict[str, str] = field(default_factory=dict)
    curve_procs: tuple[int, ...] = ()  # declared scaling curve: throughput (samples/s) at these sizes; an
    curve_rates: tuple[float, ...] = ()  # elastic job with one is sized by the MILP allocator
    resize_s: float = 10.0  # seconds of progress a resize costs it (the MILP's Tup = Tdw)
    profile: tuple[float, float, float] | None = None  # declared stage seconds (data, compute, comm) per step

    @property
    def elastic(self) -> bool:
        return self.min_procs != self.max_procs


JOB_KEYS = {"name", "command", "launcher", "procs", "min_procs", "max_procs", "steps", "workdir", "env", "scaling",
            "profile"}
SCALING_KEYS = {"procs", "rates", "resize_s"}
PROFILE_KEYS = ("data_s", "compute_s", "comm_s")


def _profile(doc: _Doc) -> dict[str, Any]:
    """``profile: {data_s: 0.02, compute_s: 0.015, comm_s: 0.005}``: the seconds one step spends loading data,
    computing and synchronising. Declared so policies know the job before it has reported any step: an
    interleaving policy (muri-s, muri-l) can group it, and duration-aware ones (srtf, srsf) rank it by the
    declared pace (their sum). The stage times it measures replace the declared ones from its first report."""
    if "profile" not in doc.data:
        return {}
    pr = doc.data["profile"]
    if not isinstance(pr, dict) or set(pr) - set(PROFILE_KEYS):
        raise doc.fail("profile", "expected {data_s: seconds, compute_s: seconds, comm_s: seconds}")
    try:
        vals = tuple(float(pr.get(k, 0.0)) for k in PROFILE_KEYS)
    except (TypeError, ValueError):
        raise doc.fail("profile", "stage times must be numbers (seconds per step)") from None
    if not all(math.isfinite(v) and v >= 0 for v in vals) or sum(vals) <= 0:
        raise doc.fail("profile", "stage times must be finite, >= 0, and not all 0")
    return {"profile": vals}


def _scaling(doc: _Doc) -> dict[str, Any]:
    """``scaling: {procs: [1, 2, 4], rates: [100, 180, 300], resize_s: 8}`` -> JobSpec fields."""
    if "scaling" not in doc.data:
        return {}
    sc = doc.data["scaling"]
    if not isinstance(sc, dict) or set(sc) - SCALING_KEYS or not {"procs", "rates"} <= set(sc):
        raise doc.fail("scaling", "expected {procs: [sizes], rates: [samples/s at each size], resize_s: seconds}")
    try:
        from hpcsched.model import ScalingCurve

        procs, rates = tuple(int(p) for p in sc["procs"]), tuple(float(r) for r in sc["rates"])
        ScalingCurve(procs, rates)  # validates: same lengths, increasing sizes, finite rates >= 0
        resize = float(sc.get("resize_s", 10.0))
    except (TypeError, ValueError) as e:
        raise doc.fail("scaling", str(e)) from None
    if resize < 0 or not procs or procs[0] < 1:
        raise doc.fail("scaling", "sizes must be >= 1 and resize_s >= 0")
    return {"curve_procs": procs, "curve_rates": rates, "resize_s": resize}


def parse_job_spec(text: str, source: str) -> JobSpec:
    doc = _Doc(text, source)
    doc.check_keys(JOB_KEYS)
    if "command" not in doc.data:
        raise InputError(source, "command: missing (the program to run, e.g. [workloads/ddp_train.py, --steps, 100])")
    cmd = doc.data["command"]
    if isinstance(cmd, str):
        cmd = shlex.split(cmd)
    if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str | int | float) for c in cmd):
        raise doc.fail("command", "expected a non-empty list of strings or one command line")
    launcher = doc.get("launcher", str, "torchrun")
    if launcher not in LAUNCHERS:
        raise doc.fail("launcher", f"unknown launcher {launcher!r}; expected one of {', '.join(LAUNCHERS)}")
    procs = doc.positive("procs", int, 1)
    lo = doc.positive("min_procs", int, procs)
    hi = doc.positive("max_procs", int, procs)
    if not lo <= procs <= hi:
        raise doc.fail("procs", f"need min_procs <= procs <= max_procs, got {lo} <= {procs} <= {hi}")
    env = doc.get("env", dict, {})
    if not all(isinstance(k, str) and isinstance(v, str | int | float) for k, v in env.items()):
        raise doc.fail("env", "expected a mapping of NAME: value")
    return JobSpec(
        name=doc.get("name", str, Path(source).stem),
        command=tuple(str(c) for c in cmd),
        launcher=launcher,
        procs=procs,
        min_procs=lo,
        max_procs=hi,
        steps=doc.positive("steps", int, None),
        workdir=doc.get("workdir", str, "."),
        env={k: str(v) for k, v in env.items()},
        **_scaling(doc),
        **_profile(doc),
    )
