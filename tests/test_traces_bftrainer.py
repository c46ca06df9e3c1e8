"""BFTrainer readers on the bundled data set, and the bad bounds/curves they must refuse."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from hpcsched.errors import InputError
from hpcsched.model import IdleInterval
from hpcsched.traces import open_trace
from hpcsched.traces.base import TraceReport
from hpcsched.traces.bftrainer import read_elastic_jobs, read_idle_intervals, read_node_order

BF = Path(__file__).resolve().parents[1] / "trace-data" / "bftrainer"
BOUNDS_HEADER = "job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\n"
CURVES_HEADER = "job,Ns,Ps,Os,Tsub\n"
CURVE = '"[0.0, 1.0, 2.0]","[0.0, 10.0, 15.0]","[0.0, 10.0, 15.0]"'


@cache
def _idle() -> tuple[list[IdleInterval], TraceReport]:
    report = TraceReport("idle", "bftrainer-idle")
    return list(read_idle_intervals(BF / "idle-intervals.csv.gz", report)), report


def test_idle_intervals_counts_and_censoring() -> None:
    ivs, report = _idle()
    # zcat idle-intervals.csv.gz | awk -F, 'NR>1' | wc -l  -> 423502
    assert len(ivs) == 423502
    # zcat idle-intervals.csv.gz | awk -F, 'NR>1 && $3==-1' | wc -l  -> 148
    assert sum(iv.end is None for iv in ivs) == 148
    assert report.anomalies == {"censored": 148}
    # zcat idle-intervals.csv.gz | awk -F, 'NR>1{print $1}' | sort -u | wc -l  -> 4680
    assert len({iv.node for iv in ivs}) == 4680
    first = ivs[0]
    assert (first.node, first.start, first.end) == ("h50n16", 1612918128.0, 1612918199.0)
    assert all(iv.end is None or iv.end >= iv.start for iv in ivs)


def test_node_order() -> None:
    nodes = read_node_order(BF / "node-order.txt")
    # wc -l node-order.txt -> 4734 ; sort -u node-order.txt | wc -l -> 4734
    assert len(nodes) == 4734 and len(set(nodes)) == 4734
    assert nodes[:2] == ["c05n06", "a02n02"]
    idle_nodes = {iv.node for iv in _idle()[0]}
    assert idle_nodes <= set(nodes)


@pytest.mark.parametrize(
    ("bounds", "curves", "n"),
    [
        ("ImageNet-imgps-Jbnd-1001J.csv", "ImageNet-imgps-JNPs-1001J.csv", 1001),
        ("hps-shufflenet-Jbnd-1000J.csv", "hps-shufflenet-JNPs-1000J.csv", 1000),
        ("hps-shufflenet-Jbnd-10J.csv", "hps-shufflenet-JNPs-10J.csv", 10),
    ],
)
def test_elastic_jobs_join(bounds: str, curves: str, n: int) -> None:
    jobs = read_elastic_jobs(BF / bounds, BF / curves)
    assert len(jobs) == n
    assert all(j.jmin == 1 and j.jmax == 64 and j.total_samples == 130e6 for j in jobs)


def test_elastic_job_fields_from_first_row() -> None:
    job = read_elastic_jobs(BF / "ImageNet-imgps-Jbnd-1001J.csv", BF / "ImageNet-imgps-JNPs-1001J.csv")[0]
    # head -2 of both files
    assert job.id == "J00000-AlexNet"
    assert job.submit == 1612988475
    assert job.scale_up_s == pytest.approx(17.78804344238519)
    assert job.scale_down_s == pytest.approx(11.273139936708727)
    assert job.curve.nodes == (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
    assert job.curve.rates[1] == 7115.3 and job.curve.rates[-1] == 202135.4
    assert job.curve.rate(3) == pytest.approx((13071.7 + 21066.1) / 2)


def _pair(tmp_path: Path, bounds_rows: str, curve_rows: str) -> tuple[Path, Path]:
    b, c = tmp_path / "b.csv", tmp_path / "c.csv"
    b.write_text(BOUNDS_HEADER + bounds_rows)
    c.write_text(CURVES_HEADER + curve_rows)
    return b, c


@pytest.mark.parametrize(
    ("bounds_rows", "curve_rows", "bad_file", "line", "words"),
    [
        ("J1,18,12,8,4,1e6,100\n", f"J1,{CURVE},100\n", "b.csv", 2, "Jmin"),
        ("J1,-1,12,1,4,1e6,100\n", f"J1,{CURVE},100\n", "b.csv", 2, "rescale"),
        ("J1,18,12,1,4,0,100\n", f"J1,{CURVE},100\n", "b.csv", 2, "Pmax"),
        ("J1,18,12,1.5,4,1e6,100\n", f"J1,{CURVE},100\n", "b.csv", 2, "whole"),
        ("J1,18,12,1,4,1e6,100\n", 'J1,"[0, 1]","[0, -5]","[0, 1]",100\n', "c.csv", 2, "Ps"),
        ("J1,18,12,1,4,1e6,100\n", 'J1,"[0, 2, 1]","[0, 5, 6]","[0, 1, 2]",100\n', "c.csv", 2, "increasing"),
        ("J1,18,12,1,4,1e6,100\n", 'J1,"[0, 1]","[0, 5, 6]","[0]",100\n', "c.csv", 2, "rates"),
        ("J1,18,12,1,4,1e6,100\n", 'J1,"[0, 1","[0, 5]","[0]",100\n', "c.csv", 2, "JSON"),
        ("J1,18,12,1,4,1e6,100\nJ2,18,12,1,4,1e6,100\n", f"J1,{CURVE},100\n", "b.csv", 3, "no scaling curve"),
        ("J1,18,12,1,4,1e6,100\n", f"J1,{CURVE},100\nJ9,{CURVE},100\n", "c.csv", 3, "no bounds"),
        ("J1,18,12,1,4,1e6,100\n", f"J1,{CURVE},101\n", "c.csv", 2, "Tsub"),
        ("J1,18,12,1,4,1e6,100\nJ1,18,12,1,4,1e6,100\n", f"J1,{CURVE},100\n", "b.csv", 3, "twice"),
        ("J1,18,12,1,4\n", f"J1,{CURVE},100\n", "b.csv", 2, "fields"),
    ],
)
def test_bad_bounds_and_curves_name_file_and_line(
    tmp_path: Path, bounds_rows: str, curve_rows: str, bad_file: str, line: int, words: str
) -> None:
    b, c = _pair(tmp_path, bounds_rows, curve_rows)
    with pytest.raises(InputError) as e:
        read_elastic_jobs(b, c)
    assert e.value.path is not None and e.value.path.endswith(bad_file)
    assert e.value.line == line
    assert words in e.value.message


def test_idle_bad_rows_counted_not_fatal(tmp_path: Path) -> None:
    f = tmp_path / "idle.csv"
    f.write_text("node,idle_start,idle_end\nn1,10,20\nn2,abc,30\nn3,40,35\nn4,5,-1\nn5,7\n")
    trace = open_trace(f)
    ivs = list(trace)
    assert [iv.node for iv in ivs] == ["n1", "n4"]
    assert trace.report.anomalies == {"malformed_row": 2, "negative_runtime": 1, "censored": 1, "unsorted_submit": 1}
    assert trace.report.first_lines["malformed_row"] == 3
    with pytest.raises(InputError) as e:
        list(open_trace(f, strict=True))
    assert e.value.line == 3


def test_every_bftrainer_file_is_detected() -> None:
    kinds = {p.name: open_trace(p).format.kind for p in sorted(BF.iterdir())}
    assert kinds == {
        "ImageNet-imgps-JNPs-1001J.csv": "elastic-curves",
        "ImageNet-imgps-Jbnd-1001J.csv": "elastic-bounds",
        "hps-shufflenet-JNPs-1000J.csv": "elastic-curves",
        "hps-shufflenet-JNPs-10J.csv": "elastic-curves",
        "hps-shufflenet-Jbnd-1000J.csv": "elastic-bounds",
        "hps-shufflenet-Jbnd-10J.csv": "elastic-bounds",
        "idle-intervals.csv.gz": "idle",
        "node-order.txt": "nodes",
    }
