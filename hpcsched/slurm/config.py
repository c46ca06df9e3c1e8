"""The harvest configuration file (YAML): what to run, how, and where to write what happened.

```yaml
mode: controller         # controller (default): the runtime's controller, node_source slurm (pilot workers)
                         # scavenger: mode (a), the harvester's own Slurm jobs in a preemptible partition
                         # local: mode (b), the harvester's own processes on nodes Slurm reports idle
partition: scavenger     # the pilots' partition (controller), the runs' partition (scavenger)
qos: scavenger           # controller: the pilots' --qos, --account, time limit (optional)
account: proj1
time_limit_s: 3600
min_runtime_s: 10        # controller: an attempt is not resized or preempted by the controller before this
pilot: {stop_grace_s: 4} # controller: any other key of the controller's ``slurm:`` section (slurm/pilot_config.py)
poll_s: 0.5              # controller: the pilots' and the pool's poll
settle_s: 3              # scavenger/local: wait after a preemption; controller: the pilots' settle_s
solver: highs            # scavenger/local: any hpcsched.milp solver (controller: its decision core's)
tfwd: 10                 # the MILP's look-ahead (controller: milp_tfwd_s)
jobs:
  - id: lr
    jmin: 1
    jmax: 4
    steps: 600
    curve: {nodes: [1, 4], rates: [1, 3.6]}   # samples/s by node count (default: linear)
    scale_up_s: 1
    scale_down_s: 1
    ckpt_dir: ckpt/lr     # relative to the config file; scavenger/local only (controller: the runtime's)
    command: ["{python}", -m, hpcsched.slurm.dp_train, --ckpt-dir, "{ckpt_dir}", --steps, "{steps}"]
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpcsched.errors import InputError
from hpcsched.slurm.harvester import HarvestConfig
from hpcsched.slurm.spec import ElasticSpec, elastic_spec

MODES = ("controller", "scavenger", "local")
DEFAULT_MODE = "controller"  # before: scavenger (README, change notes)
# Top-level keys only mode controller reads, and keys only the harvester's own modes read.
CONTROLLER_ONLY = ("qos", "account", "time_limit_s", "min_runtime_s", "pilot")
HARVESTER_ONLY = ("solver", "stop_timeout_s")


@dataclass(frozen=True, slots=True)
class HarvestFile:
    mode: str
    partition: str
    config: HarvestConfig
    specs: list[ElasticSpec]
    # mode controller: the controller's ``slurm:`` section as far as this file sets it (PilotConfig keys; the
    # partition and max_pilots are added at run time), and its min_runtime_s
    pilot: dict[str, Any] = field(default_factory=dict)
    min_runtime_s: float = 10.0
    path: Path = Path("harvest.yaml")


def _key_lines(text: str) -> tuple[dict[str, int], list[int]]:
    """1-based line of each top-level key and of each ``jobs:`` entry, so an error names the line."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return {}, []
    if not isinstance(root, yaml.MappingNode):
        return {}, []
    keys, jobs = {}, []
    for k, v in root.value:
        keys[str(k.value)] = k.start_mark.line + 1
        if k.value == "jobs" and isinstance(v, yaml.SequenceNode):
            jobs = [item.start_mark.line + 1 for item in v.value]
    return keys, jobs


def _pilot_keys(d: dict[str, Any], path: Path, key_lines: dict[str, int]) -> dict[str, Any]:
    """Mode controller: the pilot settings this file gives, by the names of the controller's ``slurm:`` section,
    checked now by the controller's own reader (so a mistake names this file before anything is submitted)."""
    from hpcsched.slurm.pilot_config import read_pilot_config

    out: dict[str, Any] = {k: d[k] for k in ("qos", "account", "time_limit_s") if k in d}
    for ours, theirs in (("poll_s", "poll_s"), ("settle_s", "settle_s"), ("pending_timeout_s", "start_timeout_s")):
        if ours in d:
            out[theirs] = d[ours]
    extra = d.get("pilot") or {}
    if not isinstance(extra, dict):
        raise InputError(path, "pilot: expected a mapping of the controller's slurm: keys (slurm/pilot_config.py)",
                         key_lines.get("pilot"))
    for k in ("partition", "max_pilots", "slots"):
        if k in extra:
            raise InputError(path, f"pilot: {k} is set by harvest itself (partition: the top-level key; max_pilots: "
                                   "the partition's nodes; slots: 1, one process per pilot)", key_lines.get("pilot"))
    out |= extra
    line = next((key_lines[k] for k in ("pilot", "time_limit_s", "qos", "account") if k in key_lines), None)
    read_pilot_config(dict(out), str(path), line, path.parent)
    return out


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
    key_lines, lines = _key_lines(text)
    mode = str(d.get("mode", DEFAULT_MODE))
    if mode not in MODES:
        raise InputError(path, f"mode must be one of {', '.join(MODES)}, got {mode!r}", key_lines.get("mode"))
    # A key the chosen mode does not read is refused, not ignored: the run would not be the one the file describes.
    for k in CONTROLLER_ONLY if mode != "controller" else HARVESTER_ONLY:
        if k in d:
            why = (f"read by mode controller only (mode is {mode})" if mode != "controller" else
                   "not read by mode controller (the runtime's controller plans and stops jobs: its decision core "
                   "picks the MILP solver, its stop_grace_s kills a task that does not stop); remove it, or set "
                   "mode: scavenger / local")
            raise InputError(path, f"{k}: {why}", key_lines.get(k))
    try:
        cfg = HarvestConfig(poll_s=float(d.get("poll_s", 0.5)), settle_s=float(d.get("settle_s", 3.0)),
                            pending_timeout_s=float(d.get("pending_timeout_s", 20.0)),
                            stop_timeout_s=float(d.get("stop_timeout_s", 30.0)),
                            solver=str(d.get("solver", "highs")), tfwd=float(d.get("tfwd", 10.0)))
    except (TypeError, ValueError) as e:
        raise InputError(path, f"bad setting: {e}") from None
    pilot = _pilot_keys(d, path, key_lines) if mode == "controller" else {}
    try:
        min_runtime_s = float(d.get("min_runtime_s", 10.0))
    except (TypeError, ValueError):
        raise InputError(path, "min_runtime_s: expected seconds", key_lines.get("min_runtime_s")) from None
    if not min_runtime_s >= 0:
        raise InputError(path, f"min_runtime_s: must be >= 0, got {min_runtime_s}", key_lines.get("min_runtime_s"))
    specs = []
    for i, j in enumerate(d["jobs"]):
        line = lines[i] if i < len(lines) else None
        if not isinstance(j, dict):
            raise InputError(path, f"jobs[{i}] must be a mapping", line)
        if mode == "controller" and "ckpt_dir" in j:
            raise InputError(path, f"jobs[{i}]: ckpt_dir is not read by mode controller: the runtime gives each job "
                                   "its checkpoint directory (OUT/checkpoints/JOB, as {ckpt_dir} and "
                                   "$HPCSCHED_CHECKPOINT_DIR); remove it, or set mode: scavenger / local", line)
        try:
            specs.append(elastic_spec(j, path.parent))
        except KeyError as e:
            raise InputError(path, f"jobs[{i}] lacks {e.args[0]!r}", line) from None
        except (TypeError, ValueError) as e:
            raise InputError(path, f"jobs[{i}]: {e}", line) from None
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise InputError(path, f"job ids must be unique, got {ids}")
    return HarvestFile(mode, str(d.get("partition", "scavenger")), cfg, specs, pilot, min_runtime_s, path)
