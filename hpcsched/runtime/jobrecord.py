"""A job file's typed record on the wire (``JobRecord``): what ``hpcsched submit`` sends once it has read the file.

The client parses a job file once (``jobfile.parse_job_spec``: every mistake with its line) into a ``JobSpec`` and
sends that record; the controller builds the same ``JobSpec`` from it and checks every value and limit again
(``check_spec``: it trusts no client), without reading any YAML. Before, the client wrote the spec back as YAML and
the controller parsed that text a second time: two YAML parses and a YAML dump per job. A request without a record
(``spec_yaml`` only: older clients, hand-written calls) is parsed as before (``submitted_spec``).

``check_spec`` holds the same limits as the YAML reader (they are its constants); its errors name the key, not a
line: the text the line would point into was never sent.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from hpcsched.errors import InputError
from hpcsched.runtime import launchers
from hpcsched.runtime.adaptive_batch import BatchSpec, parse_batch
from hpcsched.runtime.jobfile import (
    ENV_NAME,
    INT32_MAX,
    INT64_MAX,
    MAX_ARGS,
    MAX_ARRAY,
    MAX_COMMAND_CHARS,
    MAX_CURVE_POINTS,
    MAX_ENV_CHARS,
    MAX_ENV_VARS,
    MAX_GPU_TYPES,
    MAX_MODEL_CHARS,
    MAX_NAME_CHARS,
    MAX_PATH_CHARS,
    JobSpec,
    gpu_type_name,
    parse_job_spec,
)
from hpcsched.runtime.rpc import pb


def to_record(spec: JobSpec) -> pb.JobRecord:
    """The record of a spec (every field; the optional ones set only when the spec has them)."""
    rec = pb.JobRecord(name=spec.name, command=spec.command, launcher=spec.launcher, procs=spec.procs,
                       min_procs=spec.min_procs, max_procs=spec.max_procs, workdir=spec.workdir, env=spec.env,
                       curve_procs=spec.curve_procs, curve_rates=spec.curve_rates, resize_s=spec.resize_s,
                       profile=spec.profile or (), gpu_types=spec.gpu_types)
    if spec.steps is not None:
        rec.steps = spec.steps
    if spec.model is not None:
        rec.model = spec.model
    if spec.array is not None:
        rec.array = spec.array
    if spec.batch is not None:
        b = spec.batch
        rec.batch.CopyFrom(pb.BatchRecord(base=b.base, max=b.max, min_per_proc=b.min_per_proc,
                                          max_per_proc=b.max_per_proc, lr_scaling=b.lr_scaling))
    return rec


def from_record(rec: pb.JobRecord, source: str) -> JobSpec:
    """The spec a record stands for, checked completely (``check_spec``); an InputError naming ``source`` and the
    key otherwise."""
    profile = tuple(rec.profile)
    if profile and len(profile) != 3:
        raise InputError(source, f"profile: expected 3 stage times (data_s, compute_s, comm_s), got {len(profile)}")
    batch = None
    if rec.HasField("batch"):
        b = rec.batch
        batch = BatchSpec(b.base, b.max, b.min_per_proc, b.max_per_proc, b.lr_scaling)
    spec = JobSpec(
        name=rec.name, command=tuple(rec.command), launcher=rec.launcher, procs=rec.procs, min_procs=rec.min_procs,
        max_procs=rec.max_procs, steps=rec.steps if rec.HasField("steps") else None, workdir=rec.workdir,
        env=dict(rec.env), curve_procs=tuple(rec.curve_procs), curve_rates=tuple(rec.curve_rates),
        resize_s=rec.resize_s, profile=(profile[0], profile[1], profile[2]) if profile else None,
        gpu_types=tuple(rec.gpu_types), model=rec.model if rec.HasField("model") else None,
        array=rec.array if rec.HasField("array") else None, batch=batch)
    check_spec(spec, source)
    return spec


def submitted_spec(request: pb.SubmitRequest, source: str) -> JobSpec:
    """The spec a Submit / SubmitMany item carries: its record when set, else its job file text parsed."""
    if request.HasField("job"):
        return from_record(request.job, source)
    return parse_job_spec(request.spec_yaml, source)


def _text(source: str, key: str, value: str, what: str, limit: int) -> None:
    if "\0" in value:
        raise InputError(source, f"{key}: {what} contains a NUL byte, which no command line or environment can hold")
    if len(value) > limit:
        raise InputError(source, f"{key}: {what} has {len(value)} characters; the limit is {limit}")


def check_spec(spec: JobSpec, source: str) -> None:
    """Every value of a spec within the job file's limits (``jobfile``'s constants; docs/runtime.md lists them), as
    ``parse_job_spec`` checks them in a file; an InputError naming ``source`` and the key otherwise."""
    def fail(key: str, message: str) -> InputError:
        return InputError(source, f"{key}: {message}")

    _text(source, "name", spec.name, "the name", MAX_NAME_CHARS)
    if not spec.name.strip() or not spec.name.isprintable():
        raise fail("name", "is empty or holds a line break or control character")
    if not spec.command or not spec.command[0]:
        raise fail("command", "the program (first argument) is empty")
    if len(spec.command) > MAX_ARGS:
        raise fail("command", f"at most {MAX_ARGS} arguments, got {len(spec.command)}")
    for arg in spec.command:
        _text(source, "command", arg, "an argument", MAX_COMMAND_CHARS)
    if (n := sum(len(c) for c in spec.command)) > MAX_COMMAND_CHARS:
        raise fail("command", f"{n} characters; the limit is {MAX_COMMAND_CHARS} for all arguments together")
    if spec.launcher not in launchers.names():
        raise fail("launcher", f"unknown launcher {spec.launcher[:40]!r}; expected one of "
                               f"{', '.join(launchers.names())}")
    for key, v in (("procs", spec.procs), ("min_procs", spec.min_procs), ("max_procs", spec.max_procs)):
        if not 1 <= v <= INT32_MAX:
            raise fail(key, f"must be between 1 and {INT32_MAX}, got {v}")
    if not spec.min_procs <= spec.procs <= spec.max_procs:
        raise fail("procs", f"need min_procs <= procs <= max_procs, got {spec.min_procs} <= {spec.procs} <= "
                            f"{spec.max_procs}")
    if spec.steps is not None and not 1 <= spec.steps <= INT64_MAX:
        raise fail("steps", f"must be between 1 and {INT64_MAX}, got {spec.steps}")
    _text(source, "workdir", spec.workdir, "the working directory", MAX_PATH_CHARS)
    if not spec.workdir:
        raise fail("workdir", "is empty")
    _check_env(spec.env, fail)
    _check_numbers(spec, fail)
    if len(spec.gpu_types) > MAX_GPU_TYPES or len(set(spec.gpu_types)) != len(spec.gpu_types):
        raise fail("gpu_type", f"at most {MAX_GPU_TYPES} types, each once")
    for t in spec.gpu_types:
        try:
            if gpu_type_name(t) != t:
                raise ValueError(f"{t[:40]!r} is not lower case and trimmed")
        except ValueError as e:
            raise fail("gpu_type", str(e)) from None
    if spec.model is not None and (not spec.model.strip() or len(spec.model) > MAX_MODEL_CHARS
                                   or not spec.model.isprintable()):
        raise fail("model", f"1 to {MAX_MODEL_CHARS} printable characters on one line")
    if spec.array is not None and not 1 <= spec.array <= MAX_ARRAY:
        raise fail("array", f"must be between 1 and {MAX_ARRAY}, got {spec.array}")
    if spec.batch is not None:
        try:
            if parse_batch(spec.batch.as_dict()) != spec.batch:
                raise ValueError("min_per_proc and max_per_proc must be whole numbers")
        except ValueError as e:
            raise fail("batch", str(e)) from None


def _check_env(env: dict[str, str], fail: Callable[[str, str], InputError]) -> None:
    if len(env) > MAX_ENV_VARS:
        raise fail("env", f"at most {MAX_ENV_VARS} variables, got {len(env)}")
    for k, v in env.items():
        if not ENV_NAME.fullmatch(k):
            raise fail("env", f"{k[:40]!r} is not a valid variable name: letters, digits and _, not starting with a "
                              "digit")
        if "\0" in v:
            raise fail("env", f"the value of {k} contains a NUL byte, which no environment can hold")
    if (n := sum(len(k) + len(v) for k, v in env.items())) > MAX_ENV_CHARS:
        raise fail("env", f"{n} characters; the limit is {MAX_ENV_CHARS} for all names and values together")


def _check_numbers(spec: JobSpec, fail: Callable[[str, str], InputError]) -> None:
    """The declared scaling curve and stage profile (``scaling:``, ``profile:``)."""
    if spec.curve_procs or spec.curve_rates:
        if len(spec.curve_procs) > MAX_CURVE_POINTS:
            raise fail("scaling", f"at most {MAX_CURVE_POINTS} points, got {len(spec.curve_procs)}")
        try:
            from hpcsched.model import ScalingCurve

            ScalingCurve(spec.curve_procs, spec.curve_rates)  # same lengths, increasing sizes, finite rates >= 0
        except (TypeError, ValueError, OverflowError) as e:
            raise fail("scaling", str(e)) from None
        if not spec.curve_procs or spec.curve_procs[0] < 1 or spec.curve_procs[-1] > INT32_MAX:
            raise fail("scaling", f"sizes must be between 1 and {INT32_MAX}")
    if not 0 <= spec.resize_s < math.inf:
        raise fail("scaling", "resize_s must be finite and >= 0")
    if spec.profile is not None and (not all(math.isfinite(v) and v >= 0 for v in spec.profile)
                                     or not 0 < sum(spec.profile) < math.inf):
        raise fail("profile", "stage times must be finite, >= 0, and not all 0")
