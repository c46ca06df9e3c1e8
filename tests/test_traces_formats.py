"""Small hand-written logs, one per rule: each expected value is worked out in the comment beside it."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from hpcsched.errors import InputError
from hpcsched.model import JobStatus
from hpcsched.traces import detect_format, open_trace, read_jobs
from hpcsched.traces.base import TraceReport, numbered_lines

DATA = Path(__file__).resolve().parents[1] / "trace-data"

SWF_HEADER = "; Version: 2.2\n; UnixStartTime: 1000\n; MaxNodes: 4\n; MaxProcs: 8\n;\n"


def _swf(*rows: str) -> str:
    return SWF_HEADER + "".join(r + "\n" for r in rows)


def _row(jid: int, submit: int, wait: int, run: int, procs: int, req: int, status: int, req_procs: int = -2) -> str:
    rp = procs if req_procs == -2 else req_procs
    return f"{jid} {submit} {wait} {run} {procs} -1 -1 {rp} {req} -1 {status} 1 1 -1 2 -1 -1 -1"


def test_swf_conversions_and_every_anomaly(tmp_path: Path) -> None:
    f = tmp_path / "t.swf"
    f.write_text(_swf(
        _row(1, 0, 5, 100, 3, 200, 1),  # 3 procs / 2 per node -> 2 nodes; start 1005, end 1105
        _row(2, 10, 0, 0, 2, 50, 5),  # zero run time, cancelled
        _row(3, 5, 0, 300, 2, 200, 0),  # unsorted (5 < 10), over request (300 > 200), failed
        _row(3, 20, -1, -1, 10, 60, 5),  # duplicate id; wait and run unknown; 10 procs -> 5 nodes > 4
        _row(5, 30, 0, 40, -1, -1, 3, req_procs=-1),  # procs, requested procs and time unknown
        "; a comment between jobs is ignored",
        _row(6, 40, 0, 10, 2, 20, 2),  # status 2 (partial, continued) -> preempted
        "6 40 0 10",  # 4 fields: malformed, skipped
    ))
    trace = open_trace(f)
    jobs = list(trace)
    assert [j.id for j in jobs] == ["1", "2", "3", "3#2", "5", "6"]
    j1 = jobs[0]
    assert (j1.submit, j1.start, j1.end, j1.nodes, j1.procs, j1.requested) == (1000, 1005, 1105, 2, 3, 200)
    assert [j.status for j in jobs] == [JobStatus.COMPLETED, JobStatus.CANCELLED, JobStatus.FAILED,
                                        JobStatus.CANCELLED, JobStatus.COMPLETED, JobStatus.PREEMPTED]
    assert jobs[3].duration is None and jobs[3].start is None and jobs[3].nodes == 5
    assert jobs[4].nodes == 0 and jobs[4].requested is None
    r = trace.report
    assert r.anomalies == {"zero_runtime": 1, "unsorted_submit": 1, "runtime_over_request": 1, "duplicate_id": 1,
                           "unknown_field": 5, "larger_than_machine": 1, "malformed_row": 1}
    assert r.meta["unknown_fields"] == {"wait": 1, "run_time": 1, "allocated_procs": 1, "requested_procs": 1,
                                        "requested_time": 1}
    assert r.first_lines["malformed_row"] == 13 and r.first_lines["larger_than_machine"] == 9
    assert r.meta["machine_nodes"] == 4 and r.meta["cores_per_node"] == 2
    assert r.meta["cancelled_that_ran"] == 0  # job 2 ran 0 s, job 3#2's run time is unknown


@pytest.mark.parametrize(
    ("row", "kind"),
    [
        (_row(1, 0, 0, 0, 1, 10, 1), "zero_runtime"),
        (_row(1, 0, 0, 20, 1, 10, 1), "runtime_over_request"),
        (_row(1, 0, 0, 5, 16, 10, 1), "larger_than_machine"),
        (_row(1, 0, -1, 5, 1, 10, 1), "unknown_field"),
        ("1 0 0", "malformed_row"),
    ],
)
def test_strict_stops_at_each_kind(tmp_path: Path, row: str, kind: str) -> None:
    f = tmp_path / "s.swf"
    f.write_text(_swf(row))
    with pytest.raises(InputError) as e:
        list(open_trace(f, strict=True))
    assert e.value.line == 6 and kind in e.value.message and "--strict" in e.value.message


def test_swf_without_header_assumes_one_core_per_node(tmp_path: Path) -> None:
    f = tmp_path / "bare.swf"
    f.write_text(_row(1, 50, 0, 10, 4, 100, 1) + "\n")
    trace = open_trace(f)
    (job,) = list(trace)
    assert (job.submit, job.nodes) == (50, 4)  # relative time kept, 4 procs -> 4 nodes
    assert trace.report.meta["time_base"] == "relative"
    assert any("assumed" in c for c in trace.report.conversions)
    (job,) = read_jobs(f, options={"cores_per_node": 3})
    assert job.nodes == 2  # ceil(4 / 3)


def test_pbs_variant_nodespec_fallback(tmp_path: Path) -> None:
    f = tmp_path / "pbs.swf"
    base = "7 1356996147 3 100 16 1 1024 16 200 1 1 62 1 1 -1 1 1 1"
    f.write_text(f"{base} {{}} q_1d 2:ppn=4+1:ppn=8\n{base} {{5,5,9}} -1 1:ppn=3\n")
    trace = open_trace(f)
    assert trace.format.name == "swf-pbs"
    a, b = list(trace)
    assert (a.nodes, a.queue, a.start, a.end) == (3, "q_1d", 1356996150, 1356996250)  # 2 + 1 nodes in the spec
    assert (b.nodes, b.queue, b.id) == (2, None, "7#2")  # distinct ids 5 and 9


def test_detect_rejects_unknown_and_empty(tmp_path: Path) -> None:
    blank = tmp_path / "blank.csv"
    blank.write_text("\n\n  \n")
    other = tmp_path / "other.csv"
    other.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(InputError, match="empty file"):
        detect_format(blank)
    with pytest.raises(InputError, match="unrecognised trace format"):
        detect_format(other)
    with pytest.raises(InputError, match="no such file"):
        detect_format(tmp_path / "missing.swf")
    with pytest.raises(InputError, match="directory"):
        detect_format(tmp_path)


def test_binary_and_gzip_damage_name_the_line(tmp_path: Path) -> None:
    f = tmp_path / "nul.swf"
    f.write_bytes(_swf(_row(1, 0, 0, 5, 1, 10, 1)).encode() + b"2 0 0\x00 5\n")
    with pytest.raises(InputError) as e:
        list(open_trace(f))
    assert e.value.line == 7 and "binary" in e.value.message
    g = tmp_path / "bad.swf.gz"
    g.write_bytes(gzip.compress(_swf(_row(1, 0, 0, 5, 1, 10, 1)).encode())[:-12])  # CRC and length cut off
    with pytest.raises(InputError) as e:
        list(open_trace(g, fmt="swf"))
    assert "gzip" in e.value.message


def test_lines_across_blocks_and_crlf(tmp_path: Path) -> None:
    f = tmp_path / "big.txt"
    line = "x" * 1000
    f.write_bytes(("\r\n".join([line] * 3000) + "\r\nlast").encode())  # ~3 MB: spans several 1 MiB blocks
    seen = list(numbered_lines(f))
    assert len(seen) == 3001 and seen[-1] == (3001, "last") and all(s == line for _, s in seen[:-1])


def test_progress_reports_bytes_read() -> None:
    path = DATA / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz"
    calls: list[tuple[int, int]] = []
    trace = open_trace(path)
    trace.report.progress = lambda done, total: calls.append((done, total))
    list(trace)
    size = path.stat().st_size
    assert calls and all(t == size for _, t in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and calls[-1][0] == size


def test_theta_and_philly_bad_rows_counted(tmp_path: Path) -> None:
    theta = tmp_path / "theta.csv"
    head = (",job,user,project,state,gpu_num,cpu_num,node_num,submit_time,wait_time,run_time,wall_time,node_hour,"
            "new_status")
    theta.write_text(head + "\n0,1,0,0,0,0,64,1,100,5,50,60,1,Pass\n1,2,0,0,0,0,64,1,abc,5,50,60,1,Pass\n"
                     "2,3,0,0,0,0,64,1,200,nan,50,60,1,Killed\n")
    trace = open_trace(theta)
    jobs = list(trace)
    assert [j.id for j in jobs] == ["1", "3"] and jobs[1].start is None
    assert trace.report.anomalies == {"malformed_row": 1, "unknown_field": 1}
    philly = tmp_path / "philly.csv"
    philly.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,c1\n"
                      "2017-13-09 07:01:55,66.0,1,66.0,c1\n2017-10-08 00:00:00,5,2,10,c2\n")
    trace = open_trace(philly)
    jobs = list(trace)
    assert [j.id for j in jobs] == ["1", "3"]  # ids are data-row numbers, a bad row keeps its number
    assert trace.report.anomalies == {"malformed_row": 1, "unsorted_submit": 1}


def test_idle_report_optional_and_strict(tmp_path: Path) -> None:
    from hpcsched.traces.bftrainer import read_idle_intervals

    f = tmp_path / "idle.csv"
    f.write_text("node,idle_start,idle_end\nn1,10,-1\n")
    assert [iv.end for iv in read_idle_intervals(f)] == [None]
    with pytest.raises(InputError, match="censored"):
        list(read_idle_intervals(f, TraceReport(str(f), "bftrainer-idle", strict=True)))


def test_second_pass_counts_afresh() -> None:
    trace = open_trace(DATA / "swf" / "alea-wagap-2013.swf.gz")
    first = [j.id for j in trace]
    counts = dict(trace.report.anomalies)
    assert [j.id for j in trace] == first and dict(trace.report.anomalies) == counts
    # zcat alea-wagap-2013.swf.gz | awk '$4<0' | wc -l -> 2
    assert counts["negative_runtime"] == 2


def test_format_aliases_and_header_counts() -> None:
    kth = DATA / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz"
    trace = open_trace(kth, fmt="SWF")
    assert trace.format.name == "swf"
    assert open_trace(DATA / "cobalt" / "theta-2022-2023.csv.gz", fmt="theta").format.name == "cobalt"
    assert open_trace(DATA / "swf" / "alea-wagap-2013.swf.gz", fmt="wagap").format.name == "swf-pbs"
    n = sum(1 for _ in trace)
    # zcat KTH...gz | grep -E 'MaxJobs|MaxRecords' -> 28490 and 28476; the body has 28476 jobs
    assert (trace.report.meta["header_maxjobs"], trace.report.meta["header_maxrecords"], n) == ("28490", "28476", 28476)
