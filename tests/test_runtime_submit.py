"""Many jobs at once (issue 25): SubmitMany batches, job arrays, per-user limits, listing filters, and tables that
read at 80 columns (issue 31). Real controller, real gRPC on port 0; the CLI as a user runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from runtime_procs import TOKEN, controller_config, write_secret

from hpcsched.runtime.auth import metadata, open_channel
from hpcsched.runtime.client import Client
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.jobfile import parse_job_spec
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.server import ControllerServer
from hpcsched.runtime.store import Store
from hpcsched.runtime.tables import Column, cells, elide, render

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest):
    """A controller in this process (real gRPC on loopback), with the config keys the test's marker gives."""
    extra = getattr(request, "param", {})
    srv = ControllerServer(read_controller_config(controller_config(tmp_path, **extra)))
    addr = srv.start()
    yield srv, addr
    srv.stop()


def _stub(addr: str) -> pb_grpc.ControllerStub:
    return pb_grpc.ControllerStub(open_channel(addr, None))


def _cli(addr: str, *args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"HPCSCHED_TOKEN": TOKEN, "COLUMNS": str(columns), "PYTHONPATH": str(ROOT),
                        "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "hpcsched.runtime", *args, "--controller", addr], env=env,
                          capture_output=True, text=True, timeout=120)


def _jobs(state: Path) -> list:
    st = Store(state, query_only=True)
    try:
        return st.jobs()
    finally:
        st.close()


def test_submit_of_many_files_and_an_array_in_batches(tmp_path: Path, server) -> None:
    """``hpcsched submit`` of many files: each good file submitted (one line of ids each, in order), a bad one
    reported with its file and line while the others still go in, exit 1; an array makes N named instances with
    their index in the environment."""
    _, addr = server
    files = []
    for i in range(3):
        p = tmp_path / f"t{i}.yaml"
        p.write_text(f"name: train-{i}\ncommand: [a.py]\nprocs: 2\n")
        files.append(p)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ncommand: [a.py]\nprocs: 0\n")
    arr = tmp_path / "sweep.yaml"
    arr.write_text("name: sweep\ncommand: [a.py]\narray: 4\nenv: {LR: '0.1'}\n")
    done = _cli(addr, "submit", str(files[0]), str(bad), str(files[1]), str(arr), str(files[2]))
    assert done.returncode == 1, done.stderr
    assert re.fullmatch(rf"error: {re.escape(str(bad))}:3: procs: must be >= 1, got 0\n", done.stderr), done.stderr
    lines = done.stdout.split("\n")
    assert lines[:2] == ["j0001", "j0002"] and lines[2].split() == ["j0003", "j0004", "j0005", "j0006"]
    assert lines[3:] == ["j0007", ""]
    jobs = {j.id: j for j in _jobs(tmp_path / "run" / "state.db")}
    assert [jobs[f"j000{k}"].name for k in range(1, 8)] == ["train-0", "train-1", "sweep[0]", "sweep[1]", "sweep[2]",
                                                            "sweep[3]", "train-2"]
    assert [jobs[f"j000{k}"].spec.env for k in (3, 6)] == [
        {"LR": "0.1", "HPCSCHED_ARRAY_INDEX": "0", "HPCSCHED_ARRAY_COUNT": "4"},
        {"LR": "0.1", "HPCSCHED_ARRAY_INDEX": "3", "HPCSCHED_ARRAY_COUNT": "4"}]
    assert jobs["j0003"].spec.array is None and jobs["j0003"].spec.workdir == str(tmp_path)
    # --array on the command line, --json: the results per file
    done = _cli(addr, "submit", "--array", "2", str(files[0]), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"results": [{"file": str(files[0]), "job_ids": ["j0008", "j0009"],
                                                    "duplicate": False, "error": ""}], "submitted": 2, "refused": 0}
    # one file as before: its id alone
    done = _cli(addr, "submit", str(files[1]))
    assert (done.returncode, done.stdout) == (0, "j0010\n")


def test_a_resent_batch_makes_no_second_job_and_an_array_is_not_a_single_submit(server) -> None:
    """The request ids make SubmitMany idempotent: the same call again returns the same jobs as duplicates (an
    array's too), nothing new is stored. Submit (one job, one id) refuses an array rather than making one job."""
    _, addr = server
    stub, md = _stub(addr), metadata(TOKEN)
    req = pb.SubmitManyRequest(jobs=[
        pb.SubmitRequest(spec_yaml="name: a\ncommand: [a.py]\n", source="a.yaml", request_id="r-a"),
        pb.SubmitRequest(spec_yaml="name: s\ncommand: [a.py]\narray: 3\n", source="s.yaml", request_id="r-s"),
        pb.SubmitRequest(spec_yaml="name: b\ncommand: [a.py]\nlauncher: nope\n", source="b.yaml", request_id="r-b"),
    ])
    first = stub.SubmitMany(req, metadata=md, timeout=30)
    assert [(list(r.job_ids), r.duplicate) for r in first.results[:2]] == [
        (["j0001"], False), (["j0002", "j0003", "j0004"], False)]
    assert first.results[2].job_ids == [] and first.results[2].error.startswith("b.yaml:3: launcher: unknown")
    again = stub.SubmitMany(req, metadata=md, timeout=30)
    assert [(list(r.job_ids), r.duplicate) for r in again.results[:2]] == [
        (["j0001"], True), (["j0002", "j0003", "j0004"], True)]
    c = Client(addr, TOKEN)
    assert [j.job_id for j in c.jobs()] == ["j0001", "j0002", "j0003", "j0004"]
    with pytest.raises(grpc.RpcError) as e:
        stub.Submit(pb.SubmitRequest(spec_yaml="command: [a.py]\narray: 2\n", source="x.yaml"), metadata=md,
                    timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "SubmitMany" in e.value.details()
    c.close()


@pytest.mark.parametrize("server", [{"max_submit_batch": 10, "max_pending_per_user": 6}], indirect=True)
def test_the_batch_cap_and_the_pending_limit_refuse_with_the_numbers(tmp_path: Path, server) -> None:
    """A call over max_submit_batch (an array counts its instances) is refused whole, nothing stored. Past
    max_pending_per_user, a file is refused saying the limit and the count, the files before it are stored; the
    single Submit is held to the same limit (RESOURCE_EXHAUSTED, not retried)."""
    _, addr = server
    stub, md = _stub(addr), metadata(TOKEN)
    with pytest.raises(grpc.RpcError) as e:
        stub.SubmitMany(pb.SubmitManyRequest(jobs=[pb.SubmitRequest(spec_yaml="command: [a.py]\narray: 11\n",
                                                                    source="big.yaml")]), metadata=md, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "11 jobs in one call" in e.value.details() and "at most 10 per call (max_submit_batch)" in e.value.details()
    assert _jobs(tmp_path / "run" / "state.db") == []
    reply = stub.SubmitMany(pb.SubmitManyRequest(jobs=[
        pb.SubmitRequest(spec_yaml="command: [a.py]\narray: 4\n", source="four.yaml"),
        pb.SubmitRequest(spec_yaml="command: [a.py]\narray: 3\n", source="three.yaml"),
        pb.SubmitRequest(spec_yaml="command: [a.py]\n", source="one.yaml"),
        pb.SubmitRequest(spec_yaml="command: [a.py]\n", source="two.yaml"),
    ]), metadata=md, timeout=30)
    assert [len(r.job_ids) for r in reply.results] == [4, 0, 1, 1]
    err = reply.results[1].error
    assert err.startswith("three.yaml: refused:") and "has 4 pending jobs and this would add 3" in err
    assert "the limit is 6 pending jobs per user (max_pending_per_user" in err
    with pytest.raises(grpc.RpcError) as e:
        stub.Submit(pb.SubmitRequest(spec_yaml="command: [a.py]\n", source="seven.yaml"), metadata=md, timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "has 6 pending jobs" in e.value.details()
    # a job that leaves pending frees its place in the quota
    st = Store(tmp_path / "run" / "state.db", query_only=False)
    st.update_job("j0001", state="completed")
    st.close()
    assert stub.Submit(pb.SubmitRequest(spec_yaml="command: [a.py]\n", source="s.yaml"), metadata=md,
                       timeout=30).job_id == "j0007"


def test_the_pending_limit_is_per_user(tmp_path: Path) -> None:
    """Two users with their own tokens: one at the limit does not stop the other."""
    tokens = {n: write_secret(tmp_path / f"{n}.token", f"{n}-token-0123456789") for n in ("alice", "bob")}
    write_secret(tmp_path / "worker.token", "worker-token-0123456789")
    cfg = controller_config(tmp_path, max_pending_per_user=2, worker_token_file="worker.token",
                            user_tokens="{" + ", ".join(f"{n}: {p.name}" for n, p in tokens.items()) + "}")
    srv = ControllerServer(read_controller_config(cfg))
    addr = srv.start()
    try:
        alice, bob = (Client(addr, f"{n}-token-0123456789") for n in ("alice", "bob"))
        got = alice.submit_many([("command: [a.py]\n", f"a{i}.yaml", 1) for i in range(3)])
        assert [list(r.job_ids) for r in got] == [["j0001"], ["j0002"], []]
        assert "user 'alice' has 2 pending jobs" in got[2].error
        assert list(bob.submit_many([("command: [a.py]\n", "b.yaml", 1)])[0].job_ids) == ["j0003"]
        assert [(j.job_id, j.owner) for j in bob.jobs(owner="alice")] == [("j0001", "alice"), ("j0002", "alice")]
    finally:
        srv.stop()


def _fill(state: Path) -> dict[str, tuple[str, str, str]]:
    """60 jobs: owners alice/bob/carol, states pending/running/completed, names train-K and sweep[K]."""
    st = Store(state)
    out = {}
    try:
        for i in range(60):
            name = f"sweep[{i}]" if i % 2 else f"train-{i}"
            owner, state_ = ("alice", "bob", "carol")[i % 3], ("pending", "running", "completed", "failed")[i % 4]
            jid = st.add_job(parse_job_spec(f"name: {name}\ncommand: [a.py]\n", "j.yaml"), float(i), None, owner)
            st.update_job(jid, state=state_)
            out[jid] = (name, owner, state_)
    finally:
        st.close()
    return out


def test_listing_filters_are_done_by_the_controller_on_an_index(tmp_path: Path) -> None:
    """ListJobs filters by states, owner and name (exact or glob, brackets literal), page by page; every filtered
    page is one index range per state (the query plan says which index), and a state that does not exist is an
    error, not an empty listing."""
    want = _fill(tmp_path / "run" / "state.db")
    srv = ControllerServer(read_controller_config(controller_config(tmp_path)))
    addr = srv.start()
    try:
        c = Client(addr, TOKEN)
        cases = [
            ({"states": ("pending", "failed")}, lambda n, o, s: s in ("pending", "failed")),
            ({"owner": "bob"}, lambda n, o, s: o == "bob"),
            ({"owner": "alice", "states": ("running",)}, lambda n, o, s: o == "alice" and s == "running"),
            ({"name": "sweep[7]"}, lambda n, o, s: n == "sweep[7]"),
            ({"name": "sweep[1*"}, lambda n, o, s: n.startswith("sweep[1")),
            ({"name": "train-?", "states": ("pending",)},
             lambda n, o, s: re.fullmatch(r"train-\d", n) and s == "pending"),
        ]
        for kw, pred in cases:
            expect = [j for j, v in want.items() if pred(*v)]
            assert expect, kw
            got = [j.job_id for j in c.jobs(page_size=3, **kw)]  # several pages: the filters hold on each
            assert got == expect, kw
        with pytest.raises(Exception, match="INVALID_ARGUMENT: states: no job state 'runing'"):
            c.jobs(states=("runing",))
        c.close()
    finally:
        srv.stop()
    st = Store(tmp_path / "run" / "state.db", query_only=True)
    try:
        for where, args, index in ((" AND state = ?", ("pending",), "jobs_state_seq"),
                                   (" AND owner = ? AND state = ?", ("bob", "pending"), "jobs_owner_state_seq"),
                                   (" AND owner = ?", ("bob",), "jobs_owner_seq"),
                                   (" AND name = ?", ("x",), "jobs_name_seq")):
            plan = " ".join(str(r) for r in st.db.execute(
                "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE seq > ?" + where + " ORDER BY seq LIMIT 10",
                (0, *args)).fetchall())
            assert f"USING INDEX {index}" in plan and "TEMP B-TREE" not in plan, (where, plan)
    finally:
        st.close()


def test_tables_read_at_80_columns(tmp_path: Path) -> None:
    """``hpcsched jobs`` and ``workers`` at 80 columns: every line fits, every id and state is whole in its row
    (long names, users and hosts elided in the middle); -o wide shows the names whole; --json keeps its keys."""
    st = Store(tmp_path / "run" / "state.db")
    long_name = "resnet50-imagenet-lr0.1-batch256-" + "x" * 80 + "-seed7"
    states = ("pending", "failed", "completed", "cancelled", "pending")  # none the controller moves on its own
    for i, state in enumerate(states):
        jid = st.add_job(parse_job_spec(f"name: {long_name}{i}\ncommand: [a.py]\nprocs: 3\nmin_procs: 1\n"
                                        "max_procs: 64\nsteps: 123456789\n", "j.yaml"), 1.0, None,
                         "a-user-with-a-very-long-name-" + "u" * 30)
        st.update_job(jid, state=state, steps_done=12345678)
    st.close()
    srv = ControllerServer(read_controller_config(controller_config(tmp_path, worker_timeout_s=600)))
    addr = srv.start()
    try:
        stub, md = _stub(addr), metadata(TOKEN)
        for k in range(3):
            stub.Register(pb.RegisterRequest(worker_id=f"node-{k:03d}.cluster.example.org", host="h" * 60 + str(k),
                                             slots=4, gpus=4, gpu_type="a100-80gb", launchers=["torchrun"],
                                             instance="i"), metadata=md, timeout=30)
        jobs = _cli(addr, "jobs")
        assert jobs.returncode == 0, jobs.stderr
        lines = jobs.stdout.rstrip("\n").split("\n")
        assert lines[0].split() == ["ID", "NAME", "USER", "STATE", "SIZE", "PROGRESS", "AGE"]
        assert all(len(line) <= 80 for line in lines), lines
        for i, line in enumerate(lines[1:]):
            cells = line.split()
            assert cells[0] == f"j000{i + 1}" and cells[3] == states[i], line
            assert "…" in cells[1] and cells[1].startswith("resnet50") and cells[1].endswith(f"seed7{i}")
        wide = _cli(addr, "jobs", "-o", "wide")
        assert f"{long_name}0" in wide.stdout and "12345678/123456789" in wide.stdout
        as_json = json.loads(_cli(addr, "jobs", "--json").stdout)
        assert json.loads(_cli(addr, "jobs", "-o", "json").stdout) == as_json
        assert [j["name"] for j in as_json][0] == f"{long_name}0" and as_json[0]["max_procs"] == 64
        workers = _cli(addr, "workers")
        lines = workers.stdout.rstrip("\n").split("\n")
        assert all(len(line) <= 80 for line in lines), lines
        for k, line in enumerate(lines[1:]):
            assert line.split()[:3] == [f"node-{k:03d}.cluster.example.org", "alive", "0/4"], line
        srt = _cli(addr, "jobs", "--sort", "state", "--reverse", "-t", "pending,failed,cancelled")
        assert [line.split()[:4:3] for line in srt.stdout.strip().split("\n")[1:]] == [
            ["j0001", "pending"], ["j0005", "pending"], ["j0002", "failed"], ["j0004", "cancelled"]]
    finally:
        srv.stop()


def test_render_elides_in_the_middle_and_never_the_unelidable() -> None:
    assert elide("abcdefghij", 5, "~") == "ab~ij" and elide("abc", 5) == "abc"
    out = render([Column("ID", elide=False), Column("NAME")], [["j" + "9" * 90, "n" * 50]], 40, "~")
    row = out.split("\n")[1]
    assert row.startswith("j" + "9" * 90)  # wider than the terminal: printed whole, never cut
    wide = "学習ジョブ" * 10  # 50 characters, 100 columns
    out = render([Column("ID", elide=False), Column("NAME"), Column("STATE", elide=False)],
                 [["j0001", wide, "pending"], ["j0002", "x", "running"]], 40, "~")
    assert [cells(line) for line in out.split("\n")[1:]] == [40, 40]  # each row exactly the width (header: stripped)
    row = out.split("\n")[1]
    assert row.startswith("j0001  学習ジョブ") and "学~学習" in row and row.endswith(" pending")


def test_pending_counts_are_cached_between_counts_and_fresh_for_a_refusal(tmp_path: Path) -> None:
    """The per-user count is read from the store once per ttl and kept up to date with submits in between (a count
    cost 17-35 ms at 100,000 pending jobs, under the lock); a would-be refusal always counts again."""
    from hpcsched.runtime.submission import PendingCounts

    st = Store(tmp_path / "s.db")
    spec = parse_job_spec("command: [a.py]\n", "j.yaml")
    ids = st.add_jobs([(spec, None)] * 3, 0.0, "alice")
    now = [0.0]
    counts = PendingCounts(ttl_s=5.0, clock=lambda: now[0])
    try:
        assert counts.get(st, "alice", 1, 100) == 3
        counts.add("alice", 2)  # two submitted through the controller
        st.update_job(ids[0], state="running")  # started: the cache does not hear of it
        assert counts.get(st, "alice", 1, 100) == 5  # an upper bound, no count
        assert counts.get(st, "alice", 96, 100) == 2  # 5 + 96 would pass 100: counted afresh (the store's truth)
        st.update_job(ids[1], state="running")
        now[0] = 6.0
        assert counts.get(st, "alice", 1, 100) == 1  # older than the ttl: counted
        assert counts.get(st, "bob", 1, 100) == 0
    finally:
        st.close()


def test_cancel_an_array_by_name(server) -> None:
    """``hpcsched cancel -n 'sweep[*'`` cancels every instance of an array (the controller's name filter, brackets
    literal), nothing else; without ids or filters it refuses rather than cancel everything."""
    _, addr = server
    c = Client(addr, TOKEN)
    got = c.submit_many([("name: sweep\ncommand: [a.py]\narray: 3\n", "s.yaml", 3),
                         ("name: sweep2\ncommand: [a.py]\n", "t.yaml", 1)])
    assert [list(r.job_ids) for r in got] == [["j0001", "j0002", "j0003"], ["j0004"]]
    done = _cli(addr, "cancel", "-n", "sweep[*")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [f"j000{k}: cancelling" for k in (1, 2, 3)]
    assert {j.job_id: j.state for j in c.jobs()} == {"j0001": "cancelled", "j0002": "cancelled",
                                                     "j0003": "cancelled", "j0004": "pending"}
    refused = _cli(addr, "cancel")
    assert refused.returncode == 2 and "which jobs?" in refused.stderr
    c.close()


@pytest.mark.parametrize("server", [{"max_submit_batch": 4}], indirect=True)
def test_the_client_splits_a_batch_over_the_controllers_cap(server) -> None:
    """A controller whose max_submit_batch is below the client's batch size: the client halves the refused batch
    until it fits (same request ids), every file is stored in order; an array larger than the cap is refused."""
    _, addr = server
    c = Client(addr, TOKEN)
    got = c.submit_many([(f"name: f{i}\ncommand: [a.py]\n", f"f{i}.yaml", 1) for i in range(10)]
                        + [("name: big\ncommand: [a.py]\narray: 5\n", "big.yaml", 5)])
    assert [list(r.job_ids) for r in got[:10]] == [[f"j{k:04d}"] for k in range(1, 11)]
    assert not got[10].job_ids and "at most 4 per call (max_submit_batch)" in got[10].error
    assert [j.name for j in c.jobs()] == [f"f{i}" for i in range(10)]
    c.close()
