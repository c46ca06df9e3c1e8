"""The controller's read-only views: ListJobs and ListWorkers pages, read beside the controller's lock.

Queries are paged, bounded in bytes and served on reader connections of their own (``Store.reader``), at most
QUERY_SLOTS at once; at most QUERY_QUEUE more wait for a slot, and beyond that a query is refused as ``Busy`` (the
client retries): waiting queries hold server threads that heartbeats need (one unpaged listing of 10k
jobs held the lock 695 ms, and 40 at once held a heartbeat past the worker deadline). Nothing here writes.
"""

from __future__ import annotations

import contextlib
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hpcsched.errors import InputError
from hpcsched.runtime.jobfile import MAX_NAME_CHARS
from hpcsched.runtime.launch import slot_use
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.store import Store

DEFAULT_PAGE = 500
MAX_PAGE = 1000
MAX_REPLY_BYTES = 1 << 20  # a quarter of gRPC's default 4 MiB message limit, whatever the rows hold
QUERY_SLOTS = 2
QUERY_QUEUE = 14
QUERY_WAIT_S = 5.0
MAX_MESSAGE_CHARS = 500  # a job's message (a failure reason from a worker, a waiting note): one bounded line
MAX_TOKEN_CHARS = 129  # a page token: a kind letter and a worker id (at most 128 characters, controller.py)
_INT64_MAX = 2**63 - 1


STATES = ("pending", "running", "stopping", "completed", "failed", "cancelled")
_GLOB = re.compile(r"[*?]")


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a listing shows (``ListJobsRequest`` fields 3-5), checked: a state that does not exist or a name
    longer than any job's is an InputError naming the field, not an empty listing that looks like no jobs."""

    states: tuple[str, ...] = ()
    owner: str | None = None
    name: str | None = None  # exact, or a pattern (``glob``): * and ? are wildcards, every other character itself
    glob: bool = False

    @classmethod
    def of(cls, req: pb.ListJobsRequest) -> JobFilter:
        bad = [s for s in req.states if s not in STATES]
        if bad:
            shown = "".join(c if c.isprintable() else "?" for c in bad[0][:40])
            raise InputError("states", f"no job state {shown!r}; states are {', '.join(STATES)}")
        if len(req.owner) > 64 or len(req.name) > 4 * MAX_NAME_CHARS:
            raise InputError("owner" if len(req.owner) > 64 else "name", "longer than any job's")
        glob = bool(_GLOB.search(req.name))
        # In SQLite's GLOB '[' opens a character class; a job array's names hold brackets (name[3]): literal here.
        name = req.name.replace("[", "[[]") if glob else req.name
        return cls(tuple(req.states), req.owner or None, name or None, glob)

    @property
    def empty(self) -> bool:
        return not self.states and self.owner is None and self.name is None


class Busy(Exception):
    """Too many queries are in flight or waiting: the caller retries later (gRPC RESOURCE_EXHAUSTED)."""


class Listing:
    """The pages, over a pool of QUERY_SLOTS reader connections of ``store``."""

    def __init__(self, store: Store) -> None:
        self._readers: queue.Queue[Store] = queue.Queue()
        for _ in range(QUERY_SLOTS):
            self._readers.put(store.reader())
        self._waiting = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def query(self) -> Iterator[Store]:
        """A reader connection for one query page (module docstring): ``Busy`` beyond QUERY_SLOTS + QUERY_QUEUE
        queries or after QUERY_WAIT_S of waiting."""
        with self._lock:
            if self._waiting >= QUERY_SLOTS + QUERY_QUEUE:
                raise Busy(f"{self._waiting} queries in flight; retry")
            self._waiting += 1
        try:
            try:
                reader = self._readers.get(timeout=QUERY_WAIT_S)
            except queue.Empty:
                raise Busy(f"no query slot within {QUERY_WAIT_S:g} s; retry") from None
            try:
                yield reader
            finally:
                self._readers.put(reader)
        finally:
            with self._lock:
                self._waiting -= 1

    def jobs_page(self, page_size: int, page_token: str, owner: str | None, sizing: dict[str, str],
                  filters: JobFilter | None = None,
                  batches: dict[str, tuple[int, float]] | None = None) -> tuple[list[pb.JobInfo], str]:
        """One page of jobs in submit order, and the token of the next page ('' after the last): at most
        ``page_size`` jobs (DEFAULT_PAGE when 0, at most MAX_PAGE) and MAX_REPLY_BYTES. ``owner``: the only owner
        this caller may see (None: all); ``filters``: what the caller asked to see. ``sizing``: how the MILP sized
        each job last."""
        after = page_after(page_token, "j", int)
        limit = DEFAULT_PAGE if page_size <= 0 else min(page_size, MAX_PAGE)
        f = filters or JobFilter()
        if owner is not None and f.owner is not None and f.owner != owner:
            return [], ""  # own_jobs_only: another user's jobs are not this caller's to see
        with self.query() as rd:
            if f.empty:
                jobs = rd.jobs_page(after, limit + 1, owner)
            else:
                jobs = rd.jobs_filtered(after, limit + 1, f.states, f.owner or owner, f.name, f.glob)
            allocs = rd.allocations()
            keys = rd.groups({a.job_id for a in allocs})
        _, groups, _ = slot_use(allocs, keys)
        where: dict[str, list[str]] = {}
        for a in allocs:
            where.setdefault(a.job_id, []).append(a.worker_id)
        members: dict[str, list[str]] = {}
        for jid, key in groups.items():
            members.setdefault(key, []).append(jid)
        out: list[pb.JobInfo] = []
        size = 0
        for j in jobs[:limit]:
            info = pb.JobInfo(
                job_id=j.id, name=j.name[:MAX_NAME_CHARS], state=j.state, procs=j.procs, steps_done=j.steps_done,
                # A state file from before submits were validated may hold steps past int64: listing must not fail.
                steps_total=min(j.spec.steps or 0, _INT64_MAX), generation=j.generation,
                workers=where.get(j.id, []), submit_time=j.submit_time, start_time=j.start_time or 0,
                end_time=j.end_time or 0, last_loss=j.last_loss or 0, first_loss=j.first_loss or 0,
                last_checkpoint_step=j.ckpt_step, launcher=j.spec.launcher, message=j.message[:MAX_MESSAGE_CHARS],
                last_resize_s=j.last_resize_s or 0, restarts=j.restarts, group=groups.get(j.id, ""),
                interleaved_with=sorted(m for m in members.get(groups.get(j.id, ""), ()) if m != j.id),
                sizing=sizing.get(j.id, ""), uid=j.uid or "", owner=j.owner or "",
                target_procs=j.target_procs, min_procs=j.spec.min_procs, max_procs=j.spec.max_procs,
                batch_size=(batches or {}).get(j.id, (0, 0.0))[0], noise_scale=(batches or {}).get(j.id, (0, 0.0))[1],
            )
            size += info.ByteSize() + 8  # + the field's tag and length
            if out and size > MAX_REPLY_BYTES:
                return out, f"j{jobs[len(out) - 1].seq}"  # the rest from the next page
            out.append(info)
        more = len(jobs) > limit
        return out, f"j{jobs[limit - 1].seq}" if more else ""

    def workers_page(self, page_size: int, page_token: str,
                     last_seen: Callable[[list[str]], dict[str, float]]) -> tuple[list[pb.WorkerInfo], str]:
        """One page of workers in id order (as ``jobs_page``). ``last_seen``: the listed workers that are alive ->
        when each was last heard, wall clock (the controller holds its lock only for that)."""
        after = page_after(page_token, "w", str)
        limit = DEFAULT_PAGE if page_size <= 0 else min(page_size, MAX_PAGE)
        with self.query() as rd:
            rows = rd.workers_page(after, limit + 1)
            allocs = rd.allocations()
            used = slot_use(allocs, rd.groups({a.job_id for a in allocs}))[0]
        seen = last_seen([w.id for w in rows])
        out = [pb.WorkerInfo(worker_id=w.id, host=w.host, slots=w.slots, used=used.get(w.id, 0), alive=w.id in seen,
                             last_seen=seen.get(w.id, 0.0), gpus=w.gpus, gpu_type=w.gpu_type) for w in rows[:limit]]
        return out, f"w{rows[limit - 1].id}" if len(rows) > limit else ""


def every_page(page: Callable[[str], tuple[list, str]]) -> list:
    """All pages of a listing, for callers in the controller's process (the RPC serves one page at a time)."""
    out, token = page("")
    while token:
        more, token = page(token)
        out += more
    return out


def page_after(token: str, kind: str, conv: Callable[[str], object]) -> object:
    """The key a page starts after, from the previous reply's token ('' from the start); a token that is not one
    of this listing's is an InputError (shown clipped: it comes from a client)."""
    if not token:
        return conv("0") if conv is int else ""
    shown = "".join(c if c.isprintable() else "?" for c in token[:40])
    if not token.startswith(kind) or len(token) > MAX_TOKEN_CHARS:
        raise InputError("page_token", f"not a page token of this listing: {shown!r}")
    try:
        return conv(token[1:])
    except ValueError:
        raise InputError("page_token", f"not a page token of this listing: {shown!r}") from None


def wall(mono_now: float, mono: float | None) -> float:
    """A monotonic reading as wall-clock seconds (for display), given the monotonic clock's reading now: 0 when
    there is none."""
    return 0.0 if mono is None else time.time() - (mono_now - mono)
