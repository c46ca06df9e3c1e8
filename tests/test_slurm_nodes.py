"""Slurm node states -> harvestable pool, and the harvest config's errors (no Slurm needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpcsched.errors import InputError
from hpcsched.slurm.config import read_harvest_config
from hpcsched.slurm.nodes import parse_sinfo, parse_state
from hpcsched.slurm.source import SlurmJob, derive_pool, parse_squeue

# Captured from `sinfo -N -h -o '%N %T'` on the 4-node test cluster (two partitions, so each node
# appears twice) while n2 was drained, n3 ran a batch job and n4's slurmd had been killed.
SINFO = """n1 idle
n1 idle
n2 drained
n2 drained
n3 allocated
n3 allocated
n4 idle*
n4 idle*
"""


def test_only_plain_idle_is_harvestable() -> None:
    states = parse_sinfo(SINFO)
    assert [n for n, s in states.items() if s.harvestable] == ["n1"]
    assert states["n4"].reason == "idle* (not responding)"
    assert states["n2"].reason == "drained"


@pytest.mark.parametrize(
    ("raw", "harvestable", "busy"),
    [
        ("idle", True, False),
        ("planned", False, False),  # backfill holds it for a pending job
        ("idle-", False, False),
        ("mixed", False, True),
        ("allocated", False, True),
        ("completing", False, True),
        ("draining", False, False),
        ("idle+drain", False, False),
        ("down*", False, False),
        ("allocated*", False, False),  # a job holds it but its slurmd stopped answering
        ("idle~", False, False),  # powered off
        ("maint", False, False),
    ],
)
def test_state_table(raw: str, harvestable: bool, busy: bool) -> None:
    s = parse_state("n9", raw)
    assert (s.harvestable, s.busy) == (harvestable, busy)


def test_node_listed_twice_keeps_less_harvestable_reading() -> None:
    assert not parse_sinfo("n1 idle\nn1 allocated\n")["n1"].harvestable


def test_squeue_lines_expand_hostlists() -> None:
    jobs = parse_squeue("12|batch|wrap|RUNNING|n[1-3]\n13|scavenger|hpcsched-lr-1|PENDING|\n",
                        expand=lambda s: {"n[1-3]": ["n1", "n2", "n3"]}[s])
    assert [(j.id, j.nodes) for j in jobs] == [("12", ("n1", "n2", "n3")), ("13", ())]


def test_pool_keeps_our_nodes_and_drops_foreign_and_broken_ones() -> None:
    states = parse_sinfo("n1 idle\nn2 allocated\nn3 allocated\nn4 draining\nn5 allocated\nn6 down*\nn7 planned\n")
    jobs = [SlurmJob("7", "scavenger", "hpcsched-lr-1", "RUNNING", ("n2", "n4")),
            SlurmJob("8", "batch", "wrap", "CONFIGURING", ("n3",))]
    pool, why = derive_pool(states, jobs, lambda j: j.name.startswith("hpcsched-"))
    # n2: held by our own scavenger job; n5: sinfo says allocated but no job holds it (one just ended)
    assert pool == ["n1", "n2", "n5"]
    assert why == {"n3": "held by job 8 (batch), allocated", "n4": "draining", "n6": "down* (not responding)",
                   "n7": "planned"}


def _cfg(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "h.yaml"
    p.write_text(text)
    return p


def test_config_reads_jobs_relative_to_file(tmp_path: Path) -> None:
    hf = read_harvest_config(_cfg(tmp_path, "mode: scavenger\njobs:\n  - {id: a, jmax: 4, steps: 10, command: [x]}\n"))
    assert hf.mode == "scavenger" and hf.specs[0].ckpt_dir == tmp_path / "ckpt" / "a"
    assert hf.specs[0].job.curve.rate(4) == 4.0


def test_mode_controller_is_the_default_and_becomes_a_runtime_job(tmp_path: Path) -> None:
    """A config without ``mode:`` runs through the controller: its pilot keys map onto the controller's ``slurm:``
    section, and each job becomes an elastic ``direct`` runtime job that the runtime's own parser accepts, its
    ``{ckpt_dir}`` / ``{steps}`` the variables the runtime sets for the task."""
    from hpcsched.runtime.jobfile import parse_job_spec
    from hpcsched.slurm.controller_mode import controller_config, job_yaml, runtime_command

    hf = read_harvest_config(_cfg(tmp_path, (
        "partition: scav\nqos: low\naccount: p1\ntime_limit_s: 900\nsettle_s: 4\ntfwd: 30\n"
        "pilot: {stop_grace_s: 2, sbatch_args: [--mem=1G]}\njobs:\n"
        "  - {id: lr, jmin: 2, jmax: 4, steps: 50, scale_up_s: 1, scale_down_s: 3,\n"
        "     command: ['{python}', -m, prog, --ckpt-dir, '{ckpt_dir}', '--steps={steps}', 'a b']}\n")))
    assert hf.mode == "controller"
    cfg = controller_config(hf, tmp_path / "out", max_pilots=4)
    p = cfg.pilots
    assert (p.partition, p.qos, p.account, p.time_limit_s, p.settle_s, p.stop_grace_s, p.sbatch_args, p.max_pilots,
            p.slots) == ("scav", "low", "p1", 900, 4.0, 2.0, ("--mem=1G",), 4, 1)
    assert cfg.listen == "127.0.0.1:0" and cfg.milp_tfwd_s == 30 and cfg.token and cfg.worker_token != cfg.token
    job = parse_job_spec(job_yaml(hf.specs[0], tmp_path, python="/py"), "lr")
    assert (job.launcher, job.min_procs, job.max_procs, job.steps, job.resize_s) == ("direct", 2, 4, 50, 3.0)
    assert job.curve_procs == (1, 4) and job.curve_rates == (1.0, 4.0)
    assert job.command == ("/bin/sh", "-c", 'exec /py -m prog --ckpt-dir "${HPCSCHED_CHECKPOINT_DIR}" '
                                            '--steps="${HPCSCHED_STEPS}" \'a b\'')
    out = subprocess.run([*job.command[:2], job.command[2].replace("exec /py -m prog", "printf '%s|'")],
                         env={"HPCSCHED_CHECKPOINT_DIR": "/c d", "HPCSCHED_STEPS": "50"}, capture_output=True,
                         text=True, check=True).stdout
    assert out == "--ckpt-dir|/c d|--steps=50|a b|"
    plain = read_harvest_config(_cfg(tmp_path, "jobs:\n  - {id: a, jmax: 1, steps: 1, command: ['{python}', x.py]}\n"))
    assert runtime_command(plain.specs[0], python="/py") == ["/py", "x.py"]  # no variable: no shell


@pytest.mark.parametrize(
    ("text", "msg", "line"),
    [
        ("jobs:\n  - {id: a, jmax: 4, steps: 10, command: [x]}\n  - {id: b, steps: 3, command: [x]}\n",
         "jobs[1] lacks 'jmax'", 3),
        ("jobs:\n  - {id: a, jmax: 0, steps: 10, command: [x]}\n", "Jmin", 2),
        ("jobs:\n  - {id: a, jmax: 2, steps: 10, command: x}\n", "list of strings", 2),
        ("mode: both\njobs:\n  - {id: a, jmax: 2, steps: 1, command: [x]}\n", "mode must be", 1),
        ("jobs: [\n", "invalid YAML", 2),
        ("poll_s: 1\n", "non-empty 'jobs:'", 1),
        ("jobs:\n  - {id: a, jmax: 2, steps: 1, command: [x], ckpt_dir: c}\n", "ckpt_dir is not read by mode "
         "controller", 2),
        ("solver: dp\njobs:\n  - {id: a, jmax: 2, steps: 1, command: [x]}\n", "solver: not read by mode controller",
         1),
        ("mode: local\nqos: q\njobs:\n  - {id: a, jmax: 2, steps: 1, command: [x]}\n", "qos: read by mode "
         "controller only", 2),
        ("pilot: {max_pilots: 2}\njobs:\n  - {id: a, jmax: 2, steps: 1, command: [x]}\n", "set by harvest itself", 1),
        ("time_limit_s: 30\njobs:\n  - {id: a, jmax: 2, steps: 1, command: [x]}\n", "leave_before_s (60) must be "
         "below time_limit_s", 1),
        ("pilot: {stop_grace: 2}\njobs:\n  - {id: a, jmax: 2, steps: 1, command: [x]}\n", "unknown key", 1),
    ],
)
def test_config_errors_name_file_and_line(tmp_path: Path, text: str, msg: str, line: int | None) -> None:
    p = _cfg(tmp_path, text)
    with pytest.raises(InputError) as e:
        read_harvest_config(p)
    assert msg in str(e.value) and e.value.line == line


def test_mode_controller_outputs_from_a_controller_store(tmp_path: Path) -> None:
    """DIR's files in mode controller come from the controller's store: a pilot Slurm preempted is a preemption
    whose lost steps are the attempt's last step minus the step the next attempt resumed from (here 12: killed
    past its checkpoint at 25); a pilot the controller cancelled itself stops the job without a preemption, also
    when its worker's Leave reached the store before the pilot manager recorded the cancel (seen live)."""
    import csv
    import json
    import time

    from hpcsched.runtime.store import Store
    from hpcsched.slurm.controller_mode import to_results

    store = Store(tmp_path / "state.db", owner=True)
    t0 = time.time()

    def ev(job: str | None, kind: str, **detail: object) -> None:
        store.event(job, kind, **detail)
        time.sleep(0.002)  # events are ordered by their time

    def steps(gen: int, first: int, last: int, ckpt: tuple[int, ...] = ()) -> None:
        for s in range(first, last + 1):
            store.add_progress("j0001", gen, {"time": time.time(), "step": s, "resumed_from": first,
                                              "checkpoint": "c" if s in ckpt else None})

    for n in (1, 2):
        ev(None, "pilot", event="running", slurm_job=str(n), node=f"n{n}", worker=f"pilot-{n}")
    ev("j0001", "start", generation=1, procs=2, workers=["pilot-1", "pilot-2"])
    steps(1, 0, 37, ckpt=(25,))
    ev("j0001", "stop", reason="preempt", worker_left="pilot-2")
    ev("j0001", "stopped", reason="preempt")
    ev("j0001", "start", generation=2, procs=1, workers=["pilot-1"])
    steps(2, 25, 60, ckpt=(50, 60))
    ev("j0001", "stop", reason="preempt", worker_left="pilot-1")  # its worker's Leave, stored before ...
    ev(None, "pilot", event="cancel", slurm_job="1", node="n1", worker="pilot-1", detail="idle")  # ... the cancel
    ev("j0001", "stopped", reason="preempt")
    ev(None, "pilot", event="running", slurm_job="3", node="n3", worker="pilot-3")
    ev("j0001", "start", generation=3, procs=1, workers=["pilot-3"])
    steps(3, 60, 80, ckpt=(80,))
    ev("j0001", "completed", steps=80)
    events, progress = store.events(), store.progress()
    store.close()

    out = to_results(tmp_path / "out", t0, {"j0001": "lr"}, events, progress, [(t0, "join", "n1", 1, "idle")],
                     {"capacity_node_seconds": 10.0})
    with (out / "events.csv").open() as f:
        rows = [r for r in csv.DictReader(f)]
    job = [(r["event"], r["nodes"], r["step"], r["ckpt_step"], r["lost_steps"]) for r in rows if r["job"]]
    assert job == [("start", "n1 n2", "", "", ""), ("vacate", "n2", "", "", ""),
                   ("preempted", "n1 n2", "37", "25", "12"), ("start", "n1", "", "", ""), ("stop", "n1", "", "", ""),
                   ("stopped", "n1", "60", "60", "0"),
                   ("start", "n3", "", "", ""), ("finish", "n3", "80", "80", "")]
    assert rows[0]["event"] == "join" and [r["event"] for r in rows].count("pilot-running") == 3
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["preemptions"], meta["lost_steps"], meta["max_lost_steps"], meta["pilots"]) == (1, [12], 12, 3)
    assert meta["mode"] == "controller" and meta["controller_jobs"] == {"lr": "j0001"}
    with (out / "jobs.csv").open() as f:
        (lr,) = list(csv.DictReader(f))
    assert lr["status"] == "completed" and lr["nodes"] == "2" and float(lr["node_seconds"]) > 0
