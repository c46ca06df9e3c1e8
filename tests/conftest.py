"""Fixtures shared across test modules. Tests run in random order (pytest-randomly; `make test` prints the
seed), so a fixture here must not carry state from one test to the next: these return immutable inputs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def trace3() -> list:
    """Muri's trace3 (992 jobs), the bundled real trace behind the published tables."""
    from hpcsched.traces import read_jobs

    return read_jobs(ROOT / "trace-data/muri/trace3.csv")


@pytest.fixture(scope="session")
def n8g8():
    """The 8-node x 8-GPU cluster of the Muri paper's simulations."""
    from hpcsched.cluster_spec import read_cluster_spec

    return read_cluster_spec(ROOT / "cluster_spec/n8g8.csv")



LIVE_SLURM_LOCK = Path("/tmp/hpcsched-live-slurm.lock")  # the one live Slurm is machine-wide: so is its lock


@pytest.fixture(autouse=True)
def one_live_slurm_test_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests marked ``slurm`` drive the one live Slurm of this machine (every node idle before and after): under
    ``make test``'s two workers (pytest-xdist, a module per worker) two such modules would submit and cancel
    under each other, so each such test holds an exclusive lock while it runs. Its own clean-up fixtures run
    inside (this one is the outermost: a conftest autouse fixture)."""
    if request.node.get_closest_marker("slurm") is None:
        yield
        return
    import fcntl

    with LIVE_SLURM_LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
