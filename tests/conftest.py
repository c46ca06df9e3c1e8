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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for ``pytest -n N --dist loadgroup`` (``make test`` runs two workers): a module's tests stay in one
    worker, so a module-scoped fixture (three network-namespace hosts, a controller) is built once, not once per
    worker; every test that drives the one live Slurm shares a group, so two never submit to it at once."""
    for item in items:
        group = "live-slurm" if item.get_closest_marker("slurm") else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
