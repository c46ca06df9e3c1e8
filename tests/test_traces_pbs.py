"""PBS Pro / OpenPBS accounting logs: record by record, machine size and its source, round trips, garbage.

The real sample ``trace-data/pbs/casper-pbs-records.log`` holds nine records NCAR's Casper (PBS Pro)
wrote, as published in NCAR/pbsparse's tests (MIT; SOURCES.md). The Polaris-style log below is written
by hand after the accounting-log format OpenPBS documents (record types Q S E D A R, ``key=value``
messages, ``exec_vnode`` chunks, ``Resource_List.select``), with each expected value worked out beside it.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcsched.errors import InputError
from hpcsched.model import Job, JobStatus
from hpcsched.traces import detect_format, open_trace, read_jobs
from hpcsched.traces.convert import write_jobs
from hpcsched.traces.pbs import KNOWN_MACHINES, key_values, parse_walltime

DATA = Path(__file__).resolve().parents[1] / "trace-data"
CASPER = DATA / "pbs" / "casper-pbs-records.log"
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
SERVER = "polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"

# Record times are US Central (UTC-5 in June): 06/01/2024 07:00:00 local = 1717243200 UTC.
POLARIS = f"""\
06/01/2024 06:59:50;Q;100.{SERVER};queue=prod
06/01/2024 06:59:55;Q;101.{SERVER};queue=prod
06/01/2024 07:00:00;S;100.{SERVER};user=alice queue=small ctime=1717243190 qtime=1717243190 etime=1717243190 \
start=1717243200 exec_host=x3001c0s1b0n0/0*64+x3001c0s1b1n0/0*64 \
exec_vnode=(x3001c0s1b0n0:ngpus=4:ncpus=64)+(x3001c0s1b1n0:ngpus=4:ncpus=64) Resource_List.ncpus=128 \
Resource_List.ngpus=8 Resource_List.nodect=2 Resource_List.select=2:ncpus=64:ngpus=4 Resource_List.walltime=01:00:00
06/01/2024 07:00:30;D;101.{SERVER};requestor=bob@polaris-login-01
06/01/2024 07:01:00;Q;102[].{SERVER};queue=prod
06/01/2024 07:01:00;Q;103.{SERVER};queue=prod
06/01/2024 07:02:00;S;103.{SERVER};user=carol jobname="my job" account="A B" queue=medium ctime=1717243260 \
qtime=1717243260 etime=1717243260 start=1717243320 exec_vnode=(x3002c0s1b0n0:ncpus=32)+(x3002c0s1b0n0:ncpus=32) \
Resource_List.select=2:ncpus=32:ngpus=2 Resource_List.place=pack Resource_List.walltime=00:30:00
06/01/2024 07:10:00;E;100.{SERVER};user=alice queue=small ctime=1717243190 qtime=1717243190 etime=1717243190 \
start=1717243200 exec_vnode=(x3001c0s1b0n0:ngpus=4:ncpus=64)+(x3001c0s1b1n0:ngpus=4:ncpus=64) \
Resource_List.ncpus=128 Resource_List.ngpus=8 Resource_List.nodect=2 Resource_List.walltime=01:00:00 session=1 \
end=1717243800 Exit_status=0 resources_used.walltime=00:10:00 run_count=1
06/01/2024 07:40:00;E;103.{SERVER};user=carol queue=medium ctime=1717243260 qtime=1717243260 etime=1717243260 \
start=1717243320 exec_vnode=(x3002c0s1b0n0:ncpus=32)+(x3002c0s1b0n0:ncpus=32) Resource_List.select=2:ncpus=32:ngpus=2 \
Resource_List.walltime=00:30:00 end=1717245000 Exit_status=-29 resources_used.walltime=00:28:00 run_count=1
06/01/2024 07:45:00;Q;104.{SERVER};queue=prod
06/01/2024 07:46:00;S;105.{SERVER};user=dan queue=prod ctime=1717245900 start=1717245960 Resource_List.nodect=4
06/01/2024 07:47:00;Y;R77.{SERVER};requestor=admin start=1717246000 end=1717249600 nodes=(x3001c0s1b0n0:ncpus=64)
this line is not a record
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    f = tmp_path / name
    f.write_text(text)
    return f


def _key(j: Job) -> tuple[object, ...]:
    return (j.id, j.submit, j.start, j.end, j.duration, j.requested, j.nodes, j.procs, j.gpus, j.status, j.user,
            j.queue)


# --------------------------------------------------------------------------------------------- records
def test_key_values_and_walltimes() -> None:
    kv = key_values('user=a account="X Y" Resource_List.select=2:ncpus=4 exec_vnode=(n1:ncpus=1)+(n2:ncpus=1) e=')
    assert kv == {"user": "a", "account": "X Y", "Resource_List.select": "2:ncpus=4",
                  "exec_vnode": "(n1:ncpus=1)+(n2:ncpus=1)", "e": ""}
    assert (parse_walltime("01:00:00"), parse_walltime("100:00:01"), parse_walltime("90")) == (3600, 360001, 90)
    with pytest.raises(ValueError):
        parse_walltime("1e5")


def test_polaris_style_log(tmp_path: Path) -> None:
    f = _write(tmp_path, "20240601", POLARIS)
    trace = open_trace(f)
    assert trace.format.name == "pbs-accounting"
    jobs = {j.id.split(".")[0]: j for j in trace}
    assert list(jobs) == ["100", "103", "101", "104", "105"]  # E records in file order, then the unfinished
    j100, j103 = jobs["100"], jobs["103"]
    # 100: two vnodes on two hosts, 8 GPUs, 128 cores; ran 10 min; exit 0
    assert _key(j100)[1:] == (1717243190.0, 1717243200.0, 1717243800.0, 600.0, 3600.0, 2, 128, 8,
                              JobStatus.COMPLETED, "alice", "small")
    assert j100.extra["nodelist"] == ("x3001c0s1b0n0", "x3001c0s1b1n0")
    # 103: two chunks packed on one host -> 1 node; GPUs and cores from the select (2 x 2, 2 x 32); -29: walltime
    assert (j103.nodes, j103.gpus, j103.procs, j103.status, j103.duration) == (1, 4, 64, JobStatus.TIMEOUT, 1680.0)
    # 101: queued 06:59:55 local, deleted before it started; the offset (-5 h) comes from 100's S record
    assert (jobs["101"].submit, jobs["101"].start, jobs["101"].status) == (1717243195.0, None, JobStatus.CANCELLED)
    assert (jobs["104"].status, jobs["104"].submit) == (JobStatus.PENDING, 1717245900.0)
    assert (jobs["105"].status, jobs["105"].start, jobs["105"].end, jobs["105"].nodes) == (
        JobStatus.RUNNING, 1717245960.0, None, 4)
    r = trace.report
    assert r.meta["record_time_offset_s"] == -5 * 3600
    assert (r.meta["machine_nodes"], r.meta["machine_name"]) == (560, "Polaris")
    assert r.meta["machine_nodes_source"] == f"known machine Polaris, named by the PBS server {SERVER!r}"
    assert r.meta["array_parent_records_skipped"] == 1 and r.meta["records_by_type"]["Y"] == 1
    # 104 queued and 105 running at the log's end; 105 has no end; the last line is not a record;
    # 103 was submitted before 101's Q record time, which sorts it before 101 (an unsorted submit)
    assert r.anomalies == {"censored": 2, "unknown_field": 1, "malformed_row": 1, "unsorted_submit": 1}
    assert r.first_lines["malformed_row"] == 13


def test_machine_size_sources(tmp_path: Path) -> None:
    rec = "06/01/2024 07:10:00;E;7.{s};ctime=1717243190 start=1717243200 end=1717243800 Resource_List.nodect=3\n"
    # the option wins over everything
    t = open_trace(_write(tmp_path, "a", rec.format(s=SERVER)), options={"machine_nodes": 100})
    list(t)
    assert (t.report.meta["machine_nodes"], t.report.meta["machine_nodes_source"]) == (100, "given as an option")
    # a header comment, as `trace convert` writes it
    t = open_trace(_write(tmp_path, "b", "# MaxNodes: 42\n" + rec.format(s=SERVER)))
    list(t)
    meta = t.report.meta
    assert (meta["machine_nodes"], meta["machine_nodes_source"]) == (42, "the log's header (maxnodes)")
    # the file name names a known machine when the server does not
    t = open_trace(_write(tmp_path, "aurora-20240601", rec.format(s="pbs01")))
    list(t)
    assert t.report.meta["machine_nodes"] == KNOWN_MACHINES["aurora"][1] == 10624
    # nothing: the peak of concurrent use, stated as a lower bound
    t = open_trace(_write(tmp_path, "c", rec.format(s="pbs01")))
    list(t)
    assert t.report.meta["machine_nodes"] == 3 and "peak concurrent use" in t.report.meta["machine_nodes_source"]


def test_torque_nodes_and_reruns(tmp_path: Path) -> None:
    text = ("04/05/2017 13:06:53;E;45.master;user=u queue=short ctime=1491390300 start=1491390307 "
            "exec_host=node1/0-1+node3/0-1 Resource_List.nodes=2:ppn=2 end=1491390413 Exit_status=0 "
            "resources_used.walltime=00:01:44\n"
            "04/05/2017 13:07:00;R;46.master;user=u ctime=1491390300 start=1491390310 end=1491390400 "
            "Resource_List.nodes=3:ppn=8 Exit_status=-3 run_count=2\n")
    a, b = read_jobs(_write(tmp_path, "torque", text))
    assert (a.nodes, a.duration, a.extra["nodelist"]) == (2, 104.0, ("node1", "node3"))
    assert (b.id, b.nodes, b.status, b.duration) == ("46.master:run2", 3, JobStatus.PREEMPTED, 90.0)


# ------------------------------------------------------------------------------------------ real sample
def test_real_casper_records() -> None:
    trace = open_trace(CASPER)
    jobs = list(trace)
    assert [_key(j) for j in jobs] == [
        # R record: run 21 of 4400521 (run_count=21), 1 node, resources_used.walltime 00:00:00
        ("4400521.casper-pbs:run21", 1744751276.0, 1744751695.0, 1744751698.0, 0.0, 36000.0, 1, 1, 0,
         JobStatus.PREEMPTED, "rpconroy", "rda"),
        # E record: exit 271 (SIGTERM) with no D record in the excerpt -> failed; 1 GPU from Resource_List.ngpus
        ("4413086.casper-pbs", 1744817013.0, 1744817058.0, 1744820388.0, 3326.0, 14400.0, 1, 1, 1,
         JobStatus.FAILED, "vanderwb", "vis"),
        ("2281314.casper-pbs", 1770865912.0, 1770865936.0, 1770865941.0, 1.0, 3600.0, 1, 1, 0,
         JobStatus.COMPLETED, "vanderwb", "htc"),
        ("2281981.casper-pbs", 1770866179.0, 1770866202.0, 1770866207.0, 1.0, 3600.0, 2, 2, 0,
         JobStatus.COMPLETED, "vanderwb", "htc"),
    ]
    assert jobs[3].extra["nodelist"] == ("crhtc67", "crhtc70")
    m = trace.report.meta
    # C, a, A, R and D records of jobs queued before the excerpt: no submit time; Y is a reservation
    assert m["jobs_before_log_skipped"] == 5
    assert m["records_by_type"] == {"A": 1, "C": 1, "D": 1, "E": 3, "R": 1, "Y": 1, "a": 1}
    # record 04/15/2025 15:14:58 local vs end=1744751698 (21:14:58 UTC): Mountain time, UTC-6
    assert m["record_time_offset_s"] == -6 * 3600
    assert m["machine_nodes"] == 2 and "peak" in m["machine_nodes_source"]  # casper is not a known machine
    assert trace.report.anomalies == {"zero_runtime": 1}


def test_cli_inspect_and_replay_read_the_real_sample(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "hpcsched.cli", "trace", "inspect", str(CASPER), "--json",
                          "--nodes", "16"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert (info["format"], info["jobs"], info["machine"]["machine_nodes"]) == ("pbs-accounting", 4, 16)
    assert info["machine"]["machine_nodes_source"] == "given as an option"


def test_sniffers_are_unambiguous() -> None:
    assert detect_format(CASPER).name == "pbs-accounting"
    assert detect_format(DATA / "swf" / "alea-wagap-2013.swf.gz").name == "swf-pbs"  # the old "pbs" alias
    assert open_trace(CASPER, fmt="openpbs").format.name == "pbs-accounting"
    assert open_trace(DATA / "swf" / "alea-wagap-2013.swf.gz", fmt="pbs").format.name == "swf-pbs"


# ------------------------------------------------------------------------------------------ properties
_STATES = [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.TIMEOUT, JobStatus.RUNNING,
           JobStatus.PENDING]


@st.composite
def pbs_jobs(draw: st.DrawFn) -> list[Job]:
    """Random jobs as PBS records hold them: whole seconds, numeric ids."""
    jobs = []
    for k in range(draw(st.integers(1, 8))):
        status = draw(st.sampled_from(_STATES))
        submit = float(draw(st.integers(1_500_000_000, 1_900_000_000)))
        ran = status is not JobStatus.PENDING and not (status is JobStatus.CANCELLED and draw(st.booleans()))
        start = submit + draw(st.integers(0, 10**5)) if ran else None
        duration = float(draw(st.integers(0, 10**6))) if ran and status is not JobStatus.RUNNING else None
        nodes = draw(st.integers(1, 64)) if ran else 0
        jobs.append(Job(id=str(5000 + k), submit=submit, nodes=nodes, procs=nodes * draw(st.sampled_from([0, 64])),
                        gpus=nodes * draw(st.sampled_from([0, 4])), duration=duration,
                        requested=draw(st.none() | st.integers(60, 10**6).map(float)) if ran else None,
                        start=start, end=start + duration if start is not None and duration is not None else None,
                        status=status, user=draw(st.none() | st.sampled_from(["ann", "bo b"])) if ran else None,
                        queue=draw(st.none() | st.sampled_from(["prod", "debug"])) if ran else None))
    return jobs


@SETTINGS
@given(jobs=pbs_jobs())
def test_random_jobs_round_trip(tmp_path_factory: pytest.TempPathFactory, jobs: list[Job]) -> None:
    buf = io.StringIO()
    write_jobs(jobs, "pbs-accounting", buf, {"machine_nodes": 1000})
    f = tmp_path_factory.mktemp("rt") / "acct.log"
    f.write_text(buf.getvalue())
    trace = open_trace(f)
    back = {j.id: j for j in trace}
    assert {j.id: _key(j) for j in jobs} == {i: _key(j) for i, j in back.items()}
    assert trace.report.meta["machine_nodes"] == 1000


_TOKENS = st.sampled_from(["06/01/2024 07:00:00", "13/45/2024 99:00:00", ";", "E", "Q", "S", "D", "R", "A",
                           "1.srv", "R1.srv", "2[].srv", "start=", "start=0", "start=1717243200", "end=nan",
                           "end=1e99", "ctime=-5", "Resource_List.select=", "Resource_List.select=x:ngpus=y",
                           "Resource_List.nodect=99999999999", "exec_vnode=((", "resources_used.walltime=::",
                           "Exit_status=abc", '"', " ", "\t", "# MaxNodes: zz", "é", "="])


@SETTINGS
@given(lines=st.lists(st.lists(_TOKENS, max_size=12).map("".join), max_size=12))
def test_garbage_gives_records_or_an_error_with_file_and_line(tmp_path_factory: pytest.TempPathFactory,
                                                              lines: list[str]) -> None:
    f = tmp_path_factory.mktemp("g") / "acct.log"
    f.write_text("\n".join(lines) + "\n")
    trace = open_trace(f, "pbs-accounting")
    try:
        jobs = list(trace)
    except InputError as e:
        assert str(e).startswith(f"{f}:") and e.line is not None
        return
    assert all(isinstance(j.extra["line"], int) for j in jobs)
