"""The real loopback Slurm as the live pilot tests use it: its nodes, its commands, and a fixture that leaves it
with every node idle and no job before and after each test (a failed test's pilots are cancelled there too)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from runtime_procs import wait_for

from hpcsched.slurm import commands

NODES = ("n1", "n2", "n3", "n4")


def sh(*argv: str) -> str:
    return commands.run(argv)


def squeue() -> dict[str, tuple[str, str]]:
    """job id -> (name, state) of every job Slurm lists (an array's elements as ARRAYID_TASK)."""
    out = {}
    for line in sh("squeue", "-h", "-r", "-o", "%i|%j|%T").splitlines():  # -r: array elements one a line
        jid, name, state = line.split("|")
        out[jid] = (name, state)
    return out


def _reset() -> None:
    ids = list(squeue())
    if ids:
        sh("scancel", *ids)
    wait_for("all nodes idle and no job", lambda: not squeue() and set(
        sh("sinfo", "-N", "-h", "-p", "batch", "-o", "%T").split()) == {"idle"}, 60)


@pytest.fixture(autouse=True)
def clean_cluster() -> Iterator[None]:
    """Every node idle and no job before and after the test."""
    _reset()
    yield
    _reset()
