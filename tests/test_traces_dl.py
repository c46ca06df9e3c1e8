"""DL cluster trace readers (issue 17): Philly raw log and Tiresias CSV, Alibaba v2023 pods and v2020 PAI, Helios.

Three kinds of test: the bundled real samples (expected numbers worked out by hand or by the shell
one-liner in the comment, run in ``trace-data/``), hand-written files for each rule, and property tests
(any generated job log reads back to what a reference computation says; damaged input gives records or
the one InputError).
"""

from __future__ import annotations

import gzip
import json
import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcsched.errors import InputError
from hpcsched.model import JobStatus
from hpcsched.traces import FORMATS, detect_format, open_trace, read_jobs
from hpcsched.traces.synth import MODELS, pick_model

DATA = Path(__file__).resolve().parents[1] / "trace-data"
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def _read(path: Path, fmt: str | None = None, **options: object) -> tuple[list, object]:
    trace = open_trace(path, fmt, options=dict(options) if options else None)
    jobs = list(trace)
    return jobs, trace.report


# ------------------------------------------------------------------------------------------ real samples


def test_philly_joblog_real_sample() -> None:
    jobs, rep = _read(DATA / "philly" / "philly-joblog-readme.json")
    assert rep.format == "philly-joblog" and [j.id for j in jobs] == ["application_1506638472019_10238",
                                                                     "application_1506638472019_14199"]
    a, b = jobs
    # date -u -d '2017-10-05 14:49:31' +%s -> 1507214971; first attempt lists 4 + 4 GPUs on m193 and m287
    assert (a.submit, a.gpus, a.status, a.queue, a.user) == (1507214971, 8, JobStatus.COMPLETED, "2869ce", "e4f747")
    # attempt 2 (Oct 8 09:24:12 - 21:08:07) lies inside attempt 1 (Oct 5 14:50:06 - Oct 8 21:08:07): 3 d 6:18:01
    assert a.duration == 3 * 86400 + 6 * 3600 + 18 * 60 + 1 and a.extra["machines"] == 2
    # 01:12:09-01:13:23 (74 s) + Oct 7 01:13:30 - Oct 9 06:53:12 (2 d 5:39:42)
    assert b.duration == 74 + 2 * 86400 + 5 * 3600 + 39 * 60 + 42
    assert b.start == _epoch("2017-10-07 01:12:09") and b.end == _epoch("2017-10-09 06:53:12")
    assert rep.meta["attempts"] == {"gpus_differ": 0, "missing_times": 0, "overlapping": 1}
    assert rep.meta["filled"] == {"model": 2, "iterations": 2, "profile": 2} and not rep.anomalies
    assert a.model == pick_model(a.id) and a.iterations * a.iteration_time == pytest.approx(a.duration)


def test_tiresias_real_sample() -> None:
    jobs, rep = _read(DATA / "philly" / "tiresias-60_job.csv")
    assert rep.format == "tiresias" and len(jobs) == 60 and not rep.anomalies
    # row 2: 0,1,0,606,vgg19,164,30 (seconds, not Muri's milliseconds)
    j = jobs[0]
    assert (j.id, j.gpus, j.submit, j.iterations, j.model, j.duration) == ("0", 1, 0.0, 606, "vgg19", 164.0)
    assert j.iteration_time == pytest.approx(164 / 606)
    m = MODELS["vgg19"]
    assert j.profile.compute_s / j.profile.data_s == pytest.approx(m.compute_ms / m.data_ms)
    # awk -F, 'NR>1{s+=$2}END{print s}' philly/tiresias-60_job.csv -> 170
    assert sum(j.gpus for j in jobs) == 170
    # models are named, iterations given: only profiles are filled (inception3/4, googlenet... are not in the table)
    assert rep.meta["filled"] == {"model": 0, "iterations": 0, "profile": 60}


def test_alibaba_pods_real_sample() -> None:
    jobs, rep = _read(DATA / "alibaba" / "openb_pod_list_default-head200.csv")
    assert rep.format == "alibaba-pod" and rep.meta["time_base"] == "relative"
    f = "openb_pod_list_default-head200.csv"
    # awk -F, 'NR>1&&$11==""' F | wc -l -> 15 (Pending, never scheduled); 'NR>1&&$11!=""&&$4==0' -> 7 (CPU only)
    assert rep.meta["skipped"] == {"never_scheduled": 15, "cpu_only": 7, "fractional_gpu": 0}, f
    # 'NR>1&&$11!=""&&$4>0' -> 178 jobs; '...&&$5<1000' -> 60 fractional; '...&&$8=="Running"' -> 101 censored
    assert len(jobs) == 178 and rep.meta["fractional_gpu"] == 60 and dict(rep.anomalies) == {"censored": 101}
    # '...&&$4>0{s+=$4}' -> 192: a fraction of one GPU rounds up to exactly that one GPU
    assert sum(j.gpus for j in jobs) == 192
    # row 2: openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0
    j = jobs[0]
    assert (j.id, j.gpus, j.procs, j.submit, j.start, j.end, j.duration, j.status, j.queue) == (
        "openb-pod-0000", 1, 12, 0.0, 0.0, 12537496.0, 12537496.0, JobStatus.RUNNING, "LS")
    frac = next(j for j in jobs if j.id == "openb-pod-0001")  # 6000,12288,1,460: 0.46 of a GPU
    assert frac.gpus == 1 and frac.extra["gpu_share"] == pytest.approx(0.46)


def test_alibaba_pai_real_sample_joins_the_job_table() -> None:
    jobs, rep = _read(DATA / "alibaba" / "pai_task_table-sample.csv")
    assert rep.format == "alibaba-pai" and [j.id for j in jobs] == [
        "c936346f45eccd34bf748541", "455c3dec270f4777ad67721c", "ba64aa2f0feff18428923e92",
        "704783be2a4b7f88b8d2e4ee", "4f057009a5d481acec67b088"]
    by = {j.id: j for j in jobs}
    # worker: 100 instances x 10 % of a GPU = 10 GPUs; ps: no GPU. Job row: Failed, submitted 2172974, ended 2173216
    j = by["704783be2a4b7f88b8d2e4ee"]
    assert (j.gpus, j.submit, j.start, j.end, j.status, j.user) == (10, 2172974.0, 2172974.0, 2173216.0,
                                                                    JobStatus.FAILED, "cfcb2e0deb93")
    assert j.extra["tasks"] == 2 and j.procs == math.ceil(100 * 6 + 10 * 6)
    # 50 % of one GPU -> 1 whole GPU, counted; 4f05... has no job row (the README's task example): submit = start
    assert by["c936346f45eccd34bf748541"].gpus == 1 and by["c936346f45eccd34bf748541"].duration == 2612.0
    assert by["4f057009a5d481acec67b088"].submit == 1739162.0
    assert rep.meta["fractional_gpu"] == 3
    assert rep.meta["pai_join"] == {"jobs_in_job_table": 6, "matched": 4, "submit_from_task_start": 1}
    assert dict(rep.anomalies) == {"unsorted_submit": 3}


def test_alibaba_pai_job_table_alone() -> None:
    jobs, rep = _read(DATA / "alibaba" / "pai_job_table-sample.csv")
    assert rep.format == "alibaba-pai-job" and len(jobs) == 6 and all(j.gpus == 0 for j in jobs)
    assert rep.meta["gpus_unknown"] == 6
    # bce3...: Failed with no end_time -> unknown; submit = start_time (the submission)
    j = next(j for j in jobs if j.id == "bce3b9c55772f9d1e85fe796")
    assert (j.submit, j.end, j.duration, j.status) == (2374681.0, None, None, JobStatus.FAILED)
    assert dict(rep.anomalies) == {"unknown_field": 1, "unsorted_submit": 3}


def test_helios_real_sample() -> None:
    jobs, rep = _read(DATA / "helios" / "cluster_log-readme.csv")
    assert rep.format == "helios" and [j.id for j in jobs] == ["1425511", "1425512", "1425513"]
    j = jobs[2]  # 2020-06-09 18:41:28 -> 2020-06-17 14:15:21: 675233 s
    assert (j.submit, j.gpus, j.procs, j.nodes, j.duration, j.status, j.queue, j.user) == (
        _epoch("2020-06-09 18:41:28"), 1, 1, 1, 675233.0, JobStatus.CANCELLED, "vcpDC", "uzqls")
    assert jobs[0].submit == 1591728061  # date -u -d '2020-06-09 18:41:01' +%s
    assert [j.status for j in jobs[:2]] == [JobStatus.COMPLETED, JobStatus.FAILED]
    assert rep.meta["duration_mismatch"] == 0 and not rep.anomalies


@pytest.mark.parametrize("rel", ["philly/philly-joblog-readme.json", "philly/tiresias-60_job.csv",
                                 "alibaba/openb_pod_list_default-head200.csv", "alibaba/pai_task_table-sample.csv",
                                 "helios/cluster_log-readme.csv"])
def test_every_dl_sample_loads_for_the_simulator(rel: str) -> None:
    """What ``simulate`` needs: >= 1 GPU and a duration or iterations for every job, profiles filled."""
    from hpcsched.sim.runs import load_jobs

    jobs, _ = load_jobs(DATA / rel)
    assert jobs and all(j.gpus >= 1 and j.profile is not None and j.iterations for j in jobs)


def test_sia_philly_layout_unchanged() -> None:
    """The existing Sia layout keeps its exact reading: no fill rule, ids are row numbers."""
    trace = open_trace(DATA / "philly" / "philly-sia.csv.gz")
    first = next(iter(trace))
    assert (first.id, first.submit, first.duration, first.gpus, first.queue) == ("1", 1507532515.0, 66.0, 1, "11cb48")
    assert first.model is None and first.profile is None and first.iterations is None


# ----------------------------------------------------------------------------------------- hand-written


def _job(jid: str, attempts: list[dict], submit: str = "2017-10-01 00:00:00", status: str = "Pass") -> dict:
    return {"status": status, "vc": "vc1", "jobid": jid, "attempts": attempts, "submitted_time": submit, "user": "u"}


def _attempt(start: str | None, end: str | None, gpus: int = 1, machines: int = 1) -> dict:
    per = max(1, gpus // machines)
    return {"start_time": start if start is not None else "None", "end_time": end if end is not None else "None",
            "detail": [{"ip": f"m{k}", "gpus": [f"gpu{g}" for g in range(per)]} for k in range(machines)]}


def test_joblog_rules_and_damage(tmp_path: Path) -> None:
    good = _job("a", [_attempt("2017-10-01 00:01:00", "2017-10-01 00:11:00", gpus=2)])
    never = _job("b", [])  # killed before it was scheduled: skipped
    running = _job("c", [_attempt("2017-10-01 01:00:00", "2017-10-01 02:00:00", 4, 2),
                         _attempt("2017-10-01 03:00:00", None, 8)])  # still running: censored, GPUs differ
    nulls = _job("d", [{"start_time": None, "end_time": None, "detail": []}])  # JSON null times: no run time
    text = "[\n" + ",\n".join(json.dumps(j) for j in (good, never)) + ",\n"
    text += '{"status": "Pass", "jobid": "broken", "attempts": [{"start_time": }]},\n'  # does not parse
    text += ",\n".join(json.dumps(j) for j in (running, nulls)) + "\n]\n"
    f = tmp_path / "cluster_job_log"
    f.write_text(text)
    assert detect_format(f).name == "philly-joblog"
    jobs, rep = _read(f)
    assert [j.id for j in jobs] == ["a", "c"]
    assert jobs[0].gpus == 2 and jobs[0].duration == 600 and jobs[0].extra["line"] == 2
    assert jobs[1].gpus == 4 and jobs[1].duration == 3600 and jobs[1].end is None
    assert rep.anomalies == {"malformed_row": 1, "unknown_field": 1, "censored": 1}
    assert rep.first_lines["malformed_row"] == 4 and rep.first_lines["censored"] == 5
    assert rep.meta["skipped"] == {"no_attempts": 1, "no_run_time": 1}
    assert rep.meta["attempts"]["gpus_differ"] == 1


@pytest.mark.parametrize("layout", ["lines", "indent", "compact", "gzip"])
def test_joblog_layouts_across_blocks(tmp_path: Path, layout: str) -> None:
    """Several MB so objects straddle the 1 MB read blocks; every layout reads the same jobs and lines."""
    jobs = [_job(f"j{i}", [_attempt("2017-10-01 00:00:00", "2017-10-01 01:00:00", 1 + i % 8)] * (1 + i % 3))
            for i in range(6000)]
    if layout == "lines":
        text = "\n".join(json.dumps(j) for j in jobs) + "\n"
    elif layout == "indent":
        text = json.dumps(jobs, indent=4)
    else:
        text = json.dumps(jobs)
    f = tmp_path / ("log.json.gz" if layout == "gzip" else "log.json")
    f.write_bytes(gzip.compress(text.encode()) if layout == "gzip" else text.encode())
    got, rep = _read(f, "philly-joblog")
    assert [j.id for j in got] == [j["jobid"] for j in jobs] and not rep.anomalies
    assert [j.gpus for j in got] == [1 + i % 8 for i in range(6000)]
    if layout == "lines":
        assert [j.extra["line"] for j in got[:3]] == [1, 2, 3] and got[-1].extra["line"] == 6000
    if layout == "indent":  # each object starts on its own line: its '{' line is what is reported
        assert got[0].extra["line"] == 2 and got[1].extra["line"] > got[0].extra["line"]


def test_joblog_one_huge_line_needs_format(tmp_path: Path) -> None:
    f = tmp_path / "one.json"
    f.write_text(json.dumps([_job("x", [_attempt("2017-10-01 00:00:00", "2017-10-01 00:00:10")])]))
    assert [j.id for j in read_jobs(f, "philly-joblog")] == ["x"]
    assert detect_format(f).name == "philly-joblog"  # short: detected too


def test_tiresias_vs_muri_detection(tmp_path: Path) -> None:
    assert detect_format(DATA / "muri" / "trace3.csv").name == "muri"  # ms layout keeps its reader
    f = tmp_path / "t.csv"
    f.write_text("job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n0,2,5,0,resnet18,100,3\n")
    (j,), rep = _read(f)
    assert rep.format == "tiresias" and j.submit == 5.0 and j.duration == 100.0  # seconds
    assert j.iterations == round(100_000 / MODELS["resnet18"].iteration_ms)  # 0 iterations: filled
    assert rep.meta["filled"]["iterations"] == 1


def test_pods_gpu_fraction_and_cpu_options(tmp_path: Path) -> None:
    f = tmp_path / "pods.csv"
    f.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
                 "scheduled_time\n"
                 "p1,4000,1,1,250,V100M16|V100M32,BE,Succeeded,10,110,20\n"
                 "p2,4000,1,0,0,,LS,Failed,11,50,12\n"
                 "p3,4000,1,2,1000,,LS,Succeeded,12,60,13\n"
                 "p4,4000,1,1,1500,,LS,Succeeded,12,60,13\n")
    jobs, rep = _read(f)
    assert [(j.id, j.gpus, j.duration) for j in jobs] == [("p1", 1, 90.0), ("p3", 2, 47.0)]
    assert jobs[0].extra["gpu_spec"] == "V100M16|V100M32" and rep.anomalies == {"malformed_row": 1}
    jobs, rep = _read(f, gpu_fraction="drop", cpu_jobs="keep")
    assert [(j.id, j.gpus) for j in jobs] == [("p2", 0), ("p3", 2)]
    assert rep.meta["skipped"]["fractional_gpu"] == 1 and rep.meta["fractional_gpu"] == 1
    with pytest.raises(InputError, match="gpu_fraction"):
        _read(f, gpu_fraction="share")


def test_pai_header_split_jobs_and_no_sibling(tmp_path: Path) -> None:
    f = tmp_path / "pai_task_table.csv"
    f.write_text("job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type\n"
                 "j1,worker,2.0,Terminated,100.0,200.0,600.0,1.0,100.0,T4\n"
                 "j2,ps,1.0,Terminated,150.0,300.0,600.0,1.0,,\n"  # no GPU at all: CPU only
                 "j1,evaluator,1.0,Terminated,120.0,220.0,600.0,1.0,50.0,T4\n"  # j1 again, apart: a second job
                 "j3,worker,1.0,Waiting,,,600.0,1.0,100.0,\n")  # never started
    jobs, rep = _read(f)
    assert [(j.id, j.gpus, j.submit, j.duration) for j in jobs] == [("j1", 2, 100.0, 100.0), ("j1#2", 1, 120.0, 100.0)]
    assert rep.anomalies == {"duplicate_id": 1} and rep.meta["fractional_gpu"] == 1
    assert rep.meta["skipped"]["cpu_only"] == 1 and rep.meta["skipped"]["never_started"] == 1
    assert rep.meta["pai_join"]["submit_from_task_start"] == 2
    (tmp_path / "pai_job_table.csv").write_bytes(b"\x00\x01garbage")  # an unreadable sibling is not joined
    jobs, rep = _read(f)
    assert len(jobs) == 2 and "pai_job_table_error" in rep.meta


def test_helios_states_cpu_jobs_and_jobname(tmp_path: Path) -> None:
    f = tmp_path / "cluster_log.csv"
    f.write_text("job_id,user,vc,jobname,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,"
                 "queue\n"
                 "1,u1,vcA,train_r50,8,32,1,NODE_FAIL,2020-09-01 00:00:00,2020-09-01 00:00:10,2020-09-01 01:00:10,"
                 "3600,10\n"
                 "2,u1,vcA,prep,0,4,1,COMPLETED,2020-09-01 00:00:00,2020-09-01 00:00:00,2020-09-01 00:01:00,60,0\n"
                 "3,u2,vcB,x,4,8,1,PENDING,2020-09-01 00:00:00,,,,\n"
                 "4,u2,vcB,y,16,64,2,RUNNING,2020-09-01 00:00:00,2020-09-01 00:00:00,2020-09-01 00:10:00,500,0\n")
    jobs, rep = _read(f)
    assert [(j.id, j.status, j.gpus, j.nodes) for j in jobs] == [("1", JobStatus.FAILED, 8, 1),
                                                                 ("4", JobStatus.RUNNING, 16, 2)]
    assert jobs[0].extra["jobname"] == "train_r50" and jobs[0].model in MODELS
    assert rep.meta["skipped"] == {"cpu_only": 1, "never_ran": 1} and rep.meta["duration_mismatch"] == 1
    assert rep.anomalies == {"censored": 1}
    assert [j.id for j in read_jobs(f, options={"cpu_jobs": "keep"})] == ["1", "2", "4"]


def test_fill_rule_is_seeded_and_order_free(tmp_path: Path) -> None:
    rows = [f"{i},uX,vcA,1,1,1,COMPLETED,2020-09-01 00:00:00,2020-09-01 00:00:00,2020-09-01 01:00:00,3600,0"
            for i in range(200)]
    header = "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(header + "\n".join(rows) + "\n")
    b.write_text(header + "\n".join(reversed(rows)) + "\n")
    models = {j.id: j.model for j in read_jobs(a)}
    assert models == {j.id: j.model for j in read_jobs(b)}  # the file's order does not matter
    assert len(set(models.values())) == len(MODELS)  # 200 ids spread over all 8 models
    other = {j.id: j.model for j in read_jobs(a, options={"seed": 7})}
    assert other != models and other == {j.id: j.model for j in read_jobs(a, options={"seed": 7})}
    j = read_jobs(a)[0]
    assert j.iterations * j.iteration_time == pytest.approx(3600.0)


def test_bad_inputs_name_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "pods.csv"
    f.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
                 "scheduled_time\np1,1,1,x,1000,,LS,Running,0,1,0\n")
    with pytest.raises(InputError) as e:
        list(open_trace(f, strict=True))
    assert e.value.line == 2 and str(e.value).startswith(str(f))
    g = tmp_path / "empty_pai.csv"
    g.write_text("\n\n")
    with pytest.raises(InputError, match="empty"):
        list(open_trace(g, "alibaba-pai"))


# ------------------------------------------------------------------------------------------- properties

_TIMES = st.integers(1506800000, 1514000000)
_ATTEMPT = st.tuples(st.one_of(st.none(), _TIMES), st.one_of(st.none(), st.integers(0, 10**6)), st.integers(0, 16))


def _stamp(t: int | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _reference(attempts: list[tuple[int | None, int | None, int]]) -> tuple[int, float] | None:
    """(GPUs, run time) the reader must give, computed independently: union of complete attempts."""
    spans = sorted((s, s + d) for s, d, _ in attempts if s is not None and d is not None)
    if not spans:
        return None
    total, cur = 0, list(spans[0])
    for s, e in spans[1:]:
        if s > cur[1]:
            total += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    total += cur[1] - cur[0]
    gpus = next((g for _, _, g in attempts if g > 0), 0)
    return gpus, float(total)


@SETTINGS
@given(jobs=st.lists(st.lists(_ATTEMPT, max_size=4), min_size=1, max_size=12),
       layout=st.sampled_from(["lines", "indent", "compact"]))
def test_joblog_reads_what_a_reference_computes(tmp_path_factory: pytest.TempPathFactory,
                                                jobs: list[list[tuple[int | None, int | None, int]]],
                                                layout: str) -> None:
    objs = []
    for i, attempts in enumerate(jobs):
        objs.append(_job(f"j{i}", [{"start_time": _stamp(s), "end_time": _stamp(None if d is None or s is None
                                                                                   else s + d),
                                    "detail": [{"ip": "m1", "gpus": [f"gpu{k}" for k in range(g)]}] if g else []}
                                   for s, d, g in attempts]))
    text = ("\n".join(json.dumps(o) for o in objs) if layout == "lines"
            else json.dumps(objs, indent=2 if layout == "indent" else None))
    f = tmp_path_factory.mktemp("jl") / "log.json"
    f.write_text(text)
    got = {j.id: (j.gpus, j.duration) for j in read_jobs(f, "philly-joblog")}
    want = {f"j{i}": r for i, a in enumerate(jobs) if (r := _reference(a)) is not None}
    # a complete attempt whose end is before its start cannot happen here (d >= 0)
    assert got == want


@SETTINGS
@given(data=st.binary(max_size=3000), cut=st.integers(0, 4000), fmt=st.sampled_from(
    ["philly-joblog", "tiresias", "alibaba-pod", "alibaba-pai", "alibaba-pai-job", "helios"]))
def test_damaged_samples_give_records_or_one_error(tmp_path_factory: pytest.TempPathFactory, data: bytes, cut: int,
                                                   fmt: str) -> None:
    sample = {"philly-joblog": "philly/philly-joblog-readme.json", "tiresias": "philly/tiresias-60_job.csv",
              "alibaba-pod": "alibaba/openb_pod_list_default-head200.csv",
              "alibaba-pai": "alibaba/pai_task_table-sample.csv", "alibaba-pai-job": "alibaba/pai_job_table-sample.csv",
              "helios": "helios/cluster_log-readme.csv"}[fmt]
    blob = (DATA / sample).read_bytes()
    cut %= len(blob) + 1
    f = tmp_path_factory.mktemp("dmg") / Path(sample).name
    f.write_bytes(blob[:cut] + data + blob[cut:])
    try:
        jobs = list(open_trace(f, fmt))
    except InputError as e:
        assert str(e).startswith(str(f))
        return
    assert all(j.gpus >= 0 and (j.duration is None or math.isfinite(j.duration)) for j in jobs)


@SETTINGS
@given(rows=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 1000), st.sampled_from(
    ["Running", "Failed", "Succeeded", "Pending"]), st.integers(0, 10**7), st.integers(0, 10**6)), max_size=30))
def test_pods_counts_match_their_rows(tmp_path_factory: pytest.TempPathFactory,
                                      rows: list[tuple[int, int, str, int, int]]) -> None:
    lines = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
             "scheduled_time"]
    for i, (g, milli, phase, created, run) in enumerate(rows):
        sched = "" if phase == "Pending" else str(created + 5)
        lines.append(f"p{i},1000,1,{g},{milli},,LS,{phase},{created},{created + 5 + run},{sched}")
    f = tmp_path_factory.mktemp("pods") / "pods.csv"
    f.write_text("\n".join(lines) + "\n")
    trace = open_trace(f, "alibaba-pod")
    jobs = list(trace) if rows else []
    ran = [r for r in rows if r[2] != "Pending"]
    assert len(jobs) == sum(1 for r in ran if r[0] > 0)
    assert sum(j.gpus for j in jobs) == sum(r[0] for r in ran if r[0] > 0)
    assert trace.report.meta.get("fractional_gpu", 0) == sum(1 for r in ran if r[0] > 0 and 0 < r[1] < 1000)


def test_dl_formats_registered_and_aliased() -> None:
    assert {"tiresias", "philly-joblog", "alibaba-pod", "alibaba-pai", "alibaba-pai-job", "helios"} <= set(FORMATS)
    assert open_trace(DATA / "helios" / "cluster_log-readme.csv", "sensetime").format.name == "helios"
    assert open_trace(DATA / "alibaba" / "pai_task_table-sample.csv", "pai").format.name == "alibaba-pai"
