"""Controller, worker and job files: YAML in, typed and validated records out.

Every mistake is an ``InputError`` naming the file and the line of the offending key, because these
files are edited by hand on cluster login nodes where a traceback helps nobody. Relative paths are
taken relative to the file that names them, so a config works from any current directory.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpcsched.errors import InputError
from hpcsched.runtime.diskspace import DEFAULT_FLOOR, parse_floor
from hpcsched.runtime.node_source import NODE_SOURCES
from hpcsched.slurm.pilot_config import PilotConfig, read_pilot_config

LAUNCHERS = ("torchrun", "direct", "mpirun", "horovodrun")

# Limits of a job file (docs/runtime.md, "Job files: validated completely, with limits"). Each is far above
# what a real job needs and keeps one job's cost bounded: a 3.9 MB file cost the controller ~100 s of CPU and
# ~1 GB, and two 3 MB names pushed every listing past gRPC's 4 MB message limit. Integers are bounded by what
# the wire and the store hold.
MAX_JOB_FILE_BYTES = 64 * 1024
MAX_NAME_CHARS = 128
MAX_ARGS = 1024  # command arguments
MAX_COMMAND_CHARS = 16 * 1024  # all arguments together
MAX_ENV_VARS = 256
MAX_ENV_CHARS = 16 * 1024  # all names and values together
MAX_PATH_CHARS = 4096  # workdir (Linux PATH_MAX)
MAX_CURVE_POINTS = 256
INT32_MAX = 2**31 - 1  # procs, min_procs, max_procs, scaling sizes: int32 in the proto (LaunchTask.nprocs, ...)
INT64_MAX = 2**63 - 1  # steps: int64 in the proto (JobInfo.steps_total, Progress.step) and SQLite's INTEGER
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # POSIX: what execve and every shell accept
# A GPU type as workers advertise it and jobs ask for it: one short lower-case word ("v100", "a100-80gb", "cpu"),
# compared exactly, so both sides are lower-cased when read (a "V100" worker serves a "v100" job).
GPU_TYPE = re.compile(r"[a-z0-9][a-z0-9_.+-]{0,31}")
MAX_GPU_TYPES = 16  # types one job may accept
MAX_MODEL_CHARS = 128
MAX_ARRAY = 100_000  # instances of one job array (a controller's max_submit_batch may allow fewer per call)

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~20x faster, same errors and marks


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _compose(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """Parse YAML into its node tree (the line of every value) and its data. Refused here: anything that is not
    YAML, duplicate keys (YAML's last-one-wins silently dropped settings), anchors / aliases and merge keys
    (an alias bomb expands a small file into billions of values), and values that do not construct."""
    loader = _Loader(text)
    node = None
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_tree(node, source)
        data = loader.construct_document(node) if node is not None else None
    except (ValueError, OverflowError) as e:  # a scalar that does not construct, e.g. a date that does not exist
        raise InputError(source, f"not valid YAML: {e}", _unconstructible(loader, node)) from None
    except yaml.reader.ReaderError as e:
        line = text[: e.position].count("\n") + 1 if isinstance(e.position, int) else None
        ch = chr(e.character) if isinstance(e.character, int) else e.character  # libyaml gives the code point
        raise InputError(source, f"not valid YAML: character {ch!r}: {e.reason}", line) from None
    except yaml.MarkedYAMLError as e:
        problem, line = e.problem or str(e), e.problem_mark.line + 1 if e.problem_mark else None
        if e.context and e.context_mark is not None and e.context_mark.line + 1 != line:
            problem += f" ({e.context} that starts at line {e.context_mark.line + 1})"
        elif e.context:
            problem += f" ({e.context})"
        raise InputError(source, f"not valid YAML: {problem}", line) from None
    except (yaml.YAMLError, RecursionError) as e:
        raise InputError(source, f"not valid YAML: {e}") from None
    finally:
        loader.dispose()
    return node, data


def _unconstructible(loader: Any, root: yaml.Node | None) -> int | None:
    """The line of the first scalar that fails to construct (the constructor's errors carry no mark)."""
    todo = [root] if root is not None else []
    while todo:
        node = todo.pop(0)
        if isinstance(node, yaml.ScalarNode):
            try:
                loader.construct_object(node, deep=True)
            except (ValueError, OverflowError, yaml.YAMLError):
                return _line(node)
        elif isinstance(node, yaml.MappingNode):
            todo += [n for kv in node.value for n in kv]
        elif isinstance(node, yaml.SequenceNode):
            todo += node.value
    return None


_KEY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,47}")


def shown_key(key: object) -> str:
    """A key as an error may show it: a key name is the file's syntax (a typo the user must see), anything else is
    not shown. The file may not be a job file at all: a symlink to /etc/shadow printed its first line."""
    return str(key) if isinstance(key, str) and _KEY_NAME.fullmatch(key) else "a key that is not a key name (not shown)"


def _check_tree(root: yaml.Node, source: str) -> None:
    seen: set[int] = set()
    todo = [root]
    while todo:  # iterative: the depth is the parser's to bound, not Python's stack
        node = todo.pop()
        if id(node) in seen:
            raise InputError(source, "anchors and aliases (&name, *name) are not supported here; write the value out",
                             _line(node))
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: dict[str, int] = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    if k.tag == "tag:yaml.org,2002:merge":
                        raise InputError(source, "merge keys (<<) are not supported here", _line(k))
                    if k.value in keys:
                        raise InputError(source, f"{shown_key(k.value)}: duplicate key (first at line "
                                                 f"{keys[k.value]}); YAML would silently keep only the last one",
                                         _line(k))
                    keys[k.value] = _line(k)
                todo += [k, v]
        elif isinstance(node, yaml.SequenceNode):
            todo += node.value


class _Doc:
    """A YAML mapping plus the line of each top-level key, for errors that point at the right line."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        node, data = _compose(text, source)
        if data is None:
            data, node = {}, None
        if not isinstance(data, dict):
            raise InputError(source, "expected a mapping of key: value at the top level", 1)
        self.data: dict[str, Any] = data
        self.lines: dict[str, int] = {}
        self.nodes: dict[str, yaml.Node] = {}  # the value node of each top-level key
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                self.lines[str(k.value)] = k.start_mark.line + 1
                self.nodes[str(k.value)] = v

    def fail(self, key: str, message: str) -> InputError:
        return InputError(self.source, f"{key}: {message}", self.lines.get(key))

    def check_keys(self, allowed: set[str]) -> None:
        for k in self.data:
            if k not in allowed:
                raise InputError(self.source, f"{shown_key(k)}: unknown key; expected one of "
                                              f"{', '.join(sorted(allowed))}", self.lines.get(str(k)))

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


def check_private(path: Path, what: str = "token file") -> None:
    """Refuse a secret file that others can read or write, as ssh refuses such a key: anyone on the node could
    use the credential in it (issue 15: token files at 0644 were accepted)."""
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


def _inline_secret(doc: _Doc, path: Path, keys: tuple[str, ...]) -> None:
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
    # node_source: static (workers register themselves) or slurm (pilot jobs: hpcsched.slurm.pilots)
    pilots: PilotConfig | None = None  # the ``slurm:`` section when node_source is slurm
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


CONTROLLER_KEYS = {
    "listen", "address_file", "state", "checkpoint_root", "token", "token_file", "tls_cert", "tls_key",
    "policy", "heartbeat_interval_s", "worker_timeout_s", "heartbeat_rate", "schedule_interval_s", "max_restarts",
    "stop_grace_s",
    "min_runtime_s", "milp_tfwd_s", "rpc_stats_file", "worker_token", "worker_token_file", "admin_token",
    "admin_token_file", "backup_dir", "backup_interval_s", "backup_keep",
    "user_tokens", "own_jobs_only", "admission", "load_threshold", "placement", "regroup",
    "node_source", "slurm", "executor", "hetero_policy", "round_s", "round_reset_s", "throughputs",
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


def _user_tokens(doc: _Doc, base: Path) -> dict[str, str]:
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
    doc, base = _read(path)
    doc.check_keys(CONTROLLER_KEYS)
    _inline_secret(doc, Path(path), ("token", "worker_token", "admin_token", "readonly_token"))
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
        pilots=_node_source(doc, base),
        state_min_free=str(floor),
        retry_backoff_s=doc.non_negative("retry_backoff_s", float, 10.0),
        retry_backoff_max_s=doc.non_negative("retry_backoff_max_s", float, 300.0),
        **_executor(doc, base),
    )


def _executor(doc: _Doc, base: Path) -> dict[str, Any]:
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


def _node_source(doc: _Doc, base: Path) -> PilotConfig | None:
    """``node_source: slurm`` and its ``slurm:`` section (hpcsched.slurm.pilots), or None for ``static``."""
    source = doc.get("node_source", str, "static")
    if source not in NODE_SOURCES:
        raise doc.fail("node_source", f"expected one of {', '.join(NODE_SOURCES)}, got {source!r}")
    if source == "static":
        if "slurm" in doc.data:
            raise doc.fail("slurm", "a slurm: section needs node_source: slurm")
        return None
    return read_pilot_config(doc.data.get("slurm"), doc.source, doc.lines.get("slurm", doc.lines.get("node_source")),
                             base)


def _regroup(doc: _Doc) -> str:
    """``keep`` (default: a running job is never stopped to form a group) or ``replan`` (groups as the policy
    designs them: running jobs are stopped and placed again to join them, as the simulator's default mode)."""
    value = doc.get("regroup", str, "keep")
    if value not in ("keep", "replan"):
        raise doc.fail("regroup", f"expected keep or replan, got {value!r}")
    return value


def _step(doc: _Doc, key: str, default: str) -> str:
    """A registered admission or placement step of the decision core, named in the config."""
    from hpcsched.admission import get_admission
    from hpcsched.placements import get_placement

    name = doc.get(key, str, default)
    try:
        (get_admission if key == "admission" else get_placement)(name)
    except KeyError as e:
        raise doc.fail(key, str(e.args[0])) from None
    return name


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
               "stop_grace_s", "warm_ranks", "address_file", "orphan_timeout_s", "run_as", "users",
               "allowed_workdirs", "cgroups", "min_free_mb", "task_python", "checkpoint_quota_mb"}


def read_worker_config(path: str | Path) -> dict[str, Any]:
    """The worker file as keyword overrides; the CLI merges them under its own flags."""
    doc, base = _read(path)
    doc.check_keys(WORKER_KEYS)
    _inline_secret(doc, Path(path), ("token",))
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


def _isolation_keys(doc: _Doc, base: Path) -> dict[str, Any]:
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


def gpu_type_name(text: str | None) -> str:
    """A GPU type as compared everywhere: lower case, one short word; ValueError saying what is wrong."""
    t = (text or "").strip().lower()
    if not GPU_TYPE.fullmatch(t):
        raise ValueError(f"{_short(text)} is not a GPU type: 1 to 32 letters, digits and _.+- (e.g. v100, a100-80gb)")
    return t


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
    gpu_types: tuple[str, ...] = ()  # GPU types it accepts (``gpu_type:``, one or a list); empty: any
    model: str | None = None  # what it trains, as Gavel's throughput table names it (throughput-aware placement)
    array: int | None = None  # ``array: N``: the file stands for N jobs (``submission.array_instances``); never stored

    @property
    def elastic(self) -> bool:
        return self.min_procs != self.max_procs


JOB_KEYS = {"name", "command", "launcher", "procs", "min_procs", "max_procs", "steps", "workdir", "env", "scaling",
            "profile", "gpu_type", "model", "array"}
SCALING_KEYS = {"procs", "rates", "resize_s"}
PROFILE_KEYS = ("data_s", "compute_s", "comm_s")


class _JobDoc(_Doc):
    """A job file's reader: every value checked for type, range, length and what the OS accepts, with the line
    of the offending value (nested ones too: an env entry, a command argument)."""

    def node_fail(self, key: str, node: yaml.Node | None, message: str) -> InputError:
        return InputError(self.source, f"{key}: {message}", _line(node) if node is not None else self.lines.get(key))

    def text(self, key: str, node: yaml.Node, what: str) -> str:
        """A scalar as the user wrote it (``0777`` stays 0777, ``yes`` stays yes: YAML 1.1 would make them 511 and
        True), refused when it is not a scalar, null, not encodable or holds a NUL byte."""
        if not isinstance(node, yaml.ScalarNode):
            raise self.node_fail(key, node, f"{what} must be a single value (a string or number), not a "
                                            f"{'list' if isinstance(node, yaml.SequenceNode) else 'mapping'}")
        if node.tag == "tag:yaml.org,2002:null":
            raise self.node_fail(key, node, f"{what} is empty (null); quote it (\"\") if you mean an empty string")
        if node.tag not in _TEXT_TAGS:
            raise self.node_fail(key, node, f"{what} has type {node.tag.rsplit(':', 1)[-1]}; quote it")
        return self.clean(key, node, node.value, what)

    def clean(self, key: str, node: yaml.Node | None, value: str, what: str) -> str:
        if "\0" in value:
            raise self.node_fail(key, node, f"{what} contains a NUL byte, which no command line or environment "
                                            "can hold")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise self.node_fail(key, node, f"{what} is not valid UTF-8 text (a lone surrogate escape?)") from None
        return value

    def integer(self, key: str, default: int | None, lo: int, hi: int, why: str) -> int | None:
        if key not in self.data:
            return default
        v = self.data[key]
        if v is None:
            if default is None:
                return None
            raise self.fail(key, "is empty (null); give a whole number or leave the key out")
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.fail(key, f"expected a whole number, got {_short(v)}")
        if v < lo:
            raise self.fail(key, f"must be >= {lo}, got {v}")
        if v > hi:
            raise self.fail(key, f"must be at most {hi} ({why}), got {_short(v)}")
        return v


_TEXT_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool")}


def _short(v: Any, limit: int = 60) -> str:
    r = repr(v) if not isinstance(v, int) else str(v) if v.bit_length() < 200 else f"a {len(str(v))}-digit number"
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _profile(doc: _JobDoc) -> dict[str, Any]:
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
    except (TypeError, ValueError, OverflowError):
        raise doc.fail("profile", "stage times must be numbers (seconds per step)") from None
    if not all(math.isfinite(v) and v >= 0 for v in vals) or not 0 < sum(vals) < math.inf:
        raise doc.fail("profile", "stage times must be finite, >= 0, and not all 0")
    return {"profile": vals}


def _scaling(doc: _JobDoc) -> dict[str, Any]:
    """``scaling: {procs: [1, 2, 4], rates: [100, 180, 300], resize_s: 8}`` -> JobSpec fields."""
    if "scaling" not in doc.data:
        return {}
    sc = doc.data["scaling"]
    if not isinstance(sc, dict) or set(sc) - SCALING_KEYS or not {"procs", "rates"} <= set(sc):
        raise doc.fail("scaling", "expected {procs: [sizes], rates: [samples/s at each size], resize_s: seconds}")
    if not isinstance(sc["procs"], list) or not isinstance(sc["rates"], list):
        raise doc.fail("scaling", "procs and rates must be lists")
    if len(sc["procs"]) > MAX_CURVE_POINTS:
        raise doc.fail("scaling", f"at most {MAX_CURVE_POINTS} points, got {len(sc['procs'])}")
    if not all(isinstance(p, int) and not isinstance(p, bool) for p in sc["procs"]):
        raise doc.fail("scaling", "sizes (procs) must be whole numbers")
    try:
        from hpcsched.model import ScalingCurve

        procs, rates = tuple(sc["procs"]), tuple(float(r) for r in sc["rates"])
        ScalingCurve(procs, rates)  # validates: same lengths, increasing sizes, finite rates >= 0
        resize = float(sc.get("resize_s", 10.0))
    except (TypeError, ValueError, OverflowError) as e:
        raise doc.fail("scaling", str(e)) from None
    if not procs or procs[0] < 1 or procs[-1] > INT32_MAX:
        raise doc.fail("scaling", f"sizes must be between 1 and {INT32_MAX}")
    if not 0 <= resize < math.inf:
        raise doc.fail("scaling", "resize_s must be finite and >= 0")
    return {"curve_procs": procs, "curve_rates": rates, "resize_s": resize}


def _command(doc: _JobDoc) -> tuple[str, ...]:
    if "command" not in doc.data:
        raise InputError(doc.source, "command: missing (the program to run, e.g. [workloads/ddp_train.py, --steps, "
                                     "100])")
    node = doc.nodes["command"]
    if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:str":
        line = doc.clean("command", node, node.value, "the command line")
        try:
            cmd = shlex.split(line)
        except ValueError as e:  # "No closing quotation", "No escaped character"
            raise doc.node_fail("command", node, f"cannot split this command line: {e}; close the quote, or write "
                                                 "the command as a list [program, arg, ...]") from None
    elif isinstance(node, yaml.SequenceNode):
        if len(node.value) > MAX_ARGS:
            raise doc.node_fail("command", node, f"at most {MAX_ARGS} arguments, got {len(node.value)}")
        cmd = [doc.text("command", n, f"argument {i + 1}") for i, n in enumerate(node.value)]
    else:
        raise doc.fail("command", "expected a non-empty list of strings or one command line")
    if not cmd or not cmd[0]:
        raise doc.node_fail("command", node, "the program (first argument) is empty")
    if len(cmd) > MAX_ARGS:
        raise doc.node_fail("command", node, f"at most {MAX_ARGS} arguments, got {len(cmd)}")
    if (n := sum(len(c) for c in cmd)) > MAX_COMMAND_CHARS:
        raise doc.node_fail("command", node, f"{n} characters; the limit is {MAX_COMMAND_CHARS} for all arguments "
                                             "together (pass large inputs in a file)")
    return tuple(cmd)


def _env(doc: _JobDoc) -> dict[str, str]:
    node = doc.nodes.get("env")
    if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"):
        return {}
    if not isinstance(node, yaml.MappingNode):
        raise doc.fail("env", "expected a mapping of NAME: value")
    if len(node.value) > MAX_ENV_VARS:
        raise doc.node_fail("env", node, f"at most {MAX_ENV_VARS} variables, got {len(node.value)}")
    env: dict[str, str] = {}
    for k, v in node.value:
        name = doc.text("env", k, "a variable name")
        if not ENV_NAME.fullmatch(name):
            raise doc.node_fail("env", k, f"{_short(name)} is not a valid variable name: letters, digits and _, "
                                          "not starting with a digit")
        env[name] = doc.text("env", v, f"the value of {name}")
    if (n := sum(len(k) + len(v) for k, v in env.items())) > MAX_ENV_CHARS:
        raise doc.node_fail("env", node, f"{n} characters; the limit is {MAX_ENV_CHARS} for all names and values "
                                         "together")
    return env


def _gpu_types(doc: _JobDoc) -> tuple[str, ...]:
    """``gpu_type: v100`` or ``gpu_type: [v100, a100]``: the types its units may run on (lower-cased, in the order
    written, each once). Why a job names them: a batch size tuned for one card's memory, or kernels built for one
    architecture, fail or crawl on another."""
    node = doc.nodes.get("gpu_type")
    if node is None:
        return ()
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    if not items:
        raise doc.node_fail("gpu_type", node, "an empty list; leave the key out to accept any GPU type")
    if len(items) > MAX_GPU_TYPES:
        raise doc.node_fail("gpu_type", node, f"at most {MAX_GPU_TYPES} types, got {len(items)}")
    out: list[str] = []
    for n in items:
        text = doc.text("gpu_type", n, "a GPU type")
        try:
            t = gpu_type_name(text)
        except ValueError as e:
            raise doc.node_fail("gpu_type", n, str(e)) from None
        if t not in out:
            out.append(t)
    return tuple(out)


def _model(doc: _JobDoc) -> str | None:
    if "model" not in doc.data:
        return None
    model = doc.text("model", doc.nodes["model"], "the model")
    if not model.strip() or len(model) > MAX_MODEL_CHARS or not model.isprintable():
        raise doc.fail("model", f"1 to {MAX_MODEL_CHARS} printable characters on one line, e.g. "
                                "'ResNet-50 (batch size 64)' as Gavel's throughput table names it")
    return model


def _name(doc: _JobDoc, source: str) -> str:
    if "name" in doc.data:
        name = doc.text("name", doc.nodes["name"], "the name")
    else:
        name = doc.clean("name", None, Path(source).stem, "the name (from the file name)")
    if not name.strip():
        raise doc.fail("name", "is empty")
    if len(name) > MAX_NAME_CHARS:
        raise doc.fail("name", f"{len(name)} characters; the limit is {MAX_NAME_CHARS}")
    if not name.isprintable():
        raise doc.fail("name", f"{_short(name)} holds a line break or control character")
    return name


def _workdir(doc: _JobDoc) -> str:
    if "workdir" not in doc.data:
        return "."
    wd = doc.text("workdir", doc.nodes["workdir"], "the working directory")
    if not wd:
        raise doc.fail("workdir", "is empty")
    if len(wd) > MAX_PATH_CHARS:
        raise doc.fail("workdir", f"{len(wd)} characters; the limit is {MAX_PATH_CHARS}")
    return wd


def parse_job_spec(text: str, source: str) -> JobSpec:
    """Validate a job file completely (every key, type, range and length; docs/runtime.md lists the limits)
    and return its JobSpec; any mistake is an InputError with the file and line. Run by ``hpcsched submit``
    before it calls the controller, and by the controller again before it stores anything."""
    size = len(text.encode("utf-8", "surrogatepass")) if len(text) * 4 > MAX_JOB_FILE_BYTES else len(text)
    if size > MAX_JOB_FILE_BYTES:
        raise InputError(source, f"the job file is {size} bytes; the limit is {MAX_JOB_FILE_BYTES} "
                                 f"({MAX_JOB_FILE_BYTES // 1024} KiB)")
    doc = _JobDoc(text, source)
    doc.check_keys(JOB_KEYS)
    command = _command(doc)
    launcher = doc.get("launcher", str, "torchrun")
    if launcher not in LAUNCHERS:
        raise doc.fail("launcher", f"unknown launcher {_short(launcher)}; expected one of {', '.join(LAUNCHERS)}")
    wire = "int32 on the wire"
    procs = doc.integer("procs", 1, 1, INT32_MAX, wire)
    lo = doc.integer("min_procs", procs, 1, INT32_MAX, wire)
    hi = doc.integer("max_procs", procs, 1, INT32_MAX, wire)
    if not lo <= procs <= hi:
        raise doc.fail("procs", f"need min_procs <= procs <= max_procs, got {lo} <= {procs} <= {hi}")
    return JobSpec(
        name=_name(doc, source),
        command=command,
        launcher=launcher,
        procs=procs,
        min_procs=lo,
        max_procs=hi,
        steps=doc.integer("steps", None, 1, INT64_MAX, "int64 on the wire and in the store"),
        workdir=_workdir(doc),
        env=_env(doc),
        **_scaling(doc),
        **_profile(doc),
        gpu_types=_gpu_types(doc),
        model=_model(doc),
        array=doc.integer("array", None, 1, MAX_ARRAY, "instances of one job array"),
    )


def read_job_file(path: str | Path) -> str:
    """A job file's text: at most MAX_JOB_FILE_BYTES, UTF-8 (a byte that is not names its line and column). Only a
    regular file: a named pipe hung ``submit`` (opened without O_NONBLOCK, it waits for a writer), a device or a
    directory is refused at once, checked again on the opened descriptor (the path may change in between)."""
    p = Path(path)
    try:
        _regular_file(p, os.stat(p).st_mode)
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        with os.fdopen(fd, "rb") as f:
            _regular_file(p, os.fstat(f.fileno()).st_mode)
            data = f.read(MAX_JOB_FILE_BYTES + 1)
    except OSError as e:
        raise InputError(p, f"cannot read: {e.strerror or e}") from None
    if len(data) > MAX_JOB_FILE_BYTES:
        raise InputError(p, f"the job file is over {MAX_JOB_FILE_BYTES} bytes; the limit is {MAX_JOB_FILE_BYTES} "
                            f"({MAX_JOB_FILE_BYTES // 1024} KiB)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise InputError(p, f"not UTF-8 text: byte 0x{data[e.start]:02x} at column {col}; save the file as UTF-8",
                         line) from None


def _regular_file(p: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = ("a directory" if stat.S_ISDIR(mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "not a regular file")
    raise InputError(p, f"is {kind}, not a job file: submit a regular YAML file")


def job_spec_yaml(spec: JobSpec) -> str:
    """A validated JobSpec as a job file that parses back to the same JobSpec: what ``hpcsched submit`` sends
    (its workdir made absolute), so the controller checks exactly what the client checked."""
    doc: dict[str, Any] = {"name": spec.name, "launcher": spec.launcher, "procs": spec.procs,
                           "min_procs": spec.min_procs, "max_procs": spec.max_procs}
    if spec.steps is not None:
        doc["steps"] = spec.steps
    doc["workdir"] = spec.workdir
    doc["command"] = list(spec.command)
    if spec.env:
        doc["env"] = dict(spec.env)
    if spec.curve_procs:
        doc["scaling"] = {"procs": list(spec.curve_procs), "rates": list(spec.curve_rates), "resize_s": spec.resize_s}
    if spec.profile is not None:
        doc["profile"] = dict(zip(PROFILE_KEYS, spec.profile, strict=True))
    if spec.gpu_types:
        doc["gpu_type"] = list(spec.gpu_types)
    if spec.model is not None:
        doc["model"] = spec.model
    if spec.array is not None:
        doc["array"] = spec.array
    # ASCII only: every other character escaped, as YAML would otherwise read some back changed (a raw U+0085 is
    # a line break to a YAML reader, folded into a space).
    # libyaml's emitter when present (5x faster: `hpcsched submit` of 10,000 files writes 10,000 of these), same text.
    return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False, allow_unicode=False,
                     width=1 << 30)
