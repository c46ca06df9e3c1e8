"""The comparison figure is drawn from comparison.json's data, whatever simulations and group sizes it holds."""

from __future__ import annotations

from pathlib import Path

from hpcsched.testbed.plot import plot_comparison


def _cmp(scale: float, groups: list[dict]) -> dict:
    jobs = [{"job_id": str(i), "real_jct": 100.0 * (i + 1), "sim_jct": 100.0 * (i + 1) * scale, "error": scale - 1}
            for i in range(5)]
    return {"jobs": jobs, "summary": {"avg JCT": {"real": 300.0, "sim": 300.0 * scale, "error": scale - 1}},
            "groups": groups}


def test_figure_of_two_simulations_and_three_group_sizes(tmp_path: Path) -> None:
    groups = [{"group_size": k, "measured_s": 10.0 * k, "sim_s": 11.0 * k} for k in (1, 2, 3)]
    out = plot_comparison({"sim-trace": _cmp(1.3, groups), "sim-measured": _cmp(1.02, groups[:2])},
                          tmp_path / "sub" / "comparison.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_figure_without_group_rows_or_finished_jobs(tmp_path: Path) -> None:
    c = {"jobs": [{"job_id": "0", "real_jct": None, "sim_jct": 5.0, "error": None}], "summary": {}, "groups": []}
    assert plot_comparison({"sim-trace": c}, tmp_path / "c.png").stat().st_size > 0
