"""Submit the scaled jobs to a running controller at their times, wait for them, write the real jobs.csv.

The driver only talks to the controller's public API (Submit, ListJobs, Cancel): the controller's own
policy decides what runs where, exactly as it would for users. Submissions follow the trace's gaps
divided by the time scale; the run ends when every job has reached a final state, or at the timeout
(then the rest are cancelled and reported ``unfinished``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcsched.results import JobResult, write_results
from hpcsched.testbed.mapping import ScaledJob, job_yaml, real_to_trace

if TYPE_CHECKING:
    from hpcsched.runtime.client import Client
    from hpcsched.testbed.fastforward import FastForwarder

FINAL = ("completed", "failed", "cancelled")
RUN_FILE = "testbed.json"


@dataclass
class Replay:
    """What a replay did: when it started, which runtime job each trace job became, how they ended."""

    real_start: float
    trace_start: float
    scale: float
    runtime_ids: dict[str, str]  # trace id -> runtime job id
    final: dict[str, dict[str, Any]] = field(default_factory=dict)  # trace id -> JobInfo fields
    timed_out: bool = False
    wall_s: float = 0.0
    jumps: list[tuple[float, float]] = field(default_factory=list)  # fast-forward: (real time, seconds skipped)

    def virtual(self, t: float) -> float:
        """Real time ``t`` on the run's clock: real time plus the seconds fast-forward skipped by then."""
        return t + sum(s for at, s in self.jumps if at <= t)


def workloads_root() -> Path:
    """The folder holding ``workloads/`` (the repository root of this checkout)."""
    return Path(__file__).resolve().parents[2]


def replay(jobs: list[ScaledJob], client: Client, *, scale: float, workdir: Path, timeout_s: float, poll_s: float = 0.5,
           progress: Callable[[int, int], None] | None = None, ff: FastForwarder | None = None,
           launcher: str = "torchrun", declare_profiles: bool = False) -> Replay:
    """Submit ``jobs`` (sorted by ``submit_offset``) and wait until all are final or ``timeout_s`` passes.

    With ``ff`` the run's clock also jumps (``hpcsched.testbed.fastforward``): submissions follow that clock.
    """
    jobs = sorted(jobs, key=lambda j: j.submit_offset)
    rep = Replay(real_start=time.time(), trace_start=jobs[0].trace_submit if jobs else 0.0,
                 scale=scale, runtime_ids={})
    pending = list(jobs)
    deadline = rep.real_start + timeout_s
    done = 0
    report_every = ff.real_steps if ff is not None else None
    while True:
        now = time.time()
        clock = now - rep.real_start + (ff.skipped(now) if ff is not None else 0.0)
        while pending and clock >= pending[0].submit_offset:
            j = pending.pop(0)
            spec = job_yaml(j, workdir, seed=_seed(j.trace_id), report_every=report_every, launcher=launcher,
                            declare_profile=declare_profiles)
            rep.runtime_ids[j.trace_id] = client.submit(spec, j.name)
            if ff is not None:
                ff.nominal[rep.runtime_ids[j.trace_id]] = (j.workload, j.workload.nominal_iteration_s)
        infos = {i.job_id: i for i in client.jobs()}
        if ff is not None:
            ff.step(now, infos, set(rep.runtime_ids.values()),
                    pending[0].submit_offset - clock if pending else None)
        done = sum(1 for rid in rep.runtime_ids.values() if rid in infos and infos[rid].state in FINAL)
        if progress is not None:
            progress(done, len(jobs))
        if not pending and done == len(jobs):
            break
        if now > deadline:
            rep.timed_out = True
            for rid in rep.runtime_ids.values():
                if rid in infos and infos[rid].state not in FINAL:
                    client.cancel(rid)
            break
        nxt = pending[0].submit_offset - clock if pending else poll_s
        time.sleep(max(0.02, min(poll_s, nxt)))
    infos = {i.job_id: i for i in client.jobs()}
    for tid, rid in rep.runtime_ids.items():
        i = infos.get(rid)
        if i is not None:
            rep.final[tid] = {"job_id": rid, "state": i.state, "submit_time": i.submit_time,
                              "start_time": i.start_time, "end_time": i.end_time, "steps_done": i.steps_done,
                              "steps_total": i.steps_total, "restarts": i.restarts, "first_loss": i.first_loss,
                              "last_loss": i.last_loss, "procs": i.procs}
    rep.wall_s = time.time() - rep.real_start
    rep.jumps = [(j.real_t, j.seconds) for j in ff.jumps] if ff is not None else []
    return rep


def _seed(trace_id: str) -> int:
    return sum(ord(c) * 31**i for i, c in enumerate(trace_id)) % 10_000


def real_results(jobs: list[ScaledJob], rep: Replay) -> list[JobResult]:
    """The real run in the simulator's schema, times mapped back to trace seconds."""
    out = []
    for j in jobs:
        f = rep.final.get(j.trace_id, {})
        ok = f.get("state") == "completed"

        def m(key: str, f: dict = f) -> float | None:
            t = f.get(key)
            return real_to_trace(rep.virtual(t) if t else t, rep.real_start, rep.trace_start, rep.scale)

        submit = m("submit_time")
        start, end = m("start_time"), m("end_time") if ok else None
        held = (end - start) * j.procs if ok and start is not None and end is not None else 0.0
        out.append(JobResult(j.trace_id, submit if submit is not None else j.trace_submit, start, end, j.procs, 0,
                             held, 0.0, "completed" if ok else "unfinished"))
    return out


def write_real(out: Path, jobs: list[ScaledJob], rep: Replay, meta: dict[str, Any]) -> Path:
    """``OUT/jobs.csv`` + ``meta.json`` (schema hpcsched.jobs/1) and ``OUT/testbed.json`` (the run's details)."""
    write_results(out, real_results(jobs, rep), meta | {"tool": "testbed", "scale": rep.scale,
                                                        "wall_s": round(rep.wall_s, 2)})
    doc = {"scale": rep.scale, "real_start": rep.real_start, "trace_start": rep.trace_start,
           "timed_out": rep.timed_out, "wall_s": rep.wall_s, "meta": meta, "jumps": rep.jumps,
           "skipped_s": sum(s for _, s in rep.jumps),
           "jobs": [_job_doc(j) | {"runtime": rep.final.get(j.trace_id, {})} for j in jobs]}
    (out / RUN_FILE).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return out


def _job_doc(j: ScaledJob) -> dict[str, Any]:
    d = asdict(j)
    d["workload"] = asdict(j.workload)
    d["trace_profile"] = list(j.trace_profile.stages()) if j.trace_profile is not None else None
    return d


def scaled_from_doc(d: dict[str, Any]) -> ScaledJob:
    """A ``ScaledJob`` back from its ``testbed.json`` entry."""
    from hpcsched.model import ResourceProfile
    from hpcsched.testbed.mapping import Workload

    fields = {k: v for k, v in d.items() if k != "runtime"}
    fields["workload"] = Workload(**d["workload"])
    fields["trace_profile"] = ResourceProfile(*d["trace_profile"]) if d["trace_profile"] else None
    return ScaledJob(**fields)


def load_run(real_dir: Path) -> dict[str, Any] | None:
    """``testbed.json`` of a real run, or None when the folder holds only a jobs.csv."""
    p = real_dir / RUN_FILE
    return json.loads(p.read_text()) if p.is_file() else None
