"""Which GPU type a worker advertises when it is not told (``hpcsched worker --gpu-type`` / ``gpu_type:``).

Why detect: a job may ask for a type (``gpu_type: v100``) and the throughput-aware placement ranks types by speed,
so a worker that advertises the wrong type (or none) misplaces jobs; most nodes can say what they have. The rule:

- a worker that offers no GPUs (``--gpus 0``) is ``cpu``;
- otherwise ``nvidia-smi --query-gpu=name`` names its GPUs, and the type is the model word of the first name,
  lower case (``Tesla V100-SXM2-16GB`` -> ``v100``, ``NVIDIA H100 80GB HBM3`` -> ``h100``, ``Tesla T4`` -> ``t4``);
  a name with no such word becomes its words joined by ``-`` (``Quadro RTX 8000`` -> ``quadro-rtx-8000``);
- when nvidia-smi is missing or fails, or reports no GPU, the type is ``unknown`` (no typed job goes there) and the
  reason is logged with the fix (pass ``--gpu-type``), rather than a guess.

``detect`` returns the type and a sentence saying how it was reached, which the worker logs.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

from hpcsched.runtime.jobfile import GPU_TYPE

_MODEL_WORD = re.compile(r"(?<![a-z0-9])([a-z]{1,3}\d{1,4}[a-z]?)(?![a-z0-9])")
_VENDOR_WORDS = {"nvidia", "tesla"}


def type_from_name(name: str) -> str:
    """The GPU type a device name stands for (rules in the module docstring); "unknown" for an empty name."""
    words = [w for w in re.split(r"\s+", name.strip().lower()) if w and w not in _VENDOR_WORDS]
    m = _MODEL_WORD.search(" ".join(words))
    if m:
        return m.group(1)
    t = re.sub(r"[^a-z0-9_.+-]+", "-", "-".join(words)).strip("-_.+")[:32].rstrip("-_.+")
    return t if GPU_TYPE.fullmatch(t) else "unknown"


def nvidia_smi_names(timeout_s: float = 10.0) -> tuple[list[str], str]:
    """The GPU names nvidia-smi reports, one per device, or ([], why not)."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return [], "nvidia-smi is not installed here"
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"nvidia-smi did not run ({e})"
    if done.returncode != 0:
        return [], f"nvidia-smi failed (exit {done.returncode}: {(done.stderr or done.stdout).strip()[:200]})"
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return names, "" if names else "nvidia-smi reports no GPU"


def detect(gpus: int, names: Callable[[], tuple[list[str], str]] = nvidia_smi_names) -> tuple[str, str]:
    """(GPU type, how it was reached) for a worker offering ``gpus`` GPUs (rules in the module docstring)."""
    if gpus <= 0:
        return "cpu", "this worker offers no GPUs"
    found, why = names()
    if not found:
        return "unknown", f"{why}; pass --gpu-type (or gpu_type: in the worker file) so jobs that ask for a type " \
                          "can run here"
    types = [type_from_name(n) for n in found]
    how = f"detected: nvidia-smi reports {len(found)} GPU{'s' if len(found) > 1 else ''}, the first {found[0]!r}"
    if len(set(types)) > 1:
        how += f"; the node mixes types ({', '.join(sorted(set(types)))}): it advertises the first's, pass " \
               "--gpu-type to choose"
    return types[0], how
