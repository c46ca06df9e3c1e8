"""sacct in every layout it prints, rows with the delimiter inside a field, and errors that name the problem.

The real sample ``trace-data/slurm/sacct-allcols-cedar-2019.tsv`` is ``sacct --array -P --delimiter=$'\\t'
--format=ALL`` from Compute Canada's cedar (1 job, its batch and extern steps; SOURCES.md): the issue's
case, tab-delimited ``-o all`` with ``Constraints [broadwell|skylake]``. Its '|' form is what ``sacct -P``
prints for the same rows. Property tests write random jobs in every delimiter and the fixed-width table
and read them back.
"""

from __future__ import annotations

import io
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcsched.errors import InputError
from hpcsched.model import Job, JobStatus
from hpcsched.traces import detect_format, open_trace, read_jobs
from hpcsched.traces.convert import write_jobs
from hpcsched.traces.slurm import delimiter_option

DATA = Path(__file__).resolve().parents[1] / "trace-data"
ALLCOLS = DATA / "slurm" / "sacct-allcols-cedar-2019.tsv"
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))

# The one job of the real sample, worked out from its row (line 2): Submit 2019-12-11T20:35:17 read as UTC
# (date -u -d 2019-12-11T20:35:17 +%s -> 1576096517), Start 20:36:18, End 21:36:24, ElapsedRaw 3606,
# TimelimitRaw 60 (minutes), AllocCPUS 1, NNodes 1, State TIMEOUT, NodeList cdr735, User icecube10.
CEDAR_JOB = ("32650736", 1576096517.0, 1576096578.0, 1576100184.0, 3606.0, 3600.0, 1, 1, 0, JobStatus.TIMEOUT,
             "icecube10", "cpubase_bycore_b1")


def _key(j: Job) -> tuple[object, ...]:
    return (j.id, j.submit, j.start, j.end, j.duration, j.requested, j.nodes, j.procs, j.gpus, j.status, j.user,
            j.queue)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    f = tmp_path / name
    f.write_text(text)
    return f


# ------------------------------------------------------------------------------------------- real sample
def test_real_tab_delimited_all_columns() -> None:
    trace = open_trace(ALLCOLS)
    assert trace.format.name == "slurm-sacct"
    (job,) = list(trace)  # 32650736.batch and .extern are steps of the job
    assert _key(job) == CEDAR_JOB
    assert job.extra["nodelist"] == ("cdr735",)
    r = trace.report
    assert r.meta["sacct_layout"] == "delimiter tab (-P), 108 columns" and r.meta["job_steps_skipped"] == 2
    assert r.anomalies == {"runtime_over_request": 1}  # 3606 s run on a 3600 s limit


@pytest.mark.parametrize("trailing", [False, True], ids=["P", "p"])
def test_real_rows_as_pipe_output_rejoin_the_constraint(tmp_path: Path, trailing: bool) -> None:
    """The same rows as ``sacct -P`` / ``-p`` print them: Constraints '[broadwell|skylake]' splits row 2."""
    end = "|" if trailing else ""
    text = "".join(line.replace("\t", "|") + end + "\n" for line in ALLCOLS.read_text().splitlines())
    f = _write(tmp_path, "allcols.psv", text)
    trace = open_trace(f)
    (job,) = list(trace)
    assert _key(job) == CEDAR_JOB
    r = trace.report
    assert r.anomalies == {"runtime_over_request": 1, "repaired_row": 1} and r.first_lines["repaired_row"] == 2
    assert r.first_details["repaired_row"] == "1 extra piece(s) rejoined in Constraints"


def test_forced_wrong_delimiter_names_the_real_one(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        list(open_trace(ALLCOLS, "slurm-sacct", options={"delimiter": "|"}))
    assert e.value.line == 1 and str(e.value).startswith(f"{ALLCOLS}:1: delimiter looks like tab but the header has "
                                                         "1 column")
    assert "--delimiter tab" in e.value.message


# ----------------------------------------------------------------------------------------------- layouts
HEADER = ["JobID", "JobName", "Partition", "Submit", "Start", "End", "ElapsedRaw", "NNodes", "State", "NodeList"]
ROWS = [["7", "train", "gpu", "2026-01-01T00:00:00", "2026-01-01T00:00:05", "2026-01-01T00:01:05", "60", "2",
         "COMPLETED", "n[1-2]"],
        ["8", "eval", "gpu", "2026-01-01T00:00:10", "2026-01-01T00:00:10", "2026-01-01T00:00:40", "30", "1",
         "FAILED", "n3"]]
EXPECTED = [("7", 1767225600.0, 60.0, 2, JobStatus.COMPLETED), ("8", 1767225610.0, 30.0, 1, JobStatus.FAILED)]


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(header)]
    lines = [header, ["-" * w for w in widths], *rows]
    return "".join(" ".join(v.rjust(w) for v, w in zip(line, widths, strict=True)) + " \n" for line in lines)


@pytest.mark.parametrize("delim", ["|", "\t", ",", ";", "☃", "::", "X"],
                         ids=["pipe", "tab", "comma", "semicolon", "snowman", "two-chars", "letter"])
@pytest.mark.parametrize("trailing", [False, True], ids=["P", "p"])
def test_every_delimiter_is_found_from_the_header(tmp_path: Path, delim: str, trailing: bool) -> None:
    end = delim if trailing else ""
    f = _write(tmp_path, "s.txt", "".join(delim.join(r) + end + "\n" for r in [HEADER, *ROWS]))
    # a clean comma file (no comma inside a field) is a CSV too, and the CSV reader gives the same jobs
    assert detect_format(f).name == "slurm-sacct" or delim == ","
    jobs = read_jobs(f)
    assert [(j.id, j.submit, j.duration, j.nodes, j.status) for j in jobs] == EXPECTED
    assert jobs[0].extra["nodelist"] == ("n1", "n2")


def test_fixed_width_table_and_its_cut_values(tmp_path: Path) -> None:
    f = _write(tmp_path, "t.txt", _table(HEADER, ROWS))
    assert [(j.id, j.submit, j.duration, j.nodes, j.status) for j in read_jobs(f)] == EXPECTED
    # sacct cuts a value at its column's width and marks the cut with '+': "OUT_OF_MEMORY" in 10 columns
    cut = _write(tmp_path, "cut.txt", "       JobID               Submit      State \n"
                                      "------------ ------------------- ---------- \n"
                                      "          9  2026-01-01T00:00:00 OUT_OF_ME+ \n"
                                      "12345678901+ 2026-01-01T00:00:00  COMPLETED \n")
    trace = open_trace(cut)
    a, b = list(trace)
    assert a.status is JobStatus.FAILED  # OUT_OF_ME+ is OUT_OF_MEMORY, the only state it can be
    assert b.id == "12345678901" and trace.report.anomalies["truncated_field"] == 1
    assert trace.report.first_lines["truncated_field"] == 4


def test_delimiter_given_as_an_option(tmp_path: Path) -> None:
    f = _write(tmp_path, "s.txt", "".join("\t".join(r) + "\n" for r in [HEADER, *ROWS]))
    assert len(read_jobs(f, options={"delimiter": "tab"})) == 2
    assert delimiter_option("\\t") == "\t" and delimiter_option("table") == "table" and delimiter_option(None) is None


def test_comma_delimited_sacct_with_commas_in_node_lists_goes_to_sacct(tmp_path: Path) -> None:
    """``sacct -P --delimiter=,``: unquoted commas in NodeList and AllocTRES; not a clean CSV, so sacct reads it."""
    header = "JobID,Submit,Start,End,State,AllocTRES,NodeList"
    row = "5,2026-01-01T00:00:00,2026-01-01T00:00:01,2026-01-01T00:00:11,COMPLETED,cpu=4,gres/gpu=2,node=2,n[1,3]"
    f = _write(tmp_path, "c.txt", f"{header}\n{row}\n")
    trace = open_trace(f)
    assert trace.format.name == "slurm-sacct"
    (job,) = list(trace)
    assert (job.gpus, job.nodes, job.extra["nodelist"]) == (2, 2, ("n1", "n3"))
    assert trace.report.anomalies["repaired_row"] == 1


# ----------------------------------------------------------------------------------------------- repairs
def _p2(*rows: list[str]) -> str:
    return "".join("|".join(r) + "\n" for r in rows)


def test_delimiter_in_job_name_and_comment(tmp_path: Path) -> None:
    header = ["JobID", "JobName", "Submit", "State", "Comment", "NNodes"]
    text = _p2(header, ["1", "a|b|c", "2026-01-01T00:00:00", "COMPLETED", "x|y", "3"])
    trace = open_trace(_write(tmp_path, "s.txt", text))
    (job,) = list(trace)
    assert (job.id, job.nodes, job.status) == ("1", 3, JobStatus.COMPLETED)
    assert trace.report.anomalies["repaired_row"] == 1


def test_ambiguous_rows_are_dropped_and_say_why(tmp_path: Path) -> None:
    """Two free-text fields next to a typed one that accepts any name: two readings disagree on the partition."""
    header = ["JobID", "JobName", "Partition", "Comment", "Submit"]
    text = _p2(header, ["1", "a", "b|gpu", "c", "2026-01-01T00:00:00"],
               ["2", "ok", "gpu", "fine", "2026-01-01T00:00:01"])
    trace = open_trace(_write(tmp_path, "s.txt", text))
    assert [j.id for j in trace] == ["2"]
    assert trace.report.anomalies["malformed_row"] == 1 and trace.report.first_lines["malformed_row"] == 2
    assert "more than one way" in trace.report.first_details["malformed_row"]


def test_extra_fields_with_no_free_text_column(tmp_path: Path) -> None:
    text = _p2(["JobID", "Submit", "State"], ["1", "2026-01-01T00:00:00", "COMPLETED", "x"],
               ["2", "2026-01-01T00:00:00", "COMPLETED"])
    trace = open_trace(_write(tmp_path, "s.txt", text))
    assert [j.id for j in trace] == ["2"]
    assert "no column can hold" in trace.report.first_details["malformed_row"]


def test_line_break_inside_a_field(tmp_path: Path) -> None:
    header = ["JobID", "Submit", "State", "SubmitLine", "NNodes"]
    text = _p2(header) + "1|2026-01-01T00:00:00|COMPLETED|sbatch --wrap='a\nb\nc'|4\n" + _p2(
        ["2", "2026-01-01T00:00:01", "FAILED", "sbatch x", "1"])
    trace = open_trace(_write(tmp_path, "s.txt", text))
    a, b = list(trace)
    assert (a.id, a.nodes, a.extra["line"], b.id) == ("1", 4, 2, "2")
    assert trace.report.first_details["repaired_row"] == "a field spans 3 lines"


def test_short_row_not_continued_is_malformed(tmp_path: Path) -> None:
    text = _p2(["JobID", "Submit", "State"], ["1", "2026-01-01T00:00:00"], ["2", "2026-01-01T00:00:00", "FAILED"],
               ["3"])
    trace = open_trace(_write(tmp_path, "s.txt", text))
    assert [j.id for j in trace] == ["2"]
    assert trace.report.anomalies["malformed_row"] == 2 and trace.report.first_lines["malformed_row"] == 2


# ------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("1|x|2026-01-01T00:00:00|COMPLETED\n", 1, "sacct -n/--noheader prints no header line"),
        ("JobID   Submit   State\n1  2026-01-01T00:00:00  COMPLETED\n", 1, "not its '----' ruler"),
        ("JobID|Submit,State\n1|2|3\n", 1, "mixes separators"),
        ("JobID\tState\n1\tCOMPLETED\n", 1, "has no Submit column"),
        ("Submit|State\n2026-01-01T00:00:00|COMPLETED\n", 1, "has no JobID column"),
    ],
    ids=["noheader", "no-ruler", "mixed", "no-submit", "no-jobid"],
)
def test_header_errors_name_the_problem(tmp_path: Path, text: str, line: int, words: str) -> None:
    f = _write(tmp_path, "bad.txt", text)
    with pytest.raises(InputError) as e:
        list(open_trace(f, "slurm-sacct"))
    assert e.value.line == line and words in e.value.message and str(e.value).startswith(f"{f}:{line}: ")


def test_tab_header_without_submit_lists_what_it_found(tmp_path: Path) -> None:
    f = _write(tmp_path, "t.txt", "JobID\tExitCode\tState\tMaxRSS\tElapsed\n7585175\t1:0\tFAILED\t\t00:00:38\n")
    with pytest.raises(InputError) as e:
        list(open_trace(f))
    assert "delimiter tab (-P), 5 columns: JobID, ExitCode, State, MaxRSS, Elapsed" in e.value.message


def test_time_zone_offsets_are_honoured(tmp_path: Path) -> None:
    f = _write(tmp_path, "z.txt", "JobID|Submit|Start|End|State\n"
                                  "1|2023-02-21T14:37:02+0100|2023-02-21T14:37:07+0100|2023-02-21T15:26:29+0100|"
                                  "COMPLETED\n")
    (job,) = read_jobs(f)
    assert job.submit == 1676986622.0  # date -u -d 2023-02-21T13:37:02 +%s


# ------------------------------------------------------------------------------------------ properties
_STATES = [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.TIMEOUT, JobStatus.PREEMPTED,
           JobStatus.RUNNING, JobStatus.PENDING]
_NAMES = st.text(string.ascii_lowercase + string.digits + "-_", min_size=1, max_size=8)


@st.composite
def sacct_jobs(draw: st.DrawFn) -> list[Job]:
    """Random jobs as sacct can hold them: whole seconds, no step ids, times consistent with the state."""
    n = draw(st.integers(1, 8))
    jobs = []
    for k in range(n):
        status = draw(st.sampled_from(_STATES))
        submit = float(draw(st.integers(1_500_000_000, 1_900_000_000)))
        ran = status not in (JobStatus.PENDING,) and not (status is JobStatus.CANCELLED and draw(st.booleans()))
        start = submit + draw(st.integers(0, 10**5)) if ran else None
        duration = float(draw(st.integers(0, 10**6))) if ran and status is not JobStatus.RUNNING else None
        end = start + duration if start is not None and duration is not None else None
        nodes = draw(st.integers(1, 64))
        jobs.append(Job(id=str(1000 + k) + draw(st.sampled_from(["", "_1", "_27"])), submit=submit, nodes=nodes,
                        procs=nodes * draw(st.sampled_from([1, 4, 64])), gpus=draw(st.integers(0, 8)),
                        duration=duration, requested=draw(st.none() | st.integers(60, 10**6).map(float)),
                        start=start, end=end, status=status, user=draw(st.none() | _NAMES),
                        queue=draw(st.none() | _NAMES)))
    return jobs


@pytest.mark.parametrize(("delim", "trailing"), [("|", False), ("|", True), ("\t", False), (",", False),
                                                 ("##", False), ("table", False)],
                         ids=["P", "p", "tab", "comma", "hashes", "table"])
@SETTINGS
@given(jobs=sacct_jobs())
def test_random_jobs_round_trip(tmp_path_factory: pytest.TempPathFactory, delim: str, trailing: bool,
                                jobs: list[Job]) -> None:
    buf = io.StringIO()
    write_jobs(jobs, "slurm-sacct", buf, delimiter=delim, trailing=trailing)
    f = tmp_path_factory.mktemp("rt") / "sacct.txt"
    f.write_text(buf.getvalue())
    back = read_jobs(f, "slurm-sacct")
    assert [_key(j) for j in back] == [_key(j) for j in jobs]


_ALPHABET = st.sampled_from(["|", "\t", ",", " ", "-", "x", "1", "2026-01-01T00:00:00", "COMPLETED", "n[1-", "+",
                             "\n", "Unknown", "é", "JobID", "Submit"])


@SETTINGS
@given(body=st.lists(st.lists(_ALPHABET, max_size=14).map("".join), max_size=10),
       header=st.sampled_from(["JobID|Submit|State|JobName|NodeList", "JobID\tSubmit\tState",
                               "JobID  Submit\n-----  ------", "JobID,Submit,State,AllocTRES", "garbage"]))
def test_garbage_rows_give_records_or_an_error_with_file_and_line(tmp_path_factory: pytest.TempPathFactory,
                                                                  body: list[str], header: str) -> None:
    f = tmp_path_factory.mktemp("g") / "g.txt"
    f.write_text(header + "\n" + "\n".join(body) + "\n")
    trace = open_trace(f, "slurm-sacct")
    try:
        jobs = list(trace)
    except InputError as e:
        assert str(e).startswith(f"{f}:") and e.line is not None
        return
    r = trace.report
    assert all(isinstance(j.extra["line"], int) for j in jobs)
    assert all(line is not None for line in r.first_lines.values())
