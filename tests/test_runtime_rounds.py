"""The controller with ``executor: rounds`` (Gavel's round mechanism, issue 19), as a site runs it: a controller on
port 0 and three worker daemons of types v100, p100 and k80 (one slot each), ``direct`` jobs that name their
``model:``, rounds of 4 s. Checked: jobs rotate between rounds by Gavel's priorities and land on the types the
allocation favours, a job that loses its turn or its type checkpoints and resumes exactly (no step lost or done
twice), ``hpcsched jobs`` says the round and type, and the controller's rounds give the simulator's assignments
(``hpcsched.hetero.rounds.simulate_rounds``) for the same jobs. Then the config's errors, naming file and line."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from runtime_procs import ROOT, client, controller_config, start_controller, start_worker, stop, wait_for

from hpcsched.errors import InputError
from hpcsched.hetero.policies import make_policy
from hpcsched.hetero.round_executor import RoundExecutor, RoundJobView
from hpcsched.hetero.rounds import RoundJob, simulate_rounds
from hpcsched.hetero.throughputs import load_throughputs
from hpcsched.primitives.hetero_cluster import parse_hetero_cluster
from hpcsched.runtime.client import Client
from hpcsched.runtime.config import read_controller_config

# Chosen so that the first three rounds do not hinge on a near tie: the simulator's choice holds with the time a
# stop or a start costs here (charges off by up to 2 s of a 4 s round; docs/hetero.md, "Runtime").
MODELS = ("Recommendation (batch size 2048)", "Recommendation (batch size 8192)", "Recommendation (batch size 1024)",
          "ResNet-18 (batch size 64)")
STEPS = (200, 120, 200, 120)  # none ends before the third round is decided (20 steps/s, at most 8 s each by then)
TYPES = ("v100", "p100", "k80")


def _job(name: str, model: str, steps: int) -> str:
    return (f"name: {name}\nlauncher: direct\nworkdir: {ROOT}\nsteps: {steps}\nmodel: {model}\n"
            "command: [tests/netns_job.py, --comm, tcp, --step-ms, '50', --checkpoint-every, '1000']\n")


def _events(db: Path) -> list[dict]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT time, job_id, kind, detail FROM events ORDER BY rowid").fetchall()
    finally:
        con.close()
    return [{"time": t, "job_id": j, "kind": k, **json.loads(d)} for t, j, k, d in rows]


def _simulated(rounds: int) -> list[dict[int, str]]:
    seen: list[dict[int, str]] = []

    def on_round(t: float, scheduled: dict[int, str]) -> None:
        seen.append(dict(scheduled))
        if len(seen) >= rounds:
            raise StopIteration

    jobs = [RoundJob(i, m, 10**9, 1, 0.0) for i, m in enumerate(MODELS)]
    with pytest.raises(StopIteration):
        simulate_rounds(jobs, parse_hetero_cluster("v100=1,p100=1,k80=1"), make_policy("max-min-fairness-perf"),
                        load_throughputs(), on_round=on_round)
    return seen


def _steps_done(c: Client, jid: str) -> int:
    return next(j.steps_done for j in c.jobs() if j.job_id == jid)


@pytest.mark.slow
def test_rounds_rotate_jobs_by_gavel_priorities(tmp_path: Path) -> None:
    cfg = controller_config(tmp_path, executor="rounds", hetero_policy="max-min-fairness-perf", round_s=4,
                            round_reset_s=0)
    proc, address = start_controller(tmp_path, cfg)
    procs = [proc]
    c = client(address)
    wfile = tmp_path / "worker.yaml"
    wfile.write_text("warm_ranks: false\n")  # stdlib-only jobs: no torch-preloaded supervisor on this shared machine
    try:
        for t in TYPES:
            procs.append(start_worker(tmp_path, address, f"w-{t}", slots=1,
                                      extra=("--config", str(wfile), "--gpu-type", t)))
        wait_for("three live workers", lambda: sum(w.alive for w in c.workers()) == 3, 60)
        # A first job alone makes round 1; the four arrive during it, wait for a round (Gavel), and the
        # cancelled first job ends round 1, so round 2 starts with the four at once, as the simulator's jobs do.
        first = c.submit(_job("first", MODELS[3], 100000), "first.yaml")
        bare = c.submit(_job("bare", "", 10).replace("model: \n", ""), "bare.yaml")  # no model: cannot take part
        wait_for("the first job running", lambda: [j for j in c.jobs() if j.job_id == first and j.state == "running"],
                 30, 0.1)
        ids = [c.submit(_job(f"g{i}", m, s), f"g{i}.yaml") for i, (m, s) in enumerate(zip(MODELS, STEPS, strict=True))]
        assert all(j.state == "pending" for j in c.jobs() if j.job_id in ids)  # they wait for the next round
        c.cancel(first)
        db = tmp_path / "run" / "state.db"

        def rounds() -> list[dict]:
            return [e for e in _events(db) if e["kind"] == "round"]

        wait_for("round 4", lambda: len(rounds()) >= 4, 40)
        got = rounds()
        assert list(got[0]["assignment"]) == [first] and got[0]["reset"]
        index = {jid: i for i, jid in enumerate(ids)}
        controller = [{index[j]: t for j, t in r["assignment"].items()} for r in got[1:4]]
        assert controller == _simulated(3)  # parity: the same jobs on the same types, round for round
        assert got[1]["reset"] and not got[2]["reset"] and not got[3]["reset"]  # one allocation for the four
        alloc = got[1]["allocation"]
        assert max(alloc[ids[2]], key=alloc[ids[2]].get) == "k80"  # Recommendation 1024: fastest on p100, given k80
        assert alloc[ids[3]]["v100"] > 0.5 and alloc[ids[3]]["p100"] < 1e-3 and alloc[ids[3]]["k80"] < 1e-3  # ResNet-18
        fresh = RoundExecutor("max-min-fairness-perf", load_throughputs()).decide(
            0.0, [RoundJobView(str(i), m, 1, 0.0) for i, m in enumerate(MODELS)], dict.fromkeys(TYPES, 1)).allocation
        assert {index[j]: a for j, a in alloc.items()} == {int(i): pytest.approx(a, abs=1e-5) for i, a in fresh.items()}
        listing = {j.job_id: j for j in c.jobs()}
        assert any(m.startswith("round ") for m in (listing[j].message for j in ids))
        assert listing[bare].state == "pending" and listing[bare].message.startswith("round ")
        assert "not scheduled: no model: in its job file" in listing[bare].message
        assert all(r["excluded"] == {bare: listing[bare].message.split("not scheduled: ", 1)[1]} for r in got[1:])
        log = (tmp_path / "controller.log").read_text()
        assert "max-min-fairness-perf in Gavel's rounds of 4 s" in log and "round 2 (allocation re-solved): " in log

        # Jobs 1-3 end within the fourth round; job 0 (out of turn then) needs another round: not waited for.
        wait_for("jobs 1-3 completed", lambda: all(j.state == "completed" for j in c.jobs() if j.job_id in ids[1:]),
                 60)
        c.cancel(ids[0])
        events = _events(db)
        types = {"w-" + t: t for t in TYPES}
        decided = {r["round"]: r["assignment"] for r in events if r["kind"] == "round"}
        current = 0
        for e in events:  # every start is on a worker of the type its round gave the job
            if e["kind"] == "round":
                current = e["round"]
            elif e["kind"] == "start" and e["job_id"] in ids:
                assert {types[w] for w in e["workers"]} == {decided[current][e["job_id"]]}, e
        stops = [e for e in events if e["kind"] == "stop" and e["job_id"] in ids]
        assert stops and all(e["reason"] == "preempt" for e in stops)  # rotation is by checkpoint stops
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        for jid, steps in zip(ids, STEPS, strict=True):
            rows = con.execute("SELECT generation, step, resumed_from FROM progress WHERE job_id = ? ORDER BY time",
                               (jid,)).fetchall()
            last: dict[int, int] = {}
            first_of: dict[int, int] = {}
            for g, step, resumed in rows:
                last[g] = step
                first_of.setdefault(g, resumed)
            gens = sorted(last)
            if jid != ids[0]:
                assert last[gens[-1]] == steps and _steps_done(c, jid) == steps
            for a, b in zip(gens, gens[1:], strict=False):  # exact: each attempt resumes where the last one stopped
                assert first_of[b] == last[a], (jid, a, b, first_of, last)
        con.close()
        c.cancel(bare)
        moved = [jid for jid in ids if len({types[w] for e in events if e["kind"] == "start" and e["job_id"] == jid
                                            for w in e["workers"]}) > 1]
        assert ids[1] in moved  # Recommendation 8192 ran on the V100, then moved to the P100
    finally:
        c.close()
        for p in reversed(procs):
            stop(p)



def test_config_keys_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"

    def read(text: str):
        p.write_text(text)
        return read_controller_config(p)

    cfg = read("state: s.db\nexecutor: rounds\nhetero_policy: max-sum-throughput-perf\nround_s: 120\n")
    assert (cfg.executor, cfg.hetero_policy, cfg.round_s, cfg.round_reset_s) == ("rounds", "max-sum-throughput-perf",
                                                                                  120.0, 1920.0)
    default = read("state: s.db\n")
    assert (default.executor, default.hetero_policy, default.round_s) == ("decide", "max-min-fairness-perf", 360.0)
    for text, line, what in (
            ("executor: gavel\n", 2, "executor: expected one of decide, rounds"),
            ("round_s: 10\n", 2, "round_s: read by Gavel's round mechanism only"),
            ("executor: rounds\nhetero_policy: las\n", 3, "unknown Gavel policy 'las'"),
            ("executor: rounds\nhetero_policy: max-min-fairness-packed\n", 3, "space sharing"),
            ("executor: rounds\nround_s: 0\n", 3, "round_s: must be > 0"),
            ("executor: rounds\npolicy: las\n", 3, "policy: not read by executor: rounds"),
            ("executor: rounds\nthroughputs: nope.json\n", None, "no such throughput file")):
        with pytest.raises(InputError) as e:
            read("state: s.db\n" + text)
        assert what in str(e.value) and (line is None or f"c.yaml:{line}:" in str(e.value)), str(e.value)
