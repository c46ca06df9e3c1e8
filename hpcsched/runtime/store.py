"""The controller's durable state in SQLite (WAL): jobs, allocations, workers, progress, events.

Everything the controller must not forget is written here before the RPC that caused it returns, so a
``kill -9`` of the controller loses no job: on restart it reads the tables back and reconciles them
with what the workers report. WAL with synchronous=NORMAL survives a process crash (only a power cut
can lose the last commits) and lets readers (``hpcsched profile``) run while the controller writes.
The store is used from one controller lock, so it keeps one connection.

WAL checkpoints (copying the log back into the database, with an fsync) are taken off the request path:
SQLite's automatic checkpoint runs inside whichever commit crosses 1,000 pages, and that commit, under
the controller lock, stalled every heartbeat behind it (14-23 ms, the worst commits seen at 256
workers). ``start_checkpointer`` turns it off and runs PASSIVE checkpoints from a thread with its own
connection instead; a commit is in the WAL when it returns, so the crash guarantee is unchanged.

Queries (``hpcsched jobs``/``workers``) read through ``Store.reader()`` connections of their own, a page at a
time, never through the controller's connection and lock: at 10,000 jobs one unpaged listing took 695 ms under
the lock, and 40 of them held a heartbeat past the worker deadline.

The state is private (created 0600, tightened to 0600 when found wider: it holds every job's command and
environment), a file that is not a readable SQLite database is an ``InputError`` naming it with a way to recover
(``backup_to`` writes consistent online copies), and every job gets a ``uid`` no other state can produce: its
checkpoints are bound to it, so a new state's j0001 never resumes a lost state's j0001.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from hpcsched.runtime.jobfile import JobSpec
from hpcsched.runtime.statefile import StateNotReady, damaged, make_private, not_ready, take_owner_lock
from hpcsched.runtime.store_rows import (
    JOB_COLS,
    SPEC_AT,
    WORKER_COLS,
    AllocRow,
    JobRow,
    WorkerRow,
    spec_from_json,
    spec_to_json,
    worker_row,
)

log = logging.getLogger("hpcsched.runtime.store")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, seq INTEGER NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL, state TEXT NOT NULL,
  procs INTEGER NOT NULL DEFAULT 0, target_procs INTEGER NOT NULL, generation INTEGER NOT NULL DEFAULT 0,
  steps_done INTEGER NOT NULL DEFAULT 0, first_loss REAL, last_loss REAL,
  ckpt_step INTEGER NOT NULL DEFAULT -1, ckpt_path TEXT,
  submit_time REAL NOT NULL, start_time REAL, end_time REAL,
  restarts INTEGER NOT NULL DEFAULT 0, message TEXT NOT NULL DEFAULT '',
  stop_reason TEXT, stop_time REAL, last_resize_s REAL,
  executed_s REAL NOT NULL DEFAULT 0, attained_s REAL NOT NULL DEFAULT 0,
  iteration_s REAL, data_s REAL, compute_s REAL, comm_s REAL, done INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS allocations (
  task_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, generation INTEGER NOT NULL, worker_id TEXT NOT NULL,
  node_rank INTEGER NOT NULL, nprocs INTEGER NOT NULL, state TEXT NOT NULL, exit_code INTEGER,
  launch BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS alloc_job ON allocations(job_id, generation);
CREATE INDEX IF NOT EXISTS alloc_worker ON allocations(worker_id, state);
CREATE TABLE IF NOT EXISTS workers (
  id TEXT PRIMARY KEY, host TEXT NOT NULL, slots INTEGER NOT NULL, gpus INTEGER NOT NULL,
  cpus INTEGER NOT NULL, launchers TEXT NOT NULL, registered REAL NOT NULL, alive INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS progress (
  job_id TEXT NOT NULL, generation INTEGER NOT NULL, time REAL NOT NULL, step INTEGER NOT NULL, loss REAL,
  samples_per_s REAL, data_s REAL, compute_s REAL, comm_s REAL, world_size INTEGER, checkpoint TEXT,
  resumed_from INTEGER
);
CREATE INDEX IF NOT EXISTS progress_job ON progress(job_id, generation);
CREATE TABLE IF NOT EXISTS events (
  time REAL NOT NULL, job_id TEXT, kind TEXT NOT NULL, detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_seq ON jobs(seq);
"""
# Columns added after the first release: added to an older state file when its owner opens it.
_ADDED_COLUMNS = (("jobs", "uid", "TEXT"), ("jobs", "request_id", "TEXT"), ("jobs", "owner", "TEXT"),
                  ("jobs", "group", "TEXT"),  # filled from the live tasks' LaunchTasks when added (``_fill_groups``)
                  ("workers", "gpu_type", "TEXT NOT NULL DEFAULT ''"),  # '': registered before workers had types
                  # an adaptive-batch job's report: its batch and gradient statistics (NULL: none measured)
                  ("progress", "batch_size", "INTEGER"), ("progress", "grad_sqr", "REAL"),
                  ("progress", "grad_var", "REAL"))
_ADDED_INDEXES = "CREATE UNIQUE INDEX IF NOT EXISTS jobs_request ON jobs(request_id) WHERE request_id IS NOT NULL;"
# What the listing filters and the per-user pending count read (``jobs_filtered``, ``pending_count``): each page
# of a filtered listing is a range of one index, whatever the number of jobs.
_FILTER_INDEXES = """
CREATE INDEX IF NOT EXISTS jobs_state_seq ON jobs(state, seq);
CREATE INDEX IF NOT EXISTS jobs_owner_state_seq ON jobs(owner, state, seq);
CREATE INDEX IF NOT EXISTS jobs_owner_seq ON jobs(owner, seq);
CREATE INDEX IF NOT EXISTS jobs_name_seq ON jobs(name, seq);
"""
_PROGRESS_COLS = ("job_id", "generation", "time", "step", "loss", "samples_per_s", "data_s", "compute_s", "comm_s",
                  "world_size", "checkpoint", "resumed_from", "batch_size", "grad_sqr", "grad_var")
_PROGRESS_INSERT = f"INSERT INTO progress ({', '.join(_PROGRESS_COLS)}) VALUES ({','.join('?' * len(_PROGRESS_COLS))})"
MAX_REQUEST_ID_CHARS = 128
_IN_CHUNK = 500  # values in one SQL ``IN (...)``

class Store:
    """Typed access to the tables. Each public method is one transaction."""

    def __init__(self, path: Path, owner: bool = False, query_only: bool = False,
                 specs: dict[str, JobSpec] | None = None) -> None:
        """``owner``: this process is the controller of ``path``. Two controllers on one state fought over it
        (each re-planning the other's jobs), so the owner takes an exclusive lock on ``PATH.lock`` for as
        long as the store is open (the OS drops it when the process dies, even by kill -9); a second owner
        is refused with the holder's pid. Readers (``hpcsched profile``) open the store without it.
        ``query_only``: a connection that cannot write (``reader``). ``specs``: a parsed-spec cache to share."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock_fd: int | None = take_owner_lock(path) if owner else None
        self.db: sqlite3.Connection | None = None
        try:
            if not query_only:
                make_private(path)
            self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self.db.execute("PRAGMA busy_timeout=5000")
            if query_only:
                self.db.execute("PRAGMA query_only=ON")
                if self.db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
                    raise not_ready(path)
            else:
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
                if owner:  # a damaged page found now, with its file named, not as a traceback mid-heartbeat
                    problems = [r[0] for r in self.db.execute("PRAGMA quick_check(5)").fetchall()]
                    if problems != ["ok"]:
                        raise sqlite3.DatabaseError("; ".join(problems))
                self.db.executescript(SCHEMA)
                self._migrate()
            self.db.execute("SELECT count(*) FROM jobs").fetchone()
        except sqlite3.DatabaseError as e:
            self.close()
            raise damaged(path, e) from None
        except StateNotReady:
            self.close()
            raise
        self._specs: dict[str, JobSpec] = {} if specs is None else specs
        self._readers: list[Store] = []  # closed with this store
        self._ckpt_stop: threading.Event | None = None
        self._ckpt_thread: threading.Thread | None = None

    def _migrate(self) -> None:
        for table, col, kind in _ADDED_COLUMNS:
            have = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
            if col not in have:
                self.db.execute(f'ALTER TABLE {table} ADD COLUMN "{col}" {kind}')
                if (table, col) == ("jobs", "group"):
                    self._fill_groups()
        self.db.executescript(_ADDED_INDEXES)
        self.db.executescript(_FILTER_INDEXES)

    def _fill_groups(self) -> None:
        """A state file from before the ``group`` column: its jobs with live tasks get the key their LaunchTask
        carries (once, here: every later read takes it from the column), so a controller restarted on it keeps
        counting a co-located group's slots once."""
        from hpcsched.runtime.rpc import pb  # only for this one-time upgrade: readers of the store need no gRPC

        keys: dict[str, str] = {}
        for job_id, launch in self.db.execute("SELECT job_id, launch FROM allocations WHERE state != 'exited'"):
            keys[job_id] = pb.LaunchTask.FromString(launch).group or job_id
        self.db.executemany('UPDATE jobs SET "group" = ? WHERE id = ?', [(k, j) for j, k in keys.items()])
        if keys:
            log.info("%s: the co-location key of %d jobs with live tasks filled in (state upgraded)", self.path,
                     len(keys))

    def reader(self) -> Store:
        """A connection of its own that only reads (WAL: it sees the last commit and never blocks the owner's
        writes), sharing this store's parsed specs; for queries served beside the controller's lock."""
        r = Store(self.path, query_only=True, specs=self._specs)
        self._readers.append(r)
        return r

    def backup_to(self, dest: Path) -> None:
        """A consistent copy of the state while it is in use (SQLite's online backup), written aside, made
        private and renamed into place: a reader of ``dest`` never sees half a copy."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(fd)
        src = sqlite3.connect(str(self.path), isolation_level=None)
        try:
            out = sqlite3.connect(str(tmp))
            try:
                src.backup(out)
            finally:
                out.close()
        except sqlite3.DatabaseError as e:
            tmp.unlink(missing_ok=True)
            raise damaged(self.path, e) from None
        finally:
            src.close()
        os.replace(tmp, dest)

    def start_checkpointer(self, interval_s: float = 1.0) -> None:
        """Checkpoint the WAL every ``interval_s`` from a background thread (see the module docstring)."""
        if self._ckpt_thread is not None:
            return
        self.db.execute("PRAGMA wal_autocheckpoint=0")
        self._ckpt_stop = threading.Event()
        self._ckpt_thread = threading.Thread(target=self._checkpoint_loop, args=(self._ckpt_stop, interval_s),
                                             daemon=True, name="wal-checkpoint")
        self._ckpt_thread.start()

    def _checkpoint_loop(self, stop: threading.Event, interval_s: float) -> None:
        db = sqlite3.connect(str(self.path), isolation_level=None)
        db.execute("PRAGMA busy_timeout=5000")
        try:
            while not stop.wait(interval_s):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as e:  # busy or locked: the next round catches up
                    log.debug("WAL checkpoint skipped: %s", e)
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as e:  # the last one, at close (a full disk): the WAL keeps the commits regardless
            log.warning("final WAL checkpoint of %s skipped: %s (the next start replays the WAL)", self.path, e)
        finally:
            db.close()

    def close(self) -> None:
        if getattr(self, "_ckpt_thread", None) is not None and self._ckpt_stop is not None:
            self._ckpt_stop.set()
            self._ckpt_thread.join(timeout=10)
            self._ckpt_thread = None
        for r in getattr(self, "_readers", ()):
            r.close()
        if self.db is not None:
            self.db.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the lock
            self._lock_fd = None

    def tx(self) -> _Tx:
        return _Tx(self.db)

    # jobs -----------------------------------------------------------------------------------------
    def add_job(self, spec: JobSpec, now: float, request_id: str | None = None, owner: str = "") -> str:
        """Store a new pending job. Its id (``j0001``) is this state's; its ``uid`` (random, 128 bits) is unique
        across states. ``request_id``: the client's key for this submit (see ``job_for_request``)."""
        with self.tx():
            seq = self.db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
            job_id = f"j{seq:04d}"
            self.db.execute(
                "INSERT INTO jobs (id, seq, name, spec, state, target_procs, submit_time, uid, request_id, owner) "
                "VALUES (?,?,?,?,?,?,?,?,?,?)",
                (job_id, seq, spec.name, spec_to_json(spec), "pending", spec.procs, now, uuid.uuid4().hex,
                 request_id or None, owner),
            )
            self._event(now, job_id, "submit", {"procs": spec.procs})
        return job_id

    def add_jobs(self, jobs: list[tuple[JobSpec, str | None]], now: float, owner: str = "") -> list[str]:
        """Store new pending jobs (spec, request id) in ONE transaction, as ``add_job`` each: a batch of 1,000 costs
        one commit (one WAL fsync at most) instead of 1,000. Ids are consecutive, in the order given."""
        if not jobs:
            return []
        with self.tx():
            first = self.db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
            rows, events, ids = [], [], []
            for k, (spec, request_id) in enumerate(jobs):
                seq = first + k
                job_id = f"j{seq:04d}"
                ids.append(job_id)
                rows.append((job_id, seq, spec.name, spec_to_json(spec), "pending", spec.procs, now, uuid.uuid4().hex,
                             request_id or None, owner))
                events.append((now, job_id, "submit", json.dumps({"procs": spec.procs})))
            self.db.executemany(
                "INSERT INTO jobs (id, seq, name, spec, state, target_procs, submit_time, uid, request_id, owner) "
                "VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
            self.db.executemany("INSERT INTO events VALUES (?,?,?,?)", events)
        return ids

    def jobs_for_requests(self, request_ids: list[str]) -> dict[str, str]:
        """request id -> the job an earlier submit with it created, for those of ``request_ids`` seen before."""
        out: dict[str, str] = {}
        for k in range(0, len(request_ids), _IN_CHUNK):
            chunk = request_ids[k:k + _IN_CHUNK]
            q = f"SELECT request_id, id FROM jobs WHERE request_id IN ({','.join('?' * len(chunk))})"
            out.update(self.db.execute(q, chunk).fetchall())
        return out

    def pending_count(self, owner: str) -> int:
        """Pending jobs of one submitter (an index range: cheap at 100,000 jobs)."""
        return self.db.execute("SELECT count(*) FROM jobs WHERE owner = ? AND state = 'pending'",
                               (owner,)).fetchone()[0]

    def jobs_filtered(self, after_seq: int, limit: int, states: tuple[str, ...] = (), owner: str | None = None,
                      name: str | None = None, glob: bool = False) -> list[JobRow]:
        """A page as ``jobs_page``, only jobs in ``states`` (any when empty), of ``owner``, named ``name`` (a GLOB
        pattern when ``glob``). Each state is read as its own index range (state, seq) and the ranges merged:
        ``state IN (...)`` would sort every match after ``after_seq`` before the LIMIT."""
        where, args = " WHERE seq > ?", [after_seq]
        if owner is not None:
            where += " AND owner = ?"
            args.append(owner)
        if name is not None:
            where += " AND name GLOB ?" if glob else " AND name = ?"
            args.append(name)
        if not states:
            return self._jobs(where, tuple(args), limit)
        rows: list[JobRow] = []
        for state in dict.fromkeys(states):
            rows += self._jobs(where + " AND state = ?", (*args, state), limit)
        rows.sort(key=lambda j: j.seq)
        return rows[:limit]

    def job_for_request(self, request_id: str) -> str | None:
        """The job an earlier submit with this client-made key created, if any (a retried submit)."""
        r = self.db.execute("SELECT id FROM jobs WHERE request_id = ?", (request_id,)).fetchone()
        return r[0] if r else None

    def jobs_page(self, after_seq: int, limit: int, owner: str | None = None) -> list[JobRow]:
        """At most ``limit`` jobs after submit number ``after_seq``, in submit order (one page of a listing); only
        ``owner``'s when given."""
        if owner is not None:
            return self._jobs(" WHERE seq > ? AND owner = ?", (after_seq, owner), limit)
        return self._jobs(" WHERE seq > ?", (after_seq,), limit)

    def workers_page(self, after_id: str, limit: int) -> list[WorkerRow]:
        rows = self.db.execute(f"SELECT {WORKER_COLS} FROM workers WHERE id > ? ORDER BY id LIMIT ?",
                               (after_id, limit)).fetchall()
        return [worker_row(r) for r in rows]

    def jobs(self, states: tuple[str, ...] | None = None, ids: list[str] | None = None) -> list[JobRow]:
        where, args = [], []
        for col, values in (("state", states), ("id", ids)):
            if values:
                where.append(f"{col} IN ({','.join('?' * len(values))})")
                args += values
        return self._jobs(" WHERE " + " AND ".join(where) if where else "", tuple(args))

    def job(self, job_id: str) -> JobRow | None:
        rows = self._jobs(" WHERE id = ?", (job_id,))
        return rows[0] if rows else None

    def _jobs(self, where: str, args: tuple, limit: int | None = None) -> list[JobRow]:
        # Columns named in the dataclass's order, so a row builds positionally (no dict per row).
        tail = " ORDER BY seq" + (f" LIMIT {int(limit)}" if limit is not None else "")
        cur = self.db.execute(f"SELECT {JOB_COLS} FROM jobs" + where + tail, args)
        out = []
        k = SPEC_AT
        for r in cur.fetchall():
            spec = self._specs.get(r[0])  # a spec never changes once submitted: parse it once
            if spec is None:
                spec = self._specs[r[0]] = spec_from_json(r[k])
            out.append(JobRow(*r[:k], spec, *r[k + 1:]))
        return out

    def accrue_service(self, seconds: float) -> None:
        """Running jobs have run ``seconds`` more, each on its ``procs`` (LAS / Tiresias need this)."""
        self.db.execute("UPDATE jobs SET executed_s = executed_s + ?, attained_s = attained_s + ? * procs "
                        "WHERE state = 'running'", (seconds, seconds))

    def update_job(self, job_id: str, **fields: object) -> None:
        sets = ", ".join(f'"{k}" = ?' for k in fields)  # quoted: the column ``group`` is an SQL keyword
        self.db.execute(f"UPDATE jobs SET {sets} WHERE id = ?", (*fields.values(), job_id))

    def groups(self, job_ids: Iterable[str]) -> dict[str, str]:
        """Job -> the co-location key of its latest attempt (the ``group`` column), for those of ``job_ids`` that
        have one."""
        ids = list(dict.fromkeys(job_ids))
        out: dict[str, str] = {}
        for k in range(0, len(ids), _IN_CHUNK):
            chunk = ids[k:k + _IN_CHUNK]
            q = f'SELECT id, "group" FROM jobs WHERE "group" IS NOT NULL AND id IN ({",".join("?" * len(chunk))})'
            out.update(self.db.execute(q, chunk).fetchall())
        return out

    # allocations ----------------------------------------------------------------------------------
    def add_allocation(self, a: AllocRow) -> None:
        self.db.execute(
            "INSERT INTO allocations VALUES (?,?,?,?,?,?,?,?,?)",
            (a.task_id, a.job_id, a.generation, a.worker_id, a.node_rank, a.nprocs, a.state, a.exit_code, a.launch),
        )

    def allocations(self, job_id: str | None = None, worker_id: str | None = None,
                    live_only: bool = True) -> list[AllocRow]:
        q, args = "SELECT * FROM allocations WHERE 1=1", []
        if job_id is not None:
            q += " AND job_id = ?"
            args.append(job_id)
        if worker_id is not None:
            q += " AND worker_id = ?"
            args.append(worker_id)
        if live_only:
            q += " AND state != 'exited'"
        return [AllocRow(*r) for r in self.db.execute(q + " ORDER BY job_id, node_rank", args).fetchall()]

    def set_alloc_state(self, task_id: str, state: str, exit_code: int | None = None) -> None:
        self.db.execute("UPDATE allocations SET state = ?, exit_code = ? WHERE task_id = ?",
                        (state, exit_code, task_id))

    def resize_allocation(self, task_id: str, nprocs: int, launch: bytes) -> None:
        """An in-place resize: the task keeps running with a new size and LaunchTask (its new host list)."""
        self.db.execute("UPDATE allocations SET nprocs = ?, launch = ? WHERE task_id = ?", (nprocs, launch, task_id))

    def alloc(self, task_id: str) -> AllocRow | None:
        r = self.db.execute("SELECT * FROM allocations WHERE task_id = ?", (task_id,)).fetchone()
        return AllocRow(*r) if r else None

    # workers --------------------------------------------------------------------------------------
    def upsert_worker(self, w: WorkerRow) -> None:
        self.db.execute(
            f"INSERT OR REPLACE INTO workers ({WORKER_COLS}) VALUES (?,?,?,?,?,?,?,?,?)",
            (w.id, w.host, w.slots, w.gpus, w.cpus, ",".join(w.launchers), w.registered, int(w.alive), w.gpu_type),
        )

    def workers(self) -> list[WorkerRow]:
        rows = self.db.execute(f"SELECT {WORKER_COLS} FROM workers ORDER BY id").fetchall()
        return [worker_row(r) for r in rows]

    def set_worker_alive(self, worker_id: str, alive: bool) -> None:
        self.db.execute("UPDATE workers SET alive = ? WHERE id = ?", (int(alive), worker_id))

    # progress and events --------------------------------------------------------------------------
    def add_progress(self, job_id: str, generation: int, p: dict) -> None:
        self.db.execute(
            _PROGRESS_INSERT,
            (job_id, generation, p["time"], p["step"], p.get("loss"), p.get("samples_per_s"), p.get("data_s"),
             p.get("compute_s"), p.get("comm_s"), p.get("world_size"), p.get("checkpoint") or None,
             p.get("resumed_from"), p.get("batch_size"), p.get("grad_sqr"), p.get("grad_var")),
        )

    def progress(self, job_id: str | None = None) -> list[dict]:
        q = "SELECT * FROM progress" + (" WHERE job_id = ?" if job_id else "") + " ORDER BY job_id, time"
        cur = self.db.execute(q, (job_id,) if job_id else ())
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def _event(self, now: float, job_id: str | None, kind: str, detail: dict) -> None:
        self.db.execute("INSERT INTO events VALUES (?,?,?,?)", (now, job_id, kind, json.dumps(detail)))

    def event(self, job_id: str | None, kind: str, **detail: object) -> None:
        self._event(time.time(), job_id, kind, detail)

    def events(self, job_id: str | None = None, kind: str | None = None) -> list[dict]:
        q, args = "SELECT * FROM events WHERE 1=1", []
        if job_id:
            q += " AND job_id = ?"
            args.append(job_id)
        if kind:
            q += " AND kind = ?"
            args.append(kind)
        return [{"time": t, "job_id": j, "kind": k, **json.loads(d)}
                for t, j, k, d in self.db.execute(q + " ORDER BY time", args).fetchall()]


class _Tx:
    """``with store.tx():`` groups writes into one commit (and rolls back on an exception)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type:
            self.db.execute("ROLLBACK")
            return
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error:  # a failed COMMIT (a full disk) leaves the transaction open: every later BEGIN failed
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise
