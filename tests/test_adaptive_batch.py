"""Adaptive batch size (hpcsched.runtime.adaptive_batch): the job file's key, the fit from reports, the choice."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from hpcsched.runtime.adaptive_batch import BatchFit, BatchSpec, choose_batch, goodput_curve, parse_batch

ROOT = Path(__file__).resolve().parents[1]
scipy_missing = importlib.util.find_spec("scipy") is None


def test_batch_key_is_checked_and_bounds_follow_the_size() -> None:
    s = parse_batch({"base": 64, "max": 1024, "min_per_proc": 48, "max_per_proc": 64, "lr_scaling": "adascale"})
    assert s == BatchSpec(64, 1024, 48, 64, "adascale")
    assert [s.bounds(n) for n in (1, 2, 3)] == [(64, 64), (96, 128), (144, 192)]
    assert parse_batch(s.as_dict()) == s  # what the controller stores parses back the same
    assert BatchSpec(64, 64, max_per_proc=16).bounds(2) == (32, 32)  # B0 does not fit: the most that does
    for bad, what in (({"max": 8}, "base required"), ({"base": 0}, "base must be"), ({"base": 64, "max": 32},
                      "below base"), ({"base": 8, "lr_scaling": "cubic"}, "lr_scaling must be"),
                      ({"base": 8, "min_per_proc": 9, "max_per_proc": 4}, "above max_per_proc"),
                      ({"base": 8, "size": 3}, "base required"), ({"base": True}, "base must be")):
        with pytest.raises(ValueError, match=what):
            parse_batch(bad)


def test_fit_keeps_running_statistics_and_refuses_what_it_cannot_use() -> None:
    f = BatchFit()
    assert f.noise_scale() is None
    assert not f.add(64, 1, 0.0, 0.0, 0.01, 0.02)  # a report without statistics
    assert not f.add(64, 1, float("nan"), 1.0, 0.01, 0.02)
    for _ in range(20):
        assert f.add(64, 1, 0.5, 20.0, 0.01, 0.02)
    assert f.noise_scale() == pytest.approx(40.0)
    g = BatchFit()
    g.add(64, 1, -0.1, 5.0, 0.01, 0.02)  # the unbiased |G|^2 estimate can go negative: noise scale unknown
    assert g.noise_scale() is None


def test_without_statistics_a_size_gets_its_smallest_batch_and_says_why() -> None:
    s = BatchSpec(64, 1024, 48, 64)
    c = choose_batch(s, None, 3)
    assert (c.batch, c.how) == (144, "no statistics yet")
    assert goodput_curve(s, BatchFit(), range(1, 4)) == ((), ())


@pytest.mark.skipif(scipy_missing, reason="the goodput extra (scipy) fits the step-time model")
def test_goodput_choice_grows_the_batch_with_the_noise_scale() -> None:
    """Same step times; a noisier gradient (larger noise scale) makes large batches statistically cheap, so the
    goodput-best batch at 4 processes is larger; every choice is a whole per-process batch within the bounds."""
    s = BatchSpec(64, 4096, 1, 512)
    chosen = {}
    for var in (2.0, 2000.0):
        f = BatchFit()
        for n, b in ((1, 64), (2, 128), (4, 256), (4, 1024)):
            for _ in range(4):  # step time: 5 ms + 0.1 ms per sample of a process, 4 ms all-reduce beyond 1 proc
                compute = 0.005 + 1e-4 * b / n
                f.add(b, n, 1.0, var, compute, compute + (0.004 if n > 1 else 0.0))
        c = choose_batch(s, f, 4)
        lo, hi = s.bounds(4)
        assert c.how == "goodput" and lo <= c.batch <= hi and c.batch % 4 == 0 and c.goodput > 0
        chosen[var] = c.batch
        sizes, rates = goodput_curve(s, f, range(1, 5))
        assert sizes == (1, 2, 3, 4) and all(r > 0 for r in rates)
    assert chosen[2000.0] > 2 * chosen[2.0], chosen


def test_the_workloads_estimator_recovers_the_gradient_noise() -> None:
    """adaptive_train's estimator on synthetic gradients with a known mean and per-sample variance."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[torch]')")
    sys.path.insert(0, str(ROOT / "workloads"))
    try:
        from adaptive_train import grad_stats, lr_factor
    finally:
        sys.path.remove(str(ROOT / "workloads"))
    gen = torch.Generator().manual_seed(0)
    dim, small, sqr_true, var_true = 4000, 16, 0.25, 8.0  # tr(Sigma) = var_true over dim coordinates
    mean = torch.full((dim,), (sqr_true / dim) ** 0.5)
    sqrs, vars_ = [], []
    for _ in range(200):  # two half-shard gradients of ``small`` samples each, one rank
        halves = [mean + torch.randn(dim, generator=gen) * (var_true / dim / small) ** 0.5 for _ in range(2)]
        _, sqr, var = grad_stats(halves, small, 2 * small, 1, False)
        sqrs.append(sqr)
        vars_.append(var)
    assert sum(sqrs) / len(sqrs) == pytest.approx(sqr_true, rel=0.1)
    assert sum(vars_) / len(vars_) == pytest.approx(var_true, rel=0.05)
    assert lr_factor("linear", 256, 64, 1, 1) == 4 and lr_factor("sqrt", 256, 64, 1, 1) == 2
    assert lr_factor("adascale", 64, 64, 1.0, 40.0) == 1.0 and 1 < lr_factor("adascale", 256, 64, 1.0, 40.0) < 4
    assert lr_factor("adascale", 256, 64, 0.0, 0.0) == 1.0  # no statistics: no guess above the tuned rate


JOB = """name: a
launcher: direct
procs: 1
min_procs: 1
max_procs: 4
command: [workloads/adaptive_train.py]
scaling: {procs: [1, 4], rates: [100, 300]}
batch: {base: 64, max: 1024, max_per_proc: 256, lr_scaling: adascale}
"""


def test_job_file_batch_key_round_trips_and_errors_name_the_line() -> None:
    from hpcsched.errors import InputError
    from hpcsched.runtime.jobfile import job_spec_yaml, parse_job_spec

    spec = parse_job_spec(JOB, "a.yaml")
    assert spec.batch == BatchSpec(64, 1024, 1, 256, "adascale")
    assert parse_job_spec(job_spec_yaml(spec), "again") == spec  # what submit sends is what the controller reads
    assert parse_job_spec(JOB.replace("batch: {base: 64, max: 1024, max_per_proc: 256, lr_scaling: adascale}\n", ""),
                          "b.yaml").batch is None
    with pytest.raises(InputError, match=r"c\.yaml:8: .*lr_scaling must be one of"):
        parse_job_spec(JOB.replace("adascale", "cubic"), "c.yaml")


@pytest.mark.skipif(scipy_missing, reason="the goodput extra (scipy) fits the step-time model")
def test_tracker_refits_from_the_store_after_a_restart_and_values_the_job_by_goodput(tmp_path: Path) -> None:
    """The controller's tracker: the first attempt gets B0 (no statistics, said in the event), reports feed the
    fit, a job with ``batch:`` and ``scaling:`` gets a goodput curve for the MILP instead of its declared one, and
    a new tracker on the same store (a restarted controller) refits the same curve from the stored rows."""
    import time

    from hpcsched.runtime.batch_tracker import BatchTracker
    from hpcsched.runtime.jobfile import parse_job_spec
    from hpcsched.runtime.reconcile import progress_update
    from hpcsched.runtime.rpc import pb
    from hpcsched.runtime.store import Store

    store = Store(tmp_path / "state.db", owner=True)
    try:
        jid = store.add_job(parse_job_spec(JOB, "a.yaml"), time.time())
        job = store.job(jid)
        t = BatchTracker(store)
        assert t.curve(job) is None  # nothing fitted: the declared curve stands
        assert t.choose(job, 2) == 64
        assert store.events(jid, "batch")[-1]["how"] == "no statistics yet"
        for k, (n, b) in enumerate([(1, 64), (2, 128), (4, 512)] * 3):
            p = pb.Progress(step=10 * k + 10, loss=1.0, world_size=n, batch_size=b, grad_sqr=1.0, grad_var=500.0,
                            data_s=0.002, compute_s=0.004 + 1e-4 * b / n, comm_s=0.003 if n > 1 else 0.0,
                            time=time.time())
            store.add_progress(jid, 1, progress_update(job, p, time.time()).row)
            t.observe(job, p)
        t.wait_fits()  # the step-time fit runs on the tracker's thread, never under the controller's lock
        curve = t.curve(job)
        assert curve is not None and curve.nodes == (1.0, 2.0, 3.0, 4.0) and all(r > 0 for r in curve.rates)
        b4 = t.choose(job, 4)
        assert store.events(jid, "batch")[-1]["how"] == "goodput" and 64 <= b4 <= 1024 and b4 % 4 == 0
        again = BatchTracker(store)
        assert again.curve(job) is None  # its fit from the stored rows is queued, not awaited
        again.wait_fits()
        assert again.curve(job) == curve and again.choose(job, 4) == b4
        assert t.shown()[jid] == (b4, pytest.approx(500.0))
        t.forget(jid)
        assert jid not in t.shown()
        t.close()
        again.close()
    finally:
        store.close()


@pytest.mark.skipif(scipy_missing, reason="the goodput extra (scipy) fits the step-time model")
def test_controller_sizes_an_adaptive_job_by_its_fitted_goodput_not_its_declared_throughput(tmp_path: Path) -> None:
    """In-process controller, one worker of 4 slots. The job declares throughput rising 4x from 1 to 4 processes,
    so the MILP starts it at 4 (told batch 256: 64 per process at least). Its reports then say the gradient is
    nearly noise-free (a large batch is statistically wasteful) and that a step at 4 is 2/3 all-reduce: its
    goodput is far higher at 1 process, and the next decision shrinks it to 1 (a resize), told batch 64."""
    from hpcsched.runtime.config import ControllerConfig
    from hpcsched.runtime.controller import Controller
    from hpcsched.runtime.rpc import pb

    c = Controller(ControllerConfig(state=tmp_path / "s.db", checkpoint_root=tmp_path / "ck", policy="las",
                                    min_runtime_s=0.0))
    c.started()
    try:
        c.register(pb.RegisterRequest(worker_id="w0", host="127.0.0.1", slots=4, launchers=["direct"]))
        jid = c.submit("command: [t.py]\nlauncher: direct\nprocs: 1\nmin_procs: 1\nmax_procs: 4\nsteps: 1000\n"
                       "scaling: {procs: [1, 4], rates: [100, 400], resize_s: 1}\n"
                       "batch: {base: 64, max: 1024, min_per_proc: 64}\n", "j.yaml")

        def beat(tasks: list[pb.TaskStatus] = ()) -> pb.HeartbeatReply:
            return c.heartbeat(pb.HeartbeatRequest(worker_id="w0", spare_port=40000, tasks=list(tasks)))

        beat()
        c.tick()
        (t,) = beat().launch
        assert (t.world_size, t.batch_size, t.base_batch, t.lr_scaling) == (4, 256, 64, "sqrt")
        assert t.env["HPCSCHED_BATCH_SIZE"] == "256" and t.env["HPCSCHED_LR_SCALING"] == "sqrt"
        reports = [pb.Progress(time=1.0 + k, step=10 * k, world_size=4, batch_size=256, grad_sqr=1.0, grad_var=2.0,
                               data_s=0.0, compute_s=0.01, comm_s=0.02, loss=1.0) for k in range(1, 6)]
        beat([pb.TaskStatus(task_id=t.task_id, job_id=jid, generation=t.generation, running=True,
                            progress=reports)])
        c.batches.wait_fits()  # fitted on the tracker's thread
        c.tick()
        stops = c.store.events(jid, "stop")
        assert stops and stops[-1]["reason"] == "resize" and stops[-1]["new_procs"] == 1, stops
        info = {j.job_id: j for j in c.list_jobs()}[jid]
        assert info.batch_size == 256 and info.noise_scale == pytest.approx(2.0)
        beat([pb.TaskStatus(task_id=t.task_id, job_id=jid, generation=t.generation, running=False)])
        c.tick()
        (t2,) = beat().launch
        assert (t2.world_size, t2.batch_size) == (1, 64)
        assert c.store.events(jid, "batch")[-1]["how"] == "goodput"
    finally:
        c.store.close()
