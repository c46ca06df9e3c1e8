"""Issue 18, "GPUs": a worker's slots map to devices (``CUDA_VISIBLE_DEVICES``), torch.distributed uses NCCL on
GPUs (Gloo on CPUs), and jobs placed side by side get different devices. Skipped without CUDA: these run where a
machine with GPUs is lent (scripts/device_check.sh), never as a condition of the CPU suite."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from runtime_procs import client, controller_config, job_file, start_controller, start_worker, stop, submit, wait_for


def _cuda_devices() -> int:
    if importlib.util.find_spec("torch") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


GPUS = _cuda_devices()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(GPUS == 0, reason="needs torch with CUDA and a GPU")]


def test_jobs_side_by_side_get_their_own_device_and_nccl(tmp_path: Path) -> None:
    """One worker offering every GPU as a slot; one 1-proc torchrun job per GPU (at most 2): each trains on
    ``cuda:0`` of its own view, that view is one device and no two jobs share it, NCCL is the backend, steps exact."""
    n = min(GPUS, 2)
    ctl, addr = start_controller(tmp_path, controller_config(tmp_path))
    worker = start_worker(tmp_path, addr, "gpu0", slots=n, gpus=n)
    c = client(addr)
    try:
        ids = [submit(c, job_file(tmp_path, f"g{i}", 1, 40)) for i in range(n)]
        jobs = wait_for("the GPU jobs finished", lambda: (js := {j.job_id: j for j in c.jobs()}) and all(
            js[i].state in ("completed", "failed") for i in ids) and js, 300, poll=0.5)
        seen = []
        for jid in ids:
            assert jobs[jid].state == "completed", (jid, jobs[jid].message)
            result = json.loads((tmp_path / "run" / "ckpt" / jid / "result.json").read_text())
            assert result["steps"] == 40 and result["device"] == "cuda:0", result
            assert result["backend"] == "nccl", result
            visible = result["cuda_visible_devices"]
            assert visible is not None and len(visible.split(",")) == 1, result
            seen.append(visible)
        assert len(set(seen)) == n, seen  # side by side: never the same device
    finally:
        c.close()
        stop(worker)
        stop(ctl)
