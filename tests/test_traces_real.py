"""Every real trace file inspected, with record and anomaly counts checked against shell one-liners.

Each expected number was computed independently of hpcsched with the command in the comment next
to it (run in ``trace-data/``; ``Z=zcat``). RICC is not bundled: its cases skip unless
``../shared/trace-data`` is present.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from hpcsched.errors import InputError
from hpcsched.model import Job, JobStatus
from hpcsched.traces import FORMATS, open_trace, read_jobs
from hpcsched.traces.cli import inspect_trace

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "trace-data"
SHARED = ROOT.parent / "shared" / "trace-data"
RICC = SHARED / "swf" / "RICC-2010-2.swf.gz"
needs_ricc = pytest.mark.skipif(not RICC.exists(), reason="RICC is not bundled; needs ../shared/trace-data")


@cache
def inspected(rel: str) -> dict[str, Any]:
    """One streaming pass per file for the whole module (the big ones take seconds)."""
    path = BUNDLED / rel if (BUNDLED / rel).exists() else SHARED / rel
    if not path.exists():
        pytest.skip(f"{rel} not present")
    return inspect_trace(path)


# file -> (format, records, anomaly counts). No anomaly kind may appear that is not listed.
EXPECTED: dict[str, tuple[str, int, dict[str, int]]] = {
    # $Z swf/KTH...gz | awk '!/^;/&&NF' | wc -l -> 28476
    # ... | awk '!/^;/&&NF&&$4>$9&&$9>0' | wc -l -> 475 ;  '$4==0' -> 8
    # unknown (-1 in fields 3,4,5,8,9,11): '{for(i in a)if($a[i]==-1)n++}' with a=3,4,5,8,9,11 -> 2 (5 and 8 of one job)
    "swf/KTH-SP2-1996-2.1-cln.swf.gz": (
        "swf", 28476, {"runtime_over_request": 475, "zero_runtime": 8, "unknown_field": 2}),
    # $Z swf/alea-wagap-2013.swf.gz | wc -l -> 17900 ; awk '$4<0' -> 2 ; awk '$4>$9&&$9>0' -> 702
    "swf/alea-wagap-2013.swf.gz": ("swf-pbs", 17900, {"negative_runtime": 2, "runtime_over_request": 702}),
    # $Z swf/RICC-2010-2.swf.gz | awk '!/^;/&&NF' | wc -l -> 447794 ; '$4>$9&&$9>0' -> 7092 ; '$4==0' -> 10
    # unknown: '$8==-1' -> 2, '$9==-1' -> 2, fields 3,4,5,11 never -1
    "swf/RICC-2010-2.swf.gz": (
        "swf", 447794, {"runtime_over_request": 7092, "zero_runtime": 10, "unknown_field": 4}),
    # $Z cobalt/theta...gz | awk -F, 'NR>1' | wc -l -> 14374 ; awk -F, 'NR>1&&$11>$12' -> 2979
    # unsorted (submit below the running max): awk -F, 'NR>1{if(NR>2&&$9<m)u++;if(NR==2||$9>m)m=$9}END{print u}' -> 7342
    "cobalt/theta-2022-2023.csv.gz": ("cobalt", 14374, {"runtime_over_request": 2979, "unsorted_submit": 7342}),
    # $Z philly/philly-sia.csv.gz | awk -F, 'NR>1&&NF' | wc -l -> 82247
    # awk -F, 'NR>1&&NF{if(NR>2&&$1<m)u++;if(NR==2||$1>m)m=$1}END{print u}' -> 82242 (ISO strings sort as times)
    "philly/philly-sia.csv.gz": ("philly", 82247, {"unsorted_submit": 82242}),
    # awk -F, 'NR>1' slurm/eagle-sacct-sample.csv | wc -l -> 1000
    # awk -F, 'NR>1{if($1 in s)d++;s[$1]=1}END{print d}' -> 451 ; awk -F, 'NR>1&&$14>$6' -> 14
    "slurm/eagle-sacct-sample.csv": ("slurm-csv", 1000, {"duplicate_id": 451, "runtime_over_request": 14}),
    # $Z bftrainer/idle-intervals.csv.gz | awk -F, 'NR>1' | wc -l -> 423502 ; awk -F, '$3==-1' -> 148
    "bftrainer/idle-intervals.csv.gz": ("bftrainer-idle", 423502, {"censored": 148}),
    # wc -l bftrainer/node-order.txt -> 4734
    "bftrainer/node-order.txt": ("bftrainer-nodes", 4734, {}),
    # awk -F, 'NR>1' FILE | wc -l for each BFTrainer table
    "bftrainer/ImageNet-imgps-Jbnd-1001J.csv": ("bftrainer-bounds", 1001, {}),
    "bftrainer/ImageNet-imgps-JNPs-1001J.csv": ("bftrainer-curves", 1001, {}),
    "bftrainer/hps-shufflenet-Jbnd-1000J.csv": ("bftrainer-bounds", 1000, {}),
    "bftrainer/hps-shufflenet-JNPs-1000J.csv": ("bftrainer-curves", 1000, {}),
    "bftrainer/hps-shufflenet-Jbnd-10J.csv": ("bftrainer-bounds", 10, {}),
    "bftrainer/hps-shufflenet-JNPs-10J.csv": ("bftrainer-curves", 10, {}),
    # awk -F, 'NR>1&&NF' muri/FILE | wc -l ; unsorted/dup/zero duration by awk on $3/$1/$7 -> 0 for all
    "muri/cluster_trace.csv": ("muri", 400, {}),
    "muri/job_type_1.csv": ("muri", 992, {}),
    "muri/job_type_2.csv": ("muri", 992, {}),
    "muri/job_type_3.csv": ("muri", 992, {}),
    "muri/trace1.csv": ("muri", 1494, {}),
    "muri/trace1_pr.csv": ("muri", 1494, {}),
    "muri/trace2.csv": ("muri", 5755, {}),
    "muri/trace2_pr.csv": ("muri", 5755, {}),
    "muri/trace3.csv": ("muri", 992, {}),
    "muri/trace3_pr.csv": ("muri", 992, {}),
    "muri/trace4.csv": ("muri", 2638, {}),
    "muri/trace4_pr.csv": ("muri", 2638, {}),
    "muri/n8g8.csv": ("muri-cluster", 1, {}),
    # wc -l -> 61 (header + 60)
    "philly/tiresias-60_job.csv": ("tiresias", 60, {}),
    # two job objects, one per line
    "philly/philly-joblog-readme.json": ("philly-joblog", 2, {}),
    # awk -F, 'NR>1&&$4>0' -> 193 GPU pods; minus 15 Pending (never scheduled) -> 178; Running (censored) -> 101
    "alibaba/openb_pod_list_default-head200.csv": ("alibaba-pod", 178, {"censored": 101}),
    # 6 task rows, two of them one job's; 3 rows submitted before the row above
    "alibaba/pai_task_table-sample.csv": ("alibaba-pai", 5, {"unsorted_submit": 3}),
    "alibaba/pai_job_table-sample.csv": ("alibaba-pai-job", 6, {"unknown_field": 1, "unsorted_submit": 3}),
    # wc -l -> 4 (header + 3)
    "helios/cluster_log-readme.csv": ("helios", 3, {}),
    # 3 rows: JobID 32650736 and its .batch / .extern steps; its Elapsed 01:00:06 > Timelimit 01:00:00 -> 1
    "slurm/sacct-allcols-cedar-2019.tsv": ("slurm-sacct", 1, {"runtime_over_request": 1}),
    # grep -cE ';[ER];' -> 4 (jobs that ended or were requeued)
    "pbs/casper-pbs-records.log": ("pbs-accounting", 4, {"zero_runtime": 1}),
    # awk -F'\t' 'NF==10&&$7>=1' gavel/A_120jobs_0.5jph_seed0.trace | wc -l -> 120 (cut -f7: 80/17/16/7)
    # sorted arrivals: awk -F'\t' 'NR>1&&$10<p{u++}{p=$10}END{print u+0}' -> 0 ; zero steps: awk -F'\t' '$6==0' -> 0
    "gavel/A_120jobs_0.5jph_seed0.trace": ("gavel", 120, {}),
    # the same one-liners on gavel/A4_120jobs_0.5jph_seed0_sfmax4.trace -> 120, 0, 0 (scale factors 80/17/23)
    "gavel/A4_120jobs_0.5jph_seed0_sfmax4.trace": ("gavel", 120, {}),
    # the same one-liners on gavel/B_80jobs_1jph_seed1_sfmax4.trace -> 80, 0, 0 (scale factors 58/4/18),
    # gavel/C_100jobs_1jph_seed2.trace -> 100, 0, 0 (71/7/19/3), gavel/D4_120jobs_1jph_seed3_sfmax4.trace -> 120, 0, 0
    # (91/10/19)
    "gavel/B_80jobs_1jph_seed1_sfmax4.trace": ("gavel", 80, {}),
    "gavel/C_100jobs_1jph_seed2.trace": ("gavel", 100, {}),
    "gavel/D4_120jobs_1jph_seed3_sfmax4.trace": ("gavel", 120, {}),
}


def _all_files() -> list[str]:
    base = SHARED if SHARED.exists() else BUNDLED
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file() and p.name != "SOURCES.md")


def test_expected_table_covers_every_file() -> None:
    assert set(_all_files()) <= set(EXPECTED), "a trace file without checked counts"


@pytest.mark.parametrize("rel", sorted(EXPECTED), ids=lambda r: r.split("/")[-1])
def test_counts_match_independent_one_liners(rel: str) -> None:
    if rel == "swf/RICC-2010-2.swf.gz" and not RICC.exists():
        pytest.skip("RICC is not bundled; needs ../shared/trace-data")
    fmt, records, anomalies = EXPECTED[rel]
    info = inspected(rel)
    assert info["format"] == fmt
    assert info["jobs"] == records
    assert info["anomalies"] == anomalies


@needs_ricc
def test_ricc_machine_conversion_and_cancelled_jobs() -> None:
    info = inspected("swf/RICC-2010-2.swf.gz")
    assert info["machine"]["machine_nodes"] == 1024 and info["machine"]["machine_procs"] == 8192
    assert info["meta"]["cores_per_node"] == 8
    # $Z RICC...gz | awk '!/^;/&&NF&&$11==5&&$4>0' | wc -l -> 16237
    assert info["meta"]["cancelled_that_ran"] == 16237
    assert info["meta"]["unknown_fields"] == {"requested_procs": 2, "requested_time": 2}
    assert any("ceil(procs / 8" in c for c in info["conversions"])
    # $Z ... | awk '!/^;/&&NF{if(min==""||$2<min)min=$2; e=$2+$3+$4; if(e>max)max=e}END{print max-min}' -> 13218793
    assert info["span_s"] == 13218793
    assert info["size"]["p100"] == 1024


@needs_ricc
def test_ricc_first_job_fields() -> None:
    trace = open_trace(RICC)
    job = next(iter(trace))
    # line 21: "1 0 0 222 80 -1 -1 80 14400 1200000 1 1 1 -1 1 -1 -1 -1", UnixStartTime 1272639895
    assert (job.id, job.submit, job.duration, job.procs, job.nodes) == ("1", 1272639895.0, 222.0, 80, 10)
    assert (job.requested, job.start, job.end, job.status) == (14400.0, 1272639895.0, 1272640117.0,
                                                               JobStatus.COMPLETED)
    assert job.extra["line"] == 21


@cache
def jobs_of(rel: str) -> list[Job]:
    return read_jobs(BUNDLED / rel)


def test_swf_status_mapping_keeps_cancelled_and_failed() -> None:
    jobs = jobs_of("swf/KTH-SP2-1996-2.1-cln.swf.gz")
    by = {s: sum(j.status is s for j in jobs) for s in JobStatus}
    # $Z KTH...gz | awk '!/^;/&&NF{print $11}' | sort | uniq -c -> 1: 20530, 0: 7946
    assert by[JobStatus.COMPLETED] == 20530 and by[JobStatus.FAILED] == 7946
    assert jobs[0].submit == 843480031 + 599850  # UnixStartTime + field 2 of the first job (id 15)


def test_wagap_nodes_from_cpu_ids_and_negative_runs_unknown() -> None:
    trace = open_trace(BUNDLED / "swf" / "alea-wagap-2013.swf.gz")
    jobs = list(trace)
    # field 19 lists a node id per CPU; jobs with 8 distinct ids -> 118:
    # $Z alea...gz | awk '{gsub(/[{}]/,"",$19);n=split($19,a,",");delete s;k=0;
    #   for(i=1;i<=n;i++)if(!(a[i] in s)){s[a[i]]=1;k++};c[k]++}END{print c[8]}'
    assert sum(j.nodes == 8 for j in jobs) == 118
    first = jobs[0]
    assert (first.id, first.submit, first.procs, first.nodes, first.queue) == ("0", 1356996147.0, 64, 1, "q_1d")
    neg = [j for j in jobs if j.id in ("4185", "4199")]
    assert [j.duration for j in neg] == [None, None] and all(j.end is None for j in neg)
    assert trace.report.first_lines["negative_runtime"] == 4186


def test_cores_per_node_option_changes_node_counts() -> None:
    jobs = read_jobs(BUNDLED / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz", options={"cores_per_node": 4})
    # first job (id 15) used 4 procs -> 1 node of 4 cores; header says 1 core per node otherwise
    assert (jobs[0].procs, jobs[0].nodes) == (4, 1)


def test_eagle_duplicates_made_unique_and_times_exact() -> None:
    jobs = jobs_of("slurm/eagle-sacct-sample.csv")
    assert len({j.id for j in jobs}) == 1000
    arr = [j for j in jobs if j.id.split("#")[0] == "532939"]
    # awk -F, '$1==532939' eagle-sacct-sample.csv | wc -l -> 452
    assert len(arr) == 452
    first = jobs[0]
    # row 2: submit 2019-01-01 08:55:55, start +1 s, end 2019-01-02 12:39:41, run_time 99825, wallclock_req 172800
    assert first.start - first.submit == 1 and first.end - first.start == first.duration == 99825
    assert (first.nodes, first.procs, first.requested, first.status) == (10, 10, 172800.0, JobStatus.COMPLETED)
    # awk -F, 'NR>1{print $15}' | sort | uniq -c -> COMPLETED 985, TIMEOUT 15
    assert sum(j.status is JobStatus.TIMEOUT for j in jobs) == 15


def test_theta_whole_machine_jobs_and_status() -> None:
    jobs = jobs_of("cobalt/theta-2022-2023.csv.gz")
    # awk -F, 'NR>1&&$8==4392' -> 3 ; awk -F, 'NR>1{print $14}' | sort | uniq -c -> Pass 8932 Killed 4258 Failed 1184
    assert sum(j.nodes == 4392 for j in jobs) == 3
    assert sum(j.status is JobStatus.CANCELLED for j in jobs) == 4258
    assert sum(j.status is JobStatus.FAILED for j in jobs) == 1184
    # row 2: submit 1672529301, wait 71, run 3632.92, wall 3600
    j = jobs[0]
    assert (j.id, j.submit, j.start, j.duration, j.requested, j.nodes) == (
        "639487", 1672529301.0, 1672529372.0, 3632.92, 3600.0, 8)


def test_theta_machine_override_finds_larger_jobs() -> None:
    trace = open_trace(BUNDLED / "cobalt" / "theta-2022-2023.csv.gz", options={"machine_nodes": 4096})
    list(trace)
    # $Z cobalt/theta...gz | awk -F, 'NR>1&&$8>4096' | wc -l -> 8 (5 of 4391 nodes, 3 of 4392)
    assert trace.report.anomalies["larger_than_machine"] == 8


def test_philly_gpus_and_epoch_submit() -> None:
    jobs = jobs_of("philly/philly-sia.csv.gz")
    # $Z philly/philly-sia.csv.gz | awk -F, 'NR>1&&NF{s+=$3}END{print s}' -> 107235
    assert sum(j.gpus for j in jobs) == 107235
    assert jobs[0].submit == 1507532515.0  # 2017-10-09 07:01:55 read as UTC: date -u -d '...' +%s
    assert (jobs[0].id, jobs[0].duration, jobs[0].queue) == ("1", 66.0, "11cb48")


def test_every_format_reports_units() -> None:
    for rel in ("swf/KTH-SP2-1996-2.1-cln.swf.gz", "cobalt/theta-2022-2023.csv.gz", "philly/philly-sia.csv.gz",
                "slurm/eagle-sacct-sample.csv", "muri/trace3.csv"):
        assert inspected(rel)["conversions"], rel


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcsched.cli", "trace", "inspect", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_json_contract_and_strict_exit_code() -> None:
    out = _cli(str(BUNDLED / "swf" / "alea-wagap-2013.swf.gz"), "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert {"format", "jobs", "span_s", "anomalies"} <= set(info)
    assert info["anomalies"]["negative_runtime"] == 2
    strict = _cli(str(BUNDLED / "swf" / "alea-wagap-2013.swf.gz"), "--strict")
    assert strict.returncode == 2 and "Traceback" not in strict.stderr
    # $Z alea...gz | awk '$4>$9&&$9>0{print NR; exit}' -> 17 (run 86439 s, request 86400 s)
    assert "alea-wagap-2013.swf.gz:17: runtime_over_request" in strict.stderr


def test_cli_bad_files_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty.swf"
    empty.write_text("")
    garbage = tmp_path / "garbage.csv"
    garbage.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    for f, words in ((empty, "empty file"), (garbage, "binary data")):
        r = _cli(str(f))
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _cli(str(BUNDLED / "muri" / "trace3.csv"), "--format", "nope")
    assert r.returncode == 2 and "unknown format" in r.stderr


def test_truncated_gzip_names_line(tmp_path: Path) -> None:
    data = (BUNDLED / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz").read_bytes()
    cut = tmp_path / "cut.swf.gz"
    cut.write_bytes(data[: len(data) // 2])
    trace = open_trace(cut)
    n = 0
    with pytest.raises(InputError) as e:
        for _ in trace:
            n += 1
    assert "truncated" in e.value.message and e.value.line is not None and e.value.line > n > 10000


def test_wrong_format_forced_is_one_error() -> None:
    with pytest.raises(InputError) as e:
        list(open_trace(BUNDLED / "muri" / "trace3.csv", fmt="swf"))
    # every row has 1 whitespace field where SWF needs 18: one error at the first, not 993 skipped rows
    assert e.value.line == 1 and "not readable as swf" in e.value.message
    assert set(FORMATS) >= {"swf", "swf-pbs", "slurm-csv", "slurm-sacct", "slurm-jobcomp", "cobalt", "philly",
                            "muri", "bftrainer-idle", "bftrainer-bounds", "bftrainer-curves", "bftrainer-nodes"}
