"""Submitting many jobs at once: job arrays, batches (``SubmitMany``) and the per-user limits they are checked against.

One ``SubmitMany`` call carries many job files; each is validated as a single submit is (``submitted_spec``) and
answered on its own: a bad file is refused with its file and line and the others are still stored. Not all or
nothing, because a batch is a convenience of the client (``hpcsched submit *.yaml`` sends 500 files per call), not
a unit the user chose: one typo in 500 files must not cost the other 499, and retrying is safe (the request ids make
a resent item return the jobs its first attempt made). The items that pass are stored in one transaction.

A job file with ``array: N`` (or ``hpcsched submit --array N``, like ``sbatch --array``) is one item that makes N jobs,
``name[0]`` .. ``name[N-1]``, each with ``HPCSCHED_ARRAY_INDEX`` (and ``HPCSCHED_ARRAY_COUNT``) in its environment. Its
instances are stored with the request ids ``RID#0`` .. ``RID#N-1``, so a retried array finds all of them.

Limits, from the controller's config: a call of more than ``max_submit_batch`` jobs (array instances counted) is
refused whole, before anything is parsed or stored (a bound on the work one call can cause); a file whose jobs would
take its submitter past ``max_pending_per_user`` pending jobs is refused with the limit and the count (a quota, as
Slurm's MaxSubmitJobs): one user cannot queue a million jobs the scheduler must then look at every step.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from hpcsched.errors import InputError
from hpcsched.runtime.jobfile import JobSpec
from hpcsched.runtime.jobrecord import check_spec, submitted_spec
from hpcsched.runtime.store import MAX_REQUEST_ID_CHARS, Store

ARRAY_INDEX_ENV = "HPCSCHED_ARRAY_INDEX"
ARRAY_COUNT_ENV = "HPCSCHED_ARRAY_COUNT"


QUOTA_KEY = "max_pending_per_user"  # named in every refusal for it (the server counts those by it)


class LimitExceeded(Exception):
    """A submit past a per-user limit; the message says the limit, its config key and the user's count."""


@dataclass(slots=True)
class Item:
    """One request item, parsed: its jobs (an array's instances) or why it is refused."""

    source: str
    request_id: str
    specs: list[JobSpec]
    error: str = ""
    array: bool = False
    job_ids: tuple[str, ...] = ()
    duplicate: bool = False


class PendingCounts:
    """Pending jobs per submitter, counted in the store (an index range) at most every ``ttl_s`` and kept up to date
    with this controller's submits in between: at 100,000 pending jobs a count took 17-35 ms under the controller's
    lock, once per Submit. Jobs leave the queue without this cache hearing (they start or are cancelled), so it
    may count too many, never too few for submits; a refusal is therefore always made on a fresh count. What it
    does not see between two counts: a job put back in the queue (preempted, retried), which may let a user's queue
    pass the limit by the jobs requeued in ``ttl_s``."""

    def __init__(self, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self._counts: dict[str, tuple[int, float]] = {}

    def get(self, store: Store, owner: str, adding: int, limit: int) -> int:
        """The owner's pending count, fresh from the store when it is old or when ``adding`` would pass ``limit``."""
        now = self.clock()
        n, at = self._counts.get(owner, (0, -1e18))
        if now - at > self.ttl_s or n + adding > limit:
            n, at = store.pending_count(owner), now
            self._counts[owner] = (n, at)
        return n

    def add(self, owner: str, n: int) -> None:
        if owner in self._counts:
            count, at = self._counts[owner]
            self._counts[owner] = (count + n, at)


def array_instances(spec: JobSpec, source: str) -> list[JobSpec]:
    """The jobs a spec stands for: itself, or for ``array: N`` its N instances (``name[i]``, the index and count in
    the environment). The last instance (longest name, widest environment) is checked again, so every instance
    is within the job file limits (the name's length, the environment's size)."""
    n = spec.array
    if n is None:
        return [spec]
    for var in (ARRAY_INDEX_ENV, ARRAY_COUNT_ENV):
        if var in spec.env:
            raise InputError(source, f"env: {var} is set by array: for each instance; remove it from env")
    base = dataclasses.replace(spec, array=None)
    out = [dataclasses.replace(base, name=f"{spec.name}[{i}]",
                               env={**spec.env, ARRAY_INDEX_ENV: str(i), ARRAY_COUNT_ENV: str(n)}) for i in range(n)]
    try:
        check_spec(out[-1], source)
    except InputError as e:
        raise InputError(source, f"array: instance {n - 1} ({out[-1].name[:40]!r}...) is not a valid job: "
                                 f"{e.message}") from None
    return out


def parse_items(requests: list, max_batch: int) -> list[Item]:
    """Validate each request item (a ``SubmitRequest``: its job record or spec_yaml, source, request_id) on its
    own; an item's problem is its ``error``. More than ``max_batch`` jobs in all (arrays counted) is an InputError
    for the call."""
    if len(requests) > max_batch:
        raise InputError("SubmitMany", f"{len(requests)} job files in one call; this controller takes at most "
                                       f"{max_batch} jobs per call (max_submit_batch): send smaller batches")
    items = []
    for r in requests:
        src = clip(r.source or "<submitted job>", 200)
        item = Item(src, r.request_id, [])
        try:
            if len(r.request_id) > MAX_REQUEST_ID_CHARS or not r.request_id.isprintable():
                raise InputError(src, f"request id: at most {MAX_REQUEST_ID_CHARS} printable characters")
            spec = submitted_spec(r, src)
            item.specs, item.array = array_instances(spec, src), spec.array is not None
        except InputError as e:
            item.error = str(e)
        items.append(item)
    total = sum(len(i.specs) for i in items)
    if total > max_batch:
        raise InputError("SubmitMany", f"{total} jobs in one call (array instances counted); this controller takes "
                                       f"at most {max_batch} per call (max_submit_batch): send smaller batches or "
                                       "split the array")
    return items


def request_ids(item: Item) -> list[str]:
    """The request ids an item's jobs are stored under ('' when the item has none: not idempotent)."""
    if not item.request_id:
        return [""] * len(item.specs)
    if not item.array:
        return [item.request_id]
    return [f"{item.request_id}#{i}" for i in range(len(item.specs))]


def store_items(store: Store, items: list[Item], owner: str, max_pending: int, now: float,
                counts: PendingCounts) -> int:
    """Store the valid items' jobs in one transaction, in order: an item seen before (its request ids) gets the
    jobs its first submit made (``duplicate``), an item past ``max_pending`` gets its ``error``. Call under the
    controller's lock (the duplicate and count reads must see no other writer). Returns the jobs stored."""
    valid = [i for i in items if not i.error]
    rids = {i.request_id: request_ids(i) for i in valid if i.request_id}
    seen = store.jobs_for_requests([r for ids in rids.values() for r in ids])
    pending = counts.get(store, owner, sum(len(i.specs) for i in valid), max_pending) if max_pending else 0
    start = pending
    batch: list[tuple[JobSpec, str | None]] = []
    new: list[tuple[Item, int, int]] = []
    in_call: set[str] = set()
    for item in valid:
        ids = rids.get(item.request_id, [""] * len(item.specs))
        if item.request_id and item.request_id in in_call:
            item.error = f"{item.source}: request id {item.request_id[:40]!r} repeated in this call"
            continue
        in_call.add(item.request_id)
        if ids[0] and ids[0] in seen:
            item.job_ids, item.duplicate = tuple(seen[r] for r in ids if r in seen), True
            continue
        if max_pending and pending + len(item.specs) > max_pending:
            item.error = f"{item.source}: {pending_refusal(owner, pending, max_pending, len(item.specs))}"
            continue
        pending += len(item.specs)
        new.append((item, len(batch), len(item.specs)))
        batch += [(s, r or None) for s, r in zip(item.specs, ids, strict=True)]
    stored = store.add_jobs(batch, now, owner)
    if max_pending:
        counts.add(owner, pending - start)
    for item, at, n in new:
        item.job_ids = tuple(stored[at:at + n])
    return len(stored)


def pending_refusal(owner: str, pending: int, limit: int, adding: int) -> str:
    """Why a submit is refused by the pending-jobs quota: the limit, its key, the count and what to do."""
    who = f"user {owner!r}" if owner else "the submitter (no user names: one token)"
    return (f"refused: {who} has {pending:,} pending jobs and this would add {adding:,}; the limit is {limit:,} "
            f"pending jobs per user ({QUOTA_KEY} in the controller's config): wait for some to start or "
            "cancel some")


def clip(text: str, limit: int) -> str:
    """One printable line of at most ``limit`` characters (a source name comes from a client)."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
