"""Why a pending job cannot start whatever the policy does, said in its message (``waiting: ...``).

A job needs more procs than the live workers that have its launcher (and one of its GPU types) hold in total,
or no live worker has its launcher: it would wait with an empty message (``procs: 1000000``). The note goes
when workers that can hold it arrive; a job's failure reason, if it has one, is kept in front of it.

Why classes: the note depends only on the job's launcher, minimum size and GPU types against the live workers'
totals, so it is computed once per class of jobs, and when the workers change only the jobs of classes whose
note changed are written. At 100,000 queued jobs of a few shapes a registration storm then costs a few notes
per step, not a pass over the queue.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from hpcsched.runtime.store_rows import WorkerRow

WAITING = re.compile(r"(?:^|; )waiting: [^;]*$")  # the note a job that no live worker set can hold carries

JobClass = tuple[str, int, tuple[str, ...]]  # (launcher, min procs, GPU types)


def _too_big(need: int, n: int, what: str, total: int) -> str:
    return (f"waiting: needs {need} procs, and the {n} live worker{'s' if n > 1 else ''} with {what} "
            f"{'have' if n > 1 else 'has'} {total} slot{'s' if total > 1 else ''} in total")


class Capacity:
    """The live workers' slots per launcher and per (launcher, GPU type): what the notes are computed from."""

    def __init__(self, workers: list[WorkerRow]) -> None:
        self.any = bool(workers)
        self.slots: dict[str, int] = {}
        self.count: dict[str, int] = {}
        self.typed: dict[tuple[str, str], tuple[int, int]] = {}  # (launcher, GPU type) -> (slots, workers)
        self.types: dict[str, set[str]] = {}  # launcher -> GPU types of the live workers that have it
        for w in workers:
            for name in w.launchers:
                self.slots[name] = self.slots.get(name, 0) + w.slots
                self.count[name] = self.count.get(name, 0) + 1
                s, n = self.typed.get((name, w.gpu_type), (0, 0))
                self.typed[(name, w.gpu_type)] = (s + w.slots, n + 1)
                self.types.setdefault(name, set()).add(w.gpu_type or "(not advertised)")

    def note(self, cls: JobClass) -> str:
        """The waiting note of a job of class ``cls`` ('' when the live workers could hold it)."""
        launcher, need, types = cls
        if not self.any:
            return "waiting: no live worker"
        if launcher not in self.slots:
            return f"waiting: no live worker has the {launcher} launcher"
        if types:  # only the workers of its types count
            have = [self.typed.get((launcher, t), (0, 0)) for t in types]
            total, n = sum(s for s, _ in have), sum(k for _, k in have)
            kinds = "/".join(types)
            if not n:
                return (f"waiting: no live worker with {launcher} has GPU type {kinds} (their types: "
                        f"{', '.join(sorted(self.types[launcher]))})")
            return _too_big(need, n, f"{launcher} and GPU type {kinds}", total) if need > total else ""
        if need > self.slots[launcher]:
            return _too_big(need, self.count[launcher], launcher, self.slots[launcher])
        return ""


class WaitingNotes:
    """The pending jobs by class and each class's current note (rules in the module docstring)."""

    def __init__(self) -> None:
        self._members: dict[JobClass, dict[str, None]] = {}
        self._class: dict[str, JobClass] = {}
        self._note: dict[JobClass, str] = {}
        self._capacity = Capacity([])

    def leave(self, jid: str) -> None:
        cls = self._class.pop(jid, None)
        if cls is not None:
            members = self._members[cls]
            members.pop(jid, None)
            if not members:
                del self._members[cls]
                self._note.pop(cls, None)

    def enter(self, jid: str, cls: JobClass) -> str:
        """A job entered the queue: its note now."""
        self.leave(jid)
        self._class[jid] = cls
        self._members.setdefault(cls, {})[jid] = None
        note = self._note.get(cls)
        if note is None:
            note = self._note[cls] = self._capacity.note(cls)
        return note

    def blocked(self) -> set[JobClass]:
        """The classes no live worker set can hold now (their note is not empty)."""
        return {cls for cls, note in self._note.items() if note}

    def workers_changed(self, workers: list[WorkerRow]) -> Iterator[tuple[str, str]]:
        """The live workers changed: (job, its new note) for every pending job whose class's note changed."""
        self._capacity = Capacity(workers)
        for cls, members in list(self._members.items()):
            note = self._capacity.note(cls)
            if note != self._note.get(cls):
                self._note[cls] = note
                for jid in list(members):
                    yield jid, note


def with_note(message: str, note: str, clip: int) -> str:
    """A job's message with its waiting note replaced by ``note`` (none when ''), the rest kept in front of it."""
    if (note and (message == note or message.endswith("; " + note))) or (not note and "waiting: " not in message):
        return message
    base = WAITING.sub("", message)  # the note has no ';': only the last part is a note
    out = f"{base}; {note}" if base and note else base or note
    if not out.isprintable():  # checked first: the per-character pass was most of a note's cost at 100,000 notes
        out = "".join(c if c.isprintable() else "?" for c in out)
    return out if len(out) <= clip else out[: clip - 3] + "..."
