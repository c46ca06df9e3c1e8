"""Property tests: whatever bytes a reader is given, it yields records or raises the one InputError.

Three sources of input: arbitrary bytes; rows of format-like tokens under each real header (to get
past the header checks into the row parsing); and the heads of the real files, truncated, with
bytes flipped or inserted, plain and gzip-compressed (a gzip cut short or corrupted included).
Example counts are modest so the whole file runs in well under 30 s.
"""

from __future__ import annotations

import gzip
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcsched.errors import InputError
from hpcsched.traces import FORMATS, detect_format, open_trace
from hpcsched.traces.bftrainer import read_elastic_jobs
from hpcsched.traces.cli import inspect_trace
from hpcsched.traces.hostlist import expand_hostlist

DATA = Path(__file__).resolve().parents[1] / "trace-data"
FORMAT_NAMES = [None, *FORMATS]  # None: detect
# HPCSCHED_PROPERTY_EXAMPLES=2000 for a long hunt; the default keeps CI fast.
EXAMPLES = int(os.environ.get("HPCSCHED_PROPERTY_EXAMPLES", "25"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


def _head(path: Path, lines: int = 30) -> bytes:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return b"".join(f.readline() for _ in range(lines))


# Blox's own result tables (trace-data/blox/README.md) sit beside the traces but are no trace of any format.
NOT_TRACES = frozenset({"blox-preemptions-300-500.csv", "blox-results-300-500.csv"})
SAMPLES = {p.name: (_head(p), p.suffix == ".gz") for p in sorted(DATA.rglob("*"))
           if p.is_file() and p.suffix != ".md" and p.name not in NOT_TRACES}
HEADERS = sorted({s.split(b"\n", 1)[0] for s, _ in SAMPLES.values()})
TOKENS = ["-1", "0", "1", "17", "3.5", "1e9", "nan", "inf", "-7", "", " ", "Unknown", "UNLIMITED", "n[1-4,7]",
          "a[01-03]b", "n[3-1]", "2019-01-01 08:55:55", "2026-11-22T23:07:08", "[0.0, 1.0]", "[1, 0]", '"[0, 1"',
          "{1,2,2}", "1:ppn=8", "COMPLETED", "CANCELLED by 0", "RUNNING", "x.batch", "JobId=1", "JobState=FAILED",
          "é", "\t", ";", "; MaxNodes: 4", "; MaxProcs: x", "; MaxNodes: inf", "1e400", "9" * 40, "-0",
          "[1e400]", "[" + "9" * 400 + "]", "[" * 3000, "gres/gpu=4", "gres/gpu:a100=" + "7" * 5000, "²"]


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def _read_all(path: Path, fmt: str | None) -> int:
    """The property: a full read (and its ``trace inspect`` summary) ends in records or InputError."""
    try:
        if fmt is None:
            detect_format(path)
        n = sum(1 for _ in open_trace(path, fmt))
        assert inspect_trace(path, fmt)["jobs"] == n
        return n
    except InputError as e:
        assert e.path is not None and str(e).startswith(str(path))
        return -1


@pytest.mark.parametrize("fmt", FORMAT_NAMES, ids=lambda f: f or "detect")
@SETTINGS
@given(data=st.binary(max_size=1500))
def test_arbitrary_bytes(workdir: Path, fmt: str | None, data: bytes) -> None:
    f = workdir / "any.bin"
    f.write_bytes(data)
    _read_all(f, fmt)


rows = st.lists(st.lists(st.sampled_from(TOKENS), min_size=0, max_size=22), max_size=12)


@pytest.mark.parametrize("fmt", FORMAT_NAMES, ids=lambda f: f or "detect")
@SETTINGS
@given(header=st.sampled_from(HEADERS), body=rows, sep=st.sampled_from([",", "|", " ", "\t"]),
       gz=st.booleans())
def test_token_rows_under_real_headers(workdir: Path, fmt: str | None, header: bytes, body: list[list[str]],
                                       sep: str, gz: bool) -> None:
    text = header + b"\n" + "\n".join(sep.join(r) for r in body).encode()
    f = workdir / ("rows.gz" if gz else "rows.txt")
    f.write_bytes(gzip.compress(text) if gz else text)
    _read_all(f, fmt)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(SAMPLES)))
    data, gz = SAMPLES[name]
    blob = bytearray(gzip.compress(data, mtime=0) if gz and draw(st.booleans()) else data)
    for _ in range(draw(st.integers(0, 4))):
        if not blob:
            break
        i = draw(st.integers(0, len(blob) - 1))
        op = draw(st.sampled_from(["flip", "insert", "delete"]))
        if op == "flip":
            blob[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            blob[i:i] = draw(st.binary(min_size=1, max_size=8))
        else:
            del blob[i: i + draw(st.integers(1, 40))]
    cut = draw(st.integers(0, len(blob)))
    return name, bytes(blob[:cut] if draw(st.booleans()) else blob)


@pytest.mark.parametrize("fmt", FORMAT_NAMES, ids=lambda f: f or "detect")
@settings(max_examples=EXAMPLES + 5, deadline=None, suppress_health_check=list(HealthCheck))
@given(sample=mutated())
def test_mutated_real_files(workdir: Path, fmt: str | None, sample: tuple[str, bytes]) -> None:
    name, blob = sample
    f = workdir / name
    f.write_bytes(blob)
    _read_all(f, fmt)


@SETTINGS
@given(bounds=st.sampled_from([s for n, (s, _) in SAMPLES.items() if "Jbnd" in n]),
       curves=st.sampled_from([s for n, (s, _) in SAMPLES.items() if "JNPs" in n]),
       cut_b=st.integers(0, 600), cut_c=st.integers(0, 2000), flip=st.integers(0, 2000))
def test_elastic_join_on_damaged_pairs(workdir: Path, bounds: bytes, curves: bytes, cut_b: int, cut_c: int,
                                       flip: int) -> None:
    b, c = workdir / "b.csv", workdir / "c.csv"
    cb = bytearray(curves[: len(curves) - cut_c] if cut_c < len(curves) else curves)
    if cb:
        cb[flip % len(cb)] ^= 0x04
    b.write_bytes(bounds[: len(bounds) - cut_b] if cut_b < len(bounds) else bounds)
    c.write_bytes(bytes(cb))
    try:
        jobs = read_elastic_jobs(b, c)
    except InputError:
        return
    assert all(1 <= j.jmin <= j.jmax for j in jobs)


@settings(max_examples=EXAMPLES * 8, deadline=None)
@given(st.text(alphabet="n[]-,0123456789ab ", max_size=30))
def test_hostlist_raises_only_value_error(expr: str) -> None:
    try:
        names = expand_hostlist(expr)
    except ValueError:
        return
    assert all(isinstance(n, str) and n for n in names)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_undamaged_heads_read(workdir: Path, name: str) -> None:
    """The harness itself: every real head, unmutated, detects and reads to at least one record."""
    f = workdir / name
    f.write_bytes(SAMPLES[name][0])
    assert _read_all(f, None) >= 1


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("swf", "; MaxNodes: inf\n; MaxProcs: 8\n1 0 0 10 4 -1 -1 4 100 -1 1 1 1 -1 1 -1 -1 -1\n"),
        ("swf", "1 0 0 10 1e400 -1 -1 4 100 -1 1 1 1 -1 1 -1 -1 -1\n"),
        ("slurm-sacct", "JobID|Submit|NNodes|AllocTRES\n1|2026-01-01T00:00:00|1e400|\n"),
        ("slurm-sacct", "JobID|Submit|NNodes|AllocTRES\n1|2026-01-01T00:00:00|1|gres/gpu=" + "7" * 5000 + "\n"),
        ("bftrainer-curves", 'job,Ns,Ps,Os,Tsub\nJ1,"[' + "9" * 400 + ']","[1]","[1]",5\n'),
        ("bftrainer-curves", 'job,Ns,Ps,Os,Tsub\nJ1,"' + "[" * 3000 + '","[1]","[1]",5\n'),
        ("muri", "job_id,num_gpu,submit_time,iterations,model_name\n1,1,0,1e400,m\n"),
        ("muri", "job_id,num_gpu,submit_time,iterations,model_name\n1," + "9" * 400 + ",0,1,m\n"),
        ("swf", "1 " + "9" * 400 + " 0 10 4 -1 -1 4 100 -1 1 1 1 -1 1 -1 -1 -1\n"),
        ("swf", "1 0 0 10 " + "9" * 400 + " -1 -1 4 100 -1 1 1 1 -1 1 -1 -1 -1\n"),
        ("philly", "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0," + "9" * 400 + ",1,c\n"),
    ],
)
def test_overflow_regressions(workdir: Path, fmt: str, text: str) -> None:
    """Inputs that once escaped as OverflowError/RecursionError/ValueError instead of InputError."""
    f = workdir / "overflow.txt"
    f.write_text(text)
    _read_all(f, fmt)
