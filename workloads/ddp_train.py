"""Data-parallel training with torch.distributed (gloo on CPU, NCCL on GPU), run under ``torchrun``.

Checkpoints every ``--checkpoint-every`` steps and when SIGTERM asks it to stop (the runtime's
preempt / resize), resumes from the latest checkpoint at any world size, and reports throughput and
per-stage times. ``--sync manual`` (default) all-reduces the gradients itself after backward so the
compute and communication stages are measured apart; ``--sync ddp`` uses DistributedDataParallel,
whose overlapped all-reduce is then counted in compute.

    torchrun --nproc-per-node 2 workloads/ddp_train.py --model cnn --steps 200
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from _common import (
    FastForward,
    Reporter,
    StageTimer,
    StageTurns,
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


def main() -> int:
    ap = training_args(__doc__, batch=32, checkpoint_dir="checkpoints/local")
    ap.add_argument("--model", choices=("cnn", "transformer"), default="cnn")
    ap.add_argument("--sync", choices=("manual", "ddp"), default="manual")
    args = ap.parse_args()
    steps = args.steps or total_steps(200)

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    distributed = "MASTER_ADDR" in os.environ
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
    stop = StopFlag()
    torch.manual_seed(args.seed)
    model = build(args.model).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    ckpt_dir = checkpoint_dir(args.checkpoint_dir)
    path = ckpt_dir / "ckpt.pt"
    step, first_loss, history = 0, None, []
    if path.exists():
        state = torch.load(path, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        step, first_loss, history = state["step"], state["first_loss"], state["history"]
    last_loss = state.get("last_loss", float("nan")) if path.exists() else float("nan")  # resumed at the end: no step
    resumed_from = step if path.exists() else -1
    ff = FastForward(ckpt_dir, state.get("ff_applied", 0) if path.exists() else 0)  # testbed fast-forward (issue 9)
    history = [*history, {"generation": os.environ.get("HPCSCHED_GENERATION"), "resumed_from": resumed_from,
                          "world_size": world}]
    net = torch.nn.parallel.DistributedDataParallel(model) if distributed and args.sync == "ddp" else model
    rep = Reporter(rank, world, resumed_from)
    timer = StageTimer()
    # Interleaved group members take turns per stage, except in stages that wait on other ranks: the all-reduce
    # of a multi-process job, and with DDP its backward too (it all-reduces inside).
    collective = () if not distributed or world == 1 else ("comm", "compute") if args.sync == "ddp" else ("comm",)
    turns = StageTurns(int(os.environ.get("LOCAL_RANK", 0)), collective,
                       (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None)
    loss_fn = torch.nn.CrossEntropyLoss()
    window_loss, window_n = 0.0, 0

    def save() -> str:
        if rank != 0 or superseded(ckpt_dir):
            return ""
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step, "first_loss": first_loss,
                 "history": history, "last_loss": window_loss / window_n if window_n else last_loss,
                 "ff_applied": ff.applied}
        atomic_write(path, lambda p: torch.save(state, p))
        return str(path)

    rep.report(step, loss=0.0, samples_per_s=0.0)
    while step < steps:
        t0 = time.perf_counter()
        with turns.turn("data"):
            x, y = batch(args.model, args.seed, step, args.batch, rank, world)
            x, y = x.to(device), y.to(device)
            if args.io_latency_ms:
                time.sleep(args.io_latency_ms / 1e3)
        t1 = time.perf_counter()
        with turns.turn("compute"):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(x), y)
            loss.backward()
        t2 = time.perf_counter()
        with turns.turn("comm"):
            # One small all-reduce carries the loss and the stop request, so every rank stops at the same step.
            # (the third carries rank 0's fast-forward credit to every rank: issue 9's testbed)
            flags = torch.tensor([loss.item(), float(stop.requested or superseded(ckpt_dir)),
                                  float(ff.take() if rank == 0 else 0)], device=device)
            if distributed:
                if args.sync == "manual":
                    grads = [p.grad for p in model.parameters() if p.grad is not None]
                    flat = torch.cat([g.flatten() for g in grads])
                    dist.all_reduce(flat)
                    flat /= world
                    torch.nn.utils.vector_to_parameters(flat, grads)  # copies the averaged values back
                dist.all_reduce(flags)
                flags[0] /= world
        t3 = time.perf_counter()
        opt.step()  # small next to the forward/backward: not worth a second compute turn
        step += 1
        if first_loss is None:
            first_loss = float(flags[0])
        window_loss, window_n = window_loss + float(flags[0]), window_n + 1
        waited = turns.take_waits()  # a stage's time is its own work, not its wait for a turn
        timer.data += t1 - t0 - waited["data"]
        timer.compute += t2 - t1 - waited["compute"] + time.perf_counter() - t3
        timer.comm += t3 - t2 - waited["comm"]
        timer.steps += 1
        timer.samples += args.batch
        step = FastForward.jump(int(flags[2]), step, steps, rep, timer, window_loss / window_n)  # testbed (issue 9)
        stopping = flags[1] > 0
        ckpt = save() if (step % args.checkpoint_every == 0 or step == steps or stopping) else ""
        if step % args.report_every == 0 or ckpt or step == steps:
            last_loss = window_loss / window_n
            rep.report(step, loss=last_loss, checkpoint=ckpt, done=step == steps, **timer.summary())
            timer.reset()
            window_loss, window_n = 0.0, 0
        if stopping:
            break
    turns.close()  # group mates stop waiting for this one
    if rank == 0 and step == steps:
        write_result(ckpt_dir, {"steps": step, "first_loss": first_loss, "final_loss": last_loss,
                                "world_size": world, "history": history, "device": str(device),
                                "backend": dist.get_backend() if distributed else "",
                                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_now(main())
