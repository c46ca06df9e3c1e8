"""A torch-free multi-host job for the network-namespace tests: every step sums one number per rank across
all ranks (over TCP to MASTER_ADDR:MASTER_PORT with ``--comm tcp``, by MPI Allreduce with ``--comm mpi``, by
torch.distributed's Gloo all-reduce with ``--comm gloo``, for torchrun, whose agent holds MASTER_PORT),
and rank 0 records, in ``result.json``, the host name and address every rank ran at. So a test can check
that the ranks really ran on different hosts and talked over their namespace addresses.

The runtime's contract as the real workloads keep it: progress lines, a checkpoint every
``--checkpoint-every`` steps and on SIGTERM (agreed by all ranks in the same sum), resume from it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workloads"))
from _common import (  # noqa: E402
    Reporter,
    StageTurns,
    StopFlag,
    atomic_write,
    checkpoint_dir,
    superseded,
    total_steps,
    write_result,
)


class TcpSum:
    """A star all-reduce: rank 0 listens at MASTER_ADDR:MASTER_PORT, the others connect to it."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        self.peers: list[socket.socket] = []
        me = {"rank": rank, "hostname": socket.gethostname()}
        if rank == 0:
            srv = socket.create_server((addr, port))
            srv.settimeout(120)
            me["addr"] = addr
            self.hosts = [me]
            for _ in range(world - 1):
                conn, peer = srv.accept()
                hello = json.loads(self._recv_line(conn))
                self.hosts.append(hello | {"addr": peer[0]})
                self.peers.append(conn)
            srv.close()
            self.hosts.sort(key=lambda h: h["rank"])
        else:
            deadline = time.monotonic() + 120
            while True:
                try:
                    conn = socket.create_connection((addr, port), timeout=5)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            conn.sendall((json.dumps(me) + "\n").encode())
            self.peers = [conn]
            self.hosts = []

    @staticmethod
    def _recv_line(conn: socket.socket) -> str:
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = conn.recv(1)
            if not chunk:
                raise ConnectionError("peer closed during hello")
            buf += chunk
        return buf.decode()

    @staticmethod
    def _recv(conn: socket.socket, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = conn.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("peer closed")
            buf += chunk
        return buf

    def sum(self, values: tuple[float, float]) -> tuple[float, float]:
        if self.rank == 0:
            total = list(values)
            for c in self.peers:
                a, b = struct.unpack("!dd", self._recv(c, 16))
                total[0] += a
                total[1] += b
            for c in self.peers:
                c.sendall(struct.pack("!dd", *total))
            return total[0], total[1]
        self.peers[0].sendall(struct.pack("!dd", *values))
        a, b = struct.unpack("!dd", self._recv(self.peers[0], 16))
        return a, b


class MpiSum:
    def __init__(self) -> None:
        from mpi4py import MPI

        self.comm = MPI.COMM_WORLD
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # the address this rank reaches node 0 from
            s.connect((os.environ["MASTER_ADDR"], 9))
            addr = s.getsockname()[0]
        me = {"rank": self.rank, "hostname": socket.gethostname(), "addr": addr}
        self.hosts = self.comm.gather(me, root=0) or []

    def sum(self, values: tuple[float, float]) -> tuple[float, float]:
        a, b = self.comm.allreduce(values[0]), self.comm.allreduce(values[1])
        return a, b


class GlooSum:
    """torch.distributed over Gloo, as a torchrun job talks (torchrun's agent holds MASTER_PORT for its own store,
    so the TCP star cannot listen there)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        self.dist = dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((os.environ["MASTER_ADDR"], 9))
            addr = s.getsockname()[0]
        hosts: list = [None] * self.world
        dist.all_gather_object(hosts, {"rank": self.rank, "hostname": socket.gethostname(), "addr": addr})
        self.hosts = hosts if self.rank == 0 else []

    def close(self) -> None:
        """Leave the group before exiting: a Gloo group torn down at interpreter exit aborted a rank ("terminate
        called without an active exception") once its peer had gone."""
        self.dist.destroy_process_group()

    def sum(self, values: tuple[float, float]) -> tuple[float, float]:
        import torch

        t = torch.tensor(values, dtype=torch.float64)
        self.dist.all_reduce(t)
        return float(t[0]), float(t[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--comm", choices=("tcp", "mpi", "gloo"), default="tcp")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--work-ms", type=float, default=None,
                    help="strong scaling: a step takes WORK_MS / world size (instead of --step-ms at any size)")
    ap.add_argument("--stage-ms", default=None, metavar="DATA,COMPUTE",
                    help="a step is DATA ms of data loading then COMPUTE ms of compute, each holding its stage's turn "
                         "(workloads/_common.StageTurns: an interleaved group's members take turns); the seconds "
                         "waited for turns go in result.json")
    args = ap.parse_args()
    stages = [float(x) / 1e3 for x in args.stage_ms.split(",")] if args.stage_ms else None
    stop = StopFlag()
    comm = MpiSum() if args.comm == "mpi" else GlooSum() if args.comm == "gloo" else \
        TcpSum(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    rank, world = comm.rank, comm.world
    steps = args.steps or total_steps(100)
    ckpt_dir = checkpoint_dir("checkpoints/netns")
    ckpt = ckpt_dir / "ckpt.json"
    saved_state = json.loads(ckpt.read_text()) if ckpt.exists() else {}
    step = saved_state.get("step", 0)
    rep = Reporter(rank, world, step if ckpt.exists() else -1)
    rep.report(step, loss=0.0)
    step_s = (args.work_ms / world if args.work_ms is not None else args.step_ms) / 1e3
    turns = StageTurns(int(os.environ.get("LOCAL_RANK", 0))) if stages else None
    waited = {"data": 0.0, "compute": 0.0}
    # steps taken in turn with a live group mate on the same slot (StageTurns.with_mate), over the job's whole
    # run: what the checkpoint had counted up to its step, plus this attempt's
    mate_before = saved_state.get("steps_with_mate", 0)

    def with_mate() -> int:
        return mate_before + (turns.with_mate if turns is not None else 0)

    while step < steps:
        if turns is not None and stages is not None:
            for stage, seconds in zip(("data", "compute"), stages, strict=True):
                with turns.turn(stage):
                    time.sleep(seconds)
            for k, v in turns.take_waits().items():
                waited[k] = waited.get(k, 0.0) + v
        else:
            time.sleep(step_s)
        total, stopping = comm.sum((float(rank + 1), float(stop.requested or superseded(ckpt_dir))))
        assert total == world * (world + 1) / 2, (total, world)  # every rank took part
        step += 1
        saved = ""
        if rank == 0 and (step % args.checkpoint_every == 0 or step == steps or stopping) and not superseded(ckpt_dir):
            state = {"step": step, "steps_with_mate": with_mate()}
            atomic_write(ckpt, lambda p, s=state: p.write_text(json.dumps(s)))
            saved = str(ckpt)
        stage_s = dict(zip(("data_s", "compute_s", "comm_s"), [*stages, 0.0], strict=True)) if stages else {}
        rep.report(step, loss=1.0 / step, checkpoint=saved, done=step == steps, **stage_s)
        if stopping:
            if turns is not None:
                turns.close()
            getattr(comm, "close", lambda: None)()
            return 0
    if turns is not None:
        turns.close()
    getattr(comm, "close", lambda: None)()
    if rank == 0:
        where = os.environ.get("HPCSCHED_INTERLEAVE_DIR", "")
        extra = {"turn_wait_s": waited, "interleave_dir": where, "steps_with_mate": with_mate()} if stages else {}
        write_result(ckpt_dir, {"steps": step, "world_size": world, "hosts": comm.hosts} | extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
