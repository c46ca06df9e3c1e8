"""What harvesting runs: an elastic job's command, bounds, scaling curve and checkpoint directory.

Workload protocol (what the harvester needs from a training program, nothing more): it runs one
process per node; on SIGTERM it checkpoints and exits 0; it resumes from its checkpoint; and it
tells its progress in one of two ways:

- ``CKPT_DIR/progress.json`` (last completed step) and ``CKPT_DIR/checkpoint.json`` (last
  checkpointed step) as ``{"step": N}`` (``hpcsched.slurm.dp_train``);
- the runtime's: JSON lines appended to ``$HPCSCHED_PROGRESS_FILE`` (here ``CKPT_DIR/progress.jsonl``)
  with ``step`` and, when a checkpoint was written at that step, a non-empty ``checkpoint``
  (``workloads/ddp_train.py``).

In mode controller the runtime launches the program (``controller_mode``): its ranks, checkpoint directory and
steps come from the runtime's variables and its progress from its JSON lines. In the harvester's own modes
every process gets its rank as ``SLURM_PROCID``/``SLURM_NTASKS`` (mode (a)), ``HPCSCHED_RANK``/
``HPCSCHED_WORLD``/``HPCSCHED_RUN_ID`` (mode (b)) and, in both modes, the torch.distributed variables
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``, plus the runtime's
``HPCSCHED_CHECKPOINT_DIR``/``HPCSCHED_STEPS``/``HPCSCHED_PROGRESS_FILE``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcsched.model import ElasticJob, ScalingCurve


@dataclass(frozen=True, slots=True)
class ElasticSpec:
    """One elastic training job; ``command`` may use ``{ckpt_dir}``, ``{steps}`` and ``{python}`` (this interpreter)."""

    job: ElasticJob
    command: tuple[str, ...]
    ckpt_dir: Path
    steps: int

    @property
    def id(self) -> str:
        return self.job.id

    def argv(self) -> list[str]:
        return [a.format(ckpt_dir=self.ckpt_dir, steps=self.steps, python=sys.executable) for a in self.command]

    @property
    def progress_file(self) -> Path:
        return self.ckpt_dir / "progress.jsonl"

    def env(self) -> dict[str, str]:
        """The runtime's workload variables, so its programs run unchanged under the harvester."""
        return {"HPCSCHED_CHECKPOINT_DIR": str(self.ckpt_dir), "HPCSCHED_STEPS": str(self.steps),
                "HPCSCHED_PROGRESS_FILE": str(self.progress_file)}

    def progress_step(self) -> int:
        if self.progress_file.exists():
            return max((r.get("step", 0) for r in _jsonl(self.progress_file)), default=0)
        return _read_step(self.ckpt_dir / "progress.json")

    def checkpoint_step(self) -> int:
        if self.progress_file.exists():
            return max((r.get("step", 0) for r in _jsonl(self.progress_file) if r.get("checkpoint")), default=0)
        return _read_step(self.ckpt_dir / "checkpoint.json")

    @property
    def done(self) -> bool:
        return self.checkpoint_step() >= self.steps


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """Complete JSON lines of a progress file (a line being written is skipped)."""
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _read_step(path: Path) -> int:
    try:
        return int(json.loads(path.read_text())["step"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError, ValueError):
        return 0


def elastic_spec(d: Mapping[str, Any], base: Path) -> ElasticSpec:
    """Build a spec from one ``jobs:`` entry of a harvest config (raises KeyError/ValueError/TypeError)."""
    jmin, jmax, steps = int(d.get("jmin", 1)), int(d["jmax"]), int(d["steps"])
    if not 1 <= jmin <= jmax:
        raise ValueError(f"need 1 <= Jmin <= Jmax, got Jmin={jmin} Jmax={jmax}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    curve = d.get("curve") or ({"nodes": [1, jmax], "rates": [1.0, float(jmax)]} if jmax > 1
                               else {"nodes": [1], "rates": [1.0]})
    job = ElasticJob(
        id=str(d["id"]),
        submit=0.0,
        jmin=jmin,
        jmax=jmax,
        curve=ScalingCurve(tuple(float(x) for x in curve["nodes"]), tuple(float(x) for x in curve["rates"])),
        total_samples=float(steps),
        scale_up_s=float(d.get("scale_up_s", 0.0)),
        scale_down_s=float(d.get("scale_down_s", 0.0)),
    )
    cmd: Sequence[str] = d["command"]
    if isinstance(cmd, str) or not all(isinstance(a, str) for a in cmd):
        raise TypeError("command must be a list of strings")
    ckpt = Path(d.get("ckpt_dir", f"ckpt/{job.id}"))
    return ElasticSpec(job, tuple(cmd), ckpt if ckpt.is_absolute() else base / ckpt, steps)
