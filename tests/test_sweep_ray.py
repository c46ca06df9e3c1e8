"""The same sweep on a local Ray instance started by the test: same cells, same numbers, same resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcsched.sweep import load_config, read_table, run_sweep

ray = pytest.importorskip("ray", reason="the 'ray' extra is not installed (pip install -e '.[ray]')")

ROOT = Path(__file__).resolve().parents[1]
TRACE3 = ROOT / "trace-data" / "muri" / "trace3.csv"
CLUSTER = ROOT / "cluster_spec" / "n8g8.csv"


@pytest.fixture(scope="module")
def local_ray():
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as e:  # noqa: BLE001 - Ray's own start-up (raylet/GCS) failing is not our code failing
        pytest.skip(f"a local Ray instance did not start here: {e}")
    yield
    ray.shutdown()


def test_ray_runs_the_grid_like_the_local_pool(tmp_path: Path, local_ray: None) -> None:
    trace = tmp_path / "data" / "trace3_head.csv"  # inputs are shipped through Ray, not a shared path
    trace.parent.mkdir()
    trace.write_text("\n".join(TRACE3.read_text().splitlines()[:26]) + "\n")
    cfg_path = tmp_path / "sweep.yaml"
    cfg_path.write_text(f"grid:\n  kind: simulate\n  policy: [srtf, srsf]\n  trace: data/{trace.name}\n"
                        f"  cluster: {CLUSTER}\n  compat: [muri]\n")
    cfg = load_config(cfg_path)
    on_ray = run_sweep(cfg, tmp_path / "ray", ray_address="auto", progress=False)
    assert (on_ray.ran, on_ray.failed) == (2, [])
    assert run_sweep(cfg, tmp_path / "local", workers=1, progress=False).failed == []
    a, b = read_table(tmp_path / "ray"), read_table(tmp_path / "local")
    cols = ["cell_id", "policy", "jobs", "avg_jct", "p99_jct", "makespan"]
    assert a[cols].equals(b[cols])
    assert (a["jobs"] == 25).all()
    for c in cfg.cells:
        assert (tmp_path / "ray" / "cells" / c.id / "jobs.csv").is_file()
        assert (tmp_path / "ray" / "cells" / c.id / "cell.json").is_file()
    again = run_sweep(cfg, tmp_path / "ray", ray_address="auto", progress=False)
    assert (again.ran, again.skipped) == (0, 2)
