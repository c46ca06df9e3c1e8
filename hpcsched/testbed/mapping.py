"""Trace jobs -> small real training jobs: which workload, how many processes, how many steps, when.

Time scaling. One real second stands for ``scale`` trace seconds. A trace job that ran ``D`` seconds
alone becomes a real job of ``D / scale`` seconds: ``steps = D / scale / nominal_iteration_s`` of its
workload, clipped to ``[min_steps, max_steps]`` so that very short jobs are not all start-up and very
long ones do not hold the run for ever (the clipped jobs are longer or shorter than the trace's; the
simulations run exactly the jobs the runtime ran, so the comparison stays like for like). Submit times
keep the trace's gaps divided by ``scale``; real times map back as
``trace_time = first_trace_submit + (real - real_start) * scale``.

Model -> workload (``WORKLOADS``). The trace profiles each model's iteration in data loading, compute
and communication (Muri's ``resource_time_0/1/2``). Each model maps to the ``workloads/ddp_train.py``
configuration whose stage mix is closest on 2 CPU cores: data-heavy models (RL, small CNNs: the data
stage is 75-90% of their iteration) get an emulated storage latency that dominates their iteration;
compute-heavy language models get the transformer with a bigger batch and no storage latency; the
VGGs, balanced, get the CNN with a short latency. The nominal iteration times are what one process
measured alone on an idle 2-core machine; they only size the jobs and give the first simulation its
profile, the second one uses what the runtime measured.

Sizes. A trace job asks for ``num_gpu`` GPUs; the real job gets ``min(num_gpu, max_procs,
slots per worker)`` processes (one per slot), so every job fits on one worker as consolidated
placement would put it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from hpcsched.errors import InputError
from hpcsched.model import ClusterSpec, Job, ResourceProfile


@dataclass(frozen=True, slots=True)
class Workload:
    """One configuration of ``workloads/ddp_train.py``."""

    model: str  # cnn | transformer
    batch: int
    io_latency_ms: float
    nominal_iteration_s: float  # measured alone on an idle 2-core machine (world size 1, torchrun)


DATA_HEAVY = Workload("cnn", 16, 30.0, 0.045)
BALANCED = Workload("cnn", 32, 10.0, 0.040)
COMPUTE_HEAVY = Workload("transformer", 64, 0.0, 0.050)

WORKLOADS: dict[str, Workload] = {
    "a2c": DATA_HEAVY, "dqn": DATA_HEAVY, "resnet18": DATA_HEAVY, "shufflenet_v2_x1_0": DATA_HEAVY,
    "vgg16": BALANCED, "vgg19": BALANCED,
    "gpt2": COMPUTE_HEAVY, "bert": COMPUTE_HEAVY,
}


def workload_for(job: Job) -> Workload:
    """The trace model's workload; unknown models are classed by their stage profile, else balanced."""
    if job.model in WORKLOADS:
        return WORKLOADS[job.model]
    p = job.profile
    if p is not None and p.total_s > 0:
        if p.data_s / p.total_s >= 0.6:
            return DATA_HEAVY
        if p.compute_s / p.total_s >= 0.6:
            return COMPUTE_HEAVY
    return BALANCED


@dataclass(frozen=True, slots=True)
class Scaling:
    scale: float  # trace seconds per real second
    min_steps: int = 40
    max_steps: int = 400
    max_procs: int = 2


@dataclass(frozen=True, slots=True)
class ScaledJob:
    """One trace job as the testbed runs it."""

    trace_id: str
    model: str  # the trace's model name
    trace_gpus: int
    trace_submit: float  # seconds, trace scale
    trace_duration: float  # seconds alone, trace scale
    trace_profile: ResourceProfile | None
    workload: Workload
    procs: int
    steps: int
    submit_offset: float  # real seconds after the replay starts

    @property
    def name(self) -> str:
        return f"t{self.trace_id}-{self.model}"


def pick_scale(text: str, jobs: list[Job], min_steps: int, max_steps: int) -> float:
    """``--time-scale``: a number, or ``auto``: the median job gets the geometric middle of
    ``[min_steps, max_steps]`` steps of the balanced workload."""
    if text != "auto":
        try:
            v = float(text)
        except ValueError:
            raise InputError(None, f"--time-scale: expected a number or 'auto', got {text!r}") from None
        if not (v > 0 and math.isfinite(v)):
            raise InputError(None, f"--time-scale must be > 0, got {text}")
        return v
    median = statistics.median(_solo_seconds(j) for j in jobs)
    return median / (math.sqrt(min_steps * max_steps) * BALANCED.nominal_iteration_s)


def _solo_seconds(job: Job) -> float:
    if job.duration is not None and job.duration > 0:
        return job.duration
    if job.iterations and job.iteration_time:
        return job.iterations * job.iteration_time
    raise ValueError(f"job {job.id}: needs a duration, or iterations and an iteration time")


def scale_jobs(jobs: list[Job], cluster: ClusterSpec, scaling: Scaling) -> list[ScaledJob]:
    """The replayed jobs, in submit order; ``jobs`` is the chosen subset of the trace."""
    if scaling.scale <= 0:
        raise ValueError("time scale must be > 0")
    ordered = sorted(jobs, key=lambda j: j.submit)
    t0 = ordered[0].submit if ordered else 0.0
    cap = max(1, min(scaling.max_procs, cluster.gpus_per_node))
    out = []
    for j in ordered:
        w = workload_for(j)
        dur = _solo_seconds(j)
        steps = round(dur / scaling.scale / w.nominal_iteration_s)
        steps = min(max(steps, scaling.min_steps), scaling.max_steps)
        out.append(ScaledJob(
            trace_id=str(j.id), model=j.model or "unknown", trace_gpus=j.gpus, trace_submit=j.submit,
            trace_duration=dur, trace_profile=j.profile, workload=w, procs=min(max(j.gpus, 1), cap), steps=steps,
            submit_offset=(j.submit - t0) / scaling.scale,
        ))
    return out


def job_yaml(job: ScaledJob, workdir: Path, seed: int = 0, report_every: int | None = None,
             launcher: str = "torchrun", declare_profile: bool = False) -> str:
    """The job file the testbed submits (``hpcsched submit`` format); fast-forward asks for a report every
    ``report_every`` steps (its N), so the pace between jumps is measured without waiting."""
    w = job.workload
    report = report_every or max(1, job.steps // 10)
    ckpt = max(report, job.steps // 4)
    cmd = ["workloads/ddp_train.py", "--model", w.model, "--batch", str(w.batch), "--io-latency-ms",
           f"{w.io_latency_ms:g}", "--report-every", str(report), "--checkpoint-every", str(ckpt),
           "--seed", str(seed)]
    quoted = ", ".join(f"'{c}'" for c in cmd)
    text = (f"name: {job.name}\nlauncher: {launcher}\nprocs: {job.procs}\nsteps: {job.steps}\n"
            f"workdir: {workdir}\ncommand: [{quoted}]\n")
    p = declared_profile(job) if declare_profile else None
    if p is not None:  # lets an interleaving policy group the job before it has measured itself
        text += f"profile: {{data_s: {p.data_s:.6g}, compute_s: {p.compute_s:.6g}, comm_s: {p.network_s:.6g}}}\n"
    return text


def declared_profile(job: ScaledJob) -> ResourceProfile | None:
    """The trace's stage proportions at the workload's nominal real pace: what the first simulation assumes,
    declared to the controller too, so real run and simulation start from the same knowledge."""
    p = job.trace_profile
    if p is None or p.total_s <= 0:
        return None
    return p.scaled_to(job.workload.nominal_iteration_s)


def sim_job(job: ScaledJob, scale: float, iteration_s: float | None = None,
            profile: ResourceProfile | None = None) -> Job:
    """The job as a simulator input, in trace seconds.

    Without measurements (the first simulation) it runs ``steps`` iterations of the workload's nominal
    time, split into stages in the trace's proportions. With them, ``iteration_s`` (real seconds) and the
    measured stage ``profile`` (real seconds) replace the nominal ones. The measured start-up and tear-down
    are the simulation's restart cost (``simulate(..., restart_s=...)``), not part of the job.
    """
    real_it = iteration_s if iteration_s is not None else job.workload.nominal_iteration_s
    it = real_it * scale
    if profile is not None and profile.total_s > 0:
        prof = profile.scaled_to(it)
    elif job.trace_profile is not None and job.trace_profile.total_s > 0:
        prof = job.trace_profile.scaled_to(it)
    else:
        prof = None
    n = job.steps
    return Job(id=job.trace_id, submit=job.trace_submit, gpus=job.procs, iterations=n, iteration_time=it,
               duration=n * it, profile=prof, model=job.model)


def real_to_trace(t: float | None, real_start: float, trace_start: float, scale: float) -> float | None:
    """A real unix time as trace seconds (None stays None)."""
    if t is None or not math.isfinite(t) or t <= 0:
        return None
    return trace_start + (t - real_start) * scale
