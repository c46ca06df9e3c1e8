"""Testbed fast-forward (issue 9) on hand-checkable cases: when a jump happens, how far, what each job is
granted, how skipped steps stay out of the measured pace, and how the run's clock maps back to trace time.
The end-to-end run through real processes is in test_testbed_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcsched.runtime.jobfile import parse_job_spec
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.store import Store
from hpcsched.testbed.driver import Replay, real_results
from hpcsched.testbed.fastforward import CREDIT_FILE, FastForwarder, read_paces
from hpcsched.testbed.measure import read_measurements


def _job(store: Store, name: str, steps: int) -> str:
    return store.add_job(parse_job_spec(f"name: {name}\ncommand: [x.py]\nsteps: {steps}\n", "j.yaml"), 90.0)


def _report(store: Store, jid: str, t: float, step: int, trained: bool = True) -> None:
    stage = 0.01 if trained else 0.0  # a jump report carries no stage times
    store.add_progress(jid, 1, {"time": t, "step": step, "data_s": stage, "compute_s": stage, "comm_s": stage,
                                "world_size": 1})


def _info(jid: str, state: str, steps_total: int) -> pb.JobInfo:
    return pb.JobInfo(job_id=jid, state=state, generation=1, steps_total=steps_total)


@pytest.fixture
def run(tmp_path: Path):
    """Job a: 1000 steps at 0.1 s/step; job b: 100 steps at 0.2 s/step; both trained 10 steps since t=100."""
    store = Store(tmp_path / "state.db")
    a, b = _job(store, "a", 1000), _job(store, "b", 100)
    for i in range(3):
        _report(store, a, 100.0 + 0.5 * i, 5 * i)  # 0, 5, 10 at 0.1 s/step
        _report(store, b, 100.0 + 1.0 * i, 5 * i)  # 0, 5, 10 at 0.2 s/step
    store.close()
    return tmp_path, a, b


def test_paces_count_trained_steps_only(run) -> None:
    tmp, a, b = run
    store = Store(tmp / "state.db")
    _report(store, a, 101.1, 11)  # trained one more step, then the jump to 500 (no stage times)
    _report(store, a, 101.2, 500, trained=False)
    _report(store, a, 101.7, 505)
    store.close()
    p = read_paces(tmp / "state.db", {a: 1, b: 1}, since=0.0)
    assert p[a].real_steps == 16 and p[a].step == 505  # 10 + 1 + 5 trained; the 489 skipped are not
    assert p[a].pace_s == pytest.approx((1.1 + 0.5) / 16)
    assert p[b].real_steps == 10 and p[b].pace_s == pytest.approx(0.2)
    # only reports at or after ``since`` count: the pace since the jump
    assert read_paces(tmp / "state.db", {a: 1}, since=101.2)[a].real_steps == 5
    # the measurements the simulator is fed skip the jump window too
    m = read_measurements(tmp / "state.db", {a})[a]
    assert sum(w.steps for w in m.windows) == 16


def test_jump_stops_at_the_earliest_finish(run) -> None:
    tmp, a, b = run
    ff = FastForwarder(5, tmp / "state.db", tmp / "ckpt", max_jump_s=30.0, settle_s=1.0)
    infos = {a: _info(a, "running", 1000), b: _info(b, "running", 100)}
    assert ff.step(200.0, infos, {a, b}, None) is None  # first look: states just "changed"
    assert ff.step(200.5, infos, {a, b}, None) is None  # not settled for 1 s yet
    j = ff.step(201.0, infos, {a, b}, None)
    # b has 90 steps left at 0.2 s = 18 s < 30 s: the jump ends at b's finish; a gets 18 / 0.1 = 180 steps
    assert j is not None and j.seconds == pytest.approx(18.0)
    assert j.grants == {a: 180, b: 90}
    assert (tmp / "ckpt" / a / CREDIT_FILE).read_text() == "180\n"
    assert (tmp / "ckpt" / b / CREDIT_FILE).read_text() == "90\n"
    # no new trained steps since the jump: no second jump
    assert ff.step(202.0, infos, {a, b}, None) is None
    assert ff.skipped(200.9) == 0.0 and ff.skipped(201.0) == pytest.approx(18.0)


def test_jump_bounded_by_max_and_next_submission(run) -> None:
    tmp, a, b = run
    infos = {a: _info(a, "running", 1000)}
    ff = FastForwarder(5, tmp / "state.db", tmp / "ckpt", max_jump_s=30.0, settle_s=0.0)
    ff.step(200.0, infos, {a}, None)
    j = ff.step(200.0, infos, {a}, None)
    assert j.seconds == pytest.approx(30.0) and j.grants == {a: 300}
    ff = FastForwarder(5, tmp / "state.db", tmp / "ckpt2", max_jump_s=30.0, settle_s=0.0)
    ff.step(200.0, infos, {a}, 7.5)
    assert ff.step(200.0, infos, {a}, 7.5).seconds == pytest.approx(7.5)  # the next submission is real


def test_no_jump_while_anything_is_unsteady(run) -> None:
    tmp, a, b = run
    ff = FastForwarder(20, tmp / "state.db", tmp / "ckpt", settle_s=0.0)  # 20 trained steps needed: only 10
    infos = {a: _info(a, "running", 1000)}
    ff.step(200.0, infos, {a}, None)
    assert ff.step(200.0, infos, {a}, None) is None
    ff = FastForwarder(5, tmp / "state.db", tmp / "ckpt", settle_s=0.0)
    for state in ("stopping",):
        infos = {a: _info(a, state, 1000)}
        ff.step(200.0, infos, {a}, None)
        assert ff.step(200.0, infos, {a}, None) is None
    done = {a: _info(a, "running", 10)}  # reported its last step: tearing down
    ff.step(200.0, done, {a}, None)
    assert ff.step(200.0, done, {a}, None) is None
    # idle cluster, nothing queued: skip straight to the next submission; with a job queued, wait
    idle = {a: _info(a, "completed", 1000)}
    ff.step(200.0, idle, {a}, 12.0)
    assert ff.step(200.0, idle, {a}, 12.0).seconds == pytest.approx(12.0)
    queued = {a: _info(a, "pending", 1000)}
    ff.step(300.0, queued, {a}, 12.0)
    assert ff.step(300.0, queued, {a}, 12.0) is None


def test_virtual_clock_maps_to_trace_time() -> None:
    from hpcsched.testbed.mapping import BALANCED, ScaledJob

    job = ScaledJob("7", "vgg16", 1, 5000.0, 100.0, None, BALANCED, 1, 100, 0.0)
    rep = Replay(real_start=1000.0, trace_start=5000.0, scale=10.0, runtime_ids={"7": "j1"},
                 jumps=[(1005.0, 20.0), (1010.0, 30.0)])
    assert rep.virtual(1004.0) == 1004.0 and rep.virtual(1005.0) == 1025.0 and rep.virtual(1012.0) == 1062.0
    rep.final["7"] = {"state": "completed", "submit_time": 1000.0, "start_time": 1002.0, "end_time": 1012.0}
    r = real_results([job], rep)[0]
    # trace = 5000 + (virtual - real_start) x 10: start 2 s in, end 12 s in plus 50 s skipped
    assert (r.submit, r.start, r.end) == (5000.0, 5020.0, 5000.0 + 62.0 * 10)


def test_a_starting_job_is_owed_the_skipped_seconds(run) -> None:
    """c is still starting (only its opening report) when a and b jump 18 s: the jump goes ahead, and once c
    has trained 5 steps it is granted those 18 s on top of the next jump, at its own pace."""
    tmp, a, b = run
    store = Store(tmp / "state.db")
    c = _job(store, "c", 10_000)
    store.add_progress(c, 1, {"time": 100.5, "step": 0, "world_size": 1})  # the opening report: no stage times
    store.close()
    ff = FastForwarder(5, tmp / "state.db", tmp / "ckpt", max_jump_s=30.0, settle_s=0.0)
    ff.nominal[c] = ("cnn", 0.5)
    infos = {a: _info(a, "running", 1000), b: _info(b, "running", 100), c: _info(c, "running", 10_000)}
    # a short job starting bounds the jump: 30 steps at 0.4 s nominal = 12 s; unknown pace: no jump at all
    short = FastForwarder(5, tmp / "state.db", tmp / "ckpt-s", settle_s=0.0, nominal={c: ("cnn", 0.4)})
    few = infos | {c: _info(c, "running", 30)}
    short.step(201.0, few, {a, b, c}, None)
    assert short.step(201.0, few, {a, b, c}, None).seconds == pytest.approx(12.0)
    unknown = FastForwarder(5, tmp / "state.db", tmp / "ckpt-u", settle_s=0.0)
    unknown.step(201.0, infos, {a, b, c}, None)
    assert unknown.step(201.0, infos, {a, b, c}, None) is None
    ff.step(201.0, infos, {a, b, c}, None)
    j = ff.step(201.0, infos, {a, b, c}, None)
    assert j.seconds == pytest.approx(18.0) and c not in j.grants and ff.owed == {c: pytest.approx(18.0)}
    store = Store(tmp / "state.db")  # after the jump: a trains on at 0.1 s/step, c starts at 0.5 s/step
    _report(store, a, 202.0, 190)
    _report(store, a, 202.5, 195)
    _report(store, c, 203.0, 5)
    _report(store, c, 205.5, 10)
    store.close()
    del infos[b]  # b finished in the jump
    ff.step(206.0, infos, {a, c}, None)
    j = ff.step(206.0, infos, {a, c}, None)
    assert j.seconds == pytest.approx(30.0)
    assert j.grants == {a: 300, c: round((30.0 + 18.0) / 0.5)} and ff.owed == {}


def test_the_workloads_side_applies_each_credit_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``workloads/_common.py`` (no torch needed): the credit file is cumulative; a job applies what it has not
    applied yet, once, and reports the jump apart from its trained window."""
    import json
    import sys

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "workloads"))
    sys.modules.pop("_common", None)
    from _common import FastForward, Reporter, StageTimer

    from hpcsched.testbed.fastforward import write_credit

    ff = FastForward(tmp_path)
    assert ff.take() == 0  # no file yet
    write_credit(tmp_path, 100)
    assert ff.take() == 100 and ff.take() == 0  # unchanged file: nothing more
    write_credit(tmp_path, 150)
    assert ff.take() == 50 and ff.applied == 150
    assert FastForward(tmp_path, applied=150).take() == 0  # a restart whose checkpoint saw all of it
    assert FastForward(tmp_path, applied=120).take() == 30  # ... or only part of it
    progress = tmp_path / "progress.jsonl"
    monkeypatch.setenv("HPCSCHED_PROGRESS_FILE", str(progress))
    rep, timer = Reporter(0, 1, -1), StageTimer()
    timer.data, timer.steps = 0.3, 3
    assert FastForward.jump(50, 7, 40, rep, timer, loss=1.0) == 40  # never past the last step
    assert FastForward.jump(0, 7, 40, rep, timer, loss=1.0) == 7
    lines = [json.loads(x) for x in progress.read_text().splitlines()]
    assert [x["step"] for x in lines] == [7, 40]
    assert lines[0]["data_s"] == pytest.approx(0.1) and "data_s" not in lines[1] and lines[1]["samples_per_s"] == 0
