"""Per-job checkpoint quotas (worker config ``checkpoint_quota_mb``), with a real controller, worker and file system:
a job that writes past its quota gets a write error in its own checkpoint folder while another job on the same disk
keeps writing; on a file system without quotas the worker says so once and counts every folder left without one.

The quota file systems are images made and loop-mounted by the test (root, mkfs.btrfs / mkfs.xfs); each case skips
with the reason where it cannot be made here (XFS needs a kernel built with XFS quota support).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from runtime_procs import client, controller_config, start_controller, start_worker, stop, wait_for

QUOTA_MB = 8
FINAL = ("completed", "failed", "cancelled")


def _mount_quota_disk(fs: str, d: Path) -> Path:
    """A fresh file system of type ``fs`` with quotas on, loop-mounted at ``d/disk``; pytest.skip why it cannot."""
    if os.geteuid() != 0:
        pytest.skip("making and mounting a file system needs root")
    mkfs = shutil.which(f"mkfs.{fs}")
    tool = shutil.which("btrfs" if fs == "btrfs" else "xfs_quota")
    if not mkfs or not tool:
        pytest.skip(f"mkfs.{fs} or its quota tool is not installed ({'btrfs-progs' if fs == 'btrfs' else 'xfsprogs'})")
    img, mnt = d / f"{fs}.img", d / "disk"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(320 << 20)  # sparse; mkfs.xfs wants 300 MB at least
    done = subprocess.run([mkfs, "-q", str(img)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"mkfs.{fs} failed: {done.stderr.strip()[-300:]}")
    opts = "loop" if fs == "btrfs" else "loop,prjquota"
    done = subprocess.run(["mount", "-o", opts, str(img), str(mnt)], capture_output=True, text=True)
    if done.returncode:
        kernel = subprocess.run(["dmesg"], capture_output=True, text=True).stdout.strip().splitlines()[-1:]
        why = " ".join(f"{done.stderr.strip()[-200:]} {' '.join(kernel)}".split())
        pytest.skip(f"cannot mount {fs} with quotas here: {why}")
    if fs == "btrfs":
        done = subprocess.run(["btrfs", "quota", "enable", str(mnt)], capture_output=True, text=True)
        if done.returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
            pytest.skip(f"btrfs quotas cannot be enabled here: {done.stderr.strip()}")
    return mnt


@pytest.fixture(params=["btrfs", "xfs"])
def quota_disk(request, tmp_path: Path):
    mnt = _mount_quota_disk(request.param, tmp_path)
    try:
        yield request.param, mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _job(name: str, workdir: Path, script: str) -> str:
    return f"name: {name}\nlauncher: direct\nprocs: 1\nworkdir: {workdir}\ncommand: [sh, -c, {script!r}]\n"


def _output(d: Path, jid: str) -> str:
    return "\n".join(p.read_text() for p in (d / "run" / "w0").glob(f"{jid}.g*/output.log"))


def test_a_job_past_its_checkpoint_quota_fails_to_write_while_another_keeps_writing(tmp_path: Path,
                                                                                     quota_disk) -> None:
    fs, mnt = quota_disk
    wcfg = tmp_path / "worker.yaml"
    wcfg.write_text(f"checkpoint_quota_mb: {QUOTA_MB}\nmin_free_mb: 20\n")
    cfg = controller_config(tmp_path, max_restarts=0, checkpoint_root=str(mnt / "ckpt"))
    ctl, addr = start_controller(tmp_path, cfg)
    worker = start_worker(tmp_path, addr, "w0", slots=2, extra=("--config", str(wcfg)))
    c = client(addr)
    signal_file = tmp_path / "filler-done"
    try:
        wait_for("the worker registered", lambda: any(w.alive for w in c.workers()), 60)
        # the writer starts first and is still writing when the filler hits its quota, and after
        writer = c.submit(_job("writer", tmp_path, (
            "dd if=/dev/zero of=$HPCSCHED_CHECKPOINT_DIR/w1 bs=1M count=2 || exit 3; "
            f"while [ ! -e {signal_file} ]; do sleep 0.1; done; "
            "dd if=/dev/zero of=$HPCSCHED_CHECKPOINT_DIR/w2 bs=1M count=5 conv=fsync || exit 4; echo writer-ok")),
            "writer.yaml")
        filler = c.submit(_job("filler", tmp_path, (
            f"dd if=/dev/zero of=$HPCSCHED_CHECKPOINT_DIR/big bs=1M count={QUOTA_MB * 4} conv=fsync; "
            f"echo dd-exit=$?; touch {signal_file}")), "filler.yaml")
        js = wait_for("both jobs ended", lambda: (x := {j.job_id: j for j in c.jobs()}) and all(
            x[i].state in FINAL for i in (writer, filler)) and x, 120)
        out = _output(tmp_path, filler)
        error = "Disk quota exceeded" if fs == "btrfs" else "No space left on device"
        assert "dd-exit=1" in out and error in out, out
        assert js[writer].state == "completed" and "writer-ok" in _output(tmp_path, writer), (
            js[writer].message, _output(tmp_path, writer))
        used = sum(p.stat().st_size for p in (mnt / "ckpt" / filler).iterdir())
        assert used <= (QUOTA_MB + 1) << 20, used
        assert (mnt / "ckpt" / writer / "w2").stat().st_size == 5 << 20
        log = (tmp_path / "w0.log").read_text()
        assert log.count(f"checkpoint quota {QUOTA_MB} MB ({fs})") == 2, log[-3000:]
    finally:
        c.close()
        stop(worker)
        stop(ctl)


def test_a_file_system_without_quotas_is_said_once_and_counted(tmp_path: Path) -> None:
    """Here the checkpoints are on the test's own folder (not btrfs with quotas or XFS with prjquota, or a worker
    that is not root): one warning naming why, and each launch line counts the folders left without a quota."""
    wcfg = tmp_path / "worker.yaml"
    wcfg.write_text(f"checkpoint_quota_mb: {QUOTA_MB}\nmin_free_mb: 1\n")
    cfg = controller_config(tmp_path, max_restarts=0)
    ctl, addr = start_controller(tmp_path, cfg)
    worker = start_worker(tmp_path, addr, "w0", extra=("--config", str(wcfg)))
    c = client(addr)
    try:
        wait_for("the worker registered", lambda: any(w.alive for w in c.workers()), 60)
        jobs = [c.submit(_job(f"j{i}", tmp_path, "exit 0"), f"j{i}.yaml") for i in range(2)]
        wait_for("both jobs ended", lambda: all(j.state in FINAL for j in c.jobs() if j.job_id in jobs), 90)
        log = (tmp_path / "w0.log").read_text()
        if "(btrfs)" in log or "(xfs)" in log:
            pytest.skip("this test's folder is on a file system with quotas: nothing to warn about")
        assert log.count(f"checkpoint_quota_mb {QUOTA_MB} is not enforced on") == 1, log[-3000:]
        assert "1 folder(s) without one so far" in log and "2 folder(s) without one so far" in log, log[-3000:]
    finally:
        c.close()
        stop(worker)
        stop(ctl)
