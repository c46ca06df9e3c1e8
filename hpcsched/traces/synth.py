"""Seeded synthetic traces, and the one rule that fills in what real DL traces lack.

Why: the scale benchmarks' targets are at sizes no public log has (a 49,152-node Cobalt log, a year on a
160,000-node machine, 150,000 Philly-like jobs with multi-week jobs), so the project generates them,
and anyone can regenerate the exact same bytes from a kind and a seed (``hpcsched trace generate``).

Generators (each streams: memory depends on the machine, never on the number of jobs):

- ``cobalt``: the DIR-LAB/lumos Theta CSV layout that ``hpcsched.traces.cobalt`` reads, default 22,500 jobs
  on 49,152 nodes. Job sizes and run times come from quantile tables of the bundled Theta log
  (``trace-data/cobalt/theta-2022-2023.csv.gz``), taken per size class (1-8, 9-128, 129-512, 513-4392
  nodes, with the class frequencies of the log) so that big jobs run longer, as they do there. Sizes are
  Theta's fractions of the machine scaled to ``--nodes`` (at least 1 node); requested wall time is run
  time x a ratio drawn from the class's wall/run quantiles, rounded to whole minutes; the exit status
  has the log's shares (Pass 62.1 %, Killed 29.6 %, Failed 8.2 %). Submits are a Poisson process whose
  rate gives the offered load ``--load`` (node-seconds asked / node-seconds available, default 0.6;
  Theta's was 0.64); start times come from a first-come-first-served schedule on the machine, so the
  log never uses more nodes than the machine has (what ``replay --log`` needs).
- ``swf``: the same job model on ``--nodes`` (default 160,000) for ``--days`` (default 365), written as
  SWF 2.2 (one processor per node; status 1 / 5 / 0 for Pass / Killed / Failed).
- ``philly``: the Muri CSV layout (milliseconds) the simulator reads, default 150,000 jobs for cluster
  n128g8 (1,024 GPUs). GPU counts follow the Sia Philly trace's (``trace-data/philly/philly-sia.csv.gz``)
  frequencies; durations come from its quantile tables per GPU class (1, 2-4, 5-8, >8), with the top of
  each table raised to ``--max-days`` (default 60) so that the tail holds multi-week jobs. Submits are
  Poisson at the offered load ``--load`` (GPU-seconds, default 0.8). Models, iterations and stage profiles
  follow the fill rule below.

Random numbers come from ``random.Random(f"{kind}:{seed}")`` (Mersenne Twister, the same on every
platform and Python 3 version for ``random()``), every number is printed with a fixed format, and a
``.gz`` output is written with mtime 0 and no file name: one seed gives the same bytes everywhere.

Fill rule (``DLFill``), used by every DL reader (Philly, Alibaba, Helios) and by the ``philly``
generator: a job's model is ``MODEL_NAMES[crc32(f"{seed}:{job_id}") % 8]`` unless the trace names one;
the model's stage times per iteration are the medians of the bundled Muri trace3 (``MODELS``);
iterations, when the trace has none, are ``max(1, round(duration / model iteration time))``; the
iteration time is then ``duration / iterations`` (the trace's duration is kept exactly), and the
profile is the model's stage proportions at that pace. A named model missing from the table gets the
stage proportions of the hashed pick. Seed 0 by default (reader option ``seed``). Every filled value is
counted in ``report.meta['filled']``. Hashing the job id (not drawing in file order) keeps a job's fill
the same in any slice or order of the file.
"""

from __future__ import annotations

import gzip
import heapq
import io
import math
import random
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hpcsched.model import ResourceProfile
from hpcsched.progress import Update, progress_bar

# ------------------------------------------------------------------------------------------- fill rule


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """Per-iteration times (ms) of one model as Muri's trace3 records them (medians over its jobs)."""

    batch_size: int
    iteration_ms: float
    data_ms: float
    compute_ms: float
    network_ms: float


# Medians per model of trace3.csv (Rivendile/Muri): iteration_time, resource_time_0/1/2, batch_size.
MODELS: dict[str, ModelProfile] = {
    "a2c": ModelProfile(64, 555.0, 502.0, 14.0, 0.4),
    "bert": ModelProfile(4, 192.0, 0.5, 167.0, 59.0),
    "dqn": ModelProfile(128, 509.0, 435.0, 8.0, 0.5),
    "gpt2": ModelProfile(4, 437.0, 0.6, 419.0, 49.0),
    "resnet18": ModelProfile(128, 1010.0, 784.0, 117.0, 77.0),
    "shufflenet_v2_x1_0": ModelProfile(128, 957.0, 769.0, 57.0, 10.0),
    "vgg16": ModelProfile(16, 214.0, 82.0, 75.0, 66.0),
    "vgg19": ModelProfile(16, 226.0, 82.0, 88.0, 60.0),
}
MODEL_NAMES: tuple[str, ...] = tuple(sorted(MODELS))


def pick_model(job_id: str, seed: int = 0) -> str:
    """The model the fill rule gives a job: a hash of seed and id, so order and slicing never change it."""
    return MODEL_NAMES[zlib.crc32(f"{seed}:{job_id}".encode()) % len(MODEL_NAMES)]


@dataclass(frozen=True, slots=True)
class Filled:
    model: str | None
    iterations: int | None
    iteration_time: float | None
    profile: ResourceProfile | None


class DLFill:
    """Fills model, iterations and stage profile of DL jobs for one read, counting each filled value.

    Counts go to ``report.meta['filled']`` (model / iterations / profile) as they happen, and the rule
    (with its seed) is stated once as a conversion, so ``trace inspect`` shows both.
    """

    def __init__(self, report: Any, seed: int | None = None) -> None:
        self.seed = int(report.options.get("seed", 0) if seed is None else seed)
        self.counts: dict[str, int] = report.meta.setdefault("filled", {"model": 0, "iterations": 0, "profile": 0})
        report.convert(
            f"fill rule (seed {self.seed}): a missing model is crc32(seed:id) -> one of {len(MODEL_NAMES)} Muri "
            "models; "
            "iterations = round(duration / model iteration time); iteration time = duration / iterations; "
            "profile = the model's stage proportions (Muri trace3 medians); counted in meta 'filled'"
        )

    def __call__(self, job_id: str, duration: float | None, model: str | None = None,
                 iterations: int | None = None) -> Filled:
        counts = self.counts
        if not model:
            model = pick_model(job_id, self.seed)
            counts["model"] += 1
            table = MODELS[model]
        else:
            table = MODELS.get(model) or MODELS[pick_model(job_id, self.seed)]
        counts["profile"] += 1
        if duration is None or not (duration > 0 and math.isfinite(duration)):
            return Filled(model, iterations, None, _profile(table, table.iteration_ms / 1000.0))
        if iterations is None or iterations <= 0:
            iterations = max(1, round(duration * 1000.0 / table.iteration_ms))
            counts["iterations"] += 1
        it = duration / iterations
        return Filled(model, iterations, it, _profile(table, it))


def _profile(m: ModelProfile, iteration_s: float) -> ResourceProfile | None:
    total = m.data_ms + m.compute_ms + m.network_ms
    if not (iteration_s > 0 and math.isfinite(iteration_s)) or total <= 0:
        return None
    f = iteration_s / total
    return ResourceProfile(m.data_ms * f, m.compute_ms * f, m.network_ms * f)


# ------------------------------------------------------------------------------------- distributions

# Theta (bundled Cobalt log), per size class: (share of jobs, node-count quantiles as fractions of the
# 4,392-node machine, run-time quantiles in s, requested/run ratio quantiles), all at THETA_Q.
THETA_NODES = 4392
THETA_Q = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
THETA_CLASSES: tuple[tuple[float, tuple[float, ...], tuple[float, ...], tuple[float, ...]], ...] = (
    (0.5284,
     (1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8, 8, 8),
     (17, 40, 57, 81, 160, 243, 557, 1024, 1530, 2844, 3640, 3654, 3675, 3776),
     (0.415, 0.983, 0.987, 1.075, 1.998, 3.109, 4.634, 8.426, 15.799, 28.793, 57.841, 68.07, 97.195, 213.65)),
    (0.2941,
     (30, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128),
     (17, 60, 101, 139, 727, 1574, 2663, 4125, 6826, 9656, 10841, 10858, 10889, 11075),
     (0.95, 0.991, 0.994, 0.997, 1.175, 1.487, 2.146, 3.605, 7.84, 62.792, 90.977, 109.897, 265.982, 564.854)),
    (0.1215,
     (129, 144, 200, 256, 256, 256, 256, 256, 256, 448, 512, 512, 512, 512),
     (18, 56, 79, 1074, 3716, 9697, 12933, 16840, 20155, 21571, 21660, 24579, 32460, 248220),
     (0.948, 0.996, 0.997, 0.998, 1.006, 1.096, 1.195, 1.597, 2.896, 8.923, 134.247, 314.428, 575.7, 1203.227)),
    (0.0559,
     (556, 648, 700, 810, 894.3, 1020, 1024, 1024, 1536, 2048, 3415, 3587.1, 4096, 4392),
     (35, 84, 387, 1726, 3644, 5266, 15950, 24297, 59011, 82855, 86232, 86448, 86474, 86496),
     (0.943, 0.995, 0.998, 0.999, 1.016, 1.142, 1.401, 1.575, 1.987, 4.964, 36.051, 119.595, 1389.524, 2338.295)),
)
THETA_STATUS = (("Pass", 0.6214), ("Killed", 0.2962), ("Failed", 0.0824))

# Sia Philly trace (bundled): GPU counts and their job counts; durations (s) per GPU class at PHILLY_Q.
PHILLY_GPUS = ((1, 76627), (2, 1818), (4, 1870), (8, 1643), (12, 7), (16, 199), (24, 7), (32, 67), (64, 6), (128, 3))
PHILLY_Q = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0)
PHILLY_DURATIONS: tuple[tuple[int, tuple[float, ...]], ...] = (  # (largest GPU count of the class, quantiles)
    (1, (1, 52, 62, 76, 215, 600, 1117, 1728, 2464, 3754, 8512, 19137, 135399, 865709, 3256045)),
    (4, (2, 11, 15, 19, 25, 85, 367, 5583, 25424, 79258, 166120, 233082, 747317, 2171244, 2750674)),
    (8, (1, 125, 216, 785, 4011, 12382, 23683, 65014, 140721, 203050, 351982, 525618, 1060498, 2656479, 4628226)),
    (1 << 30, (1, 35, 72, 345, 890, 3167, 21137, 53750, 73311, 158991, 247972, 443240, 922629, 1612502, 1710643)),
)

DEFAULT_START = 1704067200  # 2024-01-01T00:00:00Z: synthetic logs are tied to the calendar from here


def _quantile(rng: random.Random, qs: tuple[float, ...], vs: tuple[float, ...]) -> float:
    """Inverse CDF through (q, v) points, log-linear between them (values > 0): a smooth heavy tail."""
    u = rng.random()
    i = 1
    while i < len(qs) - 1 and qs[i] < u:
        i += 1
    q0, q1, v0, v1 = qs[i - 1], qs[i], vs[i - 1], vs[i]
    if v0 == v1 or q1 == q0:
        return float(v0)
    f = (u - q0) / (q1 - q0)
    return math.exp(math.log(v0) + f * (math.log(v1) - math.log(v0)))


def _quantile_mean(qs: tuple[float, ...], vs: tuple[float, ...]) -> float:
    """The exact mean of what ``_quantile`` draws: per segment, the mean of a log-linear curve."""
    total = 0.0
    for q0, q1, v0, v1 in zip(qs, qs[1:], vs, vs[1:], strict=False):
        total += (q1 - q0) * (v0 if v0 == v1 else (v1 - v0) / math.log(v1 / v0))
    return total


def _weighted(rng: random.Random, cum: list[float]) -> int:
    u = rng.random() * cum[-1]
    for i, c in enumerate(cum):
        if u < c:
            return i
    return len(cum) - 1


def _cumulative(weights: list[float]) -> list[float]:
    out, s = [], 0.0
    for w in weights:
        s += w
        out.append(s)
    return out


@dataclass(frozen=True, slots=True)
class BatchJob:
    """One job of the HPC generators, before scheduling: size, run time, request and exit status."""

    nodes: int
    run: int
    wall: int
    status: str


class _BatchModel:
    """Draws Theta-shaped jobs scaled to a machine (see the module docstring)."""

    def __init__(self, rng: random.Random, machine_nodes: int) -> None:
        self.rng = rng
        self.machine = machine_nodes
        self.scale = machine_nodes / THETA_NODES
        self.class_cum = _cumulative([c[0] for c in THETA_CLASSES])
        self.status_cum = _cumulative([p for _, p in THETA_STATUS])

    def draw(self) -> BatchJob:
        rng = self.rng
        _, nq, rq, wq = THETA_CLASSES[_weighted(rng, self.class_cum)]
        nodes = min(self.machine, max(1, round(_quantile(rng, THETA_Q, nq) * self.scale)))
        run = max(1, round(_quantile(rng, THETA_Q, rq)))
        wall = max(60, round(run * _quantile(rng, THETA_Q, wq) / 60) * 60)
        status = THETA_STATUS[_weighted(rng, self.status_cum)][0]
        return BatchJob(nodes, run, wall, status)

    def mean_node_seconds(self) -> float:
        """Mean of nodes x run time (size and run time are drawn independently within a class)."""
        total = sum(p for p, *_ in THETA_CLASSES)
        return sum(p / total * _quantile_mean(THETA_Q, nq) * self.scale * _quantile_mean(THETA_Q, rq)
                   for p, nq, rq, _ in THETA_CLASSES)


def _fcfs(
    jobs: Iterator[tuple[int, float, BatchJob]], machine_nodes: int
) -> Iterator[tuple[int, float, float, BatchJob]]:
    """(index, submit, start, job) in submit order: first come, first served on the machine's nodes.

    Memory is the set of running jobs (bounded by the machine), so any number of jobs streams through.
    """
    free = machine_nodes
    running: list[tuple[float, int]] = []  # (end, nodes) heap
    last_start = 0.0
    for i, submit, job in jobs:
        t = max(submit, last_start)
        while running and running[0][0] <= t:
            free += heapq.heappop(running)[1]
        while free < job.nodes:
            end, n = heapq.heappop(running)
            t = max(t, end)
            free += n
        heapq.heappush(running, (t + job.run, job.nodes))
        free -= job.nodes
        last_start = t
        yield i, submit, t, job


# ---------------------------------------------------------------------------------------- generators


@dataclass(frozen=True, slots=True)
class GenerateResult:
    kind: str
    path: str
    jobs: int
    bytes: int
    seconds: float


def _open_out(path: Path) -> tuple[IO[bytes], IO[str]]:
    raw = path.open("wb")
    if path.suffix == ".gz":
        packed = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0)
        return raw, io.TextIOWrapper(packed, encoding="utf-8", newline="\n", write_through=False)
    return raw, io.TextIOWrapper(raw, encoding="utf-8", newline="\n", write_through=False)


PROGRESS_EVERY = 1000  # jobs between progress updates: a redraw per job would cost more than the job
Lines = tuple[list[str], Iterator[str]]  # (header lines, one data line per job)


def cobalt_lines(seed: int, jobs: int = 22500, nodes: int = 49152, load: float = 0.6, start: int = DEFAULT_START,
                 cores_per_node: int = 64, progress: Update | None = None, label: str = "") -> Lines:
    """The Cobalt CSV: header, then one line per job in submit order (options checked before anything is drawn)."""
    _check(jobs >= 1 and nodes >= 1 and load > 0 and cores_per_node >= 1,
           "need --jobs >= 1, --nodes >= 1, --load > 0, --cores-per-node >= 1")
    rng = random.Random(f"cobalt:{seed}")
    model = _BatchModel(rng, nodes)
    rate = load * nodes / model.mean_node_seconds()

    def draws() -> Iterator[tuple[int, float, BatchJob]]:
        t = float(start)
        for i in range(jobs):
            t += rng.expovariate(rate)
            yield i, round(t), model.draw()

    def rows() -> Iterator[str]:
        for i, submit, begin, job in _fcfs(draws(), nodes):
            if progress is not None and i % PROGRESS_EVERY == 0:
                progress(i + 1, label=f"{label}: {i + 1:,}/{jobs:,} jobs")
            user = 1 + int(rng.paretovariate(1.2)) % 300
            yield (f"{i},{1000000 + i},u{user},p{1 + user % 60},0,0,{job.nodes * cores_per_node},{job.nodes},"
                   f"{submit:.0f},{begin - submit:.0f},{job.run},{job.wall},{job.nodes * job.run / 3600:.4f},"
                   f"{job.status}")

    header = (",job,user,project,state,gpu_num,cpu_num,node_num,submit_time,wait_time,run_time,wall_time,node_hour,"
              "new_status")
    return [header], rows()


_SWF_STATUS = {"Pass": 1, "Killed": 5, "Failed": 0}


def swf_lines(seed: int, nodes: int = 160000, days: float = 365.0, load: float = 0.6, start: int = DEFAULT_START,
              progress: Update | None = None, label: str = "") -> Lines:
    """An SWF 2.2 log of ``days`` of submits on ``nodes`` one-processor nodes: header, then one line per job."""
    _check(nodes >= 1 and days > 0 and load > 0, "need --nodes >= 1, --days > 0, --load > 0")
    rng = random.Random(f"swf:{seed}")
    model = _BatchModel(rng, nodes)
    rate = load * nodes / model.mean_node_seconds()
    horizon = days * 86400.0
    header = ["; Version: 2.2",
              f"; Computer: synthetic {nodes}-node machine (hpcsched trace generate swf --seed {seed})",
              "; Installation: hpcsched synthetic workload (Theta-shaped job mix, FCFS schedule)",
              f"; UnixStartTime: {start}", "; TimeZoneString: UTC", f"; MaxNodes: {nodes}", f"; MaxProcs: {nodes}",
              "; Note: one processor per node; status 1 completed, 5 cancelled (ran), 0 failed", ";"]

    def draws() -> Iterator[tuple[int, float, BatchJob]]:
        t, i = 0.0, 0
        while True:
            t += rng.expovariate(rate)
            if t >= horizon:
                return
            yield i, round(t), model.draw()
            i += 1

    def rows() -> Iterator[str]:
        for i, submit, begin, job in _fcfs(draws(), nodes):
            if progress is not None and i % PROGRESS_EVERY == 0:
                progress(submit, label=f"{label}: day {submit / 86400:,.0f} of {days:,.0f}, {i + 1:,} jobs")
            user = 1 + int(rng.paretovariate(1.2)) % 300
            yield (f"{i + 1} {submit:.0f} {begin - submit:.0f} {job.run} {job.nodes} -1 -1 {job.nodes} {job.wall} -1 "
                   f"{_SWF_STATUS[job.status]} {user} {1 + user % 60} -1 1 1 -1 -1")

    return header, rows()


MURI_HEADER = ("job_id,num_gpu,submit_time,iterations,model_name,batch_size,duration,interval,iteration_time,"
               "resource_time_0,resource_time_1,resource_time_2,priority")


def philly_lines(seed: int, jobs: int = 150000, cluster_gpus: int = 1024, load: float = 0.8,
                 max_days: float = 60.0, progress: Update | None = None, label: str = "") -> Lines:
    """A Muri CSV (ms) of Philly-like jobs: header, then one line per job; models by the fill rule."""
    _check(jobs >= 1 and cluster_gpus >= 1 and load > 0 and max_days > 0,
           "need --jobs >= 1, cluster GPUs >= 1, --load > 0, --max-days > 0")
    rng = random.Random(f"philly:{seed}")
    kept = [(g, float(n)) for g, n in PHILLY_GPUS if g <= cluster_gpus] or [(1, 1.0)]
    sizes = [g for g, _ in kept]
    cum = _cumulative([n for _, n in kept])
    cap = max_days * 86400.0
    tables = [(top, (*qs[:-1], max(cap, qs[-2]))) for top, qs in PHILLY_DURATIONS]

    def draw(r: random.Random) -> tuple[int, float]:
        g = sizes[_weighted(r, cum)]
        qs = next(t for top, t in tables if g <= top)
        return g, min(cap, max(1.0, _quantile(r, PHILLY_Q, qs)))

    weights = [n for _, n in kept]
    mean = sum(w * g * _quantile_mean(PHILLY_Q, next(t for top, t in tables if g <= top))
               for (g, _), w in zip(kept, weights, strict=True)) / sum(weights)
    rate = load * cluster_gpus / mean

    def rows() -> Iterator[str]:
        t = 0.0
        nxt = draw(rng), rng.expovariate(rate)
        for i in range(jobs):
            (g, dur), gap = nxt
            submit_ms = round(t * 1000)
            t += gap
            nxt = draw(rng), rng.expovariate(rate)
            name = pick_model(str(i), seed)
            m = MODELS[name]
            it_ms = round(m.iteration_ms)
            iters = max(1, round(dur * 1000.0 / it_ms))
            interval = round(t * 1000) - submit_ms if i + 1 < jobs else 0
            if progress is not None and i % PROGRESS_EVERY == 0:
                progress(i + 1, label=f"{label}: {i + 1:,}/{jobs:,} jobs")
            yield (f"{i},{g},{submit_ms},{iters},{name},{m.batch_size},{iters * it_ms},{interval},{it_ms},"
                   f"{m.data_ms:g},{m.compute_ms:g},{m.network_ms:g},0")

    return [MURI_HEADER], rows()


KINDS = ("cobalt", "swf", "philly")


def generate(kind: str, out: str | Path, seed: int, progress: bool = False, **options: Any) -> GenerateResult:
    """Write one synthetic trace; ``options`` are the keyword arguments of ``KIND_lines``.

    The options are checked (ValueError) before the file is created. ``progress`` shows a bar with ETA
    on stderr (the CLI turns it on only for a TTY).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    path = Path(out)
    t0 = time.perf_counter()
    label = f"generating {path.name}"
    total = (float(options.get("days", 365.0)) * 86400.0 if kind == "swf"
             else options.get("jobs", 22500 if kind == "cobalt" else 150000))
    n = 0
    with progress_bar(label, total, progress) as bar:
        if kind == "swf":
            header, rows = swf_lines(seed, progress=bar, label=label, **options)
        else:
            header, rows = (cobalt_lines if kind == "cobalt" else philly_lines)(seed, progress=bar, label=label,
                                                                                **options)
        raw, text = _open_out(path)
        try:
            for line in header:
                text.write(line + "\n")
            for n, line in enumerate(rows, 1):  # noqa: B007 - n is the count
                text.write(line)
                text.write("\n")
            text.flush()
        finally:
            text.close()
            raw.close()
    return GenerateResult(kind, str(path), n, path.stat().st_size, time.perf_counter() - t0)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
