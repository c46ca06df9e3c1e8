"""A small, real data-parallel training program for elastic runs: numpy, checkpoint/resume, SIGTERM-safe.

Why it exists: the Slurm integration needs a training job that really computes, really loses work
when killed without warning, and really keeps it when given SIGTERM first; and whose final state
proves that resizing did not skip or repeat a step. Logistic regression on a seeded synthetic data
set does all of that in milliseconds per step and starts in half a second (torch takes ~5 s per rank
to import on a 2-core machine, which would dominate every resize).

Ranks come from the runtime (``RANK``/``WORLD_SIZE`` when its worker launched the process: ``HPCSCHED_JOB_ID``
is set; harvest mode controller), from Slurm (``SLURM_PROCID``/``SLURM_NTASKS``, one task per node under ``srun``)
or from ``HPCSCHED_RANK``/``HPCSCHED_WORLD`` when harvesting launches processes itself (mode (b)). The runtime's
variables win: a pilot's worker runs inside a Slurm job, so its tasks inherit that job's ``SLURM_*``.
Rank 0 listens on a free loopback port (``HPCSCHED_RDZV_HOST`` to change the address), or under the runtime at
``MASTER_ADDR:MASTER_PORT`` (the port node 0's worker reported free), and writes where and a one-time key to
``CKPT_DIR/rdzv.json`` for the others; gradients are summed at rank 0 in rank order and sent back.
``--ckpt-dir`` and ``--steps`` default to the runtime's ``HPCSCHED_CHECKPOINT_DIR`` / ``HPCSCHED_STEPS``.

Every step uses the same global batch (drawn from ``(seed, step)``) split across the ranks, and the
update divides by the global batch size, so the trajectory does not depend on how many ranks ran
which steps: a run resized any number of times ends with the same weights as one run on one rank
(to float rounding). SIGTERM on any rank makes all ranks stop at the same step boundary, rank 0
checkpoint there, and all exit 0; a checkpoint is also written every ``--ckpt-every`` steps, which
bounds what a SIGKILL loses. The files harvesting reads (its workload protocol):
``CKPT_DIR/progress.json`` ``{"step": last completed step}`` and ``CKPT_DIR/checkpoint.json``
``{"step": last checkpointed step}``; ``CKPT_DIR/log.jsonl`` has one line per start/stop/finish. Under the
runtime rank 0 also appends the runtime's progress lines to ``$HPCSCHED_PROGRESS_FILE`` (``step``, ``resumed_from``,
``checkpoint`` when one was written at that step, ``done`` at the end), which is how the controller counts steps.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Mapping
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path

import numpy as np

EXIT_PEER_LOST = 3
RDZV_TIMEOUT_S = 60


class _Interrupted(Exception):
    """SIGTERM or the rendezvous deadline arrived while the group was still forming."""


def _interrupt(signum: int, _frame: object) -> None:
    raise _Interrupted(signal.Signals(signum).name)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def dataset(seed: int, samples: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded, nearly separable binary classification set (the same on every rank)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features))
    w_true = rng.standard_normal(features)
    y = (x @ w_true + 0.5 * rng.standard_normal(samples) > 0).astype(np.float64)
    return x, y


def batch_indices(seed: int, step: int, samples: int, batch: int) -> np.ndarray:
    return np.random.default_rng([seed, step]).choice(samples, size=batch, replace=False)


def loss(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    z = x @ w
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def load_checkpoint(ckpt_dir: Path, features: int) -> tuple[int, np.ndarray]:
    f = ckpt_dir / "ckpt.npz"
    if not f.exists():
        return 0, np.zeros(features)
    with np.load(f) as z:
        return int(z["step"]), z["w"].copy()


def save_checkpoint(ckpt_dir: Path, step: int, w: np.ndarray) -> None:
    tmp = ckpt_dir / f".ckpt.{os.getpid()}.tmp.npz"
    np.savez(tmp, step=step, w=w)
    os.replace(tmp, ckpt_dir / "ckpt.npz")
    _atomic_write(ckpt_dir / "checkpoint.json", json.dumps({"step": step}).encode())


class AllReduceHub:
    """Rank 0 is the hub: it sums what the others send, in rank order, and sends the sum back."""

    def __init__(self, rank: int, world: int, ckpt_dir: Path, run_id: str, timeout: float = 60.0,
                 listen: tuple[str, int] | None = None) -> None:
        self.rank, self.world = rank, world
        self.peers: list[Connection] = []
        self.conn: Connection | None = None
        rdzv = ckpt_dir / "rdzv.json"
        if world == 1:
            return
        if rank == 0:
            key = secrets.token_bytes(16)
            listener = Listener(listen or (os.environ.get("HPCSCHED_RDZV_HOST", "127.0.0.1"), 0), authkey=key)
            host, port = listener.address
            _atomic_write(rdzv, json.dumps({"run": run_id, "host": host, "port": port, "key": key.hex()}).encode())
            by_rank: dict[int, Connection] = {}
            while len(by_rank) < world - 1:
                c = listener.accept()
                by_rank[c.recv()] = c
            self.peers = [by_rank[r] for r in range(1, world)]
            listener.close()
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                info = json.loads(rdzv.read_text())
                if info["run"] == run_id:
                    break
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank}: no rendezvous for run {run_id} in {rdzv}")
            time.sleep(0.05)
        self.conn = Client((info["host"], info["port"]), authkey=bytes.fromhex(info["key"]))
        self.conn.send(rank)

    def allreduce(self, vec: np.ndarray) -> np.ndarray:
        if self.world == 1:
            return vec
        if self.rank == 0:
            total = vec.copy()
            for c in self.peers:
                total += c.recv()
            for c in self.peers:
                c.send(total)
            return total
        assert self.conn is not None
        self.conn.send(vec)
        return self.conn.recv()

    def broadcast(self, obj: object) -> object:
        if self.world == 1:
            return obj
        if self.rank == 0:
            for c in self.peers:
                c.send(obj)
            return obj
        assert self.conn is not None
        return self.conn.recv()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    env_ckpt, env_steps = os.environ.get("HPCSCHED_CHECKPOINT_DIR"), os.environ.get("HPCSCHED_STEPS")
    ap.add_argument("--ckpt-dir", type=Path, required=env_ckpt is None, default=env_ckpt,
                    help="default: $HPCSCHED_CHECKPOINT_DIR (the runtime's)")
    ap.add_argument("--steps", type=int, required=env_steps is None, default=env_steps,
                    help="total steps of the whole run (all restarts); default: $HPCSCHED_STEPS (the runtime's)")
    ap.add_argument("--ckpt-every", type=int, default=20, help="periodic checkpoint interval in steps")
    ap.add_argument("--batch", type=int, default=256, help="global batch size (split across ranks)")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--step-time", type=float, default=0.0,
                    help="pace steps to at least this many seconds (stands in for a bigger model)")
    a = ap.parse_args(argv)
    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGALRM)
    try:
        return _train(a)
    finally:  # main() also runs in-process (tests): leave the caller's handlers as they were
        signal.signal(signal.SIGTERM, saved[0])
        signal.signal(signal.SIGALRM, saved[1])


def identity(env: Mapping[str, str]) -> tuple[int, int, str, tuple[str, int] | None]:
    """(rank, world size, run id, rank 0's listen address or None) from whoever launched this process: the
    runtime's worker (``HPCSCHED_JOB_ID`` set: torch.distributed's variables, one run per job attempt), the
    harvester's mode (b) (``HPCSCHED_RANK``), ``srun`` (``SLURM_PROCID``), or nobody (one process)."""
    if env.get("HPCSCHED_JOB_ID") and "RANK" in env:
        run = f"{env['HPCSCHED_JOB_ID']}.g{env.get('HPCSCHED_GENERATION', '0')}"
        listen = (env["MASTER_ADDR"], int(env["MASTER_PORT"])) if env.get("MASTER_ADDR") and env.get(
            "MASTER_PORT") else None
        return int(env["RANK"]), int(env.get("WORLD_SIZE", "1")), run, listen
    rank = int(env.get("HPCSCHED_RANK", env.get("SLURM_PROCID", "0")))
    world = int(env.get("HPCSCHED_WORLD", env.get("SLURM_NTASKS", "1")))
    return rank, world, env.get("HPCSCHED_RUN_ID") or env.get("SLURM_JOB_ID") or str(os.getppid()), None


class Progress:
    """The runtime's progress lines (rank 0, only when the runtime gave ``HPCSCHED_PROGRESS_FILE`` and launched
    this process): the harvester's own modes read ``progress.json`` / ``checkpoint.json`` instead."""

    def __init__(self, rank: int, world: int, resumed_from: int) -> None:
        runtime = os.environ.get("HPCSCHED_JOB_ID") and os.environ.get("HPCSCHED_PROGRESS_FILE")
        self.path = Path(os.environ["HPCSCHED_PROGRESS_FILE"]) if runtime and rank == 0 else None
        self.world, self.resumed_from, self.first = world, resumed_from, True

    def report(self, step: int, **fields: object) -> None:
        if self.path is None:
            return
        line = {"step": step, "world_size": self.world, "time": time.time(), "resumed_from": self.resumed_from,
                "first": self.first} | fields
        self.first = False
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")


def _train(a: argparse.Namespace) -> int:
    rank, world, run_id, listen = identity(os.environ)
    a.ckpt_dir.mkdir(parents=True, exist_ok=True)

    stop = {"flag": 0.0}
    # While the group forms nothing has been computed, so SIGTERM (or no peers after RDZV_TIMEOUT_S)
    # just ends the process; a rank blocked in accept() or recv() would otherwise wait forever for a
    # peer that died before it could connect.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGALRM, _interrupt)
    signal.alarm(RDZV_TIMEOUT_S)
    try:
        x, y = dataset(a.seed, a.samples, a.features)
        group = AllReduceHub(rank, world, a.ckpt_dir, run_id, timeout=RDZV_TIMEOUT_S, listen=listen)
        step, w = group.broadcast(load_checkpoint(a.ckpt_dir, a.features) if rank == 0 else None)  # type: ignore[misc]
        signal.alarm(0)
        signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("flag", 1.0))
    except _Interrupted as e:
        print(f"rank {rank}: {e} before the group formed; nothing to checkpoint", file=sys.stderr)
        return 0 if str(e) == "SIGTERM" else EXIT_PEER_LOST
    except (EOFError, ConnectionError, TimeoutError) as e:
        print(f"rank {rank}: rendezvous failed: {e}", file=sys.stderr)
        return EXIT_PEER_LOST
    finally:
        signal.alarm(0)
    log = a.ckpt_dir / "log.jsonl"

    def record(event: str, **kw: object) -> None:
        if rank == 0:
            with log.open("a") as f:
                f.write(json.dumps({"t": time.time(), "event": event, "step": step, "world": world,
                                    "run": run_id, **kw}) + "\n")

    record("start", node=os.environ.get("SLURMD_NODENAME", ""))
    progress = Progress(rank, world, step)
    progress.report(step)
    try:
        while step < a.steps:
            t0 = time.monotonic()
            idx = batch_indices(a.seed, step, a.samples, a.batch)[rank::world]
            xb, yb = x[idx], y[idx]
            grad = xb.T @ (1.0 / (1.0 + np.exp(-(xb @ w))) - yb)
            total = group.allreduce(np.append(grad, stop["flag"]))
            w = w - a.lr * total[:-1] / a.batch
            step += 1
            if rank == 0:
                _atomic_write(a.ckpt_dir / "progress.json", json.dumps({"step": step, "run": run_id}).encode())
                saved = step % a.ckpt_every == 0 or step == a.steps or total[-1] > 0
                if saved:
                    save_checkpoint(a.ckpt_dir, step, w)
                progress.report(step, **({"checkpoint": str(a.ckpt_dir / "ckpt.npz")} if saved else {}),
                                **({"done": True} if step == a.steps else {}))
            if total[-1] > 0 and step < a.steps:
                record("stop", reason="SIGTERM")
                return 0
            pause = a.step_time - (time.monotonic() - t0)
            if pause > 0 and rank == 0:
                time.sleep(pause)
    except (EOFError, ConnectionError) as e:
        print(f"rank {rank}: lost a peer at step {step}: {e}", file=sys.stderr)
        return EXIT_PEER_LOST
    record("finish", loss=loss(w, x, y))
    return 0


if __name__ == "__main__":
    sys.exit(main())
