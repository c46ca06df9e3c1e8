"""Fixtures shared across test modules. Tests run in random order (pytest-randomly; `make test` prints the
seed), so a fixture here must not carry state from one test to the next: these return immutable inputs."""

from __future__ import annotations

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
