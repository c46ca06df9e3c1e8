"""The controller file: how a controller listens, where it keeps state and how it schedules, validated into
``ControllerConfig``; and the secrets files name (tokens), refused unless private.

Every mistake is an ``InputError`` naming the file and the line of the offending key (``yamldoc``), because these
files are edited by hand on cluster login nodes where a traceback helps nobody. Relative paths are
taken relative to the file that names them, so a config works from any current directory. The job file is
``jobfile``, the worker file ``worker_config``.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcsched.errors import InputError
from hpcsched.runtime.diskspace import DEFAULT_FLOOR, parse_floor
from hpcsched.runtime.node_source import NODE_SOURCES, read_section
from hpcsched.runtime.yamldoc import Doc, read_doc


def parse_address(text: str, source: str = "<address>") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); port 0 means 'pick a free one'."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InputError(source, f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def check_private(path: Path, what: str = "token file") -> None:
    """Refuse a secret file that others can read or write, as ssh refuses such a key: anyone on the node could
    use the credential in it."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError as e:
        raise InputError(path, f"cannot read {what}: {e.strerror or e}") from None
    if mode & 0o077:
        raise InputError(path, f"{what} is accessible by others (mode {mode:04o}); a credential must be private: "
                               f"chmod 600 {path}")


def read_token(token: str | None, token_file: Path | None, source: str) -> str | None:
    """A secret from the file (first line; refused unless private) or inline; None means none is set."""
    if token_file is not None:
        check_private(token_file)
        try:
            token = token_file.read_text().strip()
        except OSError as e:
            raise InputError(token_file, f"cannot read token file: {e.strerror or e}") from None
        if not token:
            raise InputError(token_file, "token file is empty")
    return token


def inline_secret(doc: Doc, path: Path, keys: tuple[str, ...]) -> None:
    """A config file holding a token inline is itself a secret file."""
    if any(k in doc.data for k in keys):
        check_private(path, f"this file holds a credential ({', '.join(k for k in keys if k in doc.data)}); it")


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """How a controller listens, where it keeps state, and how it schedules."""

    listen: str = "127.0.0.1:0"  # loopback by default; port 0 picks a free port
    address_file: Path | None = None  # the bound HOST:PORT is written here for workers and clients
    state: Path = Path("hpcsched-state.db")
    checkpoint_root: Path = Path("checkpoints")
    token: str | None = None  # the user role's (every role's when it is the only one set)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    worker_token: str | None = None  # the worker role's: Register, Heartbeat, Leave
    admin_token: str | None = None  # every RPC
    readonly_token: str | None = None  # ListJobs, ListWorkers, the status page and /metrics: a dashboard's
    user_tokens: dict[str, str] = field(default_factory=dict)  # more users, name -> token: their jobs are theirs
    own_jobs_only: bool = False  # a user lists and cancels only the jobs they submitted (admins: all)
    max_pending_per_user: int = 250_000  # a submit past it is refused with the count (0: no limit)
    max_submit_batch: int = 10_000  # jobs in one SubmitMany call, array instances counted
    backup_dir: Path | None = None  # periodic online copies of the state (recovery from a damaged one)
    backup_interval_s: float = 3600.0
    backup_keep: int = 24
    policy: str = "fifo"
    heartbeat_interval_s: float = 1.0
    worker_timeout_s: float = 10.0
    # heartbeats a second the controller budgets for: workers beat every max(heartbeat_interval_s, workers / rate)
    # seconds, at most worker_timeout_s / 3 (sized for a 2-core controller host; raise it on a bigger one)
    heartbeat_rate: float = 500.0
    # a lease server process answers the lease renewals of workers with nothing to report (lease.py); false: every
    # heartbeat goes to the controller, as before
    lease_server: bool = True
    schedule_interval_s: float = 0.5
    max_restarts: int = 5  # failed attempts of one job before it is marked failed
    stop_grace_s: float = 30.0  # SIGTERM -> SIGKILL on workers when a job is stopped
    min_runtime_s: float = 10.0  # a job attempt is not preempted or resized before it has run this long
    milp_tfwd_s: float = 60.0  # look-ahead of the MILP that sizes jobs with a scaling curve (BFTrainer's Tfwd)
    admission: str = "accept-all"  # the decision core's admission step (hpcsched.admission)
    load_threshold: float = 1.0  # load-based admission: admitted demand up to this x the live slots
    placement: str = "consolidated"  # the decision core's placement step (hpcsched.placements)
    regroup: str = "keep"  # keep: running jobs never move to form groups; replan: the policy as designed
    rpc_stats_file: Path | None = None  # per-RPC handler time quantiles (JSON), written when the controller stops
    # executor: decide (the decision core, every tick) or rounds (Gavel's round mechanism: hpcsched.runtime.rounds)
    executor: str = "decide"
    hetero_policy: str = "max-min-fairness-perf"  # rounds: Gavel's policy, by Gavel's name with hyphens
    round_s: float = 360.0  # rounds: a round's length (Gavel's --time_per_iteration)
    round_reset_s: float = 1920.0  # rounds: least time between two allocations (Gavel's minimum between resets)
    throughputs: Path | None = None  # rounds: Gavel-format throughput table (None: the bundled one)
    # node_source: static (workers register themselves), slurm or pbs (pilot jobs: hpcsched.slurm.pilots,
    # hpcsched.pbs.pilots) or any other registered source; ``pilots`` is that source's section as it reads it
    # (``node_source.read_section``); each source's name is a key of the file (its section)
    node_source: str = "static"
    pilots: Any = None
    # free space kept on the state's filesystem (diskspace.py): under it the controller does not start and refuses
    # submits; "default": the smaller of 1 GiB and 5% of the filesystem
    state_min_free: str = "default"
    # a failed attempt's retry waits retry_backoff_s x 2^(k-2) for the k-th retry (the first retry at once), at most
    # retry_backoff_max_s: a job failing on a full disk spent its 6 attempts in 20 s
    retry_backoff_s: float = 10.0
    retry_backoff_max_s: float = 300.0
    # operators' HTTP listener (metrics_http): /metrics for Prometheus and / the status page; None: off
    metrics_listen: str | None = None
    metrics_address_file: Path | None = None  # its bound HOST:PORT is written here (port 0 picks one)
    # ``controller --insecure`` only (never a config key): allows a controller without tokens on a non-loopback address
    insecure: bool = False

    def source_name(self) -> str:
        """The node source to build: ``node_source``, except that a config made in code with a ``pilots`` section
        and no ``node_source`` (the Slurm harvester's controller mode, tests) means the Slurm pilots it always did."""
        return "slurm" if self.node_source == "static" and self.pilots is not None else self.node_source


CONTROLLER_KEYS = {
    "listen", "address_file", "state", "checkpoint_root", "token", "token_file", "tls_cert", "tls_key",
    "policy", "heartbeat_interval_s", "worker_timeout_s", "heartbeat_rate", "schedule_interval_s", "max_restarts",
    "stop_grace_s", "lease_server",
    "min_runtime_s", "milp_tfwd_s", "rpc_stats_file", "worker_token", "worker_token_file", "admin_token",
    "admin_token_file", "backup_dir", "backup_interval_s", "backup_keep",
    "user_tokens", "own_jobs_only", "admission", "load_threshold", "placement", "regroup",
    "node_source", *(s for s in NODE_SOURCES if s != "static"), "executor", "hetero_policy", "round_s",
    "round_reset_s", "throughputs",
    "state_min_free", "retry_backoff_s", "retry_backoff_max_s",
    "max_pending_per_user", "max_submit_batch",
    "metrics_listen", "metrics_address_file", "readonly_token", "readonly_token_file",
}
EXECUTORS = ("decide", "rounds")
ROUND_KEYS = ("hetero_policy", "round_s", "round_reset_s", "throughputs")  # read by the rounds executor only
NOT_ROUNDS_KEYS = ("policy", "admission", "load_threshold", "regroup", "min_runtime_s", "milp_tfwd_s")


def read_controller_config(path: str | Path) -> ControllerConfig:
    """The controller's YAML as a ControllerConfig; the roles' tokens, when several are set, must differ."""
    cfg = _controller_config(path)
    secrets = [(k, v) for k, v in (("token", cfg.token), ("worker_token", cfg.worker_token),
                                   ("admin_token", cfg.admin_token), ("readonly_token", cfg.readonly_token),
                                   *((f"user_tokens: {n}", t) for n, t in cfg.user_tokens.items())) if v]
    for i, (k, v) in enumerate(secrets):
        for k2, v2 in secrets[i + 1:]:
            if v == v2:
                raise InputError(path, f"{k} and {k2} are the same credential; each role needs its own")
    if (cfg.worker_token or cfg.admin_token) and not (cfg.token or cfg.user_tokens):
        raise InputError(path, "worker_token / admin_token set without a user's token: set token_file or user_tokens")
    if cfg.readonly_token and not (cfg.token or cfg.user_tokens):
        raise InputError(path, "readonly_token set without a user's token: with no token_file the controller has no "
                               "authentication and a read-only token would restrict nothing; set token_file too")
    if cfg.user_tokens and not cfg.worker_token:
        raise InputError(path, "user_tokens need worker_token_file: else the one token would hold every role")
    if cfg.own_jobs_only and not cfg.user_tokens and not cfg.worker_token:
        raise InputError(path, "own_jobs_only needs user_tokens (or at least separate user and worker tokens)")
    return cfg


_USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


def _user_tokens(doc: Doc, base: Path) -> dict[str, str]:
    """``user_tokens: {alice: secrets/alice.token, ...}``: one private token file per user, named."""
    raw = doc.get("user_tokens", dict, None)
    if raw is None:
        return {}
    out: dict[str, str] = {}
    for name, file in raw.items():
        if not isinstance(name, str) or not _USER_NAME.fullmatch(name) or name in ("user", "worker", "admin"):
            raise doc.fail("user_tokens", f"{name!r}: a user name is 1-64 letters, digits and _.@- (and not a role)")
        if not isinstance(file, str) or not file:
            raise doc.fail("user_tokens", f"{name}: expected the path of that user's token file")
        p = Path(file).expanduser()
        out[name] = read_token(None, p if p.is_absolute() else base / p, doc.source) or ""
    return out


def _controller_config(path: str | Path) -> ControllerConfig:
    doc, base = read_doc(path)
    doc.check_keys(CONTROLLER_KEYS)
    inline_secret(doc, Path(path), ("token", "worker_token", "admin_token", "readonly_token"))
    listen = doc.get("listen", str, "127.0.0.1:0")
    parse_address(listen, doc.source)
    metrics_listen = doc.get("metrics_listen", str, None)
    if metrics_listen is not None:
        try:
            parse_address(metrics_listen, "metrics_listen")
        except InputError as e:
            raise doc.fail("metrics_listen", e.message) from None
    cert, key = doc.path("tls_cert", base, None), doc.path("tls_key", base, None)
    if (cert is None) != (key is None):
        raise doc.fail("tls_cert" if cert is None else "tls_key", "TLS needs both tls_cert and tls_key")
    if key is not None:  # as a token file of the same mode is: whoever reads the key can pose as the controller
        check_private(key, "TLS private key")
    floor = doc.get("state_min_free", object, DEFAULT_FLOOR)
    try:
        parse_floor(floor)
    except ValueError as e:
        raise doc.fail("state_min_free", str(e)) from None
    return ControllerConfig(
        listen=listen,
        address_file=doc.path("address_file", base, None),
        state=doc.path("state", base, "hpcsched-state.db"),
        checkpoint_root=doc.path("checkpoint_root", base, "checkpoints"),
        token=read_token(doc.get("token", str, None), doc.path("token_file", base, None), doc.source),
        tls_cert=cert,
        tls_key=key,
        worker_token=read_token(doc.get("worker_token", str, None), doc.path("worker_token_file", base, None),
                                doc.source),
        admin_token=read_token(doc.get("admin_token", str, None), doc.path("admin_token_file", base, None),
                               doc.source),
        user_tokens=_user_tokens(doc, base),
        readonly_token=read_token(doc.get("readonly_token", str, None), doc.path("readonly_token_file", base, None),
                                  doc.source),
        metrics_listen=metrics_listen,
        metrics_address_file=doc.path("metrics_address_file", base, None),
        own_jobs_only=doc.get("own_jobs_only", bool, False),
        max_pending_per_user=doc.non_negative("max_pending_per_user", int, 250_000),
        max_submit_batch=doc.positive("max_submit_batch", int, 10_000),
        backup_dir=doc.path("backup_dir", base, None),
        backup_interval_s=doc.positive("backup_interval_s", float, 3600.0),
        backup_keep=doc.positive("backup_keep", int, 24),
        policy=doc.get("policy", str, "fifo"),
        heartbeat_interval_s=doc.positive("heartbeat_interval_s", float, 1.0),
        worker_timeout_s=doc.positive("worker_timeout_s", float, 10.0),
        heartbeat_rate=doc.positive("heartbeat_rate", float, 500.0),
        lease_server=doc.get("lease_server", bool, True),
        schedule_interval_s=doc.positive("schedule_interval_s", float, 0.5),
        max_restarts=doc.get("max_restarts", int, 5),
        stop_grace_s=doc.positive("stop_grace_s", float, 30.0),
        min_runtime_s=doc.non_negative("min_runtime_s", float, 10.0),
        milp_tfwd_s=doc.positive("milp_tfwd_s", float, 60.0),
        admission=_step(doc, "admission", "accept-all"),
        load_threshold=doc.non_negative("load_threshold", float, 1.0),
        placement=_step(doc, "placement", "consolidated"),
        regroup=_regroup(doc),
        rpc_stats_file=doc.path("rpc_stats_file", base, None),
        node_source=doc.get("node_source", str, "static"),
        pilots=_node_source(doc, base),
        state_min_free=str(floor),
        retry_backoff_s=doc.non_negative("retry_backoff_s", float, 10.0),
        retry_backoff_max_s=doc.non_negative("retry_backoff_max_s", float, 300.0),
        **_executor(doc, base),
    )


def _executor(doc: Doc, base: Path) -> dict[str, Any]:
    """``executor: decide`` (default) or ``rounds`` with its keys. A key the chosen executor does not read is refused
    (naming the line), not ignored: a site that sets ``policy:`` beside ``executor: rounds`` would otherwise believe
    it ran."""
    executor = doc.get("executor", str, "decide")
    if executor not in EXECUTORS:
        raise doc.fail("executor", f"expected one of {', '.join(EXECUTORS)}, got {executor!r}")
    if executor != "rounds":
        for k in ROUND_KEYS:
            if k in doc.data:
                raise doc.fail(k, "read by Gavel's round mechanism only: set executor: rounds")
        return {}
    for k in NOT_ROUNDS_KEYS:
        if k in doc.data:
            raise doc.fail(k, "not read by executor: rounds (Gavel's policy orders the jobs: hetero_policy)")
    from hpcsched.hetero.policies import POLICIES

    policy = doc.get("hetero_policy", str, "max-min-fairness-perf")
    if policy not in POLICIES:
        raise doc.fail("hetero_policy", f"unknown Gavel policy {policy!r}; known: {', '.join(POLICIES)}")
    if policy == "max-min-fairness-packed":
        raise doc.fail("hetero_policy", "space sharing (pairs of jobs on one GPU) is simulated only "
                                        "(hpcsched simulate --compat gavel), not run by the controller")
    table = doc.path("throughputs", base, None)
    if table is not None:
        from hpcsched.hetero.throughputs import load_throughputs

        load_throughputs(table)  # a missing or malformed table stops the controller now, naming that file
    return {"executor": executor, "hetero_policy": policy, "round_s": doc.positive("round_s", float, 360.0),
            "round_reset_s": doc.non_negative("round_reset_s", float, 1920.0), "throughputs": table}


def _node_source(doc: Doc, base: Path) -> Any:
    """The section of the ``node_source`` the file names (``slurm:`` for slurm, ``pbs:`` for pbs), read by that
    source's own reader; None for ``static``. A section beside another source is refused: it would be ignored."""
    source = doc.get("node_source", str, "static")
    if source not in NODE_SOURCES:
        raise doc.fail("node_source", f"expected one of {', '.join(NODE_SOURCES)}, got {source!r}")
    for other in NODE_SOURCES:
        if other != source and other in doc.data:
            raise doc.fail(other, f"a {other}: section needs node_source: {other}")
    return read_section(source, doc.data.get(source), doc.source, doc.lines.get(source, doc.lines.get("node_source")),
                        base)


def _regroup(doc: Doc) -> str:
    """``keep`` (default: a running job is never stopped to form a group) or ``replan`` (groups as the policy
    designs them: running jobs are stopped and placed again to join them, as the simulator's default mode)."""
    value = doc.get("regroup", str, "keep")
    if value not in ("keep", "replan"):
        raise doc.fail("regroup", f"expected keep or replan, got {value!r}")
    return value


def _step(doc: Doc, key: str, default: str) -> str:
    """A registered admission or placement step of the decision core, named in the config."""
    from hpcsched.admission import get_admission
    from hpcsched.placements import get_placement

    name = doc.get(key, str, default)
    try:
        (get_admission if key == "admission" else get_placement)(name)
    except KeyError as e:
        raise doc.fail(key, str(e.args[0])) from None
    return name


