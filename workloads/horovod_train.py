"""The CNN / transformer training of ``ddp_train.py`` in Horovod form (run under ``horovodrun``).

Same contract: checkpoint every N steps and on SIGTERM, resume at any world size, progress lines
with throughput and stage times. The communication stage is the wait for Horovod's gradient
all-reduce (``optimizer.synchronize()``), measured apart from forward/backward.

    horovodrun -np 2 -H localhost:2 --gloo python workloads/horovod_train.py --steps 100
"""

from __future__ import annotations

import os
import sys
import time

import horovod.torch as hvd
import torch
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


def main() -> int:
    ap = training_args(__doc__, batch=32, checkpoint_dir="checkpoints/horovod")
    ap.add_argument("--model", choices=("cnn", "transformer"), default="cnn")
    args = ap.parse_args()
    steps = args.steps or total_steps(200)
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed)
    stop = StopFlag()
    model = build(args.model)
    base = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    ckpt_dir = checkpoint_dir(args.checkpoint_dir)
    path = ckpt_dir / "ckpt.pt"
    step, first_loss, history = 0, None, []
    if path.exists():
        state = torch.load(path, weights_only=False)
        model.load_state_dict(state["model"])
        base.load_state_dict(state["optim"])
        step, first_loss, history = state["step"], state["first_loss"], state["history"]
    last_loss = state.get("last_loss", float("nan")) if path.exists() else float("nan")  # resumed at the end: no step
    resumed_from = step if path.exists() else -1
    history = [*history, {"generation": os.environ.get("HPCSCHED_GENERATION"), "resumed_from": resumed_from,
                          "world_size": world}]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    rep = Reporter(rank, world, resumed_from)
    timer = StageTimer()
    loss_fn = torch.nn.CrossEntropyLoss()
    window_loss, window_n = 0.0, 0
    rep.report(step, loss=0.0, samples_per_s=0.0)
    while step < steps:
        t0 = time.perf_counter()
        x, y = batch(args.model, args.seed, step, args.batch, rank, world)
        if args.io_latency_ms:
            time.sleep(args.io_latency_ms / 1e3)
        t1 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        t2 = time.perf_counter()
        opt.synchronize()
        flags = hvd.allreduce(torch.tensor([loss.item(), float(stop.requested or superseded(ckpt_dir))]),
                              op=hvd.Sum, name="flags")
        t3 = time.perf_counter()
        with opt.skip_synchronize():
            opt.step()
        step += 1
        step_loss = float(flags[0]) / world
        first_loss = step_loss if first_loss is None else first_loss
        window_loss, window_n = window_loss + step_loss, window_n + 1
        timer.data += t1 - t0
        timer.compute += t2 - t1 + time.perf_counter() - t3
        timer.comm += t3 - t2
        timer.steps += 1
        timer.samples += args.batch
        stopping = flags[1] > 0
        ckpt = ""
        if rank == 0 and (step % args.checkpoint_every == 0 or step == steps or stopping) and not superseded(ckpt_dir):
            state = {"model": model.state_dict(), "optim": base.state_dict(), "step": step, "first_loss": first_loss,
                     "history": history, "last_loss": window_loss / window_n if window_n else last_loss}
            atomic_write(path, lambda p, state=state: torch.save(state, p))
            ckpt = str(path)
        if step % args.report_every == 0 or ckpt or step == steps:
            last_loss = window_loss / window_n
            rep.report(step, loss=last_loss, checkpoint=ckpt, done=step == steps, **timer.summary())
            timer.reset()
            window_loss, window_n = 0.0, 0
        if stopping:
            break
    if rank == 0 and step == steps:
        write_result(ckpt_dir, {"steps": step, "first_loss": first_loss, "final_loss": last_loss,
                                "world_size": world, "history": history})
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    code = main()
    # Everything durable (checkpoint, result, progress) is written and closed by now. Leave without the
    # interpreter's teardown of torch and its communication threads: it took 6-9 s of a resize here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
