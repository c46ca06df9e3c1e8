"""``hpcsched trace convert`` and the SWF features it relies on: header fields, logs without waits.

Round trips write random jobs in SWF and Muri CSV and read them back; real files are converted between
formats and checked field by field; conversions that would leave jobs unusable stop with one error
naming the count and the first line; a converted batch log runs through the simulator from the CLI.
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
from hpcsched.model import Job, JobStatus, ResourceProfile
from hpcsched.traces import open_trace, read_jobs
from hpcsched.traces.convert import TARGETS, convert_trace, losses, write_jobs

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "trace-data"
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcsched.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


def _key(j: Job) -> tuple[object, ...]:
    return (j.id, j.submit, j.start, j.end, j.duration, j.requested, j.nodes, j.procs, j.gpus, j.status, j.user,
            j.queue)


# --------------------------------------------------------------------------------------------------- SWF
SWF_HEADER = """\
; Version: 2.2
; Computer: Example cluster
; Installation: Somewhere
; Acknowledge: Someone
; Information: http://example.org/
;              http://example.org/more
; Conversion: by hand
; MaxJobs: 3
; MaxRecords: 3
; Preemption: No
; UnixStartTime: 1000
; TimeZone: 3600
; TimeZoneString: Europe/Berlin
; StartTime: Thu Jan 01 01:16:40 CET 1970
; EndTime: Thu Jan 01 02:00:00 CET 1970
; MaxNodes: 4
; MaxProcs: 16
; MaxRuntime: 86400
; MaxMemory: 1024
; AllowOveruse: Yes
; MaxQueues: 2
; Queues: batch and debug
; Queue: 1 batch
; Queue: 2 debug
; MaxPartitions: 1
; Partitions: one
; Partition: 1 all
; Note: submit times are start times
;       (no wait was recorded)
; Site: not a field SWF defines
;
"""


def test_every_swf_header_field_in_meta(tmp_path: Path) -> None:
    f = tmp_path / "h.swf"
    f.write_text(SWF_HEADER + "1 0 -1 10 4 -1 -1 4 60 -1 1 1 1 -1 1 -1 -1 -1\n")
    trace = open_trace(f)
    (job,) = list(trace)
    h = trace.report.meta["swf_header"]
    assert list(h) == ["Version", "Computer", "Installation", "Acknowledge", "Information", "Conversion", "MaxJobs",
                       "MaxRecords", "Preemption", "UnixStartTime", "TimeZone", "TimeZoneString", "StartTime",
                       "EndTime", "MaxNodes", "MaxProcs", "MaxRuntime", "MaxMemory", "AllowOveruse", "MaxQueues",
                       "Queues", "Queue", "MaxPartitions", "Partitions", "Partition", "Note", "other"]
    assert (h["MaxNodes"], h["MaxProcs"], h["UnixStartTime"], h["TimeZone"], h["MaxRuntime"]) == (4, 16, 1000, 3600,
                                                                                                  86400)
    assert h["Information"] == "http://example.org/\nhttp://example.org/more"
    assert h["Queue"] == ["1 batch", "2 debug"] and h["Partition"] == ["1 all"]
    assert h["Note"] == ["submit times are start times\n(no wait was recorded)"]
    assert h["TimeZoneString"] == "Europe/Berlin" and h["other"] == {"Site": "not a field SWF defines"}
    m = trace.report.meta
    assert (m["machine_nodes"], m["machine_procs"], m["cores_per_node"]) == (4, 16, 4.0)
    # one row, and the header says waits are unknown: start = submit, counted
    assert (job.start, job.end, job.nodes) == (1000.0, 1010.0, 1)
    assert trace.report.anomalies == {"unknown_wait": 1}


def _rows(n: int, wait: str = "-1") -> str:
    return "".join(f"{k} {k * 10} {wait} 5 1 -1 -1 1 60 -1 1 1 1 -1 1 -1 -1 -1\n" for k in range(1, n + 1))


def test_log_without_waits_replays_with_start_at_submit(tmp_path: Path) -> None:
    f = tmp_path / "nowait.swf"
    f.write_text("; UnixStartTime: 0\n" + _rows(25))
    trace = open_trace(f)
    jobs = list(trace)
    assert all(j.start == j.submit and j.end == j.submit + 5 for j in jobs)
    assert trace.report.anomalies == {"unknown_wait": 25} and trace.report.meta["waits_unknown"] is True
    assert any("start = submit" in c for c in trace.report.conversions)
    # forced either way
    assert read_jobs(f, options={"swf_waits": "unknown"})[0].start is None
    few = tmp_path / "few.swf"
    few.write_text(_rows(3))  # 3 rows say nothing about the log: starts stay unknown
    assert [j.start for j in read_jobs(few)] == [None, None, None]
    assert read_jobs(few, options={"swf_waits": "start"})[0].start == 10.0


def test_some_unknown_waits_stay_unknown(tmp_path: Path) -> None:
    f = tmp_path / "mixed.swf"
    f.write_text(_rows(30, wait="3") + "31 400 -1 5 1 -1 -1 1 60 -1 1 1 1 -1 1 -1 -1 -1\n")
    trace = open_trace(f)
    jobs = list(trace)
    assert jobs[-1].start is None and trace.report.anomalies == {"unknown_field": 1}


# ------------------------------------------------------------------------------------------ round trips
@st.composite
def swf_jobs(draw: st.DrawFn) -> tuple[list[Job], int]:
    """Random SWF-shaped jobs on a machine of ``cpn`` cores per node (the reader turns procs into nodes)."""
    cpn = draw(st.sampled_from([1, 2, 8, 64]))
    jobs = []
    for k in range(draw(st.integers(1, 10))):
        submit = float(draw(st.integers(800_000_000, 1_700_000_000)))
        status = draw(st.sampled_from([JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED,
                                       JobStatus.PREEMPTED]))
        ran = k == 0 or draw(st.booleans())  # one job with a wait: not a log without waits
        start = submit + draw(st.integers(0, 10**5)) if ran else None
        duration = float(draw(st.integers(0, 10**6))) if ran else None
        nodes = draw(st.integers(1, 32))
        jobs.append(Job(id=str(k + 1), submit=submit, nodes=nodes, procs=nodes * cpn, duration=duration,
                        requested=draw(st.none() | st.integers(0, 10**6).map(float)), start=start,
                        end=start + duration if ran else None, status=status,
                        user=draw(st.none() | st.integers(1, 50).map(str)),
                        queue=draw(st.none() | st.integers(0, 3).map(str))))
    return jobs, cpn


@SETTINGS
@given(case=swf_jobs())
def test_swf_round_trip(tmp_path_factory: pytest.TempPathFactory, case: tuple[list[Job], int]) -> None:
    jobs, cpn = case
    buf = io.StringIO()
    write_jobs(jobs, "swf", buf, {"time_base": "epoch", "cores_per_node": cpn, "machine_nodes": 32})
    f = tmp_path_factory.mktemp("swf") / "t.swf"
    f.write_text(buf.getvalue())
    back = {j.id: j for j in read_jobs(f)}
    assert {j.id: _key(j) for j in jobs} == {i: _key(j) for i, j in back.items()}


@st.composite
def muri_jobs(draw: st.DrawFn) -> list[Job]:
    """Random Muri-shaped jobs: whole milliseconds, all with a stage profile or none."""
    profiles = draw(st.booleans())
    ms = st.integers(0, 10**9).map(lambda v: v * 1e-3)  # as the reader turns milliseconds into seconds
    jobs = []
    for k in range(draw(st.integers(1, 10))):
        prof = ResourceProfile(*(draw(st.integers(0, 10**5)) * 1e-3 for _ in range(3))) if profiles else None
        jobs.append(Job(id=str(k), submit=draw(ms), gpus=draw(st.integers(1, 64)), duration=draw(ms),
                        iterations=draw(st.integers(1, 10**6)), iteration_time=draw(st.integers(1, 10**5)) * 1e-3,
                        profile=prof, model=draw(st.sampled_from(["resnet50", "bert", "vgg19"])),
                        status=JobStatus.COMPLETED))
    return jobs


@SETTINGS
@given(jobs=muri_jobs())
def test_muri_round_trip(tmp_path_factory: pytest.TempPathFactory, jobs: list[Job]) -> None:
    buf = io.StringIO()
    write_jobs(jobs, "muri", buf)
    f = tmp_path_factory.mktemp("muri") / "t.csv"
    f.write_text(buf.getvalue())
    fields = ("id", "submit", "gpus", "duration", "iterations", "iteration_time", "profile", "model", "status")
    back = sorted(read_jobs(f), key=lambda j: int(j.id))
    assert [[getattr(j, a) for a in fields] for j in back] == [[getattr(j, a) for a in fields] for j in jobs]


def test_real_muri_trace_is_written_back_byte_for_byte(tmp_path: Path) -> None:
    src = DATA / "muri" / "trace3.csv"
    out = tmp_path / "trace3.csv"
    convert_trace(src, "muri", out)
    assert out.read_text() == src.read_text()


def test_real_swf_converts_to_swf_with_the_same_jobs(tmp_path: Path) -> None:
    src = DATA / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz"
    out = tmp_path / "kth.swf.gz"
    result = convert_trace(src, "swf", out)
    assert result.written == 28476
    assert [_key(j) for j in read_jobs(out)] == [_key(j) for j in read_jobs(src)]


@pytest.mark.parametrize("target", ["slurm-sacct", "pbs-accounting"])
def test_real_sacct_sample_through_every_batch_format(tmp_path: Path, target: str) -> None:
    """The real cedar job, sacct -> target -> read back: the same job in every field both formats hold."""
    src = DATA / "slurm" / "sacct-allcols-cedar-2019.tsv"
    out = tmp_path / "out.txt"
    convert_trace(src, target, out)
    assert [_key(j) for j in read_jobs(out)] == [_key(j) for j in read_jobs(src)]


# ----------------------------------------------------------------------------------------------- losses
def test_losses_name_what_each_target_lacks() -> None:
    dl = Job(id="1", submit=0.0, gpus=4, duration=10.0, iterations=5, model="bert")
    batch = Job(id="2", submit=0.0, nodes=2, duration=10.0, extra={"line": 7})
    assert [(x.count, x.required) for x in losses([dl], "swf")] == [(1, True), (1, False)]
    (need, *_) = losses([batch], "muri")
    assert (need.required, need.first_line, "GPU count" in need.what) == (True, 7, True)
    assert not any(x.required for x in losses([batch], "muri", gpus_per_node=4))
    assert set(TARGETS) == {"swf", "muri", "slurm-sacct", "pbs-accounting", "lsf-acct", "sge-accounting"}


def test_batch_log_to_simulator_needs_gpus(tmp_path: Path) -> None:
    src = DATA / "pbs" / "casper-pbs-records.log"
    with pytest.raises(InputError) as e:
        convert_trace(src, "muri", tmp_path / "x.csv")
    # 3 of the 4 jobs asked for no GPU; line 5 is the first of them (the R run)
    assert e.value.line == 5 and "3 of 4 jobs have no GPU count" in e.value.message
    assert "--allow-loss" in e.value.message
    assert not (tmp_path / "x.csv").exists()
    result = convert_trace(src, "muri", tmp_path / "x.csv", gpus_per_node=4, allow_loss=True)
    assert (result.written, result.dropped) == (3, 1)  # the R run ran 0 s: nothing to simulate


def test_unknown_target_and_non_job_files_are_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot convert to 'yaml'"):
        convert_trace(DATA / "muri" / "trace3.csv", "yaml")
    with pytest.raises(InputError, match="not jobs"):
        convert_trace(DATA / "bftrainer" / "node-order.txt", "swf")


# -------------------------------------------------------------------------------------------------- CLI
def test_cli_convert_writes_notes_and_errors_on_stderr(tmp_path: Path) -> None:
    out = tmp_path / "c.swf"
    r = _cli("trace", "convert", str(DATA / "pbs" / "casper-pbs-records.log"), "--to", "swf", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "4 jobs written as swf" in r.stderr and "renumbered" in r.stderr and "Traceback" not in r.stderr
    assert len(read_jobs(out)) == 4
    stdout = _cli("trace", "convert", str(DATA / "slurm" / "sacct-allcols-cedar-2019.tsv"), "--to", "sacct",
                  "--out-delimiter", "tab", "-q")
    assert stdout.returncode == 0 and stdout.stderr == "" and stdout.stdout.startswith("JobID\tJobName\t")
    bad = _cli("trace", "convert", str(DATA / "muri" / "trace3.csv"), "--to", "swf")
    assert bad.returncode == 2 and "trace3.csv:2: converting to swf would lose" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_cli_batch_log_converted_then_simulated(tmp_path: Path) -> None:
    """A PBS log -> the simulator's CSV (GPUs = nodes x 4) -> hpcsched simulate, end to end."""
    csv = tmp_path / "casper.csv"
    r = _cli("trace", "convert", str(DATA / "pbs" / "casper-pbs-records.log"), "--to", "muri", "--gpus-per-node", "4",
             "--allow-loss", "--rebase", "--out", str(csv))
    assert r.returncode == 0, r.stderr
    sim = _cli("simulate", "--trace", str(csv), "--cluster", str(ROOT / "cluster_spec" / "n8g8.csv"), "--policy",
               "fifo", "--out", str(tmp_path / "run"), "--json")
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["jobs"] == 3
