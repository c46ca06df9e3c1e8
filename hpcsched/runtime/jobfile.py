"""Job files: the YAML a user submits, validated completely (types, ranges, lengths, names, encodings) into one
typed record, ``JobSpec``, with the file and line of every mistake; and the record written back as YAML."""

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
from hpcsched.runtime import launchers
from hpcsched.runtime.adaptive_batch import BatchSpec, parse_batch
from hpcsched.runtime.yamldoc import Doc, node_line

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
    batch: BatchSpec | None = None  # ``batch:``: an adaptive global batch, told to each attempt (``adaptive_batch``)

    @property
    def elastic(self) -> bool:
        return self.min_procs != self.max_procs


JOB_KEYS = {"name", "command", "launcher", "procs", "min_procs", "max_procs", "steps", "workdir", "env", "scaling",
            "profile", "gpu_type", "model", "array", "batch"}
SCALING_KEYS = {"procs", "rates", "resize_s"}
PROFILE_KEYS = ("data_s", "compute_s", "comm_s")


class _JobDoc(Doc):
    """A job file's reader: every value checked for type, range, length and what the OS accepts, with the line
    of the offending value (nested ones too: an env entry, a command argument)."""

    def node_fail(self, key: str, node: yaml.Node | None, message: str) -> InputError:
        line = node_line(node) if node is not None else self.lines.get(key)
        return InputError(self.source, f"{key}: {message}", line)

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
    if launcher not in launchers.names():
        raise doc.fail("launcher", f"unknown launcher {_short(launcher)}; expected one of "
                                   f"{', '.join(launchers.names())}")
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
        batch=_batch(doc),
    )


def _batch(doc: _JobDoc) -> BatchSpec | None:
    """``batch: {base: 64, max: 1024, min_per_proc: 16, max_per_proc: 256, lr_scaling: sqrt}`` (``adaptive_batch``)."""
    if "batch" not in doc.data:
        return None
    try:
        return parse_batch(doc.data["batch"])
    except ValueError as e:
        raise doc.fail("batch", str(e)) from None


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
    if spec.batch is not None:
        doc["batch"] = spec.batch.as_dict()
    # ASCII only: every other character escaped, as YAML would otherwise read some back changed (a raw U+0085 is
    # a line break to a YAML reader, folded into a space).
    # libyaml's emitter when present (5x faster: `hpcsched submit` of 10,000 files writes 10,000 of these), same text.
    return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False, allow_unicode=False,
                     width=1 << 30)
