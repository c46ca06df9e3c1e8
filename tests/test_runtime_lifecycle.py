"""The job state machine (``hpcsched.runtime.lifecycle``) as tables: every (state, event) pair and its outcome,
and the rules that turn a task's exit and an attempt's end into an event. Pure: no store, no controller."""

from __future__ import annotations

import pytest

from hpcsched.runtime.lifecycle import TABLE, Action, Event, State, attempt_end, exit_event, next_state

P, R, S = State.PENDING, State.RUNNING, State.STOPPING
C, F, X = State.COMPLETED, State.FAILED, State.CANCELLED
E = Event
A = Action

# Every pair, written out: (state, event) -> (next state, action).
EXPECTED: dict[tuple[State, Event], tuple[State, Action]] = {
    (P, E.START): (R, A.LAUNCH),
    (P, E.STOP): (P, A.IGNORE),
    (P, E.CANCEL): (X, A.DROP),
    (P, E.TASK_EXIT_OK): (P, A.IGNORE),  # a task of an earlier attempt reporting late
    (P, E.TASK_FAILED): (P, A.IGNORE),
    (P, E.WORKER_LOST): (P, A.IGNORE),
    (P, E.ATTEMPT_DONE): (P, A.IGNORE),
    (P, E.ATTEMPT_FAILED): (P, A.IGNORE),
    (P, E.RETRY_EXHAUSTED): (P, A.IGNORE),
    (P, E.ATTEMPT_CANCELLED): (P, A.IGNORE),
    (P, E.ATTEMPT_STOPPED): (P, A.IGNORE),

    (R, E.START): (R, A.IGNORE),
    (R, E.STOP): (S, A.STOP),
    (R, E.CANCEL): (S, A.STOP),  # cancel of a running job goes through stopping
    (R, E.TASK_EXIT_OK): (R, A.WAIT),
    (R, E.TASK_FAILED): (S, A.STOP_FAILED),
    (R, E.WORKER_LOST): (S, A.STOP_FAILED),
    (R, E.ATTEMPT_DONE): (C, A.COMPLETE),
    (R, E.ATTEMPT_FAILED): (P, A.RETRY),
    (R, E.RETRY_EXHAUSTED): (F, A.GIVE_UP),
    (R, E.ATTEMPT_CANCELLED): (X, A.END_CANCELLED),
    (R, E.ATTEMPT_STOPPED): (P, A.REQUEUE),

    (S, E.START): (S, A.IGNORE),
    (S, E.STOP): (S, A.IGNORE),
    (S, E.CANCEL): (S, A.RETARGET),  # a cancel overrides a preempt or resize already under way
    (S, E.TASK_EXIT_OK): (S, A.WAIT),
    (S, E.TASK_FAILED): (S, A.WAIT),  # a task stopped by SIGTERM may exit non-zero
    (S, E.WORKER_LOST): (S, A.WAIT),
    (S, E.ATTEMPT_DONE): (C, A.COMPLETE),
    (S, E.ATTEMPT_FAILED): (P, A.RETRY),
    (S, E.RETRY_EXHAUSTED): (F, A.GIVE_UP),
    (S, E.ATTEMPT_CANCELLED): (X, A.END_CANCELLED),
    (S, E.ATTEMPT_STOPPED): (P, A.REQUEUE),
}
for _final in (C, F, X):
    for _e in Event:
        EXPECTED[_final, _e] = (_final, A.REFUSE if _e is E.CANCEL else A.IGNORE)


def test_the_table_lists_every_pair() -> None:
    """No (state, event) pair is left to a default the reader cannot see."""
    assert set(EXPECTED) == {(s, e) for s in State for e in Event} == set(TABLE)


@pytest.mark.parametrize(("state", "event"), sorted(EXPECTED))
def test_next_state(state: State, event: Event) -> None:
    """Each pair's outcome, also reached from the plain string the store holds."""
    assert next_state(state, event) == EXPECTED[state, event]
    assert next_state(str(state.value), event) == EXPECTED[state, event]


@pytest.mark.parametrize(("code", "lost", "event"), [
    (0, False, E.TASK_EXIT_OK),
    (1, False, E.TASK_FAILED),
    (137, False, E.TASK_FAILED),  # killed by a signal, as a shell reports it
    (127, False, E.TASK_FAILED),  # could not start
    (-9, False, E.TASK_FAILED),
    (-9, True, E.WORKER_LOST),
    (-1, True, E.WORKER_LOST),
])
def test_exit_event(code: int, lost: bool, event: Event) -> None:
    """Any non-zero exit fails the attempt; a lost task says so."""
    assert exit_event(code, lost) is event


# (state, stop_reason, codes, done, steps, steps_done, restarts) -> (event, short); max_restarts is 2
ENDS = [
    # every task exited 0 on its own
    (R, None, [0, 0], False, None, 0, 0, E.ATTEMPT_DONE, False),
    (R, None, [0], False, 10, 10, 0, E.ATTEMPT_DONE, False),
    (R, None, [0], True, 10, 3, 0, E.ATTEMPT_DONE, False),  # the program said it was done
    # a job that declares steps and exits 0 short of them fails, and is retried by the policy
    (R, None, [0], False, 10, 0, 0, E.ATTEMPT_FAILED, True),
    (R, None, [0], False, 10, 9, 1, E.ATTEMPT_FAILED, True),
    (R, None, [0], False, 10, 9, 2, E.RETRY_EXHAUSTED, True),
    # a failed attempt: retried while restarts + 1 <= max_restarts
    (S, "failed", [1, -9], False, 10, 3, 0, E.ATTEMPT_FAILED, False),
    (S, "failed", [1], False, None, 0, 1, E.ATTEMPT_FAILED, False),
    (S, "failed", [1], False, None, 0, 2, E.RETRY_EXHAUSTED, False),
    # done before a preempt / resize stop landed: complete even though SIGTERM made the launcher exit 1
    (S, "preempt", [1], True, 10, 10, 0, E.ATTEMPT_DONE, False),
    (S, "resize", [1], True, 10, 10, 0, E.ATTEMPT_DONE, False),
    (S, "failed", [0], True, 10, 10, 0, E.ATTEMPT_DONE, False),  # every task exited 0 and it was done
    (S, "failed", [1], True, 10, 10, 0, E.ATTEMPT_FAILED, False),
    # stopped on purpose
    (S, "preempt", [0], False, 10, 3, 0, E.ATTEMPT_STOPPED, False),
    (S, "resize", [143], False, 10, 3, 5, E.ATTEMPT_STOPPED, False),  # no restart counted
    (S, "cancel", [0], False, 10, 3, 0, E.ATTEMPT_CANCELLED, False),
    (S, "cancel", [1], True, 10, 10, 0, E.ATTEMPT_CANCELLED, False),
    (S, "preempt", [-1], False, None, 0, 0, E.ATTEMPT_STOPPED, False),  # never started
    # an elastic job whose in-place resize did not report yet ends like any running attempt
    (R, "in-place", [0], False, 10, 10, 0, E.ATTEMPT_DONE, False),
    (R, "in-place", [0], False, 10, 4, 0, E.ATTEMPT_FAILED, True),
]


@pytest.mark.parametrize(("state", "reason", "codes", "done", "steps", "steps_done", "restarts", "event", "short"),
                         ENDS)
def test_attempt_end(state: State, reason: str | None, codes: list[int], done: bool, steps: int | None,
                     steps_done: int, restarts: int, event: Event, short: bool) -> None:
    """How an attempt whose tasks have all exited ended."""
    assert attempt_end(state, reason, codes, done, steps, steps_done, restarts, max_restarts=2) == (event, short)


def _job(state: str, generation: int = 1, stop_reason: str | None = None, stop_time: float | None = None):
    from hpcsched.runtime.jobfile import parse_job_spec
    from hpcsched.runtime.store_rows import JobRow

    spec = parse_job_spec("command: [t.py]\nsteps: 10\n", "j.yaml")
    return JobRow("j0001", 1, "j", spec, state, 1, 1, generation, 0, None, None, -1, None, 0.0, None, None, 0, "",
                  stop_reason, stop_time, None, 0.0, 0.0, None, None, None, None, 0)


def _alloc(state: str, generation: int = 1):
    from hpcsched.runtime.store_rows import AllocRow

    return AllocRow("j0001.g1.n0", "j0001", generation, "w0", 0, 1, state, None, b"")


@pytest.mark.parametrize(("running", "alloc", "job", "verdict"), [
    (False, "running", "running", "exited"),
    (False, "exited", "stopping", "forget"),  # already known as exited
    (False, None, None, "forget"),  # unknown to the store
    (True, None, "running", "stale"),  # unknown task
    (True, "running", "pending", "stale"),  # its job is no longer active on it
    (True, "exited", "running", "stale"),
    (True, "launching", "running", "confirmed"),
    (True, "running", "stopping", "running"),
])
def test_reconcile_reported(running: bool, alloc: str | None, job: str | None, verdict: str) -> None:
    """A reported task against its allocation and job."""
    from hpcsched.runtime import reconcile

    a = _alloc(alloc) if alloc else None
    j = _job(job) if job else None
    assert reconcile.reported(running, a, j) == verdict


def test_reconcile_reported_stale_generation() -> None:
    """A task of an earlier attempt that still runs is killed."""
    from hpcsched.runtime import reconcile

    assert reconcile.reported(True, _alloc("running", generation=1), _job("running", generation=2)) == "stale"


@pytest.mark.parametrize(("alloc", "job", "seen", "stop_time", "verdict"), [
    ("running", "stopping", True, None, "stop"),
    ("launching", "stopping", None, None, "never_started"),
    ("running", "stopping", None, None, "lost"),
    ("running", "stopping", False, None, "ok"),  # exited: the reported side handles it
    ("launching", "running", None, None, "launch"),
    ("running", "running", None, None, "lost"),  # the worker restarted without it
    ("running", "running", True, None, "ok"),
    ("running", "in-place", True, 95.0, "resend_resize"),
    ("running", "in-place", True, 30.0, "resize_timed_out"),
])
def test_reconcile_expected(alloc: str, job: str, seen: bool | None, stop_time: float | None, verdict: str) -> None:
    """A live allocation against what its worker reported of it (now = 100, timeout 60 s)."""
    from hpcsched.runtime import reconcile
    from hpcsched.runtime.lifecycle import IN_PLACE
    from hpcsched.runtime.rpc import pb

    j = _job("running", stop_reason=IN_PLACE, stop_time=stop_time) if job == "in-place" else _job(job)
    status = None if seen is None else pb.TaskStatus(task_id="j0001.g1.n0", running=seen)
    assert reconcile.expected(_alloc(alloc), j, status, now=100.0, timeout_s=60.0) == verdict


def test_launch_tasks_and_in_place_rewrite(tmp_path) -> None:
    """Two nodes: node 0 is the rendezvous, ranks are offset by the earlier nodes' procs, the env says who the
    task is; an in-place resize rewrites only the size and host list."""
    from hpcsched.runtime import launch
    from hpcsched.runtime.jobfile import parse_job_spec
    from hpcsched.runtime.rpc import pb

    spec = parse_job_spec("command: [t.py]\nsteps: 10\nlauncher: horovodrun\nmin_procs: 1\nmax_procs: 4\n", "j.yaml")
    tasks = launch.launch_tasks("j0007", 3, spec, [("w0", 2), ("w1", 1)], {"w0": "a", "w1": "b"}, 4242,
                                tmp_path / "ck", "j0007")
    assert [(w, t.task_id, t.node_rank, t.nprocs, t.rank_offset) for w, t in tasks] == [
        ("w0", "j0007.g3.n0", 0, 2, 0), ("w1", "j0007.g3.n1", 1, 1, 2)]
    t0 = tasks[0][1]
    assert (t0.world_size, t0.master_addr, t0.master_port, list(t0.hosts)) == (3, "a", 4242, ["a:2", "b:1"])
    assert t0.env["HPCSCHED_STEPS"] == "10" and t0.env["HPCSCHED_GENERATION"] == "3"
    assert launch.in_place_capable(spec) and "HPCSCHED_MIN_PROCS" in t0.env
    # Horovod's own Gloo timeout unless the job sets one: a grow waits under it too
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS" not in t0.env
    own = parse_job_spec("command: [t.py]\nlauncher: horovodrun\nmin_procs: 1\nmax_procs: 4\n"
                         "env: {HOROVOD_GLOO_TIMEOUT_SECONDS: '45'}\n", "j.yaml")
    rigid = parse_job_spec("command: [t.py]\nlauncher: horovodrun\nprocs: 2\n", "j.yaml")
    assert launch.launch_env("j1", 1, own, tmp_path)["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "45"
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS" not in launch.launch_env("j1", 1, rigid, tmp_path)
    r = pb.LaunchTask.FromString(launch.resized_launch(t0.SerializeToString(), "a", 1))
    assert (r.nprocs, r.world_size, list(r.hosts), r.task_id, r.group) == (1, 1, ["a:1"], t0.task_id, "j0007")
    assert launch.group_key(t0.SerializeToString(), "j0007") == "j0007"
