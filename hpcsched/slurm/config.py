"""The harvest configuration file (YAML): what to run, how, and where to write what happened.

```yaml
mode: scavenger          # scavenger: mode (a), Slurm jobs in a preemptible partition
                         # local: mode (b), own processes on nodes Slurm reports idle
partition: scavenger     # mode (a) partition
poll_s: 0.5
settle_s: 3
solver: highs            # any hpcsched.milp solver
tfwd: 10
jobs:
  - id: lr
    jmin: 1
    jmax: 4
    steps: 600
    curve: {nodes: [1, 4], rates: [1, 3.6]}   # samples/s by node count (default: linear)
    scale_up_s: 1
    scale_down_s: 1
    ckpt_dir: ckpt/lr     # relative to the config file
    command: ["{python}", -m, hpcsched.slurm.dp_train, --ckpt-dir, "{ckpt_dir}", --steps, "{steps}"]
```
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from hpcsched.errors import InputError
from hpcsched.slurm.harvester import HarvestConfig
from hpcsched.slurm.spec import ElasticSpec, elastic_spec

MODES = ("scavenger", "local")


@dataclass(frozen=True, slots=True)
class HarvestFile:
    mode: str
    partition: str
    config: HarvestConfig
    specs: list[ElasticSpec]


def _job_lines(text: str) -> list[int]:
    """1-based line of each ``jobs:`` entry, so an error names the entry's line."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return []
    if not isinstance(root, yaml.MappingNode):
        return []
    for k, v in root.value:
        if k.value == "jobs" and isinstance(v, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in v.value]
    return []


def read_harvest_config(path: Path) -> HarvestFile:
    try:
        text = path.read_text()
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror}") from None
    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise InputError(path, f"invalid YAML: {getattr(e, 'problem', e)}", mark.line + 1 if mark else None) from None
    if not isinstance(d, dict) or not isinstance(d.get("jobs"), list) or not d["jobs"]:
        raise InputError(path, "expected a mapping with a non-empty 'jobs:' list", 1)
    mode = str(d.get("mode", "scavenger"))
    if mode not in MODES:
        raise InputError(path, f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    try:
        cfg = HarvestConfig(poll_s=float(d.get("poll_s", 0.5)), settle_s=float(d.get("settle_s", 3.0)),
                            pending_timeout_s=float(d.get("pending_timeout_s", 20.0)),
                            stop_timeout_s=float(d.get("stop_timeout_s", 30.0)),
                            solver=str(d.get("solver", "highs")), tfwd=float(d.get("tfwd", 10.0)))
    except (TypeError, ValueError) as e:
        raise InputError(path, f"bad setting: {e}") from None
    lines = _job_lines(text)
    specs = []
    for i, j in enumerate(d["jobs"]):
        line = lines[i] if i < len(lines) else None
        if not isinstance(j, dict):
            raise InputError(path, f"jobs[{i}] must be a mapping", line)
        try:
            specs.append(elastic_spec(j, path.parent))
        except KeyError as e:
            raise InputError(path, f"jobs[{i}] lacks {e.args[0]!r}", line) from None
        except (TypeError, ValueError) as e:
            raise InputError(path, f"jobs[{i}]: {e}", line) from None
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise InputError(path, f"job ids must be unique, got {ids}")
    return HarvestFile(mode, str(d.get("partition", "scavenger")), cfg, specs)
