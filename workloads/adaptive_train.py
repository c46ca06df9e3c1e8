"""Data-parallel training whose global batch size follows what the scheduler tells it (Pollux-style adaptive batch).

The runtime gives each attempt its global batch size, the job's base batch size and the learning-rate scaling
rule in the environment (HPCSCHED_BATCH_SIZE, HPCSCHED_BASE_BATCH, HPCSCHED_LR_SCALING, from the job file's
``batch:`` key). Under the ``direct`` or ``torchrun`` launcher a resize relaunches it, and it resumes from its
checkpoint at the new size and batch. Under an elastic ``horovodrun`` a resize is made in place (the processes
that stay keep their state): the worker rewrites the batch file named by HPCSCHED_BATCH_FILE (beside Horovod's
host-discovery script) before it rewrites the host list, and every time Horovod re-forms the world the ranks agree
on the newest batch told there (``take_batch``). The learning rate is scaled from ``--lr`` (tuned at the base
batch): ``linear`` by M/M0, ``sqrt`` by sqrt(M/M0), ``adascale`` by AdaScale's gain, measured from the gradient
statistics below.

Every step it measures the gradient noise as adaptdl does: each rank computes the gradients of the two halves of
its shard, so there are 2 x world small-batch gradients besides their mean (the big-batch gradient). Their squared
norms give unbiased estimates of the true gradient's squared norm |G|^2 (``grad_sqr``) and of the per-sample
gradient variance tr(Sigma) (``grad_var``), whose ratio is the gradient noise scale the scheduler's statistical
efficiency uses. Both are averaged over each report window and reported with the progress, beside
``batch_size``; they travel in the checkpoint (and Horovod's elastic state) as running averages, so ``adascale``
continues across resizes.

    torchrun --nproc-per-node 2 workloads/adaptive_train.py --steps 200   # batch from the env, else --batch
    horovodrun -np 2 --min-np 1 --max-np 3 --host-discovery-script ./hosts.sh --gloo \\
        python workloads/adaptive_train.py --steps 200
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from _common import (
    Reporter,
    StageTimer,
    StopFlag,
    atomic_write,
    checkpoint_dir,
    exit_now,
    superseded,
    total_steps,
    training_args,
    write_result,
)
from models import batch, build

RULES = ("linear", "sqrt", "adascale", "none")
EMA = 0.9  # weight of the past in the running gradient statistics (adascale's gain reads them)
BATCH_FILE_ENV = "HPCSCHED_BATCH_FILE"  # hpcsched.runtime.horovod_elastic.BATCH_ENV: the batch told in place
Sum = Callable[[torch.Tensor, str], torch.Tensor]  # a sum over every rank (the identity on one process)


def lr_factor(rule: str, m: int, m0: int, sqr: float, var: float) -> float:
    """The learning rate's multiplier at global batch ``m`` for one tuned at ``m0``. AdaScale's gain is
    (var/m0 + sqr) / (var/m + sqr) with ``var`` the per-sample variance: 1 at m0, m/m0 for pure noise; before
    any statistics (or with a non-positive estimate, which noise can give) it is 1, never a guess above it."""
    s = m / m0
    if rule == "linear":
        return s
    if rule == "sqrt":
        return math.sqrt(s)
    if rule == "adascale":
        if not (sqr > 0 and var > 0):
            return 1.0
        return (var / m0 + sqr) / (var / m + sqr)
    return 1.0


def grad_stats(halves: list[torch.Tensor], small: float, big: float, world: int,
               reduce: Sum | bool) -> tuple[torch.Tensor, float, float]:
    """(mean gradient, |G|^2 estimate, tr(Sigma) estimate) from this rank's two half-shard gradients; ``reduce``
    sums over the ranks (True: torch.distributed's; False: one process).

    With k small gradients of ``small`` samples each and their mean over ``big`` samples:
    E|g_small|^2 = |G|^2 + tr(S)/small and E|g_big|^2 = |G|^2 + tr(S)/big, solved for the two unknowns."""
    total = reduce if callable(reduce) else (torch_sum if reduce else no_sum)
    mean_local = total((halves[0] + halves[1]) / 2, "grad") / world
    sq = total(torch.stack([(h * h).sum() for h in halves]).sum().reshape(1), "grad_sq")
    small_sq = float(sq) / (2 * world)
    big_sq = float((mean_local * mean_local).sum())
    if big <= small:  # one small gradient per sample: no second scale to solve with
        return mean_local, big_sq, 0.0
    var = (small_sq - big_sq) / (1 / small - 1 / big)
    return mean_local, big_sq - var / big, var


def torch_sum(t: torch.Tensor, _name: str) -> torch.Tensor:
    dist.all_reduce(t)
    return t


def no_sum(t: torch.Tensor, _name: str) -> torch.Tensor:
    return t


def told_in_place(path: str | None) -> tuple[int, int, int]:
    """(version, global batch, the world size it was chosen for) from the batch file the worker rewrites with each
    in-place resize; (-1, 0, 0) without one (not launched elastic by hpcsched, or this rank's host cannot see it:
    the ranks take the newest version any rank read, ``take_batch``)."""
    if not path:
        return -1, 0, 0
    try:
        told = json.loads(open(path).read())
        return int(told["version"]), int(told["batch_size"]), int(told["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1, 0, 0


class Trainer:
    """One process's training at the batch it was told: model, optimizer, statistics, reports, checkpoints."""

    def __init__(self, args: Any, steps: int, m: int, m0: int, rule: str, rank: int, world: int, total: Sum,
                 elastic: bool) -> None:
        self.args, self.steps, self.m, self.m0, self.rule = args, steps, m, m0, rule
        self.rank, self.world, self.total, self.elastic = rank, world, total, elastic
        self.stop = StopFlag()
        torch.manual_seed(args.seed)
        self.model = build(args.model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        self.ckpt_dir = checkpoint_dir(args.checkpoint_dir)
        self.path = self.ckpt_dir / "ckpt.pt"
        self.step, self.first_loss, self.history, self.sqr_avg, self.var_avg, self.samples = 0, None, [], 0.0, 0.0, 0
        state: dict = {}
        if self.path.exists():
            state = torch.load(self.path, weights_only=False)
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optim"])
            self.step, self.first_loss, self.history = state["step"], state["first_loss"], state["history"]
            self.sqr_avg, self.var_avg, self.samples = state["sqr_avg"], state["var_avg"], state["samples"]
        self.last_loss = state.get("last_loss", float("nan"))
        self.resumed_from = self.step if state else -1
        self.rep = Reporter(rank, world, self.resumed_from)
        self.timer = StageTimer()
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.params = list(self.model.parameters())
        self.window_loss, self.window_n, self.window_sqr, self.window_var = 0.0, 0, 0.0, 0.0
        self.report_now: dict[str, object] = {}  # extra fields of the first report after an in-place resize
        self.formations = 0  # worlds Horovod formed in this attempt (part of its elastic state)

    def started(self, **extra: object) -> None:
        """This attempt's (or in-place world's) entry in the history the result keeps: its size and batch."""
        self.history = [*self.history, {"generation": os.environ.get("HPCSCHED_GENERATION"), "world_size": self.world,
                                        "batch_size": self.m, "lr_scaling": self.rule, **extra}]

    def take_batch(self, hvd: Any) -> None:
        """Every rank of a (re-)formed Horovod world agrees on the newest batch told in place (a collective: the
        ranks that stayed and the newcomers all call it at the top of the elastic loop). A batch told for another
        size than the one Horovod formed (a host not up yet) keeps its per-process batch, said as ``batch_told`` in the
        next report and the history."""
        mine = told_in_place(os.environ.get(BATCH_FILE_ENV))
        every = hvd.allgather(torch.tensor([mine], dtype=torch.int64), name="batch_told")
        version, told, for_world = (int(v) for v in every[int(torch.argmax(every[:, 0]))])
        if version < 0:  # nothing told in place: the attempt's batch (the same on every rank)
            return
        # computed from the file alone on every rank, never from what this rank ran at before: a newcomer and the
        # ranks that stayed must shard the same global batch
        m = told if for_world == self.world else max(2, told // max(1, for_world)) * self.world
        m = max(m, 2 * self.world)  # two half-shards per rank: the noise estimate needs both
        if m != told:
            self.report_now["batch_told"] = told
        self.m = m

    def regroup(self, hvd: Any) -> None:
        """After Horovod re-formed the world (the ranks that stayed; newcomers start fresh): the new rank and size.
        The batch is taken after the state's sync, where the newcomers are too (``take_batch``)."""
        old = self.world
        self.rank, self.world = hvd.rank(), hvd.size()
        self.rep.rank, self.rep.world = self.rank, self.world
        self.rep.first = False  # the same attempt goes on, whichever process now reports as rank 0
        self.report_now = {"resized_in_place": True, "from_world_size": old, "from_batch_size": self.m}
        self.timer.reset()
        self.window_loss, self.window_n, self.window_sqr, self.window_var = 0.0, 0, 0.0, 0.0

    def save(self) -> str:
        if self.rank != 0 or superseded(self.ckpt_dir):
            return ""
        state = {"model": self.model.state_dict(), "optim": self.opt.state_dict(), "step": self.step,
                 "first_loss": self.first_loss, "history": self.history,
                 "last_loss": self.window_loss / self.window_n if self.window_n else self.last_loss,
                 "sqr_avg": self.sqr_avg, "var_avg": self.var_avg, "samples": self.samples}
        atomic_write(self.path, lambda p: torch.save(state, p))
        return str(self.path)

    def one_step(self) -> bool:
        """Train one step at the current batch; True when the job is asked to stop (SIGTERM, a newer attempt)."""
        args, timer, m = self.args, self.timer, self.m
        t0 = time.perf_counter()
        x, y = batch(args.model, args.seed, self.step, m, self.rank, self.world)
        if args.io_latency_ms:
            time.sleep(args.io_latency_ms / 1e3)
        t1 = time.perf_counter()
        half = len(y) // 2
        halves, loss_sum = [], 0.0
        for part in (slice(0, half), slice(half, len(y))):
            self.opt.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model(x[part]), y[part])
            loss.backward()
            loss_sum += loss.item() * (part.stop - part.start)
            halves.append(torch.cat([p.grad.flatten() for p in self.params]))
        t2 = time.perf_counter()
        flat, sqr, var = grad_stats(halves, len(y) / 2, float(m), self.world, self.total)
        torch.nn.utils.vector_to_parameters(flat, [p.grad for p in self.params])
        flags = self.total(torch.tensor([loss_sum / len(y), float(self.stop.requested or superseded(self.ckpt_dir))]),
                           "flags")
        t3 = time.perf_counter()
        self.sqr_avg, self.var_avg = EMA * self.sqr_avg + (1 - EMA) * sqr, EMA * self.var_avg + (1 - EMA) * var
        for group in self.opt.param_groups:
            group["lr"] = args.lr * lr_factor(self.rule, m, self.m0, self.sqr_avg, self.var_avg)
        self.opt.step()
        self.step += 1
        self.samples += m
        step_loss = float(flags[0]) / self.world
        self.first_loss = step_loss if self.first_loss is None else self.first_loss
        self.window_loss, self.window_n = self.window_loss + step_loss, self.window_n + 1
        self.window_sqr, self.window_var = self.window_sqr + sqr, self.window_var + var
        timer.data += t1 - t0
        timer.compute += t2 - t1 + time.perf_counter() - t3
        timer.comm += t3 - t2
        timer.steps += 1
        timer.samples += m
        # Under elastic horovodrun a SIGTERM to some ranks only is their host going away: the scheduler takes it out
        # of the host list and Horovod removes those ranks while the rest train on (workloads/horovod_train.py).
        stopping = bool(flags[1] >= self.world) if self.elastic else bool(flags[1] > 0)
        ckpt = self.save() if (self.step % args.checkpoint_every == 0 or self.step == self.steps or stopping) else ""
        if self.step % args.report_every == 0 or ckpt or self.step == self.steps or self.report_now:
            self.last_loss = self.window_loss / self.window_n
            self.rep.report(self.step, loss=self.last_loss, checkpoint=ckpt, done=self.step == self.steps,
                            batch_size=m, grad_sqr=self.window_sqr / self.window_n,
                            grad_var=self.window_var / self.window_n, pid=os.getpid(), **self.report_now,
                            **timer.summary())
            self.report_now = {}
            timer.reset()
            self.window_loss, self.window_n, self.window_sqr, self.window_var = 0.0, 0, 0.0, 0.0
        return stopping

    def finish(self) -> None:
        if self.rank == 0 and self.step == self.steps:
            write_result(self.ckpt_dir, {"steps": self.step, "first_loss": self.first_loss,
                                         "final_loss": self.last_loss, "samples": self.samples,
                                         "world_size": self.world, "history": self.history,
                                         "grad_sqr": self.sqr_avg, "grad_var": self.var_avg})


def run_fixed(tr: Trainer) -> None:
    tr.started(resumed_from=tr.resumed_from)
    tr.rep.report(tr.step, loss=0.0, samples_per_s=0.0, batch_size=tr.m, pid=os.getpid())
    while tr.step < tr.steps:
        if tr.one_step():
            break


def run_elastic(tr: Trainer, hvd: Any, commit_every: int) -> None:
    """Horovod's elastic loop. Commit and the host-change check go together (``state.commit()``), so a newcomer's
    sync never sends the ranks that stayed back to an older step; the counters, history and statistics are part
    of the synced state, and every (re-)formed world takes its batch and says it in the history."""
    keys = ("step", "first_loss", "history", "last_loss", "sqr_avg", "var_avg", "samples", "formations")
    state = hvd.elastic.TorchState(model=tr.model, optimizer=tr.opt, **{k: getattr(tr, k) for k in keys})
    state.register_reset_callbacks([lambda: tr.regroup(hvd)])

    @hvd.elastic.run
    def train(state: Any) -> None:
        for k in keys:
            setattr(tr, k, getattr(state, k))
        tr.rank, tr.world = hvd.rank(), hvd.size()
        tr.rep.rank, tr.rep.world = tr.rank, tr.world
        tr.take_batch(hvd)
        if tr.formations == 0:  # synced from rank 0: a newcomer to a re-formed world sees the count it has
            tr.started(resumed_from=tr.resumed_from)
            tr.rep.report(tr.step, loss=0.0, samples_per_s=0.0, batch_size=tr.m, pid=os.getpid())
        else:
            tr.started(in_place_at=tr.step, **{k: v for k, v in tr.report_now.items() if k == "batch_told"})
        tr.formations += 1
        while tr.step < tr.steps:
            if tr.one_step():
                break
            if tr.step % commit_every == 0 and tr.step < tr.steps:
                for k in keys:
                    setattr(state, k, getattr(tr, k))
                state.commit()  # may raise HostsUpdatedInterrupt: hvd.elastic.run re-forms the world

    train(state)


def main() -> int:
    ap = training_args(__doc__, batch=64, checkpoint_dir="checkpoints/adaptive")
    ap.add_argument("--model", choices=("cnn", "transformer"), default="cnn")
    ap.add_argument("--lr-scaling", choices=RULES, default=None, help="default $HPCSCHED_LR_SCALING, else sqrt")
    ap.add_argument("--commit-every", type=int, default=5,
                    help="elastic Horovod: steps between in-memory commits (and host-change checks)")
    args = ap.parse_args()
    m = int(os.environ.get("HPCSCHED_BATCH_SIZE") or args.batch)
    m0 = int(os.environ.get("HPCSCHED_BASE_BATCH") or args.batch)
    rule = args.lr_scaling or os.environ.get("HPCSCHED_LR_SCALING") or "sqrt"
    if rule not in RULES:
        print(f"adaptive_train: unknown lr scaling rule {rule!r} (one of {', '.join(RULES)})", file=sys.stderr)
        return 2
    hvd: Any = None
    if os.environ.get("HOROVOD_CONTROLLER"):  # every rank horovodrun starts has it
        import horovod.torch as hvd

        hvd.init()
        rank, world = hvd.rank(), hvd.size()
        total: Sum = lambda t, name: hvd.allreduce(t, op=hvd.Sum, name=name)  # noqa: E731
    else:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        total = no_sum
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group("gloo")
            total = torch_sum
    if m < 2 * world:
        print(f"adaptive_train: batch {m} is under 2 samples per rank at {world} ranks", file=sys.stderr)
        return 2
    elastic = hvd is not None and os.environ.get("HOROVOD_ELASTIC") == "1"
    tr = Trainer(args, args.steps or total_steps(200), m, m0, rule, rank, world, total, elastic)
    if elastic:
        run_elastic(tr, hvd, max(1, args.commit_every))
    else:
        if hvd is not None:
            hvd.broadcast_parameters(tr.model.state_dict(), root_rank=0)
        run_fixed(tr)
    tr.finish()
    if hvd is not None:
        hvd.shutdown()
    elif dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_now(main())
