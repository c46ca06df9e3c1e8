"""A log that names its nodes is replayed on them: a node the log says is busy is never in the idle pool then.

Real logs with node names (the cedar sacct excerpt, Casper PBS records, an LSF lsb.acct and a Grid Engine
accounting file from trace-data/) and a faithful synthetic sacct log of a shared machine
(``bench/bench_nodelist.py``: small jobs spread over nodes with room, as a scheduler places them) are checked
against the busy set computed here straight from the rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcsched.harvest.pool import PoolTimeline, timeline_from_log
from hpcsched.traces import open_trace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
DATA = ROOT / "trace-data"
JOBS10 = (DATA / "bftrainer/hps-shufflenet-Jbnd-10J.csv", DATA / "bftrainer/hps-shufflenet-JNPs-10J.csv")


def _idle_at(tl: PoolTimeline) -> list[tuple[float, set[str]]]:
    """The idle set from the replay start and after each event."""
    idle = set(tl.initial)
    out = [(tl.start, set(idle))]
    for e in tl.events:
        idle = (idle | set(e.joined)) - set(e.left)
        out.append((e.time, set(idle)))
    return out


def _busy(jobs: list[tuple[float, float, int, tuple[str, ...]]], t: float) -> set[str]:
    """Nodes named by a job running over [t, t + dt): start <= t < end."""
    return {n for s, e, _, names in jobs if s <= t < e for n in names}


def test_synthetic_shared_machine_idle_nodes_are_exactly_those_no_job_names(tmp_path: Path) -> None:
    """Every node not named by a running job is idle and every named one busy, at every change; the pool's
    names are the log's; partial-node jobs make a node partly used, not idle; and first fit (asked for) gives
    another busy set on the same log, which is what placing by name fixes."""
    from bench_nodelist import write_shared_sacct

    log = tmp_path / "shared.sacct"
    jobs = write_shared_sacct(log, jobs=300, nodes=16, seed=3)
    tl = timeline_from_log(log)
    names = {f"c{k:03d}" for k in range(1, 17)}
    assert set(tl.nodes) == names and tl.notes["machine_nodes"] == 16 and tl.notes["cores_per_node"] == 32
    placed = tl.notes["log_placement"]
    assert (placed["by_name"], placed["first_fit"], placed["over_capacity"]) == (300, 0, 0)  # type: ignore[index]
    assert tl.notes["skipped_no_room"] == 0
    states = _idle_at(tl)
    assert len(states) > 100
    for t, idle in states:
        busy = _busy(jobs, t)
        assert idle == names - busy, t
    # partly used: some node with a job of fewer than 32 cores and nothing else, at some time
    assert tl.notes["partly_used_nodes"]["peak_nodes"] > 0  # type: ignore[index]
    ff = timeline_from_log(log, options={"placement": "first-fit"})
    assert ff.notes["log_placement"]["by_name"] == 0  # type: ignore[index]
    assert "placement=first-fit" in ff.notes["log_placement"]["note"]  # type: ignore[index]
    # first fit packs small jobs onto the lowest nodes: more nodes wholly idle than the log's spread-out placement
    area = [sum(len(a[1]) * (b[0] - a[0]) for a, b in zip(s, s[1:], strict=False)) for s in (states, _idle_at(ff))]
    assert area[1] > area[0] * 1.2


def test_rows_without_names_go_first_fit_and_are_counted(tmp_path: Path) -> None:
    """Every 10th row's NodeList blanked: those 30 rows are placed first fit on what the named ones leave; a named
    node is still never idle while its job runs."""
    from bench_nodelist import write_shared_sacct

    log = tmp_path / "mixed.sacct"
    jobs = write_shared_sacct(log, jobs=300, nodes=16, seed=3, unnamed_every=10)
    tl = timeline_from_log(log)
    placed = tl.notes["log_placement"]
    assert placed["by_name"] == 270  # type: ignore[index]
    assert placed["first_fit"] + tl.notes["skipped_no_room"] == 30  # type: ignore[index,operator]
    assert "270 placed by name" in placed["note"]  # type: ignore[index]
    for t, idle in _idle_at(tl):
        assert not idle & _busy(jobs, t), t


def test_nodes_option_larger_adds_idle_nodes_smaller_falls_back_to_first_fit_and_says_so(tmp_path: Path) -> None:
    from bench_nodelist import write_shared_sacct

    log = tmp_path / "shared.sacct"
    jobs = write_shared_sacct(log, jobs=120, nodes=8, seed=5)
    big = timeline_from_log(log, 10)
    assert len(big.nodes) == 10 and big.notes["machine_nodes_source"] == "--nodes"
    extra = set(big.nodes) - {f"c{k:03d}" for k in range(1, 9)}
    assert len(extra) == 2
    for t, idle in _idle_at(big):
        assert extra <= idle and not idle & _busy(jobs, t)
    small = timeline_from_log(log, 6)
    assert small.notes["log_placement"]["by_name"] == 0  # type: ignore[index]
    assert "--nodes 6 is fewer than the 8 nodes" in small.notes["log_placement"]["note"]  # type: ignore[index]


@pytest.mark.parametrize("path, named, nodes", [
    ("slurm/sacct-allcols-cedar-2019.tsv", 1, 1),
    ("pbs/casper-pbs-records.log", 4, 5),
    ("lsf/apel-lsb.acct", 3, 4),
    ("sge/apel-accounting", 4, 3),
])
def test_real_logs_busy_nodes_are_the_named_ones(path: str, named: int, nodes: int) -> None:
    """The bundled real logs that name hosts: each job's named hosts are busy from its start to its end and
    idle otherwise (these jobs never overlap on a host), the machine is the hosts they name."""
    log = DATA / path
    rows = [(j.start, j.end, 1, tuple(j.extra.get("nodelist") or ())) for j in open_trace(log)
            if j.start is not None and j.end is not None and j.end > j.start]
    tl = timeline_from_log(log)
    assert tl.notes["log_placement"]["by_name"] == named  # type: ignore[index]
    assert len(tl.nodes) == nodes == len({n for r in rows for n in r[3]})
    every = set(tl.nodes)
    for t, idle in _idle_at(tl):
        assert idle == every - _busy([r for r in rows if r[3]], t), (path, t)


def test_replay_json_and_meta_say_the_placement(tmp_path: Path) -> None:
    """`replay --log --json` has `log_placement` (a new key), meta.json too, a note says it, and the idle
    node-hours the harvester was offered are those of the named-idle nodes (the log's busy set, from the rows)."""
    from bench_nodelist import write_shared_sacct

    log = tmp_path / "shared.sacct"
    jobs = write_shared_sacct(log, jobs=200, nodes=12, seed=11)
    out = tmp_path / "r"
    p = subprocess.run([sys.executable, "-m", "hpcsched.cli", "replay", "--log", str(log), "--jobs", str(JOBS10[0]),
                        "--curves", str(JOBS10[1]), "--out", str(out), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    said = json.loads(p.stdout)
    assert said["nodes"] == 12
    assert said["log_placement"]["by_name"] == 200 and said["log_placement"]["first_fit"] == 0
    assert any("placed by name" in n for n in said["notes"])
    meta = json.loads((out / "meta.json").read_text())
    assert meta["log_placement"] == said["log_placement"]
    # the pool offered: idle node-seconds of the named-idle nodes from the replay's start to where it stopped
    names = {f"c{k:03d}" for k in range(1, 13)}
    start, stop = float(said["start"]), float(said["end"])
    assert stop > start
    cuts = sorted({start, stop, *(t for s, e, _, _ in jobs for t in (s, e) if start < t < stop)})
    area = sum(len(names - _busy(jobs, a)) * (b - a) for a, b in zip(cuts, cuts[1:], strict=False))
    assert said["idle_node_hours"] == pytest.approx(area / 3600, rel=1e-9)


# sacct's fixed-width table cuts a long NodeList at the column width ('+'): job 2's four nodes show as two and a
# half. Job 3 is written with -P but names fewer nodes (2) than its NNodes (3), as a hand-cut archive would.
_WIDTHS = (12, 19, 19, 19, 8, 10, 9)


def _table(rows: list[tuple[str, ...]]) -> str:
    """rows in sacct's fixed-width layout: JobID left-aligned, the rest right-aligned, a space after each."""
    def line(vals: tuple[str, ...]) -> str:
        return "".join((v.ljust(w) if k == 0 else v.rjust(w)) + " " for k, (v, w) in enumerate(zip(vals, _WIDTHS,
                                                                                                   strict=True)))
    head = ("JobID", "Submit", "Start", "End", "NNodes", "State", "NodeList")
    return "\n".join([line(head), " ".join("-" * w for w in _WIDTHS) + " ", *map(line, rows)]) + "\n"


T0, T1, T2 = "2021-01-01T00:00:00", "2021-01-01T01:00:00", "2021-01-01T02:00:00"
CUT_TABLE = _table([("1", T0, T0, T2, "1", "COMPLETED", "n007"), ("2", T0, T0, T1, "4", "COMPLETED", "n001,n00+")])
SHORT = """JobID|Submit|Start|End|NNodes|State|NodeList
1|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T02:00:00|1|COMPLETED|n7
2|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T01:00:00|2|COMPLETED|n[1-2]
3|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T01:00:00|3|COMPLETED|n[3-4]
"""


def test_a_cut_node_list_is_not_taken_for_the_jobs_nodes(tmp_path: Path) -> None:
    """A NodeList cut short ('+' in a table, or fewer names than NNodes) names some of the job's nodes or a node
    that does not exist: the row is placed first fit (counted), never on the part of a name it shows."""
    table = tmp_path / "cut.txt"
    table.write_text(CUT_TABLE)
    trace = open_trace(table)
    jobs = list(trace)
    assert "nodelist" not in jobs[1].extra and trace.report.anomalies["truncated_field"] == 1
    tl = timeline_from_log(table, 5)
    assert tl.notes["log_placement"]["by_name"] == 1 and tl.notes["log_placement"]["first_fit"] == 1  # type: ignore[index]
    assert "n001" not in tl.nodes and "n00" not in tl.nodes
    short = tmp_path / "short.sacct"
    short.write_text(SHORT)
    tl = timeline_from_log(short, 6)
    placed = tl.notes["log_placement"]
    assert (placed["by_name"], placed["first_fit"], placed["names_short"]) == (2, 1, 1)  # type: ignore[index]
    assert "1 rows named fewer nodes than they ran on" in placed["note"]  # type: ignore[index]
    assert set(tl.nodes) >= {"n1", "n2", "n7"} and "n3" not in tl.nodes


# A GPU partition: g3 once ran a 64-core job (so 64 cores a node) with 4 GPUs. Then job 2 holds 8 cores and all 4
# GPUs of g1, job 3 8 cores and 1 GPU of g2: g1 is full (no GPU left), g2 partly used, g3 idle.
GPU = """JobID|Submit|Start|End|NNodes|NCPUS|AllocTRES|State|NodeList
1|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T01:00:00|1|64|cpu=64,gres/gpu=4,node=1|COMPLETED|g3
2|2021-01-01T00:00:00|2021-01-01T01:00:00|2021-01-01T03:00:00|1|8|cpu=8,gres/gpu=4,node=1|COMPLETED|g1
3|2021-01-01T00:00:00|2021-01-01T01:00:00|2021-01-01T03:00:00|1|8|cpu=8,gres/gpu=1,node=1|COMPLETED|g2
"""


def test_a_node_whose_gpus_are_all_taken_is_full_not_partly_used(tmp_path: Path) -> None:
    log = tmp_path / "gpu.sacct"
    log.write_text(GPU)
    tl = timeline_from_log(log)
    assert tl.notes["cores_per_node"] == 64
    partly = tl.notes["partly_used_nodes"]
    assert partly["peak_nodes"] == 1 and partly["node_hours"] == pytest.approx(2.0)  # type: ignore[index]
    assert [(t - tl.start, sorted(i)) for t, i in _idle_at(tl)] == [(0.0, ["g1", "g2"]), (3600.0, ["g3"]),
                                                                   (10800.0, ["g1", "g2", "g3"])]


def test_rows_without_names_get_the_same_nodes_as_first_fit() -> None:
    """With no row naming a node, placement by name is first fit: the same seconds, runs and partly used counts
    as ``log_stream.place_stream`` (checked against the node-by-node reference elsewhere), on random logs with
    and without cores per node."""
    import numpy as np

    from hpcsched.harvest.log_stream import place_stream
    from hpcsched.harvest.named_nodes import NodeLists, place_by_name

    rng = np.random.default_rng(29)
    for cpn, machine in ((1, 12), (8, 6), (32, 9)):
        n = 400
        start = np.sort(rng.integers(0, 20_000, n)).astype(float)
        end = start + rng.integers(1, 3_000, n)
        size = rng.integers(1, cpn * 3 + 1, n)
        lists = NodeLists([], np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(n, np.int64))
        skip_a = {"no_room": 0}
        skip_b = {"no_room": 0}
        a = place_stream(start, end, size, machine, cpn, skip_a)
        b, counts = place_by_name(start, end, size, np.arange(n), lists, machine, cpn, skip_b)
        assert skip_a == skip_b and counts["first_fit"] == n - skip_a["no_room"] and counts["by_name"] == 0
        assert skip_a["no_room"] > 0  # the machine is small enough to refuse some jobs
        for field in ("t", "marked", "partly", "joff", "jlo", "jhi", "loff", "llo", "lhi"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), (cpn, field)


def test_a_node_named_beyond_its_cores_stays_busy_and_is_counted(tmp_path: Path) -> None:
    """Two 32-core jobs the log ran on c1 at once (an oversubscribed partition): both kept there, c1 busy until
    the later ends, counted as over_capacity and said."""
    log = tmp_path / "over.sacct"
    log.write_text("JobID|Submit|Start|End|NNodes|NCPUS|State|NodeList\n"
                   "1|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T01:00:00|1|32|COMPLETED|c1\n"
                   "2|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T02:00:00|1|32|COMPLETED|c1\n"
                   "3|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T00:30:00|1|32|COMPLETED|c2\n")
    tl = timeline_from_log(log)
    placed = tl.notes["log_placement"]
    assert (placed["by_name"], placed["over_capacity"]) == (3, 1)  # type: ignore[index]
    assert "1 rows found a named node already full" in placed["note"]  # type: ignore[index]
    assert [(t - tl.start, sorted(i)) for t, i in _idle_at(tl)] == [(0.0, []), (1800.0, ["c2"]),
                                                                   (7200.0, ["c1", "c2"])]


def test_a_row_without_names_keeps_off_a_node_the_log_fills_during_its_run(tmp_path: Path) -> None:
    """Job 2 (no NodeList) runs 00:00-03:00; the log puts job 1 on c1 at 01:00. Plain first fit would put job 2 on
    c1 too and c2 would look idle all along; it goes to c2, so at 01:00-02:00 both are busy, as on the machine."""
    log = tmp_path / "avoid.sacct"
    log.write_text("JobID|Submit|Start|End|NNodes|NCPUS|State|NodeList\n"
                   "1|2021-01-01T00:00:00|2021-01-01T01:00:00|2021-01-01T02:00:00|1|32|COMPLETED|c1\n"
                   "2|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T03:00:00|1|32|COMPLETED|\n"
                   "3|2021-01-01T00:00:00|2021-01-01T04:00:00|2021-01-01T05:00:00|1|32|COMPLETED|c2\n")
    tl = timeline_from_log(log)
    placed = tl.notes["log_placement"]
    assert (placed["by_name"], placed["first_fit"], placed["over_capacity"]) == (2, 1, 0)  # type: ignore[index]
    assert [(t - tl.start, sorted(i)) for t, i in _idle_at(tl)] == [
        (0.0, ["c1"]), (3600.0, []), (7200.0, ["c1"]), (10800.0, ["c1", "c2"]), (14400.0, ["c1"]),
        (18000.0, ["c1", "c2"])]
