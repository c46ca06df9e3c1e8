"""What every trace reader shares: safe line streaming, the anomaly report, the format registry.

Real logs are dirty. A reader never crashes on them: a row it cannot use is counted by kind (and
skipped only where it carries nothing usable), a file it cannot read at all raises one
``InputError`` naming file and line. ``--strict`` turns every anomaly into that error.
"""

from __future__ import annotations

import csv
import gzip
import zlib
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcsched.errors import InputError

# Anomaly kinds shared by all readers (a reader may add its own, named in its docstring).
UNKNOWN_FIELD = "unknown_field"  # a -1 / empty value where a number was expected
ZERO_RUNTIME = "zero_runtime"
NEGATIVE_RUNTIME = "negative_runtime"
RUNTIME_OVER_REQUEST = "runtime_over_request"
LARGER_THAN_MACHINE = "larger_than_machine"
UNSORTED_SUBMIT = "unsorted_submit"
DUPLICATE_ID = "duplicate_id"
DUPLICATE_JOB = "duplicate_job"  # a second record of the same job (same key, start and end): merged, dropped
CENSORED = "censored"  # still running / no end at trace end
MALFORMED_ROW = "malformed_row"  # a row that could not be parsed at all: skipped

_SNIFF_LINES = 40
GIVE_UP_ROWS = 100  # malformed rows before any good one: the file is not in this format
_BLOCK = 1 << 20
_MAX_LINE = 16 << 20  # a longer 'line' is binary garbage, not a log record


@dataclass
class TraceReport:
    """What a read found: the format, machine facts from headers, conversions made and anomalies."""

    path: str
    format: str
    strict: bool = False
    anomalies: Counter[str] = field(default_factory=Counter)
    first_lines: dict[str, int] = field(default_factory=dict)  # anomaly kind -> first line seen
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. machine_nodes, cores_per_node
    conversions: list[str] = field(default_factory=list)  # human-readable unit conversions applied
    options: dict[str, Any] = field(default_factory=dict)  # reader options, e.g. cores_per_node
    progress: Callable[[int, int], None] | None = field(default=None, repr=False, compare=False)
    first_details: dict[str, str] = field(default_factory=dict)  # anomaly kind -> detail of the first one
    records: int = 0  # records handed out so far (kept by Trace)
    notes: list[str] = field(default_factory=list)  # what the figures need beside them (a truncated file ...)

    def anomaly(self, kind: str, line: int | None = None, detail: str = "") -> None:
        """Count one anomaly; in strict mode, fail on it naming the line.

        Rows that cannot be parsed at all, with nothing read yet, mean the file is not in this
        format: after ``GIVE_UP_ROWS`` of them the read stops with one error instead of skipping on.
        """
        if self.strict:
            raise InputError(self.path, f"{kind}{': ' + detail if detail else ''} (--strict)", line)
        self.anomalies[kind] += 1
        if line is not None:
            self.first_lines.setdefault(kind, line)
        if detail:
            self.first_details.setdefault(kind, detail)
        if kind == MALFORMED_ROW and not self.records and self.anomalies[kind] >= GIVE_UP_ROWS:
            self.fail_unreadable()

    def reset(self) -> None:
        """Forget what a previous pass found; keep the settings (strict, options, progress)."""
        for d in (self.anomalies, self.first_lines, self.first_details, self.meta):
            d.clear()
        self.conversions.clear()
        self.notes.clear()
        self.records = 0

    def fail_unreadable(self) -> None:
        """Raise the one error for a file where no row could be read as this format."""
        n = self.anomalies[MALFORMED_ROW]
        raise InputError(
            self.path,
            f"not readable as {self.format}: {'the first ' if n >= GIVE_UP_ROWS else ''}{n} row(s) malformed, "
            f"none read (first: {self.first_details.get(MALFORMED_ROW, '?')}); wrong format? see --format",
            self.first_lines.get(MALFORMED_ROW),
        )

    def convert(self, note: str) -> None:
        if note not in self.conversions:
            self.conversions.append(note)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


MAX_COUNT = 10**9  # no machine has this many nodes, processors or GPUs: a larger count is damage


def count_field(text: str, name: str) -> int:
    """A node/processor/GPU count: a whole number in [0, MAX_COUNT], else ValueError naming the field."""
    try:
        v = int(text)
    except ValueError:
        f = float(text)
        if not f.is_integer():
            raise ValueError(f"{name}: not a whole number: {text!r}") from None
        v = int(f)
    if not 0 <= v <= MAX_COUNT:
        raise ValueError(f"{name}: {text!r} is not a plausible count")
    return v


def _is_gzip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == b"\x1f\x8b"


def numbered_lines(path: str | Path, report: TraceReport | None = None) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, line without newline), reading ``.gz`` transparently.

    A truncated or corrupt gzip, binary garbage or an unreadable file becomes an ``InputError``
    with the line reached, so the caller never sees a raw OSError or zlib traceback.
    With a ``report`` whose ``progress`` is set, it is called with (bytes of the file read, file size)
    after each block, so a long read can show a real progress bar.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(p, "no such file")
    if p.is_dir():
        raise InputError(p, "is a directory, expected a trace file")
    lineno = 0
    try:
        gz = _is_gzip(p)
        raw = gzip.open(p, "rb") if gz else p.open("rb")
        progress = report.progress if report is not None else None
        size = p.stat().st_size
        with raw:
            # Whole blocks are decoded and split at once: per-line reads cost more than parsing.
            rest = b""
            while True:
                block = raw.read(_BLOCK)
                if not block:
                    break
                data = rest + block
                cut = data.rfind(b"\n") + 1
                if cut == 0 and len(data) < _MAX_LINE:
                    rest = data
                    continue
                if cut == 0:
                    raise InputError(p, f"no line break in the first {_MAX_LINE:,} bytes: not a text trace", lineno + 1)
                rest = data[cut:]
                lineno = yield from _split_block(p, data[:cut], lineno)
                if progress is not None:
                    progress((raw.fileobj or raw).tell() if gz else raw.tell(), size)  # type: ignore[union-attr]
            if rest:
                yield from _split_block(p, rest, lineno)
    except InputError:
        raise
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise InputError(p, f"corrupt or truncated gzip ({e})", lineno + 1) from None
    except OSError as e:
        raise InputError(p, f"cannot read: {e.strerror or e}", lineno + 1 if lineno else None) from None


def _split_block(p: Path, data: bytes, lineno: int) -> Generator[tuple[int, str], None, int]:
    """Number the lines of a block that ends at a line break; return the last line number."""
    nul = data.find(b"\x00")
    if nul >= 0:
        raise InputError(p, "binary data (NUL byte): not a text trace", lineno + data.count(b"\n", 0, nul) + 1)
    text = data.decode("utf-8", errors="replace")
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    yield from enumerate(lines, lineno + 1)
    return lineno + len(lines)


def head_lines(path: str | Path, n: int = _SNIFF_LINES) -> list[str]:
    out: list[str] = []
    for _, line in numbered_lines(path):
        out.append(line)
        if len(out) >= n:
            break
    return out


@dataclass(frozen=True)
class TraceFormat:
    """A registered format. ``kind`` says which records ``read`` yields.

    kinds: ``jobs`` (Job), ``idle`` (IdleInterval), ``elastic-bounds`` / ``elastic-curves``
    (BFTrainer job bounds and scaling curves, read together into ElasticJob).
    ``sniff`` gets the first lines of the file and answers whether it is this format.
    """

    name: str
    kind: str
    description: str
    sniff: Callable[[list[str]], bool]
    read: Callable[[Path, TraceReport], Iterable[Any]]


def csv_rows(
    path: str | Path, required: tuple[str, ...], report: TraceReport, what: str, lenient: bool = True
) -> Iterator[tuple[int, list[str], dict[str, int]]]:
    """Yield (line number, fields, column -> index) for each data row of a headed CSV file.

    The header must hold ``required`` (else the file is not ``what``: InputError). A row with the
    wrong number of fields is counted as malformed and skipped, or with ``lenient=False`` is an error.
    Lines without quotes are split directly (the common case, several times faster than ``csv``);
    quoted fields may not span lines.
    """
    p = Path(path)
    index: dict[str, int] | None = None
    width = 0
    for lineno, line in numbered_lines(p, report):
        if not line or line.isspace():
            continue
        if '"' in line:
            try:
                row = next(csv.reader([line]))
            except csv.Error as e:
                raise InputError(p, f"unreadable CSV: {e}", lineno) from None
        else:
            row = line.split(",")
        if index is None:
            header = [c.strip() for c in row]
            missing = [c for c in required if c not in header]
            if missing:
                raise InputError(p, f"not a {what} file: header lacks {', '.join(missing)}", lineno)
            index = {c: i for i, c in reversed(list(enumerate(header)))}
            width = len(header)
            continue
        if len(row) != width:
            msg = f"{len(row)} fields, header has {width}"
            if not lenient:
                raise InputError(p, msg, lineno)
            report.anomaly(MALFORMED_ROW, lineno, msg)
            continue
        yield lineno, row, index
    if index is None:
        raise InputError(p, f"empty file: no {what} header", 1)


def csv_records(
    path: str | Path, required: tuple[str, ...], report: TraceReport, what: str, lenient: bool = True
) -> Iterator[tuple[int, dict[str, str]]]:
    """Like ``csv_rows`` but each row as {column: text} (convenient where speed does not matter)."""
    for lineno, row, index in csv_rows(path, required, report, what, lenient):
        yield lineno, {c: row[i] for c, i in index.items()}


def csv_header_is(first_lines: list[str], *columns: str) -> bool:
    """True when the first non-empty line is a CSV header starting with ``columns`` (in order)."""
    for line in first_lines:
        if line.strip():
            cols = [c.strip().strip('"') for c in line.split(",")]
            return cols[: len(columns)] == list(columns)
    return False
