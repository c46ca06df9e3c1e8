"""Seeded synthetic traces (issue 17): same seed -> same bytes, feasible schedules, read back by the readers.

Sizes here are small (a few thousand jobs) so the file runs in seconds; the full sizes and their timings
are in bench/RESULTS.md ("Generators (issue 17)").
"""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from hpcsched.traces import open_trace, read_jobs, synth
from hpcsched.traces.synth import MODELS, generate, pick_model

SMALL = {"cobalt": {"jobs": 1500, "nodes": 4096}, "swf": {"nodes": 2000, "days": 20.0},
         "philly": {"jobs": 1500, "cluster_gpus": 64}}
EXT = {"cobalt": "csv", "swf": "swf", "philly": "csv"}


@pytest.mark.parametrize("kind", synth.KINDS)
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path, kind: str, gz: bool) -> None:
    suffix = f".{EXT[kind]}" + (".gz" if gz else "")
    a, b, c = (tmp_path / f"{n}{suffix}" for n in "abc")
    ra = generate(kind, a, 1, **SMALL[kind])
    generate(kind, b, 1, **SMALL[kind])
    generate(kind, c, 2, **SMALL[kind])
    assert a.read_bytes() == b.read_bytes() and a.read_bytes() != c.read_bytes()
    assert ra.bytes == a.stat().st_size and ra.jobs > 100
    if gz:  # no name and mtime 0 in the gzip header: the bytes depend on the seed alone
        assert a.read_bytes()[4:8] == b"\x00\x00\x00\x00"


def _busy_nodes_peak(rows: list[tuple[float, float, int]]) -> int:
    """Largest number of nodes in use at once, from (start, end, nodes): a sweep over the events."""
    events = sorted([(s, n) for s, _, n in rows] + [(e, -n) for _, e, n in rows], key=lambda x: (x[0], x[1]))
    busy = peak = 0
    for _, d in events:
        busy += d
        peak = max(peak, busy)
    return peak


def test_cobalt_log_fits_the_machine_and_reads_back(tmp_path: Path) -> None:
    f = tmp_path / "mira-synth.csv"  # 'mira' names the 49,152-node machine for the reader
    generate("cobalt", f, 5, jobs=3000)
    trace = open_trace(f, options={"machine_nodes": 49152})
    jobs = list(trace)
    assert trace.report.format == "cobalt" and len(jobs) == 3000
    assert "larger_than_machine" not in trace.report.anomalies and "unsorted_submit" not in trace.report.anomalies
    assert _busy_nodes_peak([(j.start, j.start + j.duration, j.nodes) for j in jobs]) <= 49152
    assert all(j.start >= j.submit and j.requested >= 60 for j in jobs)
    assert max(j.nodes for j in jobs) > 10000  # Theta's whole-machine class, scaled
    statuses = {s: sum(j.status.value == s for j in jobs) / len(jobs) for s in ("completed", "cancelled", "failed")}
    assert statuses["completed"] == pytest.approx(0.62, abs=0.05)
    assert statuses["failed"] == pytest.approx(0.08, abs=0.03)


def test_swf_year_is_feasible_and_has_its_header(tmp_path: Path) -> None:
    f = tmp_path / "big.swf"
    r = generate("swf", f, 3, nodes=20000, days=30.0)
    trace = open_trace(f)
    jobs = list(trace)
    assert trace.report.format == "swf" and len(jobs) == r.jobs
    assert trace.report.meta["machine_nodes"] == 20000 and trace.report.meta["cores_per_node"] == 1
    assert not trace.report.anomalies.get("larger_than_machine")
    assert _busy_nodes_peak([(j.start, j.end, j.nodes) for j in jobs]) <= 20000
    assert max(j.submit for j in jobs) - min(j.submit for j in jobs) < 30 * 86400
    # the offered load is the one asked for (0.6 of the node-seconds), within sampling noise
    offered = sum(j.nodes * j.duration for j in jobs) / (20000 * 30 * 86400)
    assert offered == pytest.approx(0.6, rel=0.35)


def test_philly_like_trace_for_the_simulator(tmp_path: Path) -> None:
    f = tmp_path / "philly-like.csv"
    generate("philly", f, 9, jobs=4000, cluster_gpus=1024, max_days=60.0)
    jobs = read_jobs(f)
    assert len(jobs) == 4000 and open_trace(f).format.name == "muri"
    assert all(1 <= j.gpus <= 1024 and j.duration <= 60 * 86400 for j in jobs)
    assert all(j.iterations * j.iteration_time == pytest.approx(j.duration) for j in jobs)
    assert all(j.model == pick_model(j.id, 9) and j.profile is not None for j in jobs)
    assert sum(j.gpus == 1 for j in jobs) / len(jobs) == pytest.approx(76627 / 82247, abs=0.03)  # Sia's share
    assert [j.submit for j in jobs] == sorted(j.submit for j in jobs)
    m = MODELS[jobs[0].model]
    assert jobs[0].profile.data_s == pytest.approx(m.data_ms / 1000)


def test_multi_week_jobs_reach_the_cap(tmp_path: Path) -> None:
    f = tmp_path / "long.csv"
    generate("philly", f, 4, jobs=40000, max_days=60.0)
    durations = [j.duration for j in read_jobs(f)]
    assert max(durations) <= 60 * 86400 and sum(d > 14 * 86400 for d in durations) >= 10


def test_memory_does_not_grow_with_jobs(tmp_path: Path) -> None:
    """Streaming: 10x the jobs, about the same peak Python memory (the running set, not the log, is held)."""
    peaks = []
    for n in (2000, 20000):
        tracemalloc.start()
        generate("cobalt", tmp_path / f"c{n}.csv", 1, jobs=n, nodes=4096)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 2 * peaks[0] + 200_000


def test_bad_options_are_errors_before_any_file(tmp_path: Path) -> None:
    for kind, opts in (("cobalt", {"jobs": 0}), ("swf", {"days": -1.0}), ("philly", {"load": 0.0})):
        out = tmp_path / f"{kind}.out"
        with pytest.raises(ValueError):
            generate(kind, out, 1, **opts)
        assert not out.exists()
    with pytest.raises(ValueError, match="unknown kind"):
        generate("lsf", tmp_path / "x", 1)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_eta_only_when_enabled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    generate("philly", tmp_path / "p.csv", 1, progress=True, jobs=3000)
    shown = err.getvalue()
    assert "generating p.csv: 2,001/3,000 jobs" in shown and "eta" in shown
    err.truncate(0)
    err.seek(0)
    generate("philly", tmp_path / "q.csv", 1, progress=False, jobs=300)
    assert err.getvalue() == ""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcsched.cli", "trace", "generate", *args], capture_output=True,
                          text=True, timeout=120)


def test_cli_generate(tmp_path: Path) -> None:
    out = tmp_path / "t.swf.gz"
    r = _cli("swf", "--seed", "7", "--out", str(out), "--nodes", "500", "--days", "5", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["jobs"] > 0 and info["bytes"] == out.stat().st_size and r.stderr == ""  # not a TTY: no bar
    assert gzip.decompress(out.read_bytes()).startswith(b"; Version: 2.2")
    r = _cli("philly", "--seed", "1", "--out", str(tmp_path / "p.csv"), "--jobs", "50", "--cluster", "n8g8")
    assert r.returncode == 0 and "50 jobs" in r.stdout
    assert max(j.gpus for j in read_jobs(tmp_path / "p.csv")) <= 64
    for bad in (["lsf", "--seed", "1", "--out", str(tmp_path / "x")],
                ["cobalt", "--seed", "1", "--out", str(tmp_path / "x"), "--load", "-1"],
                ["swf", "--seed", "1", "--out", str(tmp_path / "x"), "--jobs", "5"],
                ["cobalt", "--seed", "1", "--out", str(tmp_path / "no" / "dir.csv"), "--jobs", "5"]):
        r = _cli(*bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "error" in r.stderr, (bad, r.stderr)
