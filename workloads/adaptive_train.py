"""Data-parallel training whose global batch size follows what the scheduler tells it (Pollux-style adaptive batch).

The runtime gives each attempt its global batch size, the job's base batch size and the learning-rate scaling
rule in the environment (HPCSCHED_BATCH_SIZE, HPCSCHED_BASE_BATCH, HPCSCHED_LR_SCALING, from the job file's
``batch:`` key); a resize relaunches it with a new batch size, and it resumes from its checkpoint at that size.
The learning rate is scaled from ``--lr`` (tuned at the base batch): ``linear`` by M/M0, ``sqrt`` by sqrt(M/M0),
``adascale`` by AdaScale's gain, measured from the gradient statistics below.

Every step it measures the gradient noise as adaptdl does: each rank computes the gradients of the two halves of
its shard, so there are 2 x world small-batch gradients besides their mean (the big-batch gradient). Their squared
norms give unbiased estimates of the true gradient's squared norm |G|^2 (``grad_sqr``) and of the per-sample
gradient variance tr(Sigma) (``grad_var``), whose ratio is the gradient noise scale the scheduler's statistical
efficiency uses. Both are averaged over each report window and reported with the progress, beside
``batch_size``; they travel in the checkpoint as running averages, so ``adascale`` continues across resizes.

    torchrun --nproc-per-node 2 workloads/adaptive_train.py --steps 200   # batch from the env, else --batch
"""

from __future__ import annotations

import math
import os
import sys
import time

import torch
import torch.distributed as dist
from _common import (
    Reporter,
    StageTimer,
    StopFlag,
    atomic_write,
    checkpoint_dir,
    superseded,
    total_steps,
    training_args,
    write_result,
)
from models import batch, build

RULES = ("linear", "sqrt", "adascale", "none")
EMA = 0.9  # weight of the past in the running gradient statistics (adascale's gain reads them)


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
               distributed: bool) -> tuple[torch.Tensor, float, float]:
    """(mean gradient, |G|^2 estimate, tr(Sigma) estimate) from this rank's two half-shard gradients.

    With k small gradients of ``small`` samples each and their mean over ``big`` samples:
    E|g_small|^2 = |G|^2 + tr(S)/small and E|g_big|^2 = |G|^2 + tr(S)/big, solved for the two unknowns."""
    mean_local = (halves[0] + halves[1]) / 2
    sq = torch.stack([(h * h).sum() for h in halves]).sum().reshape(1)
    if distributed:
        dist.all_reduce(mean_local)
        mean_local /= world
        dist.all_reduce(sq)
    small_sq = float(sq) / (2 * world)
    big_sq = float((mean_local * mean_local).sum())
    if big <= small:  # one small gradient per sample: no second scale to solve with
        return mean_local, big_sq, 0.0
    var = (small_sq - big_sq) / (1 / small - 1 / big)
    return mean_local, big_sq - var / big, var


def main() -> int:
    ap = training_args(__doc__, batch=64, checkpoint_dir="checkpoints/adaptive")
    ap.add_argument("--model", choices=("cnn", "transformer"), default="cnn")
    ap.add_argument("--lr-scaling", choices=RULES, default=None, help="default $HPCSCHED_LR_SCALING, else sqrt")
    args = ap.parse_args()
    steps = args.steps or total_steps(200)
    m = int(os.environ.get("HPCSCHED_BATCH_SIZE") or args.batch)
    m0 = int(os.environ.get("HPCSCHED_BASE_BATCH") or args.batch)
    rule = args.lr_scaling or os.environ.get("HPCSCHED_LR_SCALING") or "sqrt"
    if rule not in RULES:
        print(f"adaptive_train: unknown lr scaling rule {rule!r} (one of {', '.join(RULES)})", file=sys.stderr)
        return 2

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if m < 2 * world:
        print(f"adaptive_train: batch {m} is under 2 samples per rank at {world} ranks", file=sys.stderr)
        return 2
    distributed = "MASTER_ADDR" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    stop = StopFlag()
    torch.manual_seed(args.seed)
    model = build(args.model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    ckpt_dir = checkpoint_dir(args.checkpoint_dir)
    path = ckpt_dir / "ckpt.pt"
    step, first_loss, history, sqr_avg, var_avg, samples = 0, None, [], 0.0, 0.0, 0
    state: dict = {}
    if path.exists():
        state = torch.load(path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        step, first_loss, history = state["step"], state["first_loss"], state["history"]
        sqr_avg, var_avg, samples = state["sqr_avg"], state["var_avg"], state["samples"]
    last_loss = state.get("last_loss", float("nan"))
    resumed_from = step if state else -1
    history = [*history, {"generation": os.environ.get("HPCSCHED_GENERATION"), "resumed_from": resumed_from,
                          "world_size": world, "batch_size": m, "lr_scaling": rule}]
    rep = Reporter(rank, world, resumed_from)
    timer = StageTimer()
    loss_fn = torch.nn.CrossEntropyLoss()
    params = [p for p in model.parameters()]
    window_loss, window_n, window_sqr, window_var = 0.0, 0, 0.0, 0.0

    def save() -> str:
        if rank != 0 or superseded(ckpt_dir):
            return ""
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step, "first_loss": first_loss,
                 "history": history, "last_loss": window_loss / window_n if window_n else last_loss,
                 "sqr_avg": sqr_avg, "var_avg": var_avg, "samples": samples}
        atomic_write(path, lambda p: torch.save(state, p))
        return str(path)

    rep.report(step, loss=0.0, samples_per_s=0.0, batch_size=m)
    while step < steps:
        t0 = time.perf_counter()
        x, y = batch(args.model, args.seed, step, m, rank, world)
        if args.io_latency_ms:
            time.sleep(args.io_latency_ms / 1e3)
        t1 = time.perf_counter()
        half = len(y) // 2
        halves, loss_sum = [], 0.0
        for part in (slice(0, half), slice(half, len(y))):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[part]), y[part])
            loss.backward()
            loss_sum += loss.item() * (part.stop - part.start)
            halves.append(torch.cat([p.grad.flatten() for p in params]))
        t2 = time.perf_counter()
        flat, sqr, var = grad_stats(halves, len(y) / 2, float(m), world, distributed)
        torch.nn.utils.vector_to_parameters(flat, [p.grad for p in params])
        flags = torch.tensor([loss_sum / len(y), float(stop.requested or superseded(ckpt_dir))])
        if distributed:
            dist.all_reduce(flags)
            flags[0] /= world
        t3 = time.perf_counter()
        sqr_avg, var_avg = EMA * sqr_avg + (1 - EMA) * sqr, EMA * var_avg + (1 - EMA) * var
        for group in opt.param_groups:
            group["lr"] = args.lr * lr_factor(rule, m, m0, sqr_avg, var_avg)
        opt.step()
        step += 1
        samples += m
        if first_loss is None:
            first_loss = float(flags[0])
        window_loss, window_n = window_loss + float(flags[0]), window_n + 1
        window_sqr, window_var = window_sqr + sqr, window_var + var
        timer.data += t1 - t0
        timer.compute += t2 - t1 + time.perf_counter() - t3
        timer.comm += t3 - t2
        timer.steps += 1
        timer.samples += m
        stopping = flags[1] > 0
        ckpt = save() if (step % args.checkpoint_every == 0 or step == steps or stopping) else ""
        if step % args.report_every == 0 or ckpt or step == steps:
            last_loss = window_loss / window_n
            rep.report(step, loss=last_loss, checkpoint=ckpt, done=step == steps, batch_size=m,
                       grad_sqr=window_sqr / window_n, grad_var=window_var / window_n, **timer.summary())
            timer.reset()
            window_loss, window_n, window_sqr, window_var = 0.0, 0, 0.0, 0.0
        if stopping:
            break
    if rank == 0 and step == steps:
        write_result(ckpt_dir, {"steps": step, "first_loss": first_loss, "final_loss": last_loss, "samples": samples,
                                "world_size": world, "history": history, "grad_sqr": sqr_avg, "grad_var": var_avg})
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Everything durable is written and closed by now; skip the interpreter's slow teardown of torch (ddp_train).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
