"""``trace convert`` to LSF ``lsb.acct`` and Grid Engine ``accounting``: real logs of each kind go round trip
unchanged; what a source holds that the target cannot is listed, and the rest reads back as it was."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hpcsched.model import Job
from hpcsched.traces import open_trace, read_jobs
from hpcsched.traces.convert import convert_trace

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "trace-data"
LSF = DATA / "lsf" / "apel-lsb.acct"
SGE = DATA / "sge" / "apel-accounting"
KTH = DATA / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz"
EAGLE = DATA / "slurm" / "eagle-sacct-sample.csv"


def _key(j: Job, requested: bool = True) -> tuple[object, ...]:
    nodelist = j.extra.get("nodelist") if j.extra else None
    return (j.id, j.submit, j.start, j.end, j.duration, j.nodes, j.procs, j.status, j.user, j.queue,
            j.requested if requested else None, nodelist)


def _round_trip(src: Path, to: str, out: Path, fmt: str) -> tuple[list[Job], list[Job], list[str]]:
    res = convert_trace(src, to, out)
    back = list(open_trace(out, fmt))
    assert res.written == len(back)
    return read_jobs(src), back, [f"{loss.count} {loss.what}" for loss in res.losses]


def test_real_lsf_records_go_round_trip_unchanged(tmp_path: Path) -> None:
    src, back, lost = _round_trip(LSF, "lsf", tmp_path / "lsb.acct", "lsf-acct")  # an alias of lsf-acct
    assert lost == []
    assert [_key(j) for j in back] == [_key(j) for j in src]  # ids (with array index), times, hosts, status


def test_real_grid_engine_records_go_round_trip_unchanged(tmp_path: Path) -> None:
    """The sample is UGE 8.2+ (milliseconds): its fractional times are written back in milliseconds."""
    src, back, lost = _round_trip(SGE, "sge", tmp_path / "accounting", "sge-accounting")
    assert lost == []
    assert any(j.submit != int(j.submit) for j in src)
    assert sorted(map(_key, back), key=repr) == sorted(map(_key, src), key=repr)


def test_a_swf_log_to_lsf_and_grid_engine_lists_what_they_cannot_hold(tmp_path: Path) -> None:
    """The real KTH log: LSF has no run limit among JOB_FINISH's fields (listed; all else reads back); Grid
    Engine keeps h_rt, and its node counts read back from the slots (1 processor a node on the SP2)."""
    src, back, lost = _round_trip(KTH, "lsf-acct", tmp_path / "kth.acct", "lsf-acct")
    assert lost == [f"{len(src):,} requested wall time (JOB_FINISH holds no run limit among the fields read)"
                    .replace(",", "")]
    got = {j.id: _key(j, requested=False)[:-1] for j in back}
    assert got == {j.id: _key(j, requested=False)[:-1] for j in src}
    src, back, lost = _round_trip(KTH, "sge-accounting", tmp_path / "kth.sge", "sge-accounting")
    assert len(lost) == 1 and "node count" in lost[0]  # a job without a size: it reads back as 1 node
    got_sge = {j.id: _key(j)[:-1] for j in back}
    want = {j.id: _key(j)[:-1] for j in src}
    assert sum(got_sge[k] != want[k] for k in want) == (int(lost[0].split()[0]) if lost else 0)


def test_ids_statuses_and_gpus_lsf_cannot_hold_are_listed_by_the_cli(tmp_path: Path) -> None:
    """NREL Eagle's sacct sample: array tasks' repeated ids (renumbered), states LSF has no code for, GPUs."""
    out = tmp_path / "eagle.acct"
    p = subprocess.run([sys.executable, "-m", "hpcsched.cli", "trace", "convert", str(EAGLE), "--to", "lsf-acct",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    notes = [line for line in p.stderr.splitlines() if "not carried over" in line]
    assert any("451 job(s): a job id that is not a number" in n for n in notes), notes
    assert any("GPU counts" in n for n in notes) and any("status other than completed" in n for n in notes)
    back = read_jobs(out, "lsf-acct")
    src = read_jobs(EAGLE)
    assert len(back) == len(src) == 1000
    assert len({j.id for j in back}) == 1000  # renumbered ids stay distinct
    assert sorted((j.submit, j.start, j.end, j.procs) for j in back) == sorted(
        (j.submit, j.start, j.end, j.procs) for j in src)
