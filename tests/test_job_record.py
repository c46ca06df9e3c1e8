"""A job file is read once, by the client: the typed record it sends (``JobRecord``) is what the controller stores.

The controller builds the ``JobSpec`` from the record and checks every value and limit again (it trusts no client),
without any YAML; a record that breaks a limit is refused with the key named, nothing stored. Requests with only
``spec_yaml`` (older clients) are parsed as before.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from runtime_procs import TOKEN, client, controller_config, start_controller, stop
from test_job_validation import job_specs

from hpcsched.errors import InputError
from hpcsched.runtime.adaptive_batch import BatchSpec
from hpcsched.runtime.auth import metadata
from hpcsched.runtime.client import Client
from hpcsched.runtime.jobfile import (
    INT32_MAX,
    MAX_ARGS,
    MAX_COMMAND_CHARS,
    MAX_ENV_VARS,
    MAX_NAME_CHARS,
    MAX_PATH_CHARS,
    JobSpec,
    parse_job_spec,
)
from hpcsched.runtime.jobrecord import check_spec, from_record, to_record
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.store import Store


@settings(max_examples=300, deadline=None)
@given(job_specs())
def test_a_record_carries_the_spec_exactly(spec: JobSpec) -> None:
    """Any valid spec (any text, every number at its limit) survives the wire as the same spec and passes the
    controller's check."""
    wire = pb.JobRecord.FromString(to_record(spec).SerializeToString())
    assert from_record(wire, "job.yaml") == spec


def test_optional_values_and_batch_round_trip() -> None:
    spec = parse_job_spec("command: [a.py]\nsteps: 7\nmodel: ResNet-50\narray: 3\ngpu_type: [v100, a100]\n"
                          "batch: {base: 64, max: 1024, min_per_proc: 8, lr_scaling: linear}\n"
                          "profile: {data_s: 0.1, compute_s: 0.2}\n", "j.yaml")
    assert spec.batch is not None and spec.array == 3 and spec.profile == (0.1, 0.2, 0.0)
    assert from_record(to_record(spec), "j.yaml") == spec
    bare = parse_job_spec("command: [a.py]\n", "j.yaml")
    rec = to_record(bare)
    assert not any(rec.HasField(k) for k in ("steps", "model", "array", "batch"))
    assert from_record(rec, "j.yaml") == bare


_GOOD = JobSpec(name="ok", command=("a.py",), workdir="/tmp")
# (change to a valid spec, the key the refusal names, what it says): a client that checked nothing sends these
BAD_RECORDS: dict[str, tuple[dict, str, str]] = {
    "empty-name": ({"name": " "}, "name", "empty"),
    "name-newline": ({"name": "a\nb"}, "name", "line break"),
    "name-too-long": ({"name": "n" * (MAX_NAME_CHARS + 1)}, "name", "the limit is"),
    "no-command": ({"command": ()}, "command", "empty"),
    "empty-program": ({"command": ("",)}, "command", "empty"),
    "nul-in-argument": ({"command": ("a.py", "x\0y")}, "command", "NUL byte"),
    "too-many-arguments": ({"command": ("a",) * (MAX_ARGS + 1)}, "command", f"at most {MAX_ARGS}"),
    "command-too-long": ({"command": ("a", "x" * MAX_COMMAND_CHARS)}, "command", "characters; the limit"),
    "unknown-launcher": ({"launcher": "qsub"}, "launcher", "unknown launcher"),
    "procs-zero": ({"procs": 0, "min_procs": 0}, "procs", "between 1 and"),
    "procs-outside-range": ({"procs": 4, "max_procs": 2}, "procs", "min_procs <= procs <= max_procs"),
    "steps-zero": ({"steps": 0}, "steps", "between 1 and"),
    "empty-workdir": ({"workdir": ""}, "workdir", "empty"),
    "workdir-too-long": ({"workdir": "/" * (MAX_PATH_CHARS + 1)}, "workdir", "the limit is"),
    "env-name": ({"env": {"A=B": "1"}}, "env", "not a valid variable name"),
    "env-nul": ({"env": {"A": "x\0"}}, "env", "NUL byte"),
    "env-too-many": ({"env": {f"V{i}": "x" for i in range(MAX_ENV_VARS + 1)}}, "env", f"at most {MAX_ENV_VARS}"),
    "curve-lengths": ({"curve_procs": (1, 2), "curve_rates": (1.0,)}, "scaling", ""),
    "curve-size-past-int32": ({"curve_procs": (1, INT32_MAX + 1), "curve_rates": (1.0, 2.0)}, "scaling",
                              "between 1 and"),
    "resize-nan": ({"resize_s": math.nan}, "scaling", "resize_s"),
    "profile-all-zero": ({"profile": (0.0, 0.0, 0.0)}, "profile", "not all 0"),
    "gpu-type-upper-case": ({"gpu_types": ("V100",)}, "gpu_type", "lower case"),
    "gpu-type-twice": ({"gpu_types": ("v100", "v100")}, "gpu_type", "each once"),
    "model-blank": ({"model": " "}, "model", "printable"),
    "array-zero": ({"array": 0}, "array", "between 1 and"),
    "batch-rule": ({"batch": BatchSpec(64, 128, lr_scaling="cubic")}, "batch", "lr_scaling"),
    "batch-max-below-base": ({"batch": BatchSpec(64, 32)}, "batch", "below base"),
}

_UNSENDABLE = {"curve-size-past-int32"}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_the_controller_check_refuses_each_limit_naming_the_key(case: str) -> None:
    change, key, what = BAD_RECORDS[case]
    spec = dataclasses.replace(_GOOD, **change)
    with pytest.raises(InputError, match=rf"^job.yaml: {key}: .*{what}"):
        check_spec(spec, "job.yaml")
    if case in _UNSENDABLE:  # the record's int32 cannot hold it: the wire refuses it before any check
        with pytest.raises(ValueError, match="out of range"):
            to_record(spec)
        return
    with pytest.raises(InputError, match=rf"^job.yaml: {key}: "):  # as received over the wire
        from_record(to_record(spec), "job.yaml")


def test_a_profile_of_other_than_three_stages_is_refused() -> None:
    rec = to_record(_GOOD)
    rec.profile.extend([0.1, 0.2])
    with pytest.raises(InputError, match=r"^job.yaml: profile: expected 3 stage times"):
        from_record(rec, "job.yaml")


# -------------------------------------------------------------------- a real controller over real gRPC
@pytest.fixture
def controller(tmp_path: Path) -> Iterator[tuple[Path, Client]]:
    proc, address = start_controller(tmp_path, controller_config(tmp_path))
    c = client(address)
    try:
        yield tmp_path, c
    finally:
        c.close()
        stop(proc)


def _stored(d: Path) -> dict[str, JobSpec]:
    st = Store(d / "run" / "state.db", query_only=True)  # beside the running controller: read, never write
    try:
        return {j.id: j.spec for j in st.jobs()}
    finally:
        st.close()


def test_the_controller_stores_the_record_it_was_sent_and_reads_no_yaml(controller: tuple[Path, Client]) -> None:
    """A Submit with a record: the record is stored (the job file text beside it, not valid YAML here, is not read);
    SubmitMany items with records, one breaking a limit, an array; a YAML-only Submit still works."""
    d, c = controller
    spec = parse_job_spec("name: rec\ncommand: [a.py, '0777']\nworkdir: /tmp\nsteps: 5\nenv: {A: 'yes'}\n", "r.yaml")
    stub, md = pb_grpc.ControllerStub(c.channel), metadata(TOKEN)
    one = stub.Submit(pb.SubmitRequest(spec_yaml="command: [unclosed", source="r.yaml", request_id="r1",
                                       job=to_record(spec)), metadata=md, timeout=60).job_id
    bad = to_record(dataclasses.replace(spec, env={"A=B": "1"}))
    with pytest.raises(grpc.RpcError) as refused:
        stub.Submit(pb.SubmitRequest(source="bad.yaml", request_id="r2", job=bad), metadata=md, timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("bad.yaml: env: 'A=B' is not a valid variable name")
    arr = dataclasses.replace(spec, name="arr", array=2)
    results = c.submit_many([(to_record(dataclasses.replace(spec, name="m")), "m.yaml", 1),
                             (bad, "bad.yaml", 1), (to_record(arr), "arr.yaml", 2)])
    assert [(len(r.job_ids), r.error.split(":")[0]) for r in results] == [(1, ""), (0, "bad.yaml"), (2, "")]
    old = c.submit("command: [b.py]\nworkdir: /tmp\n", "old.yaml")  # a client that sends the text only
    stored = _stored(d)
    assert stored[one] == spec
    assert stored[results[0].job_ids[0]] == dataclasses.replace(spec, name="m")
    assert [stored[j].name for j in results[2].job_ids] == ["arr[0]", "arr[1]"]
    assert stored[results[2].job_ids[1]].env == {"A": "yes", "HPCSCHED_ARRAY_INDEX": "1", "HPCSCHED_ARRAY_COUNT": "2"}
    assert stored[old].command == ("b.py",)
    assert len(stored) == 5
