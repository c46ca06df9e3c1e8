"""Job files are validated completely before anything is stored (issue 15, items 2-3).

Each bad file seen in the field gets a file:line error from ``config.parse_job_spec``; ``hpcsched submit`` (a
real CLI process) refuses it before any RPC, and a real controller refuses it again over real gRPC when a
client sends it anyway. What used to happen: ``steps: 10000000000000000000`` was stored and every later
``hpcsched jobs`` failed (``Value out of range``); two 3 MB names pushed the listing past gRPC's 4 MB limit;
``procs: 1e30``-sized numbers gave ``UNKNOWN: int too large``; ``procs: 1000000`` waited with an empty
message; duplicate keys passed silently; an unterminated quote or a non-UTF-8 file gave a client traceback;
env names like ``A=B`` and NUL bytes crashed the worker (test_runtime_failures).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_procs import TOKEN, client, controller_config, start_controller, start_worker, stop, wait_for

from hpcsched.errors import InputError
from hpcsched.runtime import launchers
from hpcsched.runtime.client import Client, ClientError
from hpcsched.runtime.jobfile import (
    ENV_NAME,
    GPU_TYPE,
    INT32_MAX,
    INT64_MAX,
    MAX_ARGS,
    MAX_COMMAND_CHARS,
    MAX_CURVE_POINTS,
    MAX_ENV_CHARS,
    MAX_ENV_VARS,
    MAX_JOB_FILE_BYTES,
    MAX_NAME_CHARS,
    MAX_PATH_CHARS,
    JobSpec,
    job_spec_yaml,
    parse_job_spec,
    read_job_file,
)
from hpcsched.runtime.store import Store

C = "command: [a.py]\n"
_long_env = "".join(f"  V{i}: x\n" for i in range(MAX_ENV_VARS + 1))

# (job file, line, what the error says). Every one of them was accepted, stored or crashed something before.
BAD: dict[str, tuple[str, int | None, str]] = {
    # env names and NUL bytes: crashed the worker daemon (illegal environment variable name, embedded null byte)
    "env-name-with-equals": (C + 'env:\n  "A=B": 1\n', 3, r"env: 'A=B' is not a valid variable name"),
    "env-name-empty": (C + 'env: {"": 1}\n', 2, r"env: '' is not a valid variable name"),
    "env-name-digit-first": (C + "env: {1A: x}\n", 2, r"env: '1A' is not a valid variable name"),
    "env-name-space": (C + 'env: {"A B": x}\n', 2, r"env: 'A B' is not a valid variable name"),
    "nul-in-argument": ('command: [a.py, "x\\0y"]\n', 1, r"command: argument 2 contains a NUL byte"),
    "nul-in-command-line": ('command: "a.py x\\0y"\n', 1, r"command: the command line contains a NUL byte"),
    "nul-in-env-value": (C + 'env: {A: "x\\0"}\n', 2, r"env: the value of A contains a NUL byte"),
    "nul-in-workdir": (C + 'workdir: "/tmp/\\0"\n', 2, r"workdir: the working directory contains a NUL byte"),
    "raw-nul-byte": (C + "name: a\0b\n", 2, r"not valid YAML: character '\\x00'"),
    # sizes that do not fit the store or the wire
    "steps-past-int64": (C + "steps: 10000000000000000000\n", 2, r"steps: must be at most 9223372036854775807"),
    "procs-1e30": (C + "procs: 1e30\n", 2, r"procs: expected a whole number, got '1e30'"),
    "procs-float-1e30": (C + "procs: 1.0e+30\n", 2, r"procs: expected a whole number, got 1e\+30"),
    "procs-10-to-30": (C + "procs: " + "1" + "0" * 30 + "\n", 2, r"procs: must be at most 2147483647 \(int32"),
    "procs-past-int32": (C + "procs: 2147483648\n", 2, r"procs: must be at most 2147483647"),
    "max-procs-past-int32": (C + "max_procs: 99999999999\n", 2, r"max_procs: must be at most 2147483647"),
    "min-procs-0": (C + "min_procs: 0\n", 2, r"min_procs: must be >= 1, got 0"),
    "steps-0": (C + "steps: 0\n", 2, r"steps: must be >= 1, got 0"),
    "steps-negative": (C + "steps: -5\n", 2, r"steps: must be >= 1, got -5"),
    "steps-fraction": (C + "steps: 1.5\n", 2, r"steps: expected a whole number, got 1.5"),
    "steps-bool": (C + "steps: true\n", 2, r"steps: expected a whole number, got True"),
    "procs-null": (C + "procs:\n", 2, r"procs: is empty \(null\)"),
    "profile-huge": (C + "profile: {data_s: " + "9" * 400 + "}\n", 2, r"profile: stage times must be numbers"),
    "profile-inf": (C + "profile: {data_s: .inf}\n", 2, r"profile: stage times must be finite"),
    "scaling-size-past-int32": (C + "scaling: {procs: [1, 4294967296], rates: [1, 2]}\n", 2,
                                r"scaling: sizes must be between 1 and 2147483647"),
    "scaling-rate-inf": (C + "scaling: {procs: [1, 2], rates: [1, .inf]}\n", 2, r"scaling: "),
    "scaling-too-many-points": (C + f"scaling: {{procs: {list(range(1, MAX_CURVE_POINTS + 2))}, "
                                    f"rates: {[1.0] * (MAX_CURVE_POINTS + 1)}}}\n", 2, r"scaling: at most 256 points"),
    # lengths
    "name-too-long": (C + f"name: {'n' * (MAX_NAME_CHARS + 1)}\n", 2, r"name: 129 characters; the limit is 128"),
    "name-3mb": (C + f"name: {'n' * 3_000_000}\n", None, r"the job file is (over )?\d+ bytes; the limit is 65536"),
    "name-newline": (C + 'name: "a\\nb"\n', 2, r"name: 'a\\nb' holds a line break or control character"),
    "name-ansi": (C + 'name: "\\e[31mred"\n', 2, r"name: .* holds a line break or control character"),
    "name-empty": (C + 'name: " "\n', 2, r"name: is empty"),
    "too-many-args": ("command: [" + ", ".join(["a"] * (MAX_ARGS + 1)) + "]\n", 1,
                      r"command: at most 1024 arguments, got 1025"),
    "too-many-args-in-a-line": ("command: " + " ".join(["a"] * (MAX_ARGS + 1)) + "\n", 1,
                                r"command: at most 1024 arguments, got 1025"),
    "command-too-long": (f"command: [a.py, {'x' * MAX_COMMAND_CHARS}]\n", 1, r"command: 16388 characters; the limit"),
    "too-many-env-vars": (C + "env:\n" + _long_env, 3, r"env: at most 256 variables, got 257"),
    "env-too-long": (C + f"env: {{A: {'x' * MAX_ENV_CHARS}}}\n", 2, r"env: 16385 characters; the limit is 16384"),
    "workdir-too-long": (C + f"workdir: /{'d' * MAX_PATH_CHARS}\n", 2, r"workdir: 4097 characters; the limit is 4096"),
    "file-too-large": (C + "#" + "x" * MAX_JOB_FILE_BYTES + "\n", None,
                       r"the job file is 65554 bytes; the limit is 65536 \(64 KiB\)"),
    # structure, quoting, encodings
    "duplicate-key": (C + "procs: 1\nprocs: 2\n", 3, r"procs: duplicate key \(first at line 2\)"),
    "duplicate-env-key": (C + "env:\n  A: 1\n  B: 2\n  A: 3\n", 5, r"A: duplicate key \(first at line 3\)"),
    "duplicate-scaling-key": (C + "scaling:\n  procs: [1]\n  rates: [1]\n  procs: [2]\n", 5, r"procs: duplicate key"),
    "unterminated-quote-in-command-line": ("command: \"a.py --msg 'hello\"\n", 1,
                                           r"command: cannot split this command line: No closing quotation"),
    "unterminated-yaml-quote": ('name: x\ncommand: "a.py\nprocs: 1\n', 4,
                                r"not valid YAML: found unexpected end of stream \(while scanning a quoted scalar "
                                r"that starts at line 2\)"),
    "unclosed-list": ("command: [a.py, b\nprocs: 1\n", 2, r"not valid YAML: "),
    "alias": ("command: &c [a.py]\nname: *c\n", 1, r"anchors and aliases"),  # the line of the anchor
    "merge-key": ("base: &b {procs: 1}\n<<: *b\n" + C, 2, r"anchors and aliases|merge keys"),
    "merge-key-inline": ("<<: {procs: 2}\n" + C, 1, r"merge keys \(<<\) are not supported"),
    "impossible-date": (C + "name: 2024-13-45\n", 2, r"not valid YAML: month must be in 1..12"),
    "surrogate-escape": ('command: [a.py, "\\ud800"]\n', 1, r"(not valid YAML|not valid UTF-8)"),
    "argument-list": ("command: [a.py, [x]]\n", 1, r"command: argument 2 must be a single value"),
    "argument-null": ("command: [a.py, ~]\n", 1, r"command: argument 2 is empty \(null\); quote it"),
    "env-value-null": (C + "env:\n  A:\n", 3, r"env: the value of A is empty \(null\)"),
    "env-value-list": (C + "env: {A: [1]}\n", 2, r"env: the value of A must be a single value"),
    "env-not-mapping": (C + "env: [A]\n", 2, r"env: expected a mapping"),
    "empty-command": ("command: []\n", 1, r"command: the program \(first argument\) is empty"),
    "empty-command-line": ('command: ""\n', 1, r"command: the program \(first argument\) is empty"),
    "unknown-key": (C + "prcos: 2\n", 2, r"prcos: unknown key"),
    "not-a-mapping": ("- a\n- b\n", 1, r"expected a mapping"),
}


def _match(text: str, line: int | None, what: str, source: str = "job.yaml") -> None:
    where = f"{re.escape(source)}:{line}: " if line else f"{re.escape(source)}: "
    with pytest.raises(InputError, match="^" + where + what):
        parse_job_spec(text, source)


@pytest.mark.parametrize("case", list(BAD))
def test_bad_job_file_is_refused_with_its_line(case: str) -> None:
    _match(*BAD[case])


def test_limits_are_inclusive() -> None:
    """Each limit itself is accepted: they bound, they do not shave off legitimate values."""
    spec = parse_job_spec(
        f"name: {'n' * MAX_NAME_CHARS}\nprocs: {INT32_MAX}\nmax_procs: {INT32_MAX}\nsteps: {INT64_MAX}\n"
        f"workdir: /{'d' * (MAX_PATH_CHARS - 1)}\ncommand: [{', '.join(['a'] * MAX_ARGS)}]\n"
        "env:\n" + "".join(f"  V{i}: x\n" for i in range(MAX_ENV_VARS)), "job.yaml")
    assert (spec.procs, spec.steps, len(spec.command), len(spec.env)) == (INT32_MAX, INT64_MAX, MAX_ARGS, MAX_ENV_VARS)
    spec = parse_job_spec(f"command: [{'x' * MAX_COMMAND_CHARS}]\nenv: {{A: {'x' * (MAX_ENV_CHARS - 1)}}}\n", "j.yaml")
    assert len(spec.command[0]) == MAX_COMMAND_CHARS


def test_values_are_kept_as_written() -> None:
    """Command arguments and env values are the text the user wrote: YAML 1.1 turned ``0777`` into 511 and
    ``yes`` into True ("True" in the environment)."""
    spec = parse_job_spec('command: [a.py, 0777, yes, 1.10, 1_000, "tab\\there", ""]\n'
                          "env: {MODE: 0777, DEBUG: true, LR: 1e-3, EMPTY: ''}\n", "job.yaml")
    assert spec.command == ("a.py", "0777", "yes", "1.10", "1_000", "tab\there", "")
    assert spec.env == {"MODE": "0777", "DEBUG": "true", "LR": "1e-3", "EMPTY": ""}


def test_job_file_bytes_must_be_utf8(tmp_path: Path) -> None:
    """A non-UTF-8 file gave the client a UnicodeDecodeError traceback; now its line and column."""
    p = tmp_path / "job.yaml"
    p.write_bytes(b"command: [a.py]\nname: caf\xe9\n")
    with pytest.raises(InputError, match=r"job.yaml:2: not UTF-8 text: byte 0xe9 at column 10"):
        read_job_file(p)
    p.write_bytes(b"\xef\xbb\xbfcommand: [a.py]\n")  # a BOM is fine
    assert parse_job_spec(read_job_file(p), str(p)).command == ("a.py",)
    p.write_bytes(b"command: [a.py]\n" + b"#" * MAX_JOB_FILE_BYTES)
    with pytest.raises(InputError, match=r"job.yaml: the job file is over 65536 bytes; the limit is 65536 \(64 KiB\)"):
        read_job_file(p)
    with pytest.raises(InputError, match=r"is a directory, not a job file"):
        read_job_file(tmp_path)
    with pytest.raises(InputError, match=r"cannot read: No such file"):
        read_job_file(tmp_path / "missing.yaml")


# ------------------------------------------------------------------------------ what the client sends
_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)
_name = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp", "Cf", "Co", "Cn")), min_size=1,
                max_size=MAX_NAME_CHARS).filter(lambda s: s.strip() and s.isprintable())


@st.composite
def job_specs(draw: st.DrawFn) -> JobSpec:
    lo, procs, hi = sorted(draw(st.lists(st.integers(1, INT32_MAX), min_size=3, max_size=3)))
    curve: dict = {}
    if draw(st.booleans()):
        sizes = sorted(set(draw(st.lists(st.integers(1, INT32_MAX), min_size=1, max_size=6))))
        rates = draw(st.lists(st.floats(0, 1e12, allow_nan=False), min_size=len(sizes), max_size=len(sizes)))
        curve = {"curve_procs": tuple(sizes), "curve_rates": tuple(rates),
                 "resize_s": draw(st.floats(0, 1e6, allow_nan=False))}
    profile = None
    if draw(st.booleans()):
        profile = tuple(draw(st.lists(st.floats(0, 10, allow_nan=False), min_size=3, max_size=3)))
        if sum(profile) <= 0:
            profile = (0.1, 0.0, 0.0)
    return JobSpec(
        name=draw(_name), command=tuple([draw(_text.filter(bool)), *draw(st.lists(_text, max_size=6))]),
        launcher=draw(st.sampled_from(launchers.names())), procs=procs, min_procs=lo, max_procs=hi,
        steps=draw(st.none() | st.integers(1, INT64_MAX)), workdir=draw(_text.filter(bool)),
        env=draw(st.dictionaries(st.from_regex(ENV_NAME, fullmatch=True).filter(lambda s: len(s) < 30), _text,
                                 max_size=6)),
        profile=profile, **curve,
        gpu_types=tuple(draw(st.lists(st.from_regex(GPU_TYPE, fullmatch=True), max_size=3, unique=True))),
        model=draw(st.none() | _name))


@settings(max_examples=300, deadline=None)
@given(job_specs())
def test_what_submit_sends_parses_back_to_the_same_spec(spec: JobSpec) -> None:
    """``hpcsched submit`` sends ``job_spec_yaml(spec)``: the controller must read exactly the spec the client
    validated (any text in arguments and values, every number at its limit)."""
    assert parse_job_spec(job_spec_yaml(spec), "job.yaml") == spec


_FRAGMENTS = ["command: [a.py]\n", "command: a.py 'x\n", "name: ", "env:\n", "  A: ", "procs: ", "steps: ",
              "scaling: {procs: [1, 2], rates: [1, 2]}\n", "profile: {data_s: ", "workdir: ", "- ", "{", "}", "[", "]",
              "&a ", "*a", "<<: ", "!!binary ", "!!python/object:os.system ", "~", "1e30", "0x10", "-1", ".inf",
              "2024-02-30", '"\\0"', '"\\ud800"', "\0", "\t", "\n", ": ", "'", '"', "#", "\u2028", "\ufeff"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=8), max_size=25).map("".join))
def test_any_text_is_a_job_spec_or_an_input_error(text: str) -> None:
    """The controller turns only InputError into INVALID_ARGUMENT; anything else was UNKNOWN ('int too large')
    or a client traceback. So no text may raise anything else."""
    try:
        parse_job_spec(text, "job.yaml")
    except InputError:
        pass


# -------------------------------------------------------------------- a real controller over real gRPC
@pytest.fixture
def controller(tmp_path: Path) -> Iterator[tuple[str, Client]]:
    proc, address = start_controller(tmp_path, controller_config(tmp_path))
    c = client(address)
    try:
        yield address, c
    finally:
        c.close()
        stop(proc)


def _cli(address: str, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"HPCSCHED_TOKEN": TOKEN, "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "hpcsched.runtime", *args, "--controller", address],
                          capture_output=True, text=True, env=env, timeout=120)


CLI_CASES = ["env-name-with-equals", "nul-in-argument", "steps-past-int64", "procs-10-to-30", "duplicate-key",
             "unterminated-quote-in-command-line", "unterminated-yaml-quote", "name-3mb"]


@pytest.mark.slow
def test_submit_cli_refuses_bad_files_with_file_and_line(tmp_path: Path, controller: tuple[str, Client]) -> None:
    """``hpcsched submit`` as a user runs it: one line naming file and line, exit 2, no traceback, no RPC
    (nothing stored); a non-UTF-8 file likewise."""
    address, c = controller
    cases = {case: BAD[case] for case in CLI_CASES}
    cases["non-utf8"] = (b"command: [a.py]\nname: caf\xe9\n", 2, r"not UTF-8 text: byte 0xe9")
    for case, (text, line, what) in cases.items():
        p = tmp_path / f"{case}.yaml"
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        done = _cli(address, "submit", str(p))
        assert done.returncode == 2, (case, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, (case, done.stderr)
        where = f"{re.escape(str(p))}:{line}: " if line else f"{re.escape(str(p))}: "
        assert re.fullmatch(f"error: {where}{what}.*\n", done.stderr, re.S), (case, done.stderr)
    assert c.jobs() == []


@pytest.mark.slow
def test_submit_cli_sends_what_it_checked(tmp_path: Path, controller: tuple[str, Client]) -> None:
    """A good file goes through as written (``0777`` stays 0777), its workdir resolved from its folder."""
    address, c = controller
    (tmp_path / "sub").mkdir()
    p = tmp_path / "sub" / "good.yaml"
    p.write_text("command: a.py --mode 0777 'two words'\nworkdir: ..\nenv: {MODE: 0777, ON: yes}\nsteps: 10\n")
    done = _cli(address, "submit", str(p), "--json")
    assert done.returncode == 0, done.stderr
    jid = json.loads(done.stdout)["job_id"]
    st_ = Store(tmp_path / "run" / "state.db")
    try:
        (job,) = st_.jobs(ids=[jid])
    finally:
        st_.close()
    assert job.spec == JobSpec(name="good", command=("a.py", "--mode", "0777", "two words"), steps=10,
                               workdir=str(tmp_path), env={"MODE": "0777", "ON": "yes"})


CONTROLLER_CASES = [*CLI_CASES, "env-name-empty", "nul-in-env-value", "procs-1e30", "procs-float-1e30",
                    "duplicate-env-key", "alias", "name-newline", "file-too-large", "profile-huge",
                    "scaling-size-past-int32", "impossible-date"]


@pytest.mark.slow
def test_controller_refuses_what_a_client_did_not_check(controller: tuple[str, Client]) -> None:
    """Never trust the client: the same files sent straight over gRPC get INVALID_ARGUMENT with the line, nothing
    is stored, and listing keeps working (it failed for everyone after one ``steps: 10**19``)."""
    _, c = controller
    for case in CONTROLLER_CASES:
        text, line, what = BAD[case]
        where = f"job.yaml:{line}: " if line else "job.yaml: "
        with pytest.raises(ClientError, match=f"INVALID_ARGUMENT: {re.escape(where)}{what}"):
            c.submit(text, "job.yaml")
    assert c.jobs() == []
    jid = c.submit("command: [a.py]\nsteps: 9223372036854775807\n", "job.yaml")
    assert [(j.job_id, j.steps_total) for j in c.jobs()] == [(jid, INT64_MAX)]


@pytest.mark.slow
def test_listing_survives_a_state_file_from_before_validation(tmp_path: Path) -> None:
    """A state file that holds what old controllers accepted (steps past int64, two 3 MB names): listing,
    cancelling and a restart all work; the listing stays far below gRPC's 4 MB."""
    st_ = Store(tmp_path / "run" / "state.db")
    ids = [st_.add_job(JobSpec(name="x" * 3_000_000, command=("a.py",), steps=10**19 + k), time.time())
           for k in range(2)]
    st_.close()
    for _restart in range(2):
        proc, address = start_controller(tmp_path, controller_config(tmp_path))
        c = client(address)
        try:
            jobs = c.jobs()
            assert [j.job_id for j in jobs] == ids
            assert all(j.steps_total == INT64_MAX and len(j.name) == MAX_NAME_CHARS for j in jobs)
            if _restart == 0:
                assert c.cancel(ids[0]).cancelled
            assert [j.state for j in c.jobs()] == ["cancelled", "pending"]
            done = _cli(address, "jobs")
            assert done.returncode == 0 and ids[1] in done.stdout, done.stderr
        finally:
            c.close()
            stop(proc)


@pytest.mark.slow
def test_job_larger_than_every_worker_says_so(tmp_path: Path) -> None:
    """``procs: 1000000`` waited with an empty message; now the message says why, in ``hpcsched jobs`` too,
    while a job that fits runs."""
    proc, address = start_controller(tmp_path, controller_config(tmp_path))
    procs = [proc]
    c = client(address)
    try:
        procs.append(start_worker(tmp_path, address, "w0", slots=2))
        wait_for("the worker", lambda: any(w.alive for w in c.workers()), 90)
        big = c.submit(f"name: big\nlauncher: direct\nprocs: 1000000\nworkdir: {tmp_path}\ncommand: [sleep, '1']\n",
                       "big.yaml")
        small = c.submit(f"name: small\nlauncher: direct\nworkdir: {tmp_path}\ncommand: [sh, -c, 'exit 0']\n",
                         "small.yaml")
        want = "waiting: needs 1000000 procs, and the 1 live worker with direct has 2 slots in total"
        wait_for("the note", lambda: [j for j in c.jobs() if j.job_id == big and j.message == want], 60)
        wait_for("the small job to complete", lambda: [j for j in c.jobs() if j.job_id == small
                                                       and j.state == "completed"], 120)
        assert {j.job_id: j.state for j in c.jobs()}[big] == "pending"
        assert want in _cli(address, "jobs", "-o", "wide").stdout  # the message is a wide column
    finally:
        c.close()
        for p in reversed(procs):
            stop(p)


def test_profile_and_scaling_floats_are_finite() -> None:
    spec = parse_job_spec(C + "profile: {data_s: 1e-3, compute_s: 0.5}\nscaling: {procs: [1, 2], rates: [1, 2]}\n",
                          "j.yaml")
    assert spec.profile is not None and all(math.isfinite(v) for v in spec.profile)
