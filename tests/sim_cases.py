"""Tiny hand-checkable traces for the simulator's tests: Muri's CSV written from a few rows, and a policy that
groups any two jobs."""

from __future__ import annotations

from pathlib import Path

from hpcsched.allocator import Group, Snapshot
from hpcsched.model import ClusterSpec

HEADER = ("job_id,num_gpu,submit_time,iterations,model_name,batch_size,duration,interval,iteration_time,"
          "resource_time_0,resource_time_1,resource_time_2,priority")
ONE_NODE = ClusterSpec(1, 1, 4, name="n1g4")
R = 10.0  # restart cost of a model the table does not know


def muri_csv(tmp_path: Path, rows: list[tuple[str, int, float, int, float]], name: str = "t.csv") -> Path:
    """Rows (id, gpus, submit s, iterations, iteration s) in Muri's millisecond CSV; model 'toy'."""
    lines = [HEADER]
    for jid, gpus, submit, iters, it in rows:
        ms = round(it * 1000)
        lines.append(f"{jid},{gpus},{round(submit * 1000)},{iters},toy,1,{iters * ms},0,{ms},{ms // 2},{ms // 2},0,0")
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def ends(result) -> dict[str, float]:
    return {r.job_id: r.end for r in result.results}


# -- hand-checked orderings -----------------------------------------------------------------------


def pair_policy(snapshot: Snapshot) -> list[Group]:
    ids = tuple(v.id for v in snapshot.jobs)
    return [Group(ids, period_s=1.0)] if len(ids) == 2 else [Group((i,)) for i in ids]
