"""Durable identities and state (issue 15, item 6, and item 8's duplicated submit).

Seen: with ``state.db`` deleted, job ids restarted at j0001 and a new job resumed the old j0001's checkpoint
(step 600) and was "completed 600/300" without training; a garbled ``state.db`` gave a raw
``sqlite3.DatabaseError`` traceback; ``state.db`` and token files at 0644 were created and accepted; a submit
that timed out was stored, and its retry stored it again. Real controller and worker processes, real gRPC on
port 0 (``runtime_procs``).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from runtime_procs import (
    TOKEN,
    client,
    controller_config,
    kill_tree,
    start_controller,
    start_worker,
    stop,
    wait_for,
)

from hpcsched.runtime.auth import metadata
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.store import Store

FINAL = ("completed", "failed", "cancelled")


def _job_text(d: Path, name: str, script: str, steps: int) -> str:
    return (f"name: {name}\nlauncher: direct\nprocs: 1\nsteps: {steps}\nworkdir: {d}\n"
            f"command: {json.dumps(['sh', '-c', script])}\n")


def _report(step: int) -> str:
    return f'echo "{{\\"step\\": {step}, \\"loss\\": 1.0}}" >> "$HPCSCHED_PROGRESS_FILE"'


def _final(c, jid: str, timeout: float = 120) -> pb.JobInfo:
    return wait_for(f"job {jid} to end", lambda: next((j for j in c.jobs() if j.job_id == jid and j.state in FINAL),
                                                       None), timeout)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _controller_cli(d: Path, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcsched.runtime", "controller", "--config", str(config)], cwd=d,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_lost_state_never_resumes_an_old_job_s_checkpoint(tmp_path: Path) -> None:
    d = tmp_path
    config = controller_config(d)
    ctl, address = start_controller(d, config)
    worker = start_worker(d, None, "w0", extra=("--address-file", str(d / "run" / "controller.addr")))
    try:
        c = client(address)
        wait_for("the worker", lambda: any(w.alive for w in c.workers()), 90)
        old_script = f'echo 600 > "$HPCSCHED_CHECKPOINT_DIR/step"; {_report(600)}'
        old = _final(c, c.submit(_job_text(d, "old", old_script, 600), "old.yaml"))
        assert (old.job_id, old.state) == ("j0001", "completed")
        c.close()
        stop(ctl)
        for suffix in ("", "-wal", "-shm"):  # the state is lost; the checkpoints are not
            (d / "run" / f"state.db{suffix}").unlink(missing_ok=True)
        ctl, address = start_controller(d, config)
        c = client(address)
        new_script = ('if [ -e "$HPCSCHED_CHECKPOINT_DIR/step" ]; then echo "resumed $(cat '
                      f'$HPCSCHED_CHECKPOINT_DIR/step)"; exit 3; fi; {_report(300)}')
        new = _final(c, c.submit(_job_text(d, "new", new_script, 300), "new.yaml"))
        c.close()
    finally:
        stop(worker)
        stop(ctl)
    assert new.job_id == "j0001", "ids are the state's own; the uid is what a new state cannot produce"
    assert new.uid and new.uid != old.uid
    assert (new.state, new.steps_done, new.restarts) == ("completed", 300, 0), new.message
    aside = [p for p in (d / "run" / "ckpt").iterdir() if p.name.startswith(f".lost-j0001-{old.uid}-")]
    assert len(aside) == 1 and (aside[0] / "step").read_text() == "600\n", "the old checkpoint is kept aside"
    assert (d / "run" / "ckpt" / "j0001" / "job-uid").read_text().strip() == new.uid
    assert not (d / "run" / "ckpt" / "j0001" / "step").exists()


def test_a_garbled_state_is_a_clear_error_naming_the_file(tmp_path: Path) -> None:
    config = controller_config(tmp_path)
    state = tmp_path / "run" / "state.db"
    state.parent.mkdir(parents=True)
    state.write_bytes(b"SQLite format 3\x00" + os.urandom(8192))
    os.chmod(state, 0o600)
    r = _controller_cli(tmp_path, config)
    assert r.returncode == 2, r.stderr
    assert f"{state}: not a readable hpcsched state" in r.stderr and "backup" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_reader_of_a_state_still_being_created_is_told_to_wait_not_to_restore_a_backup(tmp_path: Path) -> None:
    """A controller creates its state file before writing the schema; a reader that comes in between (``calc``,
    ``jobs``, a test polling the state) is told the state is not ready, while a garbled file is still damaged."""
    import sqlite3

    from hpcsched.errors import InputError
    from hpcsched.runtime.statefile import StateNotReady
    from hpcsched.runtime.store import Store

    fresh = tmp_path / "fresh.db"
    sqlite3.connect(fresh).close()  # the file exists, no table yet
    with pytest.raises(StateNotReady, match="no tables yet"):
        Store(fresh, query_only=True)
    Store(fresh, owner=True).close()  # the controller writes its schema: now readable
    Store(fresh, query_only=True).close()
    garbled = tmp_path / "garbled.db"
    garbled.write_bytes(b"SQLite format 3\x00" + os.urandom(8192))
    with pytest.raises(InputError, match="not a readable hpcsched state") as e:
        Store(garbled, query_only=True)
    assert not isinstance(e.value, StateNotReady)


def test_state_is_created_private_and_tightened(tmp_path: Path) -> None:
    config = controller_config(tmp_path)
    state = tmp_path / "run" / "state.db"
    ctl, _ = start_controller(tmp_path, config)
    try:
        assert _mode(state) == 0o600
        assert _mode(state.with_name("state.db-wal")) == 0o600
    finally:
        stop(ctl)
    os.chmod(state, 0o644)
    ctl, _ = start_controller(tmp_path, config)
    try:
        assert _mode(state) == 0o600
    finally:
        stop(ctl)
    assert "was readable by others (mode 0644): made it 0600" in (tmp_path / "controller.log").read_text()


def test_token_files_others_can_read_are_refused(tmp_path: Path) -> None:
    config = controller_config(tmp_path)
    os.chmod(tmp_path / "token", 0o644)
    r = _controller_cli(tmp_path, config)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{tmp_path / 'token'}: token file is accessible by others (mode 0644)" in r.stderr
    assert "chmod 600" in r.stderr
    w = subprocess.run([sys.executable, "-m", "hpcsched.runtime", "worker", "--controller", "127.0.0.1:9", "--name",
                        "w0", "--token-file", str(tmp_path / "token")], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert w.returncode == 2 and "accessible by others" in w.stderr and "Traceback" not in w.stderr
    os.chmod(tmp_path / "token", 0o600)
    ctl, _ = start_controller(tmp_path, config)
    stop(ctl)


def test_backups_are_online_private_copies_that_recover_a_damaged_state(tmp_path: Path) -> None:
    config = controller_config(tmp_path, backup_dir="run/backups", backup_interval_s=0.5, backup_keep=3)
    ctl, address = start_controller(tmp_path, config)
    try:
        c = client(address)
        jid = c.submit(_job_text(tmp_path, "kept", "exit 0", 1), "kept.yaml")

        def backed_up() -> list[Path]:
            out = []
            for p in sorted((tmp_path / "run" / "backups").glob("state-*.db")):
                st = Store(p, query_only=True)
                try:
                    out += [p] if [j.id for j in st.jobs()] == [jid] else []
                finally:
                    st.close()
            return out

        periodic = wait_for("a backup holding the job", backed_up, 30)[-1]
        assert _mode(periodic) == 0o600
        time.sleep(2.5)
        assert len(list((tmp_path / "run" / "backups").glob("state-*.db"))) <= 3  # backup_keep
        by_hand = subprocess.run([sys.executable, "-m", "hpcsched.runtime", "backup", "--state", "run/state.db",
                                  "--out", "manual"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert by_hand.returncode == 0, by_hand.stderr
        copy = tmp_path / by_hand.stdout.strip()
        c.close()
    finally:
        stop(ctl)
    state = tmp_path / "run" / "state.db"
    for suffix in ("-wal", "-shm"):
        state.with_name("state.db" + suffix).unlink(missing_ok=True)
    state.write_bytes(os.urandom(4096))  # damaged
    assert _controller_cli(tmp_path, config).returncode == 2
    copy.replace(state)  # the documented recovery: the latest backup over the damaged state
    ctl, address = start_controller(tmp_path, config)
    try:
        c = client(address)
        assert [j.job_id for j in c.jobs()] == [jid]
        c.close()
    finally:
        stop(ctl)


def test_a_retried_submit_is_stored_once(tmp_path: Path) -> None:
    """The client makes a request id and keeps it across retries; a submit whose reply was lost (here: a deadline
    that expired while the controller stored it) and is sent again returns the first job."""
    ctl, address = start_controller(tmp_path, controller_config(tmp_path))
    try:
        c = client(address)
        text = _job_text(tmp_path, "once", "exit 0", 1)
        stub = pb_grpc.ControllerStub(c.channel)
        try:
            stub.Submit(pb.SubmitRequest(spec_yaml=text, source="once.yaml", request_id="req-1"), timeout=0.001,
                        metadata=metadata(TOKEN))
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        jid = c.submit(text, "once.yaml", request_id="req-1")
        assert c.submit(text, "once.yaml", request_id="req-1") == jid
        again = stub.Submit(pb.SubmitRequest(spec_yaml=text, source="once.yaml", request_id="req-1"), timeout=30,
                            metadata=metadata(TOKEN))
        assert (again.job_id, again.duplicate) == (jid, True)
        other = c.submit(text, "once.yaml")  # another request: another job
        assert other != jid
        assert [j.job_id for j in c.jobs()] == [jid, other]
        c.close()
    finally:
        kill_tree(ctl)
