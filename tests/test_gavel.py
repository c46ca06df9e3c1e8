"""Gavel's data and workload (issue 19): its trace format, throughput table, cluster strings and generator.

The two traces in ``trace-data/gavel/`` were made by Gavel's own scheduler (seed 0, 120 jobs, 0.5 jobs/hour;
the second with scale factors capped at 4); our generator must write them byte for byte.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hpcsched.errors import InputError
from hpcsched.hetero.throughputs import BUNDLED, load_throughputs
from hpcsched.hetero.workload import TEMPLATES, GavelJob, generate, write_trace
from hpcsched.primitives.hetero_cluster import HeteroCluster, parse_hetero_cluster
from hpcsched.traces import detect_format, open_trace, read_jobs

DATA = Path(__file__).resolve().parents[1] / "trace-data" / "gavel"
A = DATA / "A_120jobs_0.5jph_seed0.trace"
A4 = DATA / "A4_120jobs_0.5jph_seed0_sfmax4.trace"
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def table():  # noqa: ANN201 - a fixture
    return load_throughputs()


# ---- trace format ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "scales"), [(A, {1: 80, 2: 17, 4: 16, 8: 7}), (A4, {1: 80, 2: 17, 4: 23})])
def test_real_traces(path: Path, scales: dict[int, int]) -> None:
    assert detect_format(path).name == "gavel"
    trace = open_trace(path)
    jobs = list(trace)
    assert len(jobs) == 120 and not trace.report.anomalies
    assert Counter(j.gpus for j in jobs) == scales  # the shared README's 80/17/16/7 for A
    first = jobs[0]  # line 1, checked by eye against the file
    assert (first.id, first.submit, first.gpus, first.iterations, first.model) == (
        "0", 0.0, 8 if path == A else 4, 17484476 if path == A else 6532909, "ResNet-18 (batch size 64)")
    assert first.extra["command"] == "python3 main.py --data_dir=%s/cifar10 --batch_size 64"
    assert first.extra["num_steps_arg"] == "--num_steps" and first.extra["needs_data_dir"] is True
    assert first.extra["slo"] is None and first.extra["priority_weight"] == 1.0
    assert jobs[-1].submit == pytest.approx(996969.0, abs=1.0)


def _line(job: GavelJob) -> str:
    return job.line() + "\n"


_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=20).filter(str.strip)


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(TEMPLATES), st.integers(0, 10**9), st.sampled_from((1, 2, 4, 8, 16)),
                          st.floats(0, 1e7, allow_nan=False), st.sampled_from((1.0, 5.0)),
                          st.sampled_from((None, 1.2, 2.0, 10.0)), _text), min_size=1, max_size=30))
def test_round_trip(rows: list) -> None:
    """Random jobs written in Gavel's format read back the same (arrivals sorted, as Gavel requires)."""
    rows = sorted(rows, key=lambda r: r[3])
    jobs = [GavelJob(t.__class__(name, t.command, t.working_directory, t.num_steps_arg, t.distributed,
                                 t.needs_data_dir), steps, sf, arr, 0.0, w, slo)
            for t, steps, sf, arr, w, slo, name in rows]
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.trace"
        write_trace(jobs, p)
        back = read_jobs(p, "gavel")
        assert detect_format(p).name == "gavel"
    assert len(back) == len(jobs)
    for i, (j, b) in enumerate(zip(jobs, back, strict=True)):
        assert b.id == str(i) and b.model == j.template.job_type and b.gpus == j.scale_factor
        assert b.iterations == j.total_steps and b.submit == pytest.approx(j.arrival, abs=1e-6)
        assert b.extra["slo"] == j.slo and b.extra["priority_weight"] == j.priority_weight
        assert b.extra["command"] == j.template.command and b.extra["line"] == i + 1


@pytest.mark.parametrize(("text", "where"), [
    ("hello world\n", 1),
    ("a\tb\tc\td\t1\t10\t1\t1\t-1\t0\n" * 2 + "a\tb\tc\td\t1\tten\t1\t1\t-1\t0\n" * 100, None),
    ("\x00\x01garbage", 1),
])
def test_garbage_is_input_error(tmp_path: Path, text: str, where: int | None) -> None:
    p = tmp_path / "bad.trace"
    p.write_text(text)
    if where is None:  # good rows then bad ones: the bad ones are counted, not fatal; --strict names the line
        trace = open_trace(p, "gavel")
        assert len(list(trace)) == 2 and trace.report.anomalies["malformed_row"] == 100
        assert trace.report.first_lines["malformed_row"] == 3
        with pytest.raises(InputError, match=r"bad\.trace:3") as e:
            list(open_trace(p, "gavel", strict=True))
        assert "total_steps" in str(e.value)
        return
    with pytest.raises(InputError) as e:
        list(open_trace(p, "gavel"))
    assert "bad.trace" in str(e.value) and f"{where}" in str(e.value)


@pytest.mark.parametrize(("line", "why"), [
    ("a\tb\tc\td\t1\t10\t0\t1\t-1\t0", "scale_factor"),
    ("a\tb\tc\td\t2\t10\t1\t1\t-1\t0", "needs_data_dir"),
    ("a\tb\tc\td\t1\t10\t1\t1\t-1\tnan", "arrival_time"),
    ("a\tb\tc\td\t1\t10\t1\t1\t-1", "9 tab-separated fields"),
])
def test_bad_line_named(tmp_path: Path, line: str, why: str) -> None:
    p = tmp_path / "one.trace"
    p.write_text("a\tb\tc\td\t1\t10\t1\t1\t-1\t0\n" + line + "\n")
    with pytest.raises(InputError, match=why) as e:
        list(open_trace(p, "gavel", strict=True))
    assert e.value.line == 2 and "one.trace:2" in str(e.value)


def test_zero_steps_kept_and_counted(tmp_path: Path) -> None:
    p = tmp_path / "z.trace"
    p.write_text("a\tb\tc\td\t1\t0\t1\t1\t-1\t0\n")
    trace = open_trace(p)
    assert len(list(trace)) == 1 and trace.report.anomalies == {"zero_steps": 1}


# ---- throughput table -----------------------------------------------------------------------------------------

def test_throughputs_match_the_json(table) -> None:  # noqa: ANN001
    raw = json.loads(gzip.decompress(BUNDLED.read_bytes()))
    # Values read by hand from the JSON (zcat ... | python -m json.tool):
    assert table.isolated("ResNet-18 (batch size 16)", "v100") == 32.353384328946916
    assert table.isolated("ResNet-18 (batch size 16)", "k80") == 4.795294551566172
    assert table.isolated("LM (batch size 10)", "k80", 8) == 75.56769495697503
    assert table.isolated("LM (batch size 10)", "v100", 4) == 121.4776195889045
    assert table.colocated("A3C", "CycleGAN", "p100") == (2.9861354534193176, 1.1999531379682131)
    assert table.colocated("ResNet-18 (batch size 16)", "ResNet-18 (batch size 64)", "v100") == (
        32.353384328946916, 24.093231895382736)
    assert table.colocated("ResNet-18 (batch size 16)", "ResNet-18 (batch size 32)", "k80") == (
        2.539979567443098, 3.1201925448827033)
    assert table.colocated("LM (batch size 10)", "LM (batch size 5)", "v100", 4) == (0.0, 0.0)  # not co-locatable
    assert set(table.gpu_types) == set(raw) == {"k80", "p100", "v100", "k80_unconsolidated",
                                                "p100_unconsolidated", "v100_unconsolidated"}
    assert len(table.job_types("v100")) == 26 and table.scale_factors("A3C") == (1,)
    n_pairs = sum(len(e) - 1 for e in raw["v100"].values())
    assert len(table.colocated_rates["v100"]) == n_pairs
    # every template the generator draws has every size it may be drawn at
    for t in TEMPLATES:
        for sf in (1, 2, 4, 8) if t.distributed else (1,):
            assert table.isolated(t.job_type, "v100", sf) > 0


def test_bundled_isolated_rates_are_the_json(table, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """The bundled table's isolated rates come from its compact derivative (throughputs.ISOLATED): they must be
    the JSON's, in the JSON's order, and a derivative of another version of the JSON must not be used."""
    from hpcsched.hetero import throughputs

    assert table.source == str(BUNDLED)
    plain = tmp_path / "plain.json"  # not the bundled path: read from the JSON itself
    plain.write_bytes(gzip.decompress(BUNDLED.read_bytes()))
    full = load_throughputs(plain)
    assert [(g, list(r.items())) for g, r in table.isolated_rates.items()] == \
        [(g, list(r.items())) for g, r in full.isolated_rates.items()]
    assert throughputs._bundled_isolated() is not None  # the shipped derivative matches the shipped JSON
    stale = tmp_path / "stale.json.gz"
    stale.write_bytes(gzip.compress(json.dumps({"source": [1, 2], "isolated": {"v100": [["A3C", 1, 9.0]]}}).encode()))
    monkeypatch.setattr(throughputs, "ISOLATED", stale)
    again = load_throughputs()
    assert again.isolated("A3C", "v100") == full.isolated("A3C", "v100") != 9.0
    assert again.colocated("A3C", "CycleGAN", "p100") == full.colocated("A3C", "CycleGAN", "p100")


def test_throughput_errors(table, tmp_path: Path) -> None:  # noqa: ANN001
    with pytest.raises(KeyError, match="GPU type 'a100' not in the throughput table"):
        table.isolated("A3C", "a100")
    with pytest.raises(KeyError, match="job type 'ResNet-19' not in the throughput table"):
        table.isolated("ResNet-19", "v100")
    with pytest.raises(KeyError, match="no scale factor 2.*it has 1"):
        table.isolated("A3C", "v100", 2)
    with pytest.raises(KeyError, match="'Nope' not in the throughput table"):
        table.colocated("A3C", "Nope", "v100")
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"v100": {"ResNet": {"null": 1.0}}}))
    with pytest.raises(InputError, match="v100 / ResNet"):
        load_throughputs(bad)
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not a Gavel throughput JSON"):
        load_throughputs(bad)


# ---- cluster strings ------------------------------------------------------------------------------------------

def test_cluster_strings() -> None:
    c = parse_hetero_cluster("v100=8,p100=8,k80=8")
    assert c == HeteroCluster(("v100", "p100", "k80"), (8, 8, 8), (1, 1, 1), (None, None, None))
    assert c.gpu_counts() == {"v100": 8, "p100": 8, "k80": 8} and c.total_gpus == 24
    c = parse_hetero_cluster(" V100=8x4@2.48 , k80=2@0.45")
    assert (c.types, c.servers, c.gpus_per_server, c.prices) == (("v100", "k80"), (8, 2), (4, 1), (2.48, 0.45))
    assert c.gpus("v100") == 32 and c.price("K80") == 0.45 and str(c) == "v100=8x4@2.48,k80=2@0.45"
    assert parse_hetero_cluster(str(c)) == c
    with pytest.raises(KeyError, match="'a100' not in the cluster"):
        c.gpus("a100")
    with pytest.raises(AttributeError):
        c.types = ()  # type: ignore[misc]


@pytest.mark.parametrize(("text", "part"), [
    ("v100=8,p100", "'p100'"), ("v100=8,v100=4", "given twice"), ("v100=0", "'v100=0'"), ("v100=8x0", "'v100=8x0'"),
    ("v100=8@cheap", "'cheap' is not a number"), ("v100=8@-1", "'v100=8@-1'"), ("", "empty"), ("v100=8,", "''"),
    ("v100=-8", "'v100=-8'"),
])
def test_cluster_string_errors(text: str, part: str) -> None:
    with pytest.raises(ValueError, match=part):
        parse_hetero_cluster(text)


# ---- generator ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "max_scale"), [(A, 8), (A4, 4)])
def test_generator_reproduces_gavel(table, path: Path, max_scale: int) -> None:  # noqa: ANN001
    jobs = generate(120, 0.5, 0, table, max_scale=max_scale)
    assert "".join(map(_line, jobs)).encode() == path.read_bytes()


def test_generator_seeded_and_shaped(table) -> None:  # noqa: ANN001
    a, b, c = (generate(400, 2.0, s, table) for s in (7, 7, 8))
    assert [j.line() for j in a] == [j.line() for j in b] and [j.line() for j in a] != [j.line() for j in c]
    assert all(y.arrival >= x.arrival for x, y in zip(a, a[1:], strict=False))
    assert all(j.scale_factor == 1 or j.template.distributed for j in a)
    assert all(60 * 10**1.5 <= j.duration <= 60 * 10**4 for j in a)
    assert generate(3, 0.0, 0, table)[-1].arrival == 0.0
    with pytest.raises(ValueError, match="max-scale"):
        generate(1, 1.0, 0, table, max_scale=3)


def test_trace_generate_cli(tmp_path: Path) -> None:
    from hpcsched.cli import app

    out = tmp_path / "g.trace"
    r = CliRunner().invoke(app, ["trace", "generate", "gavel", "--jobs", "120", "--rate", "0.5", "--seed", "0",
                                 "--out", str(out), "--max-scale", "4", "--json"])
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == A4.read_bytes()
    assert json.loads(r.stdout)["jobs"] == 120


# ---- the greedy pass ------------------------------------------------------------------------------------------

def test_round_schedule_is_round_picks_of_round_queue() -> None:
    """The simulator's one-type-at-a-time pass (rounds.round_schedule) stops early; it must pick exactly what the
    full queue's pass (round_picks(round_queue(...)), the runtime executor's) picks, in the same order."""
    import random
    from types import SimpleNamespace

    from hpcsched.hetero.rounds import RoundJob, round_picks, round_queue, round_schedule

    rng = random.Random(7)
    for case in range(300):
        n_types = rng.randint(1, 3)
        gpus = [rng.choice([0, 1, 2, 4, 8]) for _ in range(n_types)]
        states = {}
        for jid in range(rng.randint(0, 14)):
            sf = rng.choice([1, 1, 2, 4])
            alloc = None if rng.random() < 0.15 else [rng.choice([0.0, rng.random()]) for _ in range(n_types)]
            states[jid] = SimpleNamespace(job=RoundJob(jid, "x", 10, sf, 0.0), alloc=alloc,
                                          thr=[rng.choice([0.0, 1.0 + rng.random()]) for _ in range(n_types)],
                                          time=[rng.choice([180.0, rng.uniform(0, 2000)]) for _ in range(n_types)],
                                          deficit=[rng.choice([0.0, rng.uniform(-50, 50)]) for _ in range(n_types)])
        worker_time = [rng.choice([0.0, rng.uniform(1, 5000)]) for _ in range(n_types)]
        types = rng.sample(range(n_types), n_types)
        for skip_zero in (False, True):
            want = round_picks(round_queue(list(states.items()), types, worker_time, skip_zero), states, gpus,
                               skip_zero)
            assert round_schedule(states, types, worker_time, gpus, skip_zero) == want, (case, skip_zero)
