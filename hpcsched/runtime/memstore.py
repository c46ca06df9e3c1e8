"""The controller's state held in memory and written through to the SQLite store (``MemStore``).

Why: at 100,000 queued jobs a scheduling tick that re-read and re-parsed every active job took 0.5-2.1 s under
the controller's lock, and every heartbeat ran a few SQL reads per task. Here the controller's reads come from
dictionaries (active jobs with their parsed spec, the allocations of active jobs indexed by job and by worker,
the workers), and every write goes to SQLite first, then to memory, inside the same transaction as before.

Durability is unchanged: a write is in SQLite (WAL) when the RPC that caused it returns, so ``kill -9`` of the
controller loses nothing, and a restarted controller reads the tables back (``_load``); memory is never the
only copy of anything. A transaction that rolls back reloads memory from the tables (rare: a bug or a full
disk), so memory never holds a write SQLite refused.

Transactions begin lazily: ``tx()`` issues ``BEGIN IMMEDIATE`` at the first write inside it, and a transaction
that wrote nothing issues no SQL at all, so a heartbeat that changes nothing costs no SQL.

Rows are snapshots: a write replaces the row object in memory (a copy) instead of changing it,
so a row the scheduling thread holds outside the lock never changes under it (its plan is checked against the
current rows before it is applied). The one exception is service accrual (``accrue_service``: executed and
attained seconds of running jobs), changed in place because it touches every running job and no validity check
reads it. Finished jobs leave memory (and their exited allocations with them): memory grows with the active
jobs, not with the history; a read of a finished job goes to SQLite.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from hpcsched.runtime.store import Store
from hpcsched.runtime.store_rows import ACTIVE, FINAL, AllocRow, JobRow, WorkerRow

_ACTIVE = frozenset(ACTIVE)
_Row = TypeVar("_Row", JobRow, AllocRow, WorkerRow)
_FIELDS = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in (JobRow, AllocRow, WorkerRow)}


def _replaced(row: _Row, changes: dict[str, object]) -> _Row:
    """A copy of ``row`` with ``changes`` (``dataclasses.replace`` without its per-call checks: it was most of a
    step's time when 20,000 jobs got their waiting note)."""
    cls = type(row)
    new = cls.__new__(cls)
    for name in _FIELDS[cls]:
        setattr(new, name, changes[name] if name in changes else getattr(row, name))
    return new


class MemStore(Store):
    """A ``Store`` for the controller (the owner of the state): reads from memory, writes through (module doc)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, owner=True)
        self._depth = 0  # nesting of tx()
        self._begun = False  # BEGIN issued in the current outermost tx
        self.sql_writes = 0  # statements written (tests check that a quiet heartbeat writes nothing)
        # what changed since the scheduling step last looked (``drain``): it plans only when something did
        self._moved: set[str] = set()  # jobs whose state, size, attempt or stop reason changed, and new jobs
        self._freed = False  # an allocation ended or shrank: slots may have come free
        self._load()

    # ------------------------------------------------------------------------------------- loading
    def _load(self) -> None:
        """Read the tables back (at start, and after a rollback)."""
        self._rows: dict[str, JobRow] = {j.id: j for j in super().jobs(ACTIVE)}
        self._by_state: dict[str, dict[str, None]] = {s: {} for s in ACTIVE}
        for j in self._rows.values():
            self._by_state[j.state][j.id] = None
        rows = self.db.execute(
            "SELECT * FROM allocations WHERE state != 'exited' OR job_id IN "
            "(SELECT id FROM jobs WHERE state IN ('pending', 'running', 'stopping'))").fetchall()
        self._allocs: dict[str, AllocRow] = {}
        self._by_job: dict[str, dict[str, None]] = {}
        self._by_worker: dict[str, dict[str, None]] = {}
        for r in rows:
            self._put_alloc(AllocRow(*r))
        self._workers: dict[str, WorkerRow] = {w.id: w for w in super().workers()}
        self._moved, self._freed = set(self._rows), True  # read back: everything is new to the scheduling step

    # --------------------------------------------------------------------------------- transactions
    def tx(self) -> _LazyTx:
        return _LazyTx(self)

    def _begin(self) -> None:
        self.sql_writes += 1
        if self._depth and not self._begun:
            self.db.execute("BEGIN IMMEDIATE")
            self._begun = True

    # ------------------------------------------------------------------------------------------ jobs
    def add_job(self, spec, now: float, request_id: str | None = None, owner: str = "") -> str:  # noqa: ANN001
        with self.tx():
            self._begin()
            job_id = super().add_job(spec, now, request_id, owner)
            row = super().job(job_id)
        assert row is not None
        self._set_job(row)
        return job_id

    def add_jobs(self, jobs: list, now: float, owner: str = "") -> list[str]:
        """As ``Store.add_jobs`` (one transaction for the batch); the new rows are read back into memory."""
        with self.tx():
            self._begin()
            ids = super().add_jobs(jobs, now, owner)
            rows = []
            for k in range(0, len(ids), 500):  # SQLite bounds the parameters of one statement
                rows += super().jobs(ids=ids[k:k + 500])
        for row in rows:
            self._set_job(row)
        return ids

    def jobs(self, states: tuple[str, ...] | None = None, ids: list[str] | None = None) -> list[JobRow]:
        """From memory when only active states are asked (in submit order); else from SQLite."""
        if not states or not _ACTIVE.issuperset(states):
            return super().jobs(states, ids)
        if ids is not None:
            out = [j for j in (self._rows.get(i) for i in dict.fromkeys(ids)) if j is not None and j.state in states]
        else:
            out = [self._rows[i] for s in states for i in self._by_state[s]]
        out.sort(key=lambda j: j.seq)
        return out

    def groups(self, job_ids: Iterable[str]) -> dict[str, str]:
        """As ``Store.groups``, from memory for the active jobs (the jobs with live tasks are active)."""
        out: dict[str, str] = {}
        others = []
        for jid in job_ids:
            row = self._rows.get(jid)
            if row is None:
                others.append(jid)
            elif row.group is not None:
                out[jid] = row.group
        return out | super().groups(others) if others else out

    def active_ids(self, state: str) -> dict[str, None]:
        """The ids of the active jobs in ``state`` (a live view: copy it to keep it)."""
        return self._by_state[state]

    def job(self, job_id: str) -> JobRow | None:
        j = self._rows.get(job_id)
        return j if j is not None else super().job(job_id)

    def update_job(self, job_id: str, **fields: object) -> None:
        self._begin()
        super().update_job(job_id, **fields)
        old = self._rows.get(job_id)
        if old is not None:
            self._set_job(_replaced(old, fields))

    def drain(self) -> tuple[set[str], bool]:
        """(jobs whose state, size or attempt changed, whether slots may have come free) since the last call."""
        moved, freed = self._moved, self._freed
        self._moved, self._freed = set(), False
        return moved, freed

    def _set_job(self, row: JobRow) -> None:
        old = self._rows.get(row.id)
        if old is None or (old.state, old.procs, old.generation, old.stop_reason) != \
                (row.state, row.procs, row.generation, row.stop_reason):
            self._moved.add(row.id)
        if old is not None and old.state != row.state:
            self._by_state[old.state].pop(row.id, None)
        if row.state in FINAL:
            self._rows.pop(row.id, None)
            for tid in list(self._by_job.get(row.id, ())):
                if self._allocs[tid].state == "exited":
                    self._drop_alloc(tid)
            return
        self._rows[row.id] = row
        self._by_state[row.state][row.id] = None

    def accrue_service(self, seconds: float) -> None:
        self._begin()
        super().accrue_service(seconds)
        for jid in self._by_state["running"]:
            j = self._rows[jid]
            j.executed_s += seconds  # in place: see the module docstring
            j.attained_s += seconds * j.procs

    # ----------------------------------------------------------------------------------- allocations
    def _put_alloc(self, a: AllocRow) -> None:
        self._allocs[a.task_id] = a
        self._by_job.setdefault(a.job_id, {})[a.task_id] = None
        self._by_worker.setdefault(a.worker_id, {})[a.task_id] = None

    def _drop_alloc(self, task_id: str) -> None:
        a = self._allocs.pop(task_id)
        for index, key in ((self._by_job, a.job_id), (self._by_worker, a.worker_id)):
            tasks = index.get(key)
            if tasks is not None:
                tasks.pop(task_id, None)
                if not tasks:
                    del index[key]

    def add_allocation(self, a: AllocRow) -> None:
        self._begin()
        super().add_allocation(a)
        self._put_alloc(a)

    def allocations(self, job_id: str | None = None, worker_id: str | None = None,
                    live_only: bool = True) -> list[AllocRow]:
        """As ``Store.allocations`` (ordered by job, node rank), from memory where memory holds them all: a
        finished job's exited allocations are only in SQLite."""
        if job_id is not None and job_id not in self._rows and not live_only:
            return super().allocations(job_id, worker_id, live_only)
        if job_id is not None:
            ids = self._by_job.get(job_id, ())
        elif worker_id is not None:
            ids = self._by_worker.get(worker_id, ())
        else:
            ids = self._allocs
        out = [a for a in (self._allocs[t] for t in ids)
               if (not live_only or a.state != "exited") and (worker_id is None or a.worker_id == worker_id)]
        out.sort(key=lambda a: (a.job_id, a.node_rank))
        return out

    def worker_allocs_unlocked(self, worker_id: str) -> list[AllocRow] | None:
        """The allocations in memory on ``worker_id`` (exited ones included), read without the controller's lock, or
        None when one vanished meanwhile (the caller then takes the lock). Safe from any thread: the index is copied
        in one C call (``tuple`` of a dict of strings runs no Python code, so no other thread changes it midway),
        and rows are snapshots that are replaced, never changed (module docstring). What it returns may be a write
        not yet committed or about to roll back: a caller may only decide from it that there is nothing to do."""
        rows = []
        for t in tuple(self._by_worker.get(worker_id, ())):
            a = self._allocs.get(t)
            if a is None:
                return None
            rows.append(a)
        return rows

    def active_job_unlocked(self, job_id: str) -> JobRow | None:
        """An active job's row from memory only (None when it is not active), readable without the lock as
        ``worker_allocs_unlocked``; never SQL, which would use the controller's connection from another thread."""
        return self._rows.get(job_id)

    def live_allocations(self) -> list[AllocRow]:
        """Every live allocation, in no particular order (the scheduling step's slot accounting)."""
        return [a for a in self._allocs.values() if a.state != "exited"]

    def set_alloc_state(self, task_id: str, state: str, exit_code: int | None = None) -> None:
        self._begin()
        super().set_alloc_state(task_id, state, exit_code)
        a = self._allocs.get(task_id)
        if a is not None:
            self._allocs[task_id] = _replaced(a, {"state": state, "exit_code": exit_code})
            self._freed |= state == "exited"

    def resize_allocation(self, task_id: str, nprocs: int, launch: bytes) -> None:
        self._begin()
        super().resize_allocation(task_id, nprocs, launch)
        a = self._allocs.get(task_id)
        if a is not None:
            self._allocs[task_id] = _replaced(a, {"nprocs": nprocs, "launch": launch})
            self._freed |= nprocs < a.nprocs

    def alloc(self, task_id: str) -> AllocRow | None:
        a = self._allocs.get(task_id)
        return a if a is not None else super().alloc(task_id)

    # --------------------------------------------------------------------------------------- workers
    def upsert_worker(self, w: WorkerRow) -> None:
        self._begin()
        super().upsert_worker(w)
        self._workers[w.id] = w

    def workers(self) -> list[WorkerRow]:
        return sorted(self._workers.values(), key=lambda w: w.id)

    def worker(self, worker_id: str) -> WorkerRow | None:
        return self._workers.get(worker_id)

    def set_worker_alive(self, worker_id: str, alive: bool) -> None:
        self._begin()
        super().set_worker_alive(worker_id, alive)
        w = self._workers.get(worker_id)
        if w is not None:
            self._workers[worker_id] = _replaced(w, {"alive": alive})

    # ----------------------------------------------------------------------------- progress, events
    def add_progress(self, job_id: str, generation: int, p: dict) -> None:
        self._begin()
        super().add_progress(job_id, generation, p)

    def _event(self, now: float, job_id: str | None, kind: str, detail: dict) -> None:
        self._begin()
        super()._event(now, job_id, kind, detail)


class _LazyTx:
    """``with store.tx():`` one commit for the writes inside (nested: the outermost commits), begun at the first
    write; an exception rolls back and reloads memory from the tables."""

    def __init__(self, store: MemStore) -> None:
        self.store = store

    def __enter__(self) -> None:
        self.store._depth += 1

    def __exit__(self, exc_type, exc, tb) -> None:  # noqa: ANN001
        s = self.store
        s._depth -= 1
        if s._depth or not s._begun:
            return
        s._begun = False
        if exc_type is None:
            try:
                s.db.execute("COMMIT")
                return
            except BaseException:  # a full disk fails the commit: undo it in memory too
                if s.db.in_transaction:  # SQLite may have rolled it back itself (SQLITE_FULL)
                    s.db.execute("ROLLBACK")
                s._load()
                raise
        if s.db.in_transaction:
            s.db.execute("ROLLBACK")
        s._load()
