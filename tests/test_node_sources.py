"""Every registered node source (``hpcsched.runtime.node_source.SOURCES``) against the contract in that module's
docstring: built by name, ``start``/``stop`` prompt and ``stop`` idempotent, ``step`` a bounded number of
external calls whatever the node count, ``arriving`` a list, ``view`` an immutable snapshot named after the source.
The Slurm and PBS sources run against the fake Slurm and PBS Pro programs (tests/fake_slurm.py, tests/fake_pbs.py)
on PATH, through the same ``commands.run`` as against the real ones."""

from __future__ import annotations

import time
from pathlib import Path

import fake_pbs
import pytest
from fake_slurm import FakeSlurm, View, install, save

from hpcsched.pbs.config import PbsConfig
from hpcsched.runtime.node_source import NODE_SOURCES, SOURCES, SourceView, build, factory
from hpcsched.slurm.pilot_config import PilotConfig


def _source(name: str, tmp_path: Path, nodes: int, monkeypatch: pytest.MonkeyPatch):
    """The source and a function giving the external calls it has made so far."""
    cfg = None
    calls = tmp_path / f"{name}-{nodes}.json.calls"
    if name == "slurm":
        state = tmp_path / f"slurm-{nodes}.json"
        save(FakeSlurm(nodes, auto_start=True), state)
        install(tmp_path / f"bin-{nodes}", state)
        monkeypatch.setenv("PATH", f"{tmp_path / f'bin-{nodes}'}:{__import__('os').environ['PATH']}")
        cfg = PilotConfig(partition="scavenger", max_pilots=nodes, work_dir=tmp_path / f"pilots-{nodes}", poll_s=0.2)
    if name == "pbs":
        state = tmp_path / f"pbs-{nodes}.json"
        fake_pbs.save(fake_pbs.FakePbs(nodes, ncpus=1, run_scripts=False), state)
        fake_pbs.install(tmp_path / f"bin-{nodes}", state)
        monkeypatch.setenv("PATH", f"{tmp_path / f'bin-{nodes}'}:{__import__('os').environ['PATH']}")
        cfg = PbsConfig(max_pilots=nodes, work_dir=tmp_path / f"pilots-{nodes}", poll_s=0.2)
    src = build(name, cfg, View(demand=nodes // 2), "127.0.0.1:1", None, tmp_path / f"state-{nodes}.db")
    return src, lambda: calls.read_text().split() if calls.exists() else []


def test_the_registry_names_static_slurm_and_pbs() -> None:
    assert NODE_SOURCES == tuple(SOURCES) and {"static", "slurm", "pbs"} <= set(NODE_SOURCES)
    with pytest.raises(ValueError, match="unknown node source 'lsf'; expected one of static, slurm, pbs"):
        factory("lsf")


@pytest.mark.parametrize("name", NODE_SOURCES)
def test_every_node_source_keeps_the_contract(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    per_step = {}
    for nodes in (10, 200):
        src, calls = _source(name, tmp_path, nodes, monkeypatch)
        assert src.name == name
        v0 = src.view()
        assert isinstance(v0, SourceView) and v0.name == name
        src.step()  # claims what the queue wants (slurm: one sbatch for all its pilots)
        src.step()
        assert isinstance(src.arriving(set()), list)
        n0 = len(calls())
        src.step()
        per_step[nodes] = sorted(calls()[n0:])
        v1 = src.view()
        assert v1.name == name and src.view() is v1  # a snapshot, replaced by a step, not a live table
        assert isinstance(v0.nodes, dict) and v0 is not v1 or name == "static"
        if name in ("slurm", "pbs"):
            assert len(v1.nodes) == nodes and sum(1 for _, job in v1.nodes.values() if job) == nodes // 2
            assert len(v1.workers) == nodes // 2
        t0 = time.monotonic()
        src.start()
        src.stop()
        src.stop()  # idempotent
        assert time.monotonic() - t0 < 60
        assert src.arriving(set()) == [] or name != "static"
    # the external calls of a steady step do not grow with the node count
    assert per_step[10] == per_step[200], per_step
    if name in ("slurm", "pbs"):
        assert per_step[200] == {"slurm": ["sinfo", "squeue"], "pbs": ["pbsnodes", "qstat"]}[name]
