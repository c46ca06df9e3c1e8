"""A faithful synthetic sacct log of a machine whose small jobs share nodes, and a replay of it placed by name
against first fit.

No public sacct dump with NodeList and sharing ships with the project (the real cedar excerpt is one job), so
this writes one as Slurm would: `sacct -P --format JobID,JobIDRaw,Partition,Submit,Start,End,ElapsedRaw,NNodes,
NCPUS,State,NodeList`, with nodes `c[001-NNN]` of 32 cores, whole-node jobs of 1-4 nodes and 1-16-core jobs that
share a node, each started on nodes chosen at random among those with room (as a scheduler spreading load would,
not the lowest-numbered ones), and the NodeList written as a compressed hostlist. Seeded.

    python bench/bench_nodelist.py [--jobs N] [--nodes N] [--seed S] [--out DIR]

prints, placed by name and placed first fit (`placement=first-fit`): the idle node-hours of the pool over the
log's span, the time and peak memory of building it, and a BFTrainer replay of the 1,000 elastic jobs of
trace-data/bftrainer (hps-shufflenet) on it: idle node-hours offered up to its stop, node-hours harvested
(held by the elastic jobs), utilisation, preemptions and jobs done.
"""

from __future__ import annotations

import argparse
import datetime as dt
import heapq
import random
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcsched.traces.hostlist import compress_hostlist  # noqa: E402

HEADER = "JobID|JobIDRaw|Partition|Submit|Start|End|ElapsedRaw|NNodes|NCPUS|State|NodeList"
CORES = 32
T0 = dt.datetime(2021, 3, 1, tzinfo=dt.UTC)


def _stamp(t: float) -> str:
    return (T0 + dt.timedelta(seconds=t)).strftime("%Y-%m-%dT%H:%M:%S")


def write_shared_sacct(path: Path, jobs: int = 400, nodes: int = 24, seed: int = 7,
                       unnamed_every: int = 0) -> list[tuple[float, float, int, tuple[str, ...]]]:
    """Write the log; return each job's (start, end, cores a node, named nodes) as the scheduler placed it.

    ``unnamed_every`` > 0 blanks the NodeList of every such row (a field lost in an archive): those rows are
    returned with no names."""
    rng = random.Random(seed)
    names = [f"c{k:03d}" for k in range(1, nodes + 1)]
    free = dict.fromkeys(names, CORES)
    running: list[tuple[float, int, tuple[str, ...], int]] = []  # (end, id, nodes, cores a node)
    t = last_start = 0.0
    out: list[tuple[float, float, int, tuple[str, ...]]] = []
    lines = [HEADER]
    for jid in range(1, jobs + 1):
        t += float(int(rng.expovariate(1 / 300.0)))  # whole seconds, as sacct writes them
        small = rng.random() < 0.6
        want_nodes = 1 if small else rng.choice((1, 1, 2, 2, 3, 4))
        per = rng.randint(1, 16) if small else CORES
        start = max(t, last_start)  # FCFS: the machine's state below is at a time that only moves on
        while True:
            while running and running[0][0] <= start:
                _, _, held, c = heapq.heappop(running)
                for n in held:
                    free[n] += c
            room = [n for n in names if free[n] >= per]
            if len(room) >= want_nodes:
                break
            start = running[0][0]  # wait for the next end
        last_start = start
        chosen = tuple(sorted(rng.sample(room, want_nodes)))
        for n in chosen:
            free[n] -= per
        run = float(rng.randint(600, 4 * 3600))
        heapq.heappush(running, (start + run, jid, chosen, per))
        blank = unnamed_every > 0 and jid % unnamed_every == 0
        lines.append("|".join([str(jid), str(jid), "batch", _stamp(t), _stamp(start), _stamp(start + run),
                               str(int(run)), str(want_nodes), str(per * want_nodes), "COMPLETED",
                               "" if blank else compress_hostlist(chosen)]))
        out.append((T0.timestamp() + start, T0.timestamp() + start + run, per, () if blank else chosen))
    path.write_text("\n".join(lines) + "\n")
    return out


def _pool(log: Path, options: dict[str, object]) -> tuple[float, float, float, dict[str, object]]:
    """(idle node-hours over the log's span, seconds, peak MB, placement) of a pool built from the log."""
    from hpcsched.harvest.pool import timeline_from_log

    tracemalloc.start()
    t0 = time.perf_counter()
    tl = timeline_from_log(log, options=options)
    took = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    idle, now, area = len(tl.initial), tl.start, 0.0
    for e in tl.events:
        area += idle * (e.time - now)
        idle, now = idle + len(e.joined) - len(e.left), e.time
    area += idle * (tl.end - now)
    return area / 3600.0, took, peak, dict(tl.notes["log_placement"])  # type: ignore[call-overload]


def _replay(log: Path, options: dict[str, object], out: Path, jobs: str) -> dict[str, object]:
    """The summary of a BFTrainer replay of the elastic jobs on the log's idle nodes."""
    from hpcsched.harvest.run import ReplayRequest, run_replay

    data = ROOT / "trace-data/bftrainer"
    req = ReplayRequest(data / f"hps-shufflenet-Jbnd-{jobs}.csv", data / f"hps-shufflenet-JNPs-{jobs}.csv", log=log,
                        log_options=dict(options))
    out.mkdir(parents=True, exist_ok=True)
    return dict(run_replay(req, out).summary)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_nodelist"))
    ap.add_argument("--elastic", default="1000J", help="which BFTrainer job set: 10J or 1000J")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / f"shared-{a.jobs}.sacct"
    write_shared_sacct(log, a.jobs, a.nodes, a.seed)
    for label, options in (("by name", {}), ("first fit", {"placement": "first-fit"})):
        hours, took, peak, placed = _pool(log, options)
        print(f"{label:9s}: idle {hours:,.1f} node-h over the log's span; pool built in {took:.2f} s, "
              f"peak {peak:.1f} MB (tracemalloc); placed by name {placed['by_name']:,}, "
              f"first fit {placed['first_fit']:,}")
        t0 = time.perf_counter()
        r = _replay(log, options, a.out / label.replace(" ", "-"), a.elastic)
        print(f"{'':9s}  replay ({time.perf_counter() - t0:.1f} s): idle offered {r['idle_node_hours']:,.1f} node-h, "
              f"harvested {r['used_node_hours']:,.1f} node-h (useful {r['useful_node_hours']:,.1f}), utilisation "
              f"{r['utilization']:.4f}, preemptions {r['preemptions']:,}, rescales {r['rescales']:,}, "
              f"jobs done {r['jobs_done']}/{r['jobs']}")


if __name__ == "__main__":
    main()
