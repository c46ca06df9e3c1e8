"""What every workload shares: progress reports, stop requests, atomic checkpoints, fencing.

Kept free of torch and MPI so each program imports only the framework it uses. The runtime passes
everything through the environment (HPCSCHED_PROGRESS_FILE, HPCSCHED_CHECKPOINT_DIR, HPCSCHED_STEPS,
HPCSCHED_GENERATION); run by hand without them, the programs still train and print their reports.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path


class StopFlag:
    """SIGTERM asks for a checkpoint and a clean exit at the next step boundary, never mid-step."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, *_: object) -> None:
        self.requested = True


class Reporter:
    """Appends one JSON line per report to $HPCSCHED_PROGRESS_FILE (rank 0 only); the worker forwards them."""

    def __init__(self, rank: int, world: int, resumed_from: int) -> None:
        self.rank, self.world, self.resumed_from = rank, world, resumed_from
        self.path = os.environ.get("HPCSCHED_PROGRESS_FILE")
        self.first = True

    def report(self, step: int, **fields: object) -> None:
        if self.rank != 0:
            return
        line = {"step": step, "world_size": self.world, "time": time.time(), "resumed_from": self.resumed_from,
                "first": self.first} | fields
        self.first = False
        text = json.dumps(line)
        if self.path:
            with open(self.path, "a") as f:
                f.write(text + "\n")
        else:
            print(text, file=sys.stderr, flush=True)


class StageTurns:
    """Interleaved jobs take turns per stage, as Muri's executor makes them: co-located members of a group
    (same slots) are each in a different stage at a time, so none of them waits on a resource another holds.

    The worker gives every task ``$HPCSCHED_INTERLEAVE_DIR`` (one directory per co-location group on that
    worker); a stage holds the exclusive file lock ``<stage>.<local rank>`` there while it runs. Only stages
    that do no collective work are locked: a rank must never hold a lock while it waits for another rank
    (two jobs spanning the same two slots would deadlock), so the caller names its ``collective`` stages (a
    multi-process job's all-reduce; with DistributedDataParallel also compute, whose backward all-reduces)
    and those run free. ``sync`` (``torch.cuda.synchronize`` on GPUs, where kernels run after the Python call
    returns) ends a turn only once its work is done. Without the variable (run by hand, or an old worker)
    every stage runs free. The seconds spent waiting for a turn are kept apart, so stage times stay the
    job's own.

    Members also keep in LOCK STEP, as in Muri (a group runs one iteration of every member per period): a
    member starts its next iteration (its data turn) only when no mate has started fewer iterations than it.
    Locks alone are work-conserving but not fair: a member with time outside its stages (checkpoints,
    reports) or a lucky wake-up ran up to 2x the iterations of its mates here. Each member writes how many
    iterations it has started, and how long its last one took, to ``turns.<local rank>.<pid>``; a mate
    whose file has not moved for ``STALE_S`` or three of its iterations, whichever is longer (it is
    checkpointing, stopping, or gone), is not waited for, and a member removes its file when it stops
    training (``close``). A new member starts level with the slowest mate.

    ``with_mate`` counts the iterations this member began with at least one such live mate (by the same rule,
    so a file left by a killed mate counts for ``STALE_S`` at most): the iterations it took in turn with a
    mate. Counting any other ``turns.*`` file in the directory, as the pair's program once did, counted a dead
    mate's file for ever, and a restarted process counted only its own attempt.
    """

    STALE_S = 2.0  # a mate that has not started an iteration for this long (or 3 of its iterations) is not waited for
    POLL_S = 0.001
    STAGES = ("data", "compute", "comm")

    def __init__(self, local_rank: int, collective: Collection[str] = (),
                 sync: Callable[[], object] | None = None) -> None:
        self.waited = dict.fromkeys(self.STAGES, 0.0)
        self._sync = sync
        self._fds: dict[str, int] = {}
        self._root: Path | None = None
        self._count: int | None = None  # iterations started, on the group's common count
        self._began: float | None = None  # when this member's last iteration began
        self.with_mate = 0  # iterations begun while a mate on this local rank was training (see the class doc)
        root = os.environ.get("HPCSCHED_INTERLEAVE_DIR")
        if not root:
            return
        self._root = Path(root)
        self._root.mkdir(parents=True, exist_ok=True)
        self._prefix = f"turns.{local_rank}."
        self._mine = self._root / f"{self._prefix}{os.getpid()}"
        for stage in self.STAGES:
            if stage not in collective:
                self._fds[stage] = os.open(self._root / f"{stage}.{local_rank}", os.O_RDWR | os.O_CREAT, 0o644)

    def _mates(self) -> list[int]:
        """Iterations started by the mates on this local rank that are still training."""
        out, now = [], time.time()
        for name in os.listdir(self._root):
            if not name.startswith(self._prefix) or name == self._mine.name or name.endswith(".tmp"):
                continue
            path = self._root / name
            try:
                count, last = path.read_text().split()
                if now - path.stat().st_mtime > max(self.STALE_S, 3 * float(last)):
                    continue
                out.append(int(count))
            except (OSError, ValueError):  # gone meanwhile, or caught mid-write
                continue
        return out

    def _lock_step(self) -> None:
        while True:
            mates = self._mates()
            if self._count is None:
                self._count = min(mates, default=0)
            if not mates or self._count <= min(mates):
                break
            time.sleep(self.POLL_S)
        self.with_mate += bool(mates)
        now = time.time()
        last = 0.0 if self._began is None else now - self._began
        self._count, self._began = self._count + 1, now
        tmp = self._mine.with_name(self._mine.name + ".tmp")
        tmp.write_text(f"{self._count} {last:.6f}")
        os.replace(tmp, self._mine)  # mates never read half a line

    def close(self) -> None:
        """Leave the group (the mates stop waiting for this member at once) and let go of the lock files."""
        if self._root is not None:
            with contextlib.suppress(OSError):
                self._mine.unlink()
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    @contextlib.contextmanager
    def turn(self, stage: str) -> Iterator[None]:
        fd = self._fds.get(stage)
        if fd is None:
            yield
            return
        t = time.perf_counter()
        if stage == "data":  # an iteration begins
            self._lock_step()
        fcntl.flock(fd, fcntl.LOCK_EX)
        self.waited[stage] += time.perf_counter() - t
        try:
            yield
            if self._sync is not None:
                self._sync()
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def take_waits(self) -> dict[str, float]:
        """Seconds waited per stage since the last call."""
        out, self.waited = self.waited, dict.fromkeys(self.waited, 0.0)
        return out


class StageTimer:
    """Seconds per iteration in data / compute / communication, averaged over one report window."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.data = self.compute = self.comm = 0.0
        self.steps = 0
        self.samples = 0
        self.started = time.perf_counter()

    def summary(self) -> dict[str, float]:
        n = max(1, self.steps)
        wall = max(1e-9, time.perf_counter() - self.started)
        return {"data_s": self.data / n, "compute_s": self.compute / n, "comm_s": self.comm / n,
                "samples_per_s": self.samples / wall}


def training_args(doc: str, batch: int, checkpoint_dir: str) -> argparse.ArgumentParser:
    """The options every workload shares; each adds its own (model, sync) to the parser it returns."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None, help="total steps (default $HPCSCHED_STEPS, else 200)")
    ap.add_argument("--batch", type=int, default=batch, help="global batch size")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-every", type=int, default=20)
    ap.add_argument("--report-every", type=int, default=5)
    ap.add_argument("--checkpoint-dir", default=checkpoint_dir)
    ap.add_argument("--io-latency-ms", type=float, default=0.0,
                    help="emulated storage latency per batch (counted in the data stage)")
    return ap


def checkpoint_dir(default: str) -> Path:
    d = Path(os.environ.get("HPCSCHED_CHECKPOINT_DIR") or default)
    d.mkdir(parents=True, exist_ok=True)
    return d


def total_steps(default: int) -> int:
    return int(os.environ.get("HPCSCHED_STEPS") or default)


def superseded(ckpt_dir: Path) -> bool:
    """True when a newer attempt of this job has started: this process must not write checkpoints."""
    mine = os.environ.get("HPCSCHED_GENERATION")
    try:
        current = (ckpt_dir / "generation").read_text().strip()
    except OSError:
        return False
    return mine is not None and current.isdigit() and int(current) > int(mine)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Write to a temporary name, then rename: a crash mid-write never leaves half a checkpoint."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def write_result(ckpt_dir: Path, result: dict) -> None:
    atomic_write(ckpt_dir / "result.json", lambda p: p.write_text(json.dumps(result, indent=1)))


# --- testbed fast-forward (issue 9, owned by hpcsched/testbed): begin ---
class FastForward:
    """Steps a testbed driver grants this job (``hpcsched testbed --fast-forward``), applied at a step boundary.

    The driver writes the job's cumulative credit (one integer) to ``fastforward`` in the checkpoint dir; rank 0
    adds what it has not applied yet to the step counter (the caller shares it with the other ranks). ``applied``
    travels in the checkpoint, so a restarted attempt applies exactly the credit its checkpoint has not seen.
    Around a jump the job reports twice: the real window so far, then the jump itself with no stage times and no
    samples, so whoever measures pace from reports can tell skipped steps from trained ones.
    """

    FILE = "fastforward"

    def __init__(self, ckpt_dir: Path, applied: int = 0) -> None:
        self.path, self.applied, self._seen = ckpt_dir / self.FILE, applied, None

    def take(self) -> int:
        """Credit not yet applied (0 when the file is absent or unchanged since the last look)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return 0
        if (st.st_ino, st.st_mtime_ns) == self._seen:
            return 0
        self._seen = (st.st_ino, st.st_mtime_ns)
        try:
            credit = int(self.path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0
        add = max(0, credit - self.applied)
        self.applied = max(self.applied, credit)
        return add

    @staticmethod
    def jump(skip: int, step: int, steps: int, rep: Reporter, timer: StageTimer, loss: float) -> int:
        """The step after skipping ``skip`` steps (never past ``steps``), reporting around the jump."""
        if skip <= 0 or step >= steps:
            return step
        rep.report(step, loss=loss, **timer.summary())
        timer.reset()
        new = min(steps, step + skip)
        rep.report(new, loss=loss, samples_per_s=0.0)
        return new
# --- testbed fast-forward: end ---


def exit_now(code: int) -> None:
    """End the program with ``code`` once its durable output (checkpoint, result, progress) is written and closed,
    without the interpreter's teardown of torch and its communication threads: that took 6-9 s of a resize here.
    Only the standard streams are flushed first; anything else still buffered is lost, so call it last."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
