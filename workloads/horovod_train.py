"""The CNN / transformer training of ``ddp_train.py`` in Horovod form (run under ``horovodrun``).

Same contract: checkpoint every N steps and on SIGTERM, resume at any world size, progress lines
with throughput and stage times. The communication stage is the wait for Horovod's gradient
all-reduce (``optimizer.synchronize()``), measured apart from forward/backward.

Under an elastic ``horovodrun`` (``--min-np/--max-np --host-discovery-script``, which sets
``HOROVOD_ELASTIC=1``) the loop runs inside ``hvd.elastic.run`` with a ``TorchState`` committed every
``--commit-every`` steps: when the discovery script's host list changes, the survivors keep their
process and their in-memory state, newcomers receive it by broadcast, and the step count goes on
without touching the disk checkpoint (which is still written, so a full stop and restart resumes too).

    horovodrun -np 2 -H localhost:2 --gloo python workloads/horovod_train.py --steps 100
    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script ./hosts.sh --gloo \\
        --network-interface lo python workloads/horovod_train.py --steps 100
"""

from __future__ import annotations

import os
import time

import horovod.torch as hvd
import torch
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


class Trainer:
    """One process's training: model, optimizer, counters, reports and checkpoints.

    The fixed-size and the elastic loops both drive it one step at a time; only the elastic one has to
    re-read the rank and world size, because Horovod may change them between two steps.
    """

    def __init__(self, args, steps: int) -> None:
        self.args, self.steps = args, steps
        torch.manual_seed(args.seed)
        self.stop = StopFlag()
        self.model = build(args.model)
        self.base = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        self.ckpt_dir = checkpoint_dir(args.checkpoint_dir)
        self.path = self.ckpt_dir / "ckpt.pt"
        self.step, self.first_loss, self.history, self.last_loss = 0, None, [], float("nan")
        self.resumed_from = -1
        if self.path.exists():
            state = torch.load(self.path, weights_only=False)
            self.model.load_state_dict(state["model"])
            self.base.load_state_dict(state["optim"])
            self.step, self.first_loss, self.history = state["step"], state["first_loss"], state["history"]
            self.last_loss = state.get("last_loss", float("nan"))  # resumed at the end: no step to average
            self.resumed_from = self.step
        self.rank, self.world = hvd.rank(), hvd.size()
        self.elastic = os.environ.get("HOROVOD_ELASTIC") == "1"
        self.history = [*self.history, {"generation": os.environ.get("HPCSCHED_GENERATION"),
                                        "resumed_from": self.resumed_from, "world_size": self.world}]
        self.opt = hvd.DistributedOptimizer(self.base, named_parameters=self.model.named_parameters())
        self.rep = Reporter(self.rank, self.world, self.resumed_from)
        self.timer = StageTimer()
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.window_loss, self.window_n = 0.0, 0
        self.report_now: dict[str, object] = {}  # extra fields of an out-of-turn report (after an in-place resize)
        # In-place resizes this process lived through. Kept apart from ``history``, which the elastic state
        # syncs from its last commit (before the resize), so an entry appended there would be lost.
        self.in_place: list[dict] = []

    def regroup(self) -> None:
        """After Horovod re-formed the world: take the new rank and size. The shard of every later batch
        follows from them (``models.batch``); the learning rate stays as it is because the global batch
        is fixed, so the averaged gradient is the same at any size (Horovod's ``lr * size`` rule is for a
        fixed per-rank batch, and would make a resized run diverge from an unresized one)."""
        old = self.world
        self.rank, self.world = hvd.rank(), hvd.size()
        self.rep.rank, self.rep.world = self.rank, self.world
        self.rep.first = False  # the same attempt goes on, whichever process now reports as rank 0
        self.in_place.append({"generation": os.environ.get("HPCSCHED_GENERATION"), "in_place_at": self.step,
                              "world_size": self.world, "pid": os.getpid()})
        self.report_now = {"resized_in_place": True, "from_world_size": old}
        self.timer.reset()
        self.window_loss, self.window_n = 0.0, 0

    def one_step(self) -> bool:
        """Train one step; True when every rank has been asked to stop (SIGTERM, or a newer attempt)."""
        args, timer = self.args, self.timer
        t0 = time.perf_counter()
        x, y = batch(args.model, args.seed, self.step, args.batch, self.rank, self.world)
        if args.io_latency_ms:
            time.sleep(args.io_latency_ms / 1e3)
        t1 = time.perf_counter()
        self.opt.zero_grad()
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        t2 = time.perf_counter()
        self.opt.synchronize()
        flags = hvd.allreduce(torch.tensor([loss.item(), float(self.stop.requested or superseded(self.ckpt_dir))]),
                              op=hvd.Sum, name="flags")
        t3 = time.perf_counter()
        with self.opt.skip_synchronize():
            self.opt.step()
        self.step += 1
        step_loss = float(flags[0]) / self.world
        self.first_loss = step_loss if self.first_loss is None else self.first_loss
        self.window_loss, self.window_n = self.window_loss + step_loss, self.window_n + 1
        timer.data += t1 - t0
        timer.compute += t2 - t1 + time.perf_counter() - t3
        timer.comm += t3 - t2
        timer.steps += 1
        timer.samples += args.batch
        # Under elastic horovodrun a SIGTERM to some ranks only is their host going away (a preempted pilot: Slurm
        # signals every process there): the scheduler takes that host out of the host list and Horovod removes those
        # ranks at the next commit, while the rest train on. Stopping the whole job for it (as a rigid job must)
        # ended an elastic job that was being shrunk in place. A stop of the job reaches every rank (horovodrun
        # passes the signal on), and then they agree to stop, checkpoint and exit.
        stopping = bool(flags[1] >= self.world) if self.elastic else bool(flags[1] > 0)
        self._checkpoint_and_report(stopping)
        return stopping

    def _checkpoint_and_report(self, stopping: bool) -> None:
        step, args = self.step, self.args
        ckpt = ""
        if self.rank == 0 and (step % args.checkpoint_every == 0 or step == self.steps or stopping) \
                and not superseded(self.ckpt_dir):
            state = {"model": self.model.state_dict(), "optim": self.base.state_dict(), "step": step,
                     "first_loss": self.first_loss, "history": self.history + self.in_place,
                     "last_loss": self.window_loss / self.window_n if self.window_n else self.last_loss}
            atomic_write(self.path, lambda p, state=state: torch.save(state, p))
            ckpt = str(self.path)
        if step % args.report_every == 0 or ckpt or step == self.steps or self.report_now:
            self.last_loss = self.window_loss / self.window_n
            self.rep.report(step, loss=self.last_loss, checkpoint=ckpt, done=step == self.steps, pid=os.getpid(),
                            **self.report_now, **self.timer.summary())
            self.report_now = {}
            self.timer.reset()
            self.window_loss, self.window_n = 0.0, 0

    def finish(self) -> None:
        if self.rank == 0 and self.step == self.steps:
            write_result(self.ckpt_dir, {"steps": self.step, "first_loss": self.first_loss,
                                         "final_loss": self.last_loss, "world_size": self.world,
                                         "history": self.history + self.in_place})


def run_fixed(tr: Trainer) -> None:
    hvd.broadcast_parameters(tr.model.state_dict(), root_rank=0)
    tr.rep.report(tr.step, loss=0.0, samples_per_s=0.0, pid=os.getpid())
    while tr.step < tr.steps:
        if tr.one_step():
            break


def run_elastic(tr: Trainer, commit_every: int) -> None:
    """Commit, then check for host changes, only together (``state.commit()``): an interrupt then always
    finds the committed state equal to the live one, so a newcomer's sync (which broadcasts the committed
    counters) never sends the survivors back to an older step."""
    state = hvd.elastic.TorchState(model=tr.model, optimizer=tr.opt, step=tr.step, first_loss=tr.first_loss,
                                   history=tr.history, last_loss=tr.last_loss)
    state.register_reset_callbacks([tr.regroup])
    reported = [False]

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        tr.step, tr.first_loss, tr.history, tr.last_loss = state.step, state.first_loss, state.history, state.last_loss
        if not reported[0]:
            tr.rep.report(tr.step, loss=0.0, samples_per_s=0.0, pid=os.getpid())
            reported[0] = True
        while tr.step < tr.steps:
            stopping = tr.one_step()
            if stopping:
                break
            if tr.step % commit_every == 0 and tr.step < tr.steps:
                state.step, state.first_loss, state.history, state.last_loss = \
                    tr.step, tr.first_loss, tr.history, tr.last_loss
                state.commit()  # may raise HostsUpdatedInterrupt: hvd.elastic.run re-forms the world

    train(state)


def main() -> int:
    ap = training_args(__doc__, batch=32, checkpoint_dir="checkpoints/horovod")
    ap.add_argument("--model", choices=("cnn", "transformer"), default="cnn")
    ap.add_argument("--commit-every", type=int, default=5,
                    help="elastic: steps between in-memory commits (and host-change checks)")
    args = ap.parse_args()
    hvd.init()
    tr = Trainer(args, args.steps or total_steps(200))
    if os.environ.get("HOROVOD_ELASTIC") == "1":
        run_elastic(tr, max(1, args.commit_every))
    else:
        run_fixed(tr)
    tr.finish()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    exit_now(main())
