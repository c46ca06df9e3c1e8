"""Logs as sites keep them: conversions that say what they lose, notes on truncated and sparse logs.

Real files first (KTH's PWA log, cut short as a download would be), then files written to the format's
documentation where no public log of that shape is bundled (a PWA log whose every wait is -1).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcsched.errors import InputError
from hpcsched.harvest.pool import timeline_from_log
from hpcsched.traces import open_trace, read_jobs
from hpcsched.traces.cli import inspect_trace
from hpcsched.traces.convert import convert_trace

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "trace-data"
KTH = DATA / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz"
JOBS10 = (DATA / "bftrainer" / "hps-shufflenet-Jbnd-10J.csv", DATA / "bftrainer" / "hps-shufflenet-JNPs-10J.csv")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcsched.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


def _no_wait_log(path: Path, n: int = 30) -> Path:
    """A PWA-style log that records no wait (every field 3 is -1), with executable (14) and partition (16)."""
    rows = "".join(f"{k} {k * 600} -1 {300 + k} 4 -1 -1 4 3600 -1 1 {k % 3 + 1} 1 {k % 5 + 1} 1 2 -1 -1\n"
                   for k in range(1, n + 1))
    path.write_text("; UnixStartTime: 1000000000\n; MaxNodes: 4\n; MaxProcs: 16\n" + rows)
    return path


# 3. conversions never silent


def test_unknown_waits_stay_unknown_through_swf(tmp_path: Path) -> None:
    src = _no_wait_log(tmp_path / "nowait.swf")
    trace = open_trace(src)
    jobs = list(trace)
    assert trace.report.anomalies["unknown_wait"] == 30
    out = tmp_path / "back.swf"
    res = convert_trace(src, "swf", out)
    rows = [r.split() for r in out.read_text().splitlines() if not r.startswith(";")]
    assert [r[2] for r in rows] == ["-1"] * 30  # before: written as 0, a known wait of nothing
    back = open_trace(out)
    again = list(back)
    assert back.report.anomalies["unknown_wait"] == 30
    assert [(j.submit, j.start, j.end) for j in again] == [(j.submit, j.start, j.end) for j in jobs]
    # the executable and partition the source filled are said to be lost, with the first line
    note = next(n for n in res.notes if n.startswith("not carried over"))
    assert "executable (field 14) (first at line 4)" in note and "partition (field 16) (first at line 4)" in note
    assert "group (field 13)" in note and "think time" not in note  # fields left -1 are not listed
    # a short file (3 rows) reads back as waits unknown too: the header says so
    short = _no_wait_log(tmp_path / "short.swf", 3)
    out3 = tmp_path / "short-back.swf"
    convert_trace(short, "swf", out3, options={"swf_waits": "start"})
    back3 = open_trace(out3)
    assert [j.start == j.submit for j in back3] == [True] * 3 and back3.report.anomalies["unknown_wait"] == 3


def test_unknown_waits_are_listed_for_targets_without_unknown(tmp_path: Path) -> None:
    src = _no_wait_log(tmp_path / "nowait.swf")
    p = _cli("trace", "convert", str(src), "--to", "slurm-sacct", "--out", str(tmp_path / "s.txt"))
    assert p.returncode == 0, p.stderr
    assert "30 job(s): an unknown wait" in p.stderr and "not carried over" in p.stderr
    assert "executable (field 14)" in p.stderr


def test_real_kth_log_lists_its_group_field_as_not_carried_over(tmp_path: Path) -> None:
    res = convert_trace(KTH, "swf", tmp_path / "kth.swf")
    (note,) = [n for n in res.notes if n.startswith("not carried over")]
    assert "group (field 13)" in note and "executable" not in note  # KTH fills the group, not the executable
    assert res.written == 28476


# 6. wording


def test_muri_says_no_size_apart_from_no_gpu_count(tmp_path: Path) -> None:
    src = tmp_path / "sizes.swf"
    # job 1: 4 procs; job 2: no size at all (allocated and requested procs -1)
    src.write_text("; UnixStartTime: 0\n; MaxNodes: 4\n; MaxProcs: 16\n"
                   "1 0 0 10 4 -1 -1 4 60 -1 1 1 1 -1 1 -1 -1 -1\n"
                   "2 5 0 10 -1 -1 -1 -1 60 -1 1 1 1 -1 1 -1 -1 -1\n")
    p = _cli("trace", "convert", str(src), "--to", "muri", "--gpus-per-node", "4")
    assert p.returncode == 2
    assert "1 of 2 jobs have no size at all" in p.stderr and "no GPU count" not in p.stderr
    p = _cli("trace", "convert", str(src), "--to", "muri")
    assert "no size at all" in p.stderr and "1 with no GPU count" in p.stderr


def test_truncated_real_pwa_log_gets_a_note(tmp_path: Path) -> None:
    cut = tmp_path / "kth-head.swf"
    with gzip.open(KTH, "rt") as f:
        lines = [line for _, line in zip(range(3200), f, strict=False)]
    cut.write_text("".join(lines))
    info = inspect_trace(cut)
    rows = sum(1 for line in lines if not line.startswith(";") and line.strip())
    (note,) = [n for n in info["notes"] if "truncated" in n]
    assert f"MaxJobs 28,490 but the file holds {rows:,} job rows" in note
    (whole,) = inspect_trace(KTH)["notes"]  # the cleaned log: 14 jobs fewer than its header, not truncated
    assert "MaxJobs 28,490, the file holds 28,476 job rows (14 fewer" in whole and "truncated" not in whole
    tl = timeline_from_log(cut)
    assert any("truncated" in str(n) for n in tl.notes["log_notes"])  # type: ignore[attr-defined]


def _sparse_log(path: Path) -> Path:
    """Nine one-hour jobs spread over eleven years (one a year or so), as a site's test partition keeps."""
    year = 365 * 86400
    rows = "".join(f"{k} {k * 460 * 86400} 0 3600 1 -1 -1 1 3600 -1 1 1 1 -1 1 -1 -1 -1\n" for k in range(9))
    path.write_text("; UnixStartTime: 1300000000\n; MaxNodes: 1\n; MaxProcs: 1\n" + rows)
    assert 8 * 460 * 86400 > 10 * year
    return path


def test_sparse_log_is_said_by_inspect_and_replay(tmp_path: Path) -> None:
    log = _sparse_log(tmp_path / "sparse.swf")
    (note,) = [n for n in inspect_trace(log)["notes"] if n.startswith("sparse log")]
    assert "8 gap(s) of a week or more" in note
    assert not [n for n in inspect_trace(KTH)["notes"] if n.startswith("sparse")]
    p = _cli("replay", "--log", str(log), "--jobs", str(JOBS10[0]), "--curves", str(JOBS10[1]),
             "--out", str(tmp_path / "r"), "--json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["nodes"] == 1
    assert any(w.startswith("sparse log") for w in s["warnings"]), s["warnings"]


def test_replay_says_jobs_that_ran_0_s_apart_from_missing_times(tmp_path: Path) -> None:
    log = tmp_path / "zero.swf"
    log.write_text("; UnixStartTime: 0\n; MaxNodes: 2\n; MaxProcs: 2\n"
                   "1 0 0 3600 1 -1 -1 1 3600 -1 1 1 1 -1 1 -1 -1 -1\n"
                   "2 10 0 0 1 -1 -1 1 3600 -1 1 1 1 -1 1 -1 -1 -1\n"
                   "3 20 0 -1 1 -1 -1 1 3600 -1 1 1 1 -1 1 -1 -1 -1\n")
    p = _cli("replay", "--log", str(log), "--jobs", str(JOBS10[0]), "--curves", str(JOBS10[1]),
             "--out", str(tmp_path / "r"), "--json")
    assert p.returncode == 0, p.stderr
    assert "1 had no start or end" in p.stderr and "1 ran 0 s (no node-time to replay)" in p.stderr


# 2. headerless sacct: --columns

# Open XDMoD's documented archive command (resource-manager-slurm: TZ=UTC sacct --allusers --parsable2 --noheader
# --allocations --format jobid,jobidraw,...,nodelist,jobname), rows written to that layout; the last job's name
# holds the delimiter, as free text may.
XDMOD_ROWS = [
    "4001|4001|edge|batch|chem|chem|5001|alice|5001|2019-03-01T08:00:00|2019-03-01T08:00:00|2019-03-01T08:00:10|"
    "2019-03-01T09:00:10|01:00:00|0:0|COMPLETED|2|64|64|4000Mc||billing=64,cpu=64,mem=256000M,node=2|02:00:00|"
    "c[001-002]|md-run",
    "4002|4002|edge|gpu|phys|phys|5002|bob|5002|2019-03-01T08:10:00|2019-03-01T08:10:00|2019-03-01T08:20:00|"
    "2019-03-01T08:50:00|00:30:00|1:0|FAILED|1|8|8|16Gn|gpu:2|cpu=8,gres/gpu=2,mem=16G,node=1|01:00:00|g003|train",
    "4003|4003|edge|batch|chem|chem|5001|alice|5001|2019-03-01T08:30:00|2019-03-01T08:30:00|2019-03-01T08:31:00|"
    "2019-03-01T08:41:00|00:10:00|0:0|COMPLETED|1|4|4|4000Mc||cpu=4,node=1|00:20:00|c003|a|b",
]
XDMOD_COLUMNS = ("JobID,JobIDRaw,Cluster,Partition,Account,Group,GID,User,UID,Submit,Eligible,Start,End,Elapsed,"
                 "ExitCode,State,NNodes,NCPUS,ReqCPUS,ReqMem,ReqGRES,ReqTRES,Timelimit,NodeList,JobName")


def test_headerless_xdmod_archive_reads_with_columns(tmp_path: Path) -> None:
    dump = tmp_path / "edge-2019-03-01.log"
    dump.write_text("\n".join(XDMOD_ROWS) + "\n")
    p = _cli("trace", "inspect", str(dump), "--json")
    assert p.returncode == 2 and "--columns" in p.stderr  # no header, no sniff: the error names the way out
    p = _cli("trace", "inspect", str(dump), "--format", "slurm-sacct")
    assert p.returncode == 2 and "--columns" in p.stderr and "Traceback" not in p.stderr
    for given in ("xdmod", XDMOD_COLUMNS, XDMOD_COLUMNS.lower()):
        trace = open_trace(dump, options={"columns": given})
        jobs = list(trace)
        assert [(j.id, j.nodes, j.procs, j.gpus, j.duration, j.requested, j.status.value, j.user, j.queue)
                for j in jobs] == [
            ("4001", 2, 64, 0, 3600.0, 7200.0, "completed", "alice", "batch"),
            ("4002", 1, 8, 2, 1800.0, 3600.0, "failed", "bob", "gpu"),
            ("4003", 1, 4, 0, 600.0, 1200.0, "completed", "alice", "batch")]
        assert jobs[0].extra["nodelist"] == ("c001", "c002")
        assert trace.report.anomalies == {"repaired_row": 1}  # 'a|b': the name holding the delimiter, rejoined
    # the same on the CLI, for inspect, convert and replay --log
    p = _cli("trace", "inspect", str(dump), "--format", "slurm-sacct", "--columns", XDMOD_COLUMNS, "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["jobs"] == 3 and info["anomalies"] == {"repaired_row": 1}
    p = _cli("trace", "convert", str(dump), "--columns", "xdmod", "--to", "swf", "--out", str(tmp_path / "x.swf"))
    assert p.returncode == 0, p.stderr
    assert [j.id for j in read_jobs(tmp_path / "x.swf")] == ["4001", "4002", "4003"]
    p = _cli("replay", "--log", str(dump), "--format", "slurm-sacct", "--columns", XDMOD_COLUMNS, "--jobs",
             str(JOBS10[0]), "--curves", str(JOBS10[1]), "--out", str(tmp_path / "r"), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["nodes"] >= 1


def test_headerless_real_cedar_dump_matches_its_headed_original(tmp_path: Path) -> None:
    """The real cedar sample without its header line, read with the header's names as --columns."""
    src = DATA / "slurm" / "sacct-allcols-cedar-2019.tsv"
    header, *rows = src.read_text().splitlines()
    dump = tmp_path / "cedar-noheader.tsv"
    dump.write_text("\n".join(rows) + "\n")
    names = header.replace("\t", ",")
    got = read_jobs(dump, options={"columns": names})  # tab found from the rows
    want = read_jobs(src)
    assert [(j.id, j.submit, j.start, j.end, j.nodes, j.procs, j.status) for j in got] == [
        (j.id, j.submit, j.start, j.end, j.nodes, j.procs, j.status) for j in want]
    # a header line that names the same columns is skipped, not read as a job
    assert len(read_jobs(src, options={"columns": names})) == 1
    # sacct's %width suffixes are dropped; a wrong column count is one error with the line
    assert len(read_jobs(dump, options={"columns": names.replace(",JobID,", ",JobID%20,")})) == 1
    with pytest.raises(InputError) as e:
        read_jobs(dump, options={"columns": "JobID,Submit,State"})
    assert e.value.line == 1
    with pytest.raises(InputError, match="--columns names the fields of a headerless sacct dump"):
        read_jobs(KTH, fmt="swf", options={"columns": "xdmod"})


# 4. duplicates

# TORQUE accounting (torque admin guide, "Accounting records": MM/DD/YYYY HH:MM:SS;T;id;key=value ...): job 6 is
# queued and started under its short id and ends under both forms, with the same times, as the issue's log did.
TORQUE_ROWS = [
    "03/01/2019 08:00:00;Q;6;queue=batch",
    "03/01/2019 08:00:05;S;6;user=alice group=chem queue=batch ctime=1551427200 qtime=1551427200 etime=1551427200 "
    "start=1551427205 exec_host=n1/0+n1/1 Resource_List.nodes=1:ppn=2 Resource_List.walltime=01:00:00",
    "03/01/2019 08:10:05;E;6;user=alice group=chem queue=batch ctime=1551427200 qtime=1551427200 etime=1551427200 "
    "start=1551427205 exec_host=n1/0+n1/1 Resource_List.nodes=1:ppn=2 Resource_List.walltime=01:00:00 "
    "end=1551427805 Exit_status=0 resources_used.walltime=00:10:00",
    "03/01/2019 08:10:05;E;6.edge.example.org;user=alice group=chem queue=batch ctime=1551427200 qtime=1551427200 "
    "etime=1551427200 start=1551427205 exec_host=n1/0+n1/1 Resource_List.nodes=1:ppn=2 "
    "Resource_List.walltime=01:00:00 end=1551427805 Exit_status=0 resources_used.walltime=00:10:00",
    "03/01/2019 08:20:00;E;7.edge.example.org;user=bob group=phys queue=batch ctime=1551427300 qtime=1551427300 "
    "etime=1551427300 start=1551427310 exec_host=n2/0 Resource_List.nodes=1:ppn=1 end=1551428400 Exit_status=0 "
    "resources_used.walltime=00:18:10",
]


def test_torque_short_and_full_id_of_one_job_are_one_job(tmp_path: Path) -> None:
    log = tmp_path / "20190301"
    log.write_text("\n".join(TORQUE_ROWS) + "\n")
    trace = open_trace(log)
    jobs = list(trace)
    assert [j.id for j in jobs] == ["6", "7.edge.example.org"]  # before: 6 and 6.edge... both, replayed twice
    assert trace.report.anomalies["duplicate_job"] == 1 and trace.report.first_lines["duplicate_job"] == 4
    assert "censored" not in trace.report.anomalies  # the Q/S records under '6' ended with its E record
    tl = timeline_from_log(log)
    assert tl.notes["log_jobs"] == 2 and tl.notes["log_rows_dropped"] == {"duplicate_job": 1}


# sacct -P --duplicates (an archive whose daily dumps overlap), with JobIDRaw: job 900 twice, identical; the array
# 910's range row of tasks not started (JobIDRaw 910) and, later, its task 910_3 that ran under the array's own
# record (JobIDRaw 910); the range row 920_[1-2] nothing replaced (never started); 901 requeued (two runs).
SACCT_DUP = """JobID|JobIDRaw|Partition|Submit|Start|End|ElapsedRaw|NNodes|NCPUS|State|NodeList
900|900|batch|2020-01-01T00:00:00|2020-01-01T00:01:00|2020-01-01T01:01:00|3600|1|4|COMPLETED|c1
901|901|batch|2020-01-01T00:00:00|2020-01-01T00:01:00|2020-01-01T00:31:00|1800|1|4|REQUEUED|c2
910_[2-3]|910|batch|2020-01-01T00:05:00|Unknown|Unknown|0|1|1|PENDING|None assigned
910_1|911|batch|2020-01-01T00:05:00|2020-01-01T00:06:00|2020-01-01T00:16:00|600|1|1|COMPLETED|c3
920_[1-2]|920|batch|2020-01-01T00:07:00|Unknown|Unknown|0|1|1|PENDING|None assigned
900|900|batch|2020-01-01T00:00:00|2020-01-01T00:01:00|2020-01-01T01:01:00|3600|1|4|COMPLETED|c1
901|901|batch|2020-01-01T00:00:00|2020-01-01T00:40:00|2020-01-01T01:40:00|3600|1|4|COMPLETED|c2
910_2|912|batch|2020-01-01T00:05:00|2020-01-01T00:16:00|2020-01-01T00:26:00|600|1|1|COMPLETED|c3
910_3|910|batch|2020-01-01T00:05:00|2020-01-01T00:26:00|2020-01-01T00:36:00|600|1|1|COMPLETED|c3
"""


def test_sacct_duplicate_rows_and_array_ranges_resolved(tmp_path: Path) -> None:
    log = tmp_path / "sacct-dup.txt"
    log.write_text(SACCT_DUP)
    trace = open_trace(log)
    jobs = list(trace)
    assert [(j.id, j.start is not None) for j in jobs] == [
        ("900", True), ("901", True), ("910_1", True), ("901#2", True), ("910_2", True), ("910_3", True),
        ("920_1", False), ("920_2", False)]
    # 900 twice (same times), the range row 910_[2-3] resolved to its task 910_3
    assert trace.report.anomalies["duplicate_job"] == 2
    assert trace.report.anomalies["duplicate_id"] == 1  # 901's two runs: both held nodes, kept apart
    assert any("one job per task" in c for c in trace.report.conversions)
    # nothing overlaps on c3 any more: the range row no longer counts as a job beside its tasks
    ran = sorted((j.start, j.end) for j in jobs if j.extra.get("nodelist") == ("c3",))
    assert all(a[1] <= b[0] for a, b in zip(ran, ran[1:], strict=False))


# 5. LSF lsb.acct and Grid Engine accounting; formats recognised but not read

LSF = DATA / "lsf" / "apel-lsb.acct"
SGE = DATA / "sge" / "apel-accounting"


def test_real_lsf_lsb_acct_records() -> None:
    """APEL's three real JOB_FINISH records (LSF 5.1 at CERN, 7.06, 9.11); its test's expected values by hand."""
    trace = open_trace(LSF)
    assert trace.format.name == "lsf-acct"
    jobs = list(trace)
    got = [(j.id, j.submit, j.start, j.end, j.duration, j.procs, j.nodes, j.status.value, j.user, j.queue)
           for j in jobs]
    assert got == [
        # wall 544 s = event time 1089407406 - start 1089406862; one exec host tbed0079; jStatus 64 DONE
        ("699195", 1089290023.0, 1089406862.0, 1089407406.0, 544.0, 1, 1, "completed", "raortega", "8nm"),
        # 16 slots on comp042 x8 + comp043 x8 (2 nodes); array element 23 of imb_sr[1-90]; jStatus 32 EXIT
        ("436491[23]", 1302184001.0, 1302184004.0, 1302184020.0, 16.0, 16, 2, "failed", "viglen", "normal"),
        ("31255091", 1380043614.0, 1380043630.0, 1380043655.0, 25.0, 1, 1, "completed", "oops17", "abcgrid")]
    assert jobs[1].extra["nodelist"] == ("comp042", "comp043")
    assert trace.report.anomalies == {} and trace.report.meta["records_by_type"] == {"JOB_FINISH": 3}


def test_real_grid_engine_accounting_records(tmp_path: Path) -> None:
    """APEL's four real SGE accounting lines and one UGE 8.2 line (milliseconds)."""
    trace = open_trace(SGE)
    assert trace.format.name == "sge-accounting"
    jobs = list(trace)
    got = [(j.id, j.start, j.end, j.duration, j.procs, j.nodes, j.status.value, j.user, j.queue, j.requested)
           for j in jobs]
    assert got[:4] == [
        ("43", 1200093294.0, 1200093295.0, 1.0, 1, 1, "completed", "dteam041", "dteam", None),
        # PE mpi, 9 slots, h_rt=180300 in the category; failed 100 with exit 138
        ("6972834", 1318560254.0, 1318740255.0, 180001.0, 9, 9, "failed", "csfiylfl", "large", 180300.0),
        ("1630912", 1358190002.0, 1358210574.0, 20572.0, 1, 1, "failed", "pilatl10", "lcg_analysis", None),
        ("3294013", 1404169049.0, 1404169408.0, 359.0, 1, 1, "completed", "prdatl26", "grid.q", None)]
    uge = jobs[4]
    assert (uge.id, uge.start, uge.end) == ("3872561", 1412932865.141, 1412933085.629)
    assert any("milliseconds" in c for c in trace.report.conversions)
    # --cores-per-node sizes the parallel job in nodes
    assert read_jobs(SGE, options={"cores_per_node": 4})[1].nodes == 3
    # both convert to SWF and back with their sizes and times
    res = convert_trace(SGE, "swf", tmp_path / "sge.swf")
    back = read_jobs(tmp_path / "sge.swf")
    assert res.written == 5 and [(j.start, j.procs) for j in back] == [(j.start, j.procs) for j in jobs]


def test_recognised_but_unsupported_formats_are_named(tmp_path: Path) -> None:
    events = tmp_path / "lsb.events"
    events.write_text('"JOB_NEW" "10.1" 1589400000 123 1000 33554434 1 1589400000 0 0 0 "alice" "normal"\n')
    p = _cli("trace", "inspect", str(events))
    assert p.returncode == 2 and "LSF's lsb.events" in p.stderr and "lsf-acct" in p.stderr
    js = tmp_path / "sacct.json"
    js.write_text('{\n  "meta": {"plugin": {"type": "openapi/slurmctld"}, "Slurm": {"version": {}}},\n'
                  '  "jobs": [{"job_id": 1, "association": {}}]\n}\n')
    p = _cli("trace", "inspect", str(js))
    assert p.returncode == 2 and "sacct --json" in p.stderr
    p = _cli("trace", "inspect", str(LSF), "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["jobs"] == 3


# 1. node sharing: the machine from NodeList, small jobs sharing nodes by cores

# sacct -P of a 3-node, 32-core machine: four 8-CPU jobs share c1, one 64-CPU job holds c[2-3]. The peak sum of
# NNodes is 6; the nodes the log names are 3.
SHARED = """JobID|Partition|Submit|Start|End|ElapsedRaw|NNodes|NCPUS|State|NodeList
1|p|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T02:00:00|7200|1|8|COMPLETED|c1
2|p|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T02:00:00|7200|1|8|COMPLETED|c1
3|p|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T02:00:00|7200|1|8|COMPLETED|c1
4|p|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T02:00:00|7200|1|8|COMPLETED|c1
5|p|2021-01-01T00:00:00|2021-01-01T00:00:00|2021-01-01T02:00:00|7200|2|64|COMPLETED|c[2-3]
6|p|2021-01-01T02:00:00|2021-01-01T02:00:00|2021-01-01T04:00:00|7200|1|16|COMPLETED|c2
"""


def test_sacct_machine_is_its_distinct_nodes_and_small_jobs_share_them(tmp_path: Path) -> None:
    log = tmp_path / "shared.sacct"
    log.write_text(SHARED)
    trace = open_trace(log)
    list(trace)
    meta = trace.report.meta
    assert (meta["machine_nodes"], meta["cores_per_node"]) == (3, 32)
    assert "distinct nodes" in str(meta["machine_nodes_source"])
    tl = timeline_from_log(log)
    # before: 6 nodes (the peak sum of NNodes), 3 of them never used
    assert tl.notes["machine_nodes"] == 3 and tl.notes["skipped_no_room"] == 0 and tl.notes["log_jobs_placed"] == 6
    assert tl.notes["log_peak_nodes"] == 3
    # after 02:00 only job 6 runs (16 of 32 cores on one node): two nodes are idle for harvesting
    idle = set(tl.initial)
    assert idle == set()  # 00:00-02:00: c1 full (4 x 8 of 32 cores), c2 and c3 held by job 5
    for e in tl.events:
        if e.time <= tl.start + 3 * 3600:
            idle = (idle | set(e.joined)) - set(e.left)
    assert len(idle) == 2  # at 03:00 job 6 uses half of one node: the two others are idle
    p = _cli("replay", "--log", str(log), "--jobs", str(JOBS10[0]), "--curves", str(JOBS10[1]),
             "--out", str(tmp_path / "r"), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["nodes"] == 3


# 7. inspect by columns: the same figures as the row reader

ANOMALOUS_ROWS = [
    "1 0 5 100 4 -1 -1 4 50 -1 1 1 1 -1 1 -1 -1 -1",  # ran over its request
    "2 10 -1 0 8 2.5 -1 8 60 -1 1 2 1 7 1 -1 -1 -1",  # 0 s, wait unknown, a fractional avg CPU, an executable
    "3 5 0 20 64 -1 -1 64 60 -1 0 2 1 -1 1 -1 -1 -1",  # submitted before row 2, larger than the machine
    "4 20 0 -5 -1 -1 -1 -1 60 -1 5 3 1 -1 1 3 -1 -1",  # negative run time, no size, a partition
    "5 30 1 10 4 -1 -1 4 -1 -1 5 3 1 -1 1 -1 -1 -1",  # cancelled after it ran, no requested time
]


def _same(path: Path) -> dict[str, object]:
    cols, rows = inspect_trace(path), inspect_trace(path, options={"rows": True})
    assert json.dumps(cols, sort_keys=True) == json.dumps(rows, sort_keys=True)
    return cols


def test_inspect_by_columns_matches_the_row_reader(tmp_path: Path) -> None:
    from hpcsched.traces.swf_columns import summarise

    f = tmp_path / "anomalous.swf"
    head = "; UnixStartTime: 100\n; MaxNodes: 4\n; MaxProcs: 16\n; MaxJobs: 9\n"
    f.write_text(head + "\n".join(ANOMALOUS_ROWS) + "\n")
    t = open_trace(f)
    assert summarise(f, t.report) is not None  # this file takes the columnar path
    info = _same(f)
    assert info["anomalies"] == {"larger_than_machine": 1, "negative_runtime": 1, "runtime_over_request": 1,
                                 "unknown_field": 4, "unsorted_submit": 1, "zero_runtime": 1}
    assert info["anomaly_first_lines"] == {"unknown_field": 6, "unsorted_submit": 7, "zero_runtime": 6,
                                           "negative_runtime": 8, "runtime_over_request": 5, "larger_than_machine": 7}
    _same(KTH)
    _same(_no_wait_log(tmp_path / "nowait.swf"))
    # a malformed row, a repeated id: the columnar path declines and the row reader answers (same output)
    bad = tmp_path / "bad.swf"
    bad.write_text("; UnixStartTime: 0\n" + "\n".join(ANOMALOUS_ROWS[:2]) + "\n1 2 3\n" + ANOMALOUS_ROWS[0] + "\n")
    t = open_trace(bad)
    assert summarise(bad, t.report) is None and not t.report.anomalies
    assert _same(bad)["anomalies"]["malformed_row"] == 1
    ricc = ROOT.parent / "shared" / "trace-data" / "swf" / "RICC-2010-2.swf.gz"
    if ricc.exists():  # 447,794 jobs; absent from a user's clone
        assert _same(ricc)["jobs"] == 447794
