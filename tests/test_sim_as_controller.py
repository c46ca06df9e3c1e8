"""The simulator deciding through the shared decision core as the runtime's controller does
(``simulate(..., as_controller=...)``, ``hpcsched.sim.core_decisions``): what the controller knows of jobs,
its hysteresis, its rule that running jobs are never moved to form groups, stops before the starts that need
their slots. Hand-checkable cases; the parity with the real controller is tests/test_parity.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcsched.core.decide import DecideOptions
from hpcsched.interleave.period import pipeline_period
from hpcsched.model import ClusterSpec, Job, ResourceProfile
from hpcsched.primitives.speed import SOLO_FACTOR, group_factor
from hpcsched.sim.core_decisions import AsController
from hpcsched.sim.engine import simulate

ONE_GPU = ClusterSpec(1, 1, 1, name="g1")
TWO_NODES = ClusterSpec(1, 2, 1, name="n2g1")
DATA_HEAVY, GPU_HEAVY = ResourceProfile(0.6, 0.2, 0.2), ResourceProfile(0.2, 0.6, 0.2)


def _job(i: str, submit: float, n: int, profile: ResourceProfile = DATA_HEAVY, gpus: int = 1) -> Job:
    return Job(i, submit=submit, gpus=gpus, iterations=n, iteration_time=profile.total_s,
               duration=n * profile.total_s, profile=profile, model="toy")


def _ends(r) -> dict[str, float]:  # noqa: ANN001
    return {x.job_id: x.end for x in r.results}


def test_jobs_that_never_ran_are_grouped_only_when_their_profiles_are_declared() -> None:
    """muri-s on one GPU: the controller knows no profile of a job that has not run, so two complementary jobs
    run one after the other; declared profiles let it co-locate them at once, and the pair runs at the
    pipeline period of their REAL stages (the declared ones only decide the grouping)."""
    jobs = [_job("a", 0, 100, DATA_HEAVY), _job("b", 0, 100, GPU_HEAVY)]
    hidden = simulate(jobs, ONE_GPU, "muri-s", restart_s=0.0, as_controller=AsController())
    assert [(d.kind, d.job, d.time) for d in hidden.decisions] == [("start", "a", 0.0), ("start", "b", pytest.approx(
        100 * SOLO_FACTOR))]
    declared = {"a": ResourceProfile(0.9, 0.05, 0.05), "b": ResourceProfile(0.05, 0.9, 0.05)}
    shown = simulate(jobs, ONE_GPU, "muri-s", restart_s=0.0, as_controller=AsController(declared=declared))
    assert [(d.kind, d.job, d.time, d.workers) for d in shown.decisions] == [
        ("start", "a", 0.0, ("n0",)), ("start", "b", 0.0, ("n0",))]
    period = pipeline_period([DATA_HEAVY.stages(), GPU_HEAVY.stages()])[0] * group_factor(2)
    assert _ends(shown) == {"a": pytest.approx(100 * period), "b": pytest.approx(100 * period)}
    assert shown.meta["executor"] == "controller" and shown.meta["declared_profiles"] == 2


def test_running_jobs_are_never_moved_to_form_a_group() -> None:
    """Two nodes of one GPU; a and b (complementary) run apart; when c arrives at 5 muri-s, knowing both
    profiles now, would pair a with b. The simulator's own planner moves them together and gives c the GPU it
    frees; the controller never moves running jobs, so c waits for the first of them to end, and nothing is
    stopped."""
    jobs = [_job("a", 0, 50, DATA_HEAVY), _job("b", 0, 80, GPU_HEAVY), _job("c", 5, 10, DATA_HEAVY)]
    planner = simulate(jobs, TWO_NODES, "muri-s", restart_s=0.0)
    assert {r.job_id: r.start for r in planner.results}["c"] == pytest.approx(5.0)
    ctl = simulate(jobs, TWO_NODES, "muri-s", restart_s=0.0, as_controller=AsController())
    assert not [d for d in ctl.decisions if d.kind == "stop"]
    starts = {d.job: (d.time, d.workers) for d in ctl.decisions}
    assert starts["a"] == (0.0, ("n0",)) and starts["b"] == (0.0, ("n1",))
    assert starts["c"] == (pytest.approx(50 * SOLO_FACTOR), ("n0",))  # a's node, when a ends


def test_the_controllers_hysteresis_keeps_a_young_attempt_running() -> None:
    """SRTF with declared profiles on one GPU: A (100 iterations) starts at 0; B and C (10 each, declared) arrive
    at 1 and 6. With min_runtime_s 5 A keeps its GPU at 1 (its attempt is 1 s old) and B takes it at 6, the
    first decision after the protection ends; without it B preempts A at its arrival. The stop comes before
    the start that needs its GPU, at the same instant."""
    p = ResourceProfile(0.5, 0.3, 0.2)
    jobs = [_job("A", 0, 100, p), _job("B", 1, 10, p), _job("C", 6, 10, p)]
    declared = {"B": p, "C": p}

    def run(hold: float):  # noqa: ANN202
        return simulate(jobs, ONE_GPU, "srtf", restart_s=0.0,
                        as_controller=AsController(DecideOptions(min_runtime_s=hold), declared))

    held = run(5.0)
    b_end = 6 + 10 * SOLO_FACTOR
    ends = _ends(held)
    assert ends["B"] == pytest.approx(b_end) and ends["C"] == pytest.approx(b_end + 10 * SOLO_FACTOR)
    assert ends["A"] == pytest.approx(ends["C"] + 100 * SOLO_FACTOR - 6)  # 6 s of A's work were done before B
    assert [(d.kind, d.job, d.time) for d in held.decisions][:3] == [
        ("start", "A", 0.0), ("stop", "A", 6.0), ("start", "B", 6.0)]
    assert held.decisions[1].reason == "preempt"
    assert _ends(run(0.0))["B"] == pytest.approx(1 + 10 * SOLO_FACTOR)  # no brake: B preempts A at its arrival


def test_controller_executor_on_a_real_trace_runs_every_job_once_and_never_overbooks(trace3, n8g8) -> None:  # noqa: ANN001
    """trace3 on n8g8 under each kind of policy: every job completes, its decisions alternate start / stop
    and end with a start, and at no instant do the started jobs hold more slots than a node has (co-located
    jobs share theirs)."""
    for policy in ("fifo", "las", "muri-l"):
        r = simulate(trace3, n8g8, policy, as_controller=AsController(DecideOptions(min_runtime_s=60.0)))
        assert all(x.status == "completed" for x in r.results), policy
        by_job: dict[str, list[str]] = {}
        for d in r.decisions:
            by_job.setdefault(d.job, []).append(d.kind)
        assert set(by_job) == {x.job_id for x in r.results}
        for kinds in by_job.values():
            assert kinds[0] == "start" and kinds[-1] == "start"
            assert all(a != b for a, b in zip(kinds, kinds[1:], strict=False)), policy
        assert r.meta["min_runtime_s"] == 60.0


def test_as_controller_refuses_a_compat_mode() -> None:
    with pytest.raises(ValueError, match="pick one"):
        simulate([_job("a", 0, 1)], ONE_GPU, "fifo", "muri", as_controller=AsController())


def test_testbed_simulation_decides_through_the_core(tmp_path: Path) -> None:
    """The testbed's simulations of what the runtime would do go through the same core (no policy wrapper):
    its run's meta says so and the decisions are the core's."""
    from hpcsched.testbed.feedback import run_sim

    jobs = [_job("a", 0, 20), _job("b", 1, 5)]
    r = run_sim(jobs, ONE_GPU, "srtf", tmp_path / "sim", "toy", min_runtime_s=2.0)
    assert r.meta["executor"] == "controller" and r.meta["knowledge"] == "what the controller knows"
    assert [d.job for d in r.decisions if d.kind == "start"] == ["a", "b"]  # b's length is unknown: no preemption


def test_cli_simulate_as_controller_writes_its_decisions(tmp_path: Path) -> None:
    """`hpcsched simulate --as-controller`: the run's meta says how it decided, decisions.jsonl holds every start
    and stop; with --compat it is refused with the reason, no traceback."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    base = [sys.executable, "-m", "hpcsched.cli", "simulate", "--trace", str(root / "trace-data/muri/trace3.csv"),
            "--cluster", str(root / "cluster_spec/n8g8.csv"), "--policy", "las", "--out", str(tmp_path / "run")]
    done = subprocess.run([*base, "--as-controller", "--min-runtime-s", "30", "--json"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["executor"] == "controller" and meta["min_runtime_s"] == 30.0
    decisions = [json.loads(x) for x in (tmp_path / "run" / "decisions.jsonl").read_text().splitlines()]
    assert {d["kind"] for d in decisions} == {"start", "stop"} and len({d["job"] for d in decisions}) == 992
    bad = subprocess.run([*base, "--as-controller", "--compat", "muri"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "pick one" in bad.stderr and "Traceback" not in bad.stderr


def test_compare_refuses_compat_gavel_with_the_reason(tmp_path: Path) -> None:
    """Gavel's round mechanism runs through `simulate` alone: `compare --compat gavel` must not silently run the
    ordinary simulator under Gavel's name."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "hpcsched.cli", "compare", "--trace",
                           str(root / "trace-data/muri/trace3.csv"), "--cluster", str(root / "cluster_spec/n8g8.csv"),
                           "--out", str(tmp_path / "c"), "--compat", "gavel"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "simulate --compat gavel" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "c").exists()


def test_co_located_jobs_without_a_profile_are_counted_not_guessed_silently() -> None:
    """Declared profiles pair two jobs whose trace has no stage profile: their group runs at a compute-only
    period, and the run counts them (``untimed_colocated_jobs``); with real profiles the count is 0."""
    bare = [Job(i, submit=0, gpus=1, iterations=50, iteration_time=1.0, duration=50.0, model="toy") for i in "ab"]
    declared = {"a": ResourceProfile(0.9, 0.05, 0.05), "b": ResourceProfile(0.05, 0.9, 0.05)}
    r = simulate(bare, ONE_GPU, "muri-s", restart_s=0.0, as_controller=AsController(declared=declared))
    assert [d.workers for d in r.decisions] == [("n0",), ("n0",)] and r.meta["untimed_colocated_jobs"] == 2
    timed = [_job("a", 0, 50, DATA_HEAVY), _job("b", 0, 50, GPU_HEAVY)]
    r = simulate(timed, ONE_GPU, "muri-s", restart_s=0.0, as_controller=AsController(declared=declared))
    assert r.meta["untimed_colocated_jobs"] == 0
