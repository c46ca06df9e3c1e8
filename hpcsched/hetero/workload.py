"""Gavel's continuous-arrival workload, seeded, line for line as Gavel's scheduler generates it.

Why exact: ``--compat gavel`` is checked against figures Gavel's simulator printed for traces its own
generator made, and "other traces made the same way" must be the same jobs, not the same distribution.
So the draws below follow Gavel's order of random-number calls, on Python's ``random.Random``:

- jobs come from one generator seeded ``seed + 2``; per job: the scale factor (one uniform: <0.7 -> 1,
  0.7-0.8 -> 2, 0.8-0.95 -> 4, else 8, boundaries inclusive upwards as Gavel tests them), the duration
  (one draw picks the short 80% or long 20% branch, a second draws the exponent: 60*10^U(1.5,3) s or
  60*10^U(3,4) s), then job templates drawn uniformly until one fits (any for 1 GPU; a distributed one
  for more);
- inter-arrival gaps come from a second generator seeded ``seed + 3``: exponential with mean
  3600 / rate s (inverse transform of one uniform); the first job arrives at 0;
- total_steps = duration x the template's isolated V100 throughput at the job's scale factor, truncated.

``max_scale`` caps the scale factor after the draws (so the jobs are otherwise the same; the steps are
recomputed at the capped size): Gavel never splits a job across GPU types, so an 8-GPU job cannot run
on a cluster with 4 GPUs of each type.

Gavel does not write priorities (1) or SLOs (-1) in this mode, so neither is drawn.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hpcsched.hetero.throughputs import ThroughputTable, load_throughputs


@dataclass(frozen=True, slots=True)
class JobTemplate:
    """A runnable job kind: what Gavel's trace lines carry besides sizes and times."""

    job_type: str
    command: str  # with %s where the data directory goes
    working_directory: str
    num_steps_arg: str
    distributed: bool  # may run on more than one GPU
    needs_data_dir: bool = True


def _family(name: str, sizes: tuple[int, ...], command: str, workdir: str, steps_arg: str,
            distributed: bool) -> list[JobTemplate]:
    return [JobTemplate(f"{name} (batch size {b})", command.format(b=b), workdir, steps_arg, distributed)
            for b in sizes]


# The 26 kinds in the order Gavel's job table lists them: the order matters, a draw picks by index.
TEMPLATES: tuple[JobTemplate, ...] = (
    *_family("ResNet-18", (16, 32, 64, 128, 256), "python3 main.py --data_dir=%s/cifar10 --batch_size {b}",
             "image_classification/cifar10", "--num_steps", True),
    *_family("ResNet-50", (16, 32, 64, 128), "python3 main.py -j 8 -a resnet50 -b {b} %s/imagenet/",
             "image_classification/imagenet", "--num_minibatches", True),
    *_family("Transformer", (16, 32, 64, 128, 256),
             "python3 train.py -data %s/translation/multi30k.atok.low.pt -batch_size {b} -proj_share_weight",
             "translation", "-step", True),
    *_family("LM", (5, 10, 20, 40, 80), "python main.py --cuda --data %s/wikitext2 --batch_size {b}",
             "language_modeling", "--steps", True),
    *_family("Recommendation", (512, 1024, 2048, 4096, 8192),
             "python3 train.py --data_dir %s/ml-20m/pro_sg/ --batch_size {b}", "recommendation", "-n", False),
    JobTemplate("A3C", "python3 main.py --env PongDeterministic-v4 --workers 4 --amsgrad True", "rl",
                "--max-steps", False, needs_data_dir=False),
    JobTemplate("CycleGAN", "python3 cyclegan.py --dataset_path %s/monet2photo --decay_epoch 0", "cyclegan",
                "--n_steps", False),
)

SCALE_FACTORS = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class GavelJob:
    """One line of a Gavel trace: a template, its size, length in steps, weight, SLO and arrival time."""

    template: JobTemplate
    total_steps: int
    scale_factor: int
    arrival: float
    duration: float  # seconds on V100s, alone (not written: Gavel's traces carry steps)
    priority_weight: float = 1.0
    slo: float | None = None

    def line(self) -> str:
        """The tab-separated line Gavel writes (no newline); numbers formatted as Gavel formats them."""
        t = self.template
        slo = -1.0 if self.slo is None else self.slo
        return (f"{t.job_type}\t{t.command}\t{t.working_directory}\t{t.num_steps_arg}\t{int(t.needs_data_dir)}\t"
                f"{int(self.total_steps)}\t{self.scale_factor}\t{int(self.priority_weight)}\t{slo:f}\t{self.arrival:f}")


def _scale_factor(rng: random.Random) -> int:
    r = rng.uniform(0, 1)
    if 0.7 <= r <= 0.8:
        return 2
    if 0.8 <= r <= 0.95:
        return 4
    if r >= 0.95:
        return 8
    return 1


def _duration(rng: random.Random) -> float:
    if rng.random() >= 0.8:
        return 60 * (10 ** rng.uniform(3, 4))
    return 60 * (10 ** rng.uniform(1.5, 3))


def iter_jobs(n: int, rate_per_hour: float, seed: int, table: ThroughputTable | None = None,
              max_scale: int = 8, reference_gpu: str = "v100") -> Iterator[GavelJob]:
    """``n`` jobs of Gavel's generator at ``rate_per_hour`` (Poisson arrivals; 0 puts every job at 0)."""
    if n < 0:
        raise ValueError(f"--jobs must be >= 0, got {n}")
    if not (rate_per_hour >= 0 and math.isfinite(rate_per_hour)):
        raise ValueError(f"--rate must be a finite number of jobs per hour >= 0, got {rate_per_hour}")
    if max_scale not in SCALE_FACTORS:
        raise ValueError(f"--max-scale must be one of {', '.join(map(str, SCALE_FACTORS))}, got {max_scale}")
    table = table if table is not None else load_throughputs()
    jobs_rng = random.Random(seed + 2)
    gaps_rng = random.Random(seed + 3)
    mean_gap = 3600.0 / rate_per_hour if rate_per_hour > 0 else 0.0
    arrival = 0.0
    for i in range(n):
        if i:
            # Gavel's draw, operation for operation: -log(1 - u) / (1 / mean).
            arrival += -math.log(1.0 - gaps_rng.random()) / (1.0 / mean_gap) if mean_gap else 0.0
        scale = _scale_factor(jobs_rng)
        duration = _duration(jobs_rng)
        while True:
            template = jobs_rng.choice(TEMPLATES)
            if scale == 1 or template.distributed:
                break
        scale = min(scale, max_scale)
        steps = int(duration * table.isolated(template.job_type, reference_gpu, scale))
        yield GavelJob(template, steps, scale, arrival, duration)


def generate(n: int, rate_per_hour: float, seed: int, table: ThroughputTable | None = None,
             max_scale: int = 8) -> list[GavelJob]:
    """The jobs as a list (see ``iter_jobs``)."""
    return list(iter_jobs(n, rate_per_hour, seed, table, max_scale))


def write_trace(jobs: list[GavelJob], out: str | Path) -> int:
    """Write ``jobs`` as a Gavel trace file; returns the bytes written."""
    text = "".join(j.line() + "\n" for j in jobs)
    data = text.encode()
    Path(out).write_bytes(data)
    return len(data)
