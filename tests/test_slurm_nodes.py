"""Slurm node states -> harvestable pool, and the harvest config's errors (no Slurm needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcsched.errors import InputError
from hpcsched.slurm.config import read_harvest_config
from hpcsched.slurm.nodes import parse_sinfo, parse_state
from hpcsched.slurm.source import SlurmJob, derive_pool, parse_squeue

# Captured from `sinfo -N -h -o '%N %T'` on the 4-node test cluster (two partitions, so each node
# appears twice) while n2 was drained, n3 ran a batch job and n4's slurmd had been killed.
SINFO = """n1 idle
n1 idle
n2 drained
n2 drained
n3 allocated
n3 allocated
n4 idle*
n4 idle*
"""


def test_only_plain_idle_is_harvestable() -> None:
    states = parse_sinfo(SINFO)
    assert [n for n, s in states.items() if s.harvestable] == ["n1"]
    assert states["n4"].reason == "idle* (not responding)"
    assert states["n2"].reason == "drained"


@pytest.mark.parametrize(
    ("raw", "harvestable", "busy"),
    [
        ("idle", True, False),
        ("planned", False, False),  # backfill holds it for a pending job
        ("idle-", False, False),
        ("mixed", False, True),
        ("allocated", False, True),
        ("completing", False, True),
        ("draining", False, False),
        ("idle+drain", False, False),
        ("down*", False, False),
        ("allocated*", False, False),  # a job holds it but its slurmd stopped answering
        ("idle~", False, False),  # powered off
        ("maint", False, False),
    ],
)
def test_state_table(raw: str, harvestable: bool, busy: bool) -> None:
    s = parse_state("n9", raw)
    assert (s.harvestable, s.busy) == (harvestable, busy)


def test_node_listed_twice_keeps_less_harvestable_reading() -> None:
    assert not parse_sinfo("n1 idle\nn1 allocated\n")["n1"].harvestable


def test_squeue_lines_expand_hostlists() -> None:
    jobs = parse_squeue("12|batch|wrap|RUNNING|n[1-3]\n13|scavenger|hpcsched-lr-1|PENDING|\n",
                        expand=lambda s: {"n[1-3]": ["n1", "n2", "n3"]}[s])
    assert [(j.id, j.nodes) for j in jobs] == [("12", ("n1", "n2", "n3")), ("13", ())]


def test_pool_keeps_our_nodes_and_drops_foreign_and_broken_ones() -> None:
    states = parse_sinfo("n1 idle\nn2 allocated\nn3 allocated\nn4 draining\nn5 allocated\nn6 down*\nn7 planned\n")
    jobs = [SlurmJob("7", "scavenger", "hpcsched-lr-1", "RUNNING", ("n2", "n4")),
            SlurmJob("8", "batch", "wrap", "CONFIGURING", ("n3",))]
    pool, why = derive_pool(states, jobs, lambda j: j.name.startswith("hpcsched-"))
    # n2: held by our own scavenger job; n5: sinfo says allocated but no job holds it (one just ended)
    assert pool == ["n1", "n2", "n5"]
    assert why == {"n3": "held by job 8 (batch), allocated", "n4": "draining", "n6": "down* (not responding)",
                   "n7": "planned"}


def _cfg(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "h.yaml"
    p.write_text(text)
    return p


def test_config_reads_jobs_relative_to_file(tmp_path: Path) -> None:
    hf = read_harvest_config(_cfg(tmp_path, "jobs:\n  - {id: a, jmax: 4, steps: 10, command: [x]}\n"))
    assert hf.mode == "scavenger" and hf.specs[0].ckpt_dir == tmp_path / "ckpt" / "a"
    assert hf.specs[0].job.curve.rate(4) == 4.0


@pytest.mark.parametrize(
    ("text", "msg", "line"),
    [
        ("jobs:\n  - {id: a, jmax: 4, steps: 10, command: [x]}\n  - {id: b, steps: 3, command: [x]}\n",
         "jobs[1] lacks 'jmax'", 3),
        ("jobs:\n  - {id: a, jmax: 0, steps: 10, command: [x]}\n", "Jmin", 2),
        ("jobs:\n  - {id: a, jmax: 2, steps: 10, command: x}\n", "list of strings", 2),
        ("mode: both\njobs:\n  - {id: a, jmax: 2, steps: 1, command: [x]}\n", "mode must be", None),
        ("jobs: [\n", "invalid YAML", 2),
        ("poll_s: 1\n", "non-empty 'jobs:'", 1),
    ],
)
def test_config_errors_name_file_and_line(tmp_path: Path, text: str, msg: str, line: int | None) -> None:
    p = _cfg(tmp_path, text)
    with pytest.raises(InputError) as e:
        read_harvest_config(p)
    assert msg in str(e.value) and e.value.line == line
