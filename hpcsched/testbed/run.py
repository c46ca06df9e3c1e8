"""One testbed experiment from start to finish: scale, replay, measure, simulate twice, compare."""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcsched.cluster_spec import read_cluster_spec
from hpcsched.errors import InputError
from hpcsched.model import ClusterSpec
from hpcsched.runtime import launchers
from hpcsched.runtime.config import ControllerConfig
from hpcsched.testbed import compare, driver, feedback, groupfit, measure, profiles
from hpcsched.testbed.mapping import ScaledJob, Scaling, declared_profile, pick_scale, scale_jobs
from hpcsched.testbed.probe import startup_probe


@dataclass(frozen=True)
class RunOptions:
    trace: Path
    cluster: Path
    policy: str
    out: Path
    jobs: int = 12
    skip: int = 0
    min_steps: int = 40
    max_steps: int = 400
    max_procs: int = 1
    timeout_s: float = 1800.0
    controller: str | None = None  # None: start a local cluster
    state: Path | None = None
    token_file: Path | None = None
    time_scale: str = "auto"
    profiles_from: Path | None = None  # an earlier run: adds the out-of-sample sim-predicted
    fast_forward: int = 0  # N real steps per job between jumps; 0: real time throughout
    max_jump_s: float = 30.0  # real-equivalent seconds one jump may skip
    checkpoint_root: Path | None = None  # the controller's (for --controller with fast-forward)
    launcher: str = "torchrun"  # how the workers start each job's processes (torchrun | direct)
    probes: int = 3  # start-up probe samples before the first job (0: none)
    declare_profiles: bool = True  # job files declare the trace's stage profile (groups form before measuring)


def _select(opts: RunOptions):
    from hpcsched.sim.runs import load_jobs

    jobs, _ = load_jobs(opts.trace)
    jobs = sorted(jobs, key=lambda j: j.submit)[opts.skip: opts.skip + opts.jobs]
    if len(jobs) < 1:
        raise InputError(opts.trace, f"no jobs left after --skip {opts.skip}")
    return jobs


def run_testbed(opts: RunOptions, progress: Callable[[int, int], None] | None = None,
                say: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    """Run everything; return the comparison of the real run with each simulation, by simulation name."""
    from hpcsched.policies import REGISTRY

    if opts.policy not in REGISTRY.names():
        raise InputError(None, f"unknown policy {opts.policy!r}; known: {', '.join(REGISTRY.names())}")
    if opts.jobs < 1 or opts.skip < 0 or not 1 <= opts.min_steps <= opts.max_steps or opts.max_procs < 1:
        raise InputError(None, "need --jobs >= 1, --skip >= 0, 1 <= --min-steps <= --max-steps, --max-procs >= 1")
    if opts.probes < 0:
        raise InputError(None, f"--probes must be >= 0, got {opts.probes}")
    per_node = [n for n in launchers.names() if not launchers.get(n).one_command]  # each node starts its own ranks
    if opts.launcher not in per_node:
        raise InputError(None, f"--launcher must be {' or '.join(per_node)}, got {opts.launcher!r}")
    if opts.fast_forward < 0 or opts.max_jump_s <= 0:
        raise InputError(None, "need --fast-forward >= 0 (0: off) and --max-jump > 0")
    if opts.fast_forward and opts.controller and (opts.state is None or opts.checkpoint_root is None):
        raise InputError(None, "--fast-forward with --controller needs --state and --checkpoint-root "
                               "(the controller's state file and checkpoint root, readable and writable here)")
    spec = read_cluster_spec(opts.cluster)
    chosen = _select(opts)
    scale = pick_scale(opts.time_scale, chosen, opts.min_steps, opts.max_steps)
    scaled = scale_jobs(chosen, spec, Scaling(scale, opts.min_steps, opts.max_steps, opts.max_procs))
    say(f"testbed: {len(scaled)} jobs, time scale {scale:,.1f} trace s per real s, "
        f"{spec.nodes} workers x {spec.gpus_per_node} slots, policy {opts.policy}"
        + (f", fast-forward {opts.fast_forward} real steps per jump" if opts.fast_forward else ""))
    opts.out.mkdir(parents=True, exist_ok=True)
    rep, state, probe = _replay(opts, spec, scaled, scale, progress)
    meta = {"policy": opts.policy, "trace": str(opts.trace), "cluster": spec.name, "capacity_gpus": spec.gpus,
            "capacity_nodes": spec.nodes, "gpus_per_node": spec.gpus_per_node, "jobs_replayed": len(scaled),
            "skip": opts.skip, "state": str(state) if state is not None else None,
            "fast_forward": opts.fast_forward, "skipped_s": round(sum(s for _, s in rep.jumps), 3),
            "jumps": len(rep.jumps), "startup_probe_s": round(probe, 3) if probe else None,
            "launcher": opts.launcher, "declare_profiles": opts.declare_profiles}
    driver.write_real(opts.out, scaled, rep, meta)
    if opts.fast_forward:
        say(f"testbed: {len(rep.jumps)} jumps skipped {sum(s for _, s in rep.jumps):,.0f} real-equivalent s "
            f"in {rep.wall_s:,.0f} s of wall time")
    if rep.timed_out:
        say(f"testbed: timed out after {opts.timeout_s:.0f} s; unfinished jobs were cancelled")
    if state is None:
        say("testbed: no --state given: the second simulation uses nominal profiles (nothing measured)")
    return analyse(opts.out, spec, opts.policy, scaled, scale, rep.runtime_ids, state, str(opts.trace),
                   opts.profiles_from, probe, declared=opts.declare_profiles)


def analyse(out_dir: Path, spec: ClusterSpec, policy: str, scaled: list[ScaledJob], scale: float,
            runtime_ids: dict[str, str], state: Path | None, trace: str,
            profiles_from: Path | None = None, probe_s: float | None = None,
            declared: bool = False) -> dict[str, dict[str, Any]]:
    """Measure, simulate three ways (four with ``profiles_from``) and compare; ``reanalyse`` calls it
    again on a finished run. ``declared``: the job files declared their profiles (``--declare-profiles``),
    so the simulations show the policy those for jobs that have not run yet, as the controller does.

    The measured group factors (``groupfit``) speed the groups of sim-measured and sim-grouped; sim-predicted
    takes the earlier run's (``PROFILES_FROM/profile/group-factors.csv``); sim-trace keeps the defaults.
    Likewise the restart cost: sim-measured and sim-grouped pay this run's median start-up + tear-down per
    launch as wall time (``feedback.measured_restart_s``), sim-predicted the earlier run's, probe-scaled;
    sim-trace the simulator's per-model table (nothing measured). The simulations that run the policy as the
    runtime does also keep the controller's hysteresis (``min_runtime_s``, the default a ``--local`` cluster
    runs with, in trace seconds)."""
    measured: dict[str, measure.Measured] = {}
    factors: dict[int, float] = {}
    if state is not None:
        by_runtime = measure.read_measurements(state, set(runtime_ids.values()))
        measured = {tid: by_runtime[rid] for tid, rid in runtime_ids.items() if rid in by_runtime}
        _write_windows(out_dir / compare.ITERATIONS_FILE, measured, runtime_ids, scale)
        _write_profiles(state, out_dir / "profile")
        fits = groupfit.fit_group_factors(by_runtime)
        groupfit.write_group_factors(out_dir / "profile" / groupfit.FILE, fits)
        factors = {g.k: g.factor for g in fits}
    decl = {j.trace_id: p.scaled_to(j.workload.nominal_iteration_s * scale)
            for j in scaled if (p := declared_profile(j)) is not None} if declared else None
    with_measured = feedback.measured_jobs(scaled, scale, measured)
    restart = feedback.measured_restart_s(measured, scale)
    sims = {"sim-trace": (feedback.trace_jobs(scaled, scale), True, None, None),
            "sim-measured": (with_measured, True, factors, restart),
            "sim-grouped": (with_measured, False, factors, restart)}
    if profiles_from is not None:
        learned = profiles.learn(profiles_from)
        old = groupfit.read_group_factors(profiles_from / "profile" / groupfit.FILE)
        predicted = profiles.predicted_jobs(scaled, scale, learned)
        sims["sim-predicted"] = (predicted, True, old, learned.restart_s(scale, probe_s))
        if probe_s is not None and learned.probe_s is not None:  # the same without the start-up probe's scaling
            sims["sim-predicted-unscaled"] = (predicted, True, old, learned.restart_s(scale))
    hold = ControllerConfig().min_runtime_s * scale  # the controller's hysteresis (a local cluster's default)
    out = {}
    for name, (jobs, flatten, gf, restart_s) in sims.items():
        feedback.run_sim(jobs, spec, policy, out_dir / name, trace, flatten=flatten, declared=decl,
                         group_factors=gf or None, restart_s=restart_s, min_runtime_s=hold)
        out[name] = compare.compare_runs(out_dir / name, out_dir)
    return out


def reanalyse(out_dir: Path, profiles_from: Path | None = None) -> dict[str, dict[str, Any]]:
    """The simulations and comparison of a finished run again, from its ``testbed.json`` and state file."""
    run = driver.load_run(out_dir)
    if run is None:
        raise InputError(out_dir / driver.RUN_FILE, "not a testbed run folder")
    meta = run["meta"]
    spec = ClusterSpec(1, int(meta["capacity_nodes"]), int(meta["gpus_per_node"]), name=meta["cluster"])
    scaled = [driver.scaled_from_doc(j) for j in run["jobs"]]
    ids = {j["trace_id"]: j["runtime"]["job_id"] for j in run["jobs"] if j["runtime"]}
    state = Path(meta["state"]) if meta.get("state") else None
    return analyse(out_dir, spec, meta["policy"], scaled, run["scale"], ids, state, meta["trace"], profiles_from,
                   meta.get("startup_probe_s"), declared=bool(meta.get("declare_profiles")))


def _replay(opts: RunOptions, spec, scaled: list[ScaledJob], scale: float, progress):
    from hpcsched.runtime.client import Client, resolve_token

    workdir = driver.workloads_root()
    if not (workdir / "workloads" / "ddp_train.py").is_file():
        raise InputError(workdir, "no workloads/ddp_train.py here: run the testbed from a source checkout")
    if opts.controller:
        client = Client(opts.controller, resolve_token(opts.token_file))
        _check_workers(client, spec, opts.cluster)
        try:
            ff = _forwarder(opts, opts.state, opts.checkpoint_root)
            probe = startup_probe(opts.probes) if opts.probes else None
            return driver.replay(scaled, client, scale=scale, workdir=workdir, timeout_s=opts.timeout_s,
                                 progress=progress, ff=ff, poll_s=0.2 if ff else 0.5,
                                 launcher=opts.launcher, declare_profiles=opts.declare_profiles), opts.state, probe
        finally:
            client.close()
    from hpcsched.testbed.local import LocalCluster

    with LocalCluster(opts.out / "runtime", spec, opts.policy) as lc:
        client = Client(lc.address, lc.token, timeout=30)
        try:
            lc.wait_workers(client)
            ff = _forwarder(opts, lc.state, lc.ckpt_root)
            # the workers are up: how slow a start is here, before the first job
            probe = startup_probe(opts.probes) if opts.probes else None
            return driver.replay(scaled, client, scale=scale, workdir=workdir, timeout_s=opts.timeout_s,
                                 progress=progress, ff=ff, poll_s=0.2 if ff else 0.5,
                                 launcher=opts.launcher, declare_profiles=opts.declare_profiles), lc.state, probe
        finally:
            client.close()


def _forwarder(opts: RunOptions, state: Path | None, ckpt_root: Path | None):
    if not opts.fast_forward or state is None or ckpt_root is None:
        return None
    from hpcsched.testbed.fastforward import FastForwarder

    return FastForwarder(opts.fast_forward, state, ckpt_root.resolve(), max_jump_s=opts.max_jump_s)


def _check_workers(client, spec, path: Path) -> None:
    alive = [w for w in client.workers() if w.alive]
    if len(alive) != spec.nodes or any(w.slots != spec.gpus_per_node for w in alive):
        raise InputError(path, f"the controller has {len(alive)} live workers with slots "
                               f"{[w.slots for w in alive]}; the spec says {spec.nodes} x {spec.gpus_per_node}")


def _write_windows(path: Path, measured: dict[str, measure.Measured], runtime_ids: dict[str, str],
                   scale: float) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("job_id", "runtime_id", "generation", "steps", "sharing", "pace_s", "data_s", "compute_s",
                    "comm_s", "startup_s", "group_size", "group_members"))
        trace_of = {rid: tid for tid, rid in runtime_ids.items()}
        for tid, m in measured.items():
            start = m.overhead_s() * scale
            for win in m.windows:
                w.writerow((tid, runtime_ids[tid], win.generation, win.steps, win.sharing,
                            f"{win.pace * scale:.6f}", f"{win.data_s * scale:.6f}", f"{win.compute_s * scale:.6f}",
                            f"{win.comm_s * scale:.6f}", f"{start:.3f}", win.group_size,
                            ";".join(trace_of.get(j, j) for j in win.members)))


def _write_profiles(state: Path, out: Path) -> None:
    """What ``hpcsched profile --state STATE --out OUT/profile`` writes (the runtime's own format)."""
    from hpcsched.runtime.profile import write_profiles
    from hpcsched.runtime.store import Store

    store = Store(state)
    try:
        write_profiles(store, out)
    finally:
        store.close()
