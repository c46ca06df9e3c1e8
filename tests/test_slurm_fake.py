"""The fake Slurm command layer (tests/fake_slurm.py) against the REAL loopback Slurm: the same commands, with
the options the pilot manager uses, print the same lines (job ids and times aside) on both. What the benchmark
at 10,000 nodes and the unit tests rely on is checked here, not assumed.

Skipped with the reason when no Slurm controller answers (run ``scripts/slurm_cluster.sh up`` as root)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fake_slurm import FakeSlurm
from runtime_procs import wait_for
from slurm_cluster import NODES, clean_cluster, sh  # noqa: F401 (clean_cluster: autouse fixture)

from hpcsched.slurm import commands
from hpcsched.slurm.pilot_read import SQUEUE_FORMAT

WHY_NOT = commands.available()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(WHY_NOT is not None, reason=f"no real Slurm: {WHY_NOT}")]


def _norm(text: str, ids: dict[str, str]) -> list[str]:
    """Job ids replaced by their names in ``ids`` (ARRAY_TASK keeps its task), times and node names blanked."""
    out = []
    for line in text.splitlines():
        def jid(m: re.Match) -> str:
            return ids.setdefault(m.group(1), f"J{len(ids)}") + (m.group(2) or "")
        line = re.sub(r"^(\d+)(_\d+)?", jid, line)
        line = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", "TIME", line)
        line = re.sub(r"\|n\d+\|", "|NODE|", line)
        out.append(line)
    return sorted(out)


def test_the_fake_prints_what_the_real_slurm_prints(tmp_path: Path) -> None:
    fake = FakeSlurm(len(NODES))
    for argv in (["sinfo", "-N", "-h", "-p", "scavenger", "-o", "%N %T"], ["sinfo", "-N", "-h", "-o", "%N %T"]):
        assert sorted(sh(*argv).splitlines()) == sorted(fake.run(argv).splitlines()), argv
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec sleep 60\n")
    sbatch = ["sbatch", "--parsable", "--job-name", "fake-check", "--nodes", "1", "--time", "5", "--output",
              "/dev/null", "--chdir", str(tmp_path), "--partition", "scavenger"]
    # an array of two, running; an array held pending (--begin) and a job pinned to a node
    runs = [sbatch + ["--array=0-1", "--signal=B:TERM@60", str(script)],
            sbatch + ["--array=0-1", "--begin=now+600", str(script)],
            sbatch + ["--nodelist", "n3", str(script)]]
    real_ids = [sh(*a).strip() for a in runs]
    fake_ids = [fake.run(a).strip() for a in runs]
    assert all(re.fullmatch(r"\d+", x) for x in real_ids + fake_ids), (real_ids, fake_ids)
    # the jobs by their submission: each side's ids mapped to the same names
    real_names = {x: f"J{k}" for k, x in enumerate(real_ids)}
    fake_names = {x: f"J{k}" for k, x in enumerate(fake_ids)}
    for i in (f"{fake_ids[0]}_0", f"{fake_ids[0]}_1", fake_ids[2]):
        fake.start(i)
    wait_for("the real jobs running", lambda: sh("squeue", "-h", "-t", "R", "-o", "%i").split().__len__() == 3, 60)
    for argv in (["squeue", "-h", "-r", "-o", SQUEUE_FORMAT],
                 ["squeue", "-h", "-r", "--name", "fake-check", "-o", SQUEUE_FORMAT],
                 ["sinfo", "-N", "-h", "-p", "scavenger", "-o", "%N %T"]):
        real, got = sh(*argv), fake.run(argv)
        assert _norm(real, dict(real_names)) == _norm(got, dict(fake_names)), (argv, real, got)
    # scancel: many ids at once; an id Slurm no longer has is passed over, silently, exit 0 (slurm-wlm 22.05)
    assert sh("scancel", f"{real_ids[0]}_0", f"{real_ids[0]}_1", real_ids[2], "999999") == ""
    assert fake.run(["scancel", f"{fake_ids[0]}_0", f"{fake_ids[0]}_1", fake_ids[2], "999999"]) == ""
    wait_for("the real jobs gone", lambda: sh("squeue", "-h", "-t", "R,CG", "-o", "%i").strip() == "", 60)
    argv = ["squeue", "-h", "-r", "-o", SQUEUE_FORMAT]
    assert _norm(sh(*argv), dict(real_names)) == _norm(fake.run(argv), dict(fake_names))
