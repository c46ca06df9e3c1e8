"""Data-parallel least squares with mpi4py: numpy gradients, summed across ranks with MPI Allreduce.

The same contract as the torch workloads (checkpoint, resume, stop on SIGTERM at a step boundary,
progress lines with data / compute / communication times), for clusters that run MPI programs.

    mpirun -np 2 python workloads/mpi_allreduce.py --steps 200
"""

from __future__ import annotations

import sys
import time

import numpy as np
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
from mpi4py import MPI

DIM = 64


def shard(seed: int, step: int, global_batch: int, rank: int, world: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's rows of the global batch of ``step``: y = X w* + noise, w* fixed by the seed."""
    w_true = np.random.default_rng(seed).normal(size=DIM)
    rng = np.random.default_rng([seed, step])
    x = rng.normal(size=(global_batch, DIM))
    y = x @ w_true + 0.1 * rng.normal(size=global_batch)
    lo, hi = rank * global_batch // world, (rank + 1) * global_batch // world
    return x[lo:hi], y[lo:hi]


def _save(path, **arrays: object) -> None:
    with open(path, "wb") as f:  # a file object: np.savez would append ".npz" to the temporary name
        np.savez(f, **arrays)


def main() -> int:
    args = training_args(__doc__, batch=256, checkpoint_dir="checkpoints/mpi").parse_args()
    steps = args.steps or total_steps(200)
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    stop = StopFlag()
    ckpt_dir = checkpoint_dir(args.checkpoint_dir)
    path = ckpt_dir / "ckpt.npz"
    w, step, first_loss = np.zeros(DIM), 0, None
    if path.exists():
        saved = np.load(path)
        w, step, first_loss = saved["w"], int(saved["step"]), float(saved["first_loss"])
    resumed_from = step if path.exists() else -1
    rep = Reporter(rank, world, resumed_from)
    timer = StageTimer()
    rep.report(step, loss=0.0, samples_per_s=0.0)
    last_loss = float("nan")
    while step < steps:
        t0 = time.perf_counter()
        x, y = shard(args.seed, step, args.batch, rank, world)
        if args.io_latency_ms:
            time.sleep(args.io_latency_ms / 1e3)
        t1 = time.perf_counter()
        err = x @ w - y
        local = np.concatenate([x.T @ err, [float(err @ err), float(stop.requested or superseded(ckpt_dir))]])
        t2 = time.perf_counter()
        total = np.empty_like(local)
        comm.Allreduce(local, total, op=MPI.SUM)  # gradient, squared error and stop request in one call
        t3 = time.perf_counter()
        w -= args.lr * total[:DIM] / args.batch
        step += 1
        last_loss = total[DIM] / args.batch
        first_loss = last_loss if first_loss is None else first_loss
        timer.data += t1 - t0
        timer.compute += t2 - t1
        timer.comm += t3 - t2
        timer.steps += 1
        timer.samples += args.batch
        stopping = total[DIM + 1] > 0
        ckpt = ""
        if rank == 0 and (step % args.checkpoint_every == 0 or step == steps or stopping) and not superseded(ckpt_dir):
            state = {"w": w.copy(), "step": step, "first_loss": first_loss}
            atomic_write(path, lambda p, state=state: _save(p, **state))
            ckpt = str(path)
        if step % args.report_every == 0 or ckpt or step == steps:
            rep.report(step, loss=last_loss, checkpoint=ckpt, done=step == steps, **timer.summary())
            timer.reset()
        if stopping:
            break
    if rank == 0 and step == steps:
        write_result(ckpt_dir, {"steps": step, "first_loss": first_loss, "final_loss": last_loss, "world_size": world})
    return 0


if __name__ == "__main__":
    sys.exit(main())
