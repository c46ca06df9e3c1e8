"""How one ``sacct`` file is laid out: its delimiter (or fixed-width table) and its column names.

sacct prints its table in one of these layouts (sacct(1)): ``-p``/``--parsable`` ('|' between fields and
after the last), ``-P``/``--parsable2`` (no trailing '|'), either with ``--delimiter=CHARS`` instead of
'|', or (without -p/-P) a fixed-width table: a header, a ruler of dashes, values cut to the column width
with a '+' marking a cut. Header names are sacct's field names whatever case ``-o`` used. A row split
into too many pieces by a delimiter inside a field is rejoined by the columns that can hold it
(``Layout.rejoin``).
"""

from __future__ import annotations

import re
from pathlib import Path

from hpcsched.errors import InputError

# sacct's field names (``sacct --helpformat``, Slurm 17-24), lower case: they tell a header from data, and
# where they meet, the delimiter between them.
SACCT_NAMES = frozenset("""
account admincomment alloccpus allocgres allocnodes alloctres associd avecpu avecpufreq avediskread avediskwrite
avepages averss avevmsize blockid cluster comment constraints consumedenergy consumedenergyraw container cputime
cputimeraw dbindex derivedexitcode elapsed elapsedraw eligible end exclusive exitcode extra failednode flags gid group
jobid jobidraw jobname layout licenses maxdiskread maxdiskreadnode maxdiskreadtask maxdiskwrite maxdiskwritenode
maxdiskwritetask maxpages maxpagesnode maxpagestask maxrss maxrssnode maxrsstask maxvmsize maxvmsizenode
maxvmsizetask mcslabel mincpu mincpunode mincputask ncpus nnodes nodelist ntasks originalsluid oversubscribe
partition planned plannedcpu plannedcpuraw priority qos qosraw qosreq reason reqcpufreq reqcpufreqgov
reqcpufreqmax reqcpufreqmin reqcpus reqgres reqmem reqnodes reqtres reservation reservationid reserved resvcpu
resvcpuraw restarts segmentsize sluid start state stderr stdin stdout submit submitline suspended systemcomment
systemcpu timelimit timelimitraw totalcpu tresusageinave tresusageinmax tresusageinmaxnode tresusageinmaxtask
tresusageinmin tresusageinminnode tresusageinmintask tresusageintot tresusageoutave tresusageoutmax
tresusageoutmaxnode tresusageoutmaxtask tresusageoutmin tresusageoutminnode tresusageoutmintask tresusageouttot
uid user usercpu wckey wckeyid workdir
""".split())
_LONGEST_FIRST = sorted(SACCT_NAMES, key=len, reverse=True)
# Fields whose text is free (names, paths, comments, constraint expressions): the only ones that may hold
# the delimiter, so the only ones a row with too many fields can be rejoined in.
FREE_TEXT = frozenset({"jobname", "comment", "admincomment", "systemcomment", "constraints", "submitline", "workdir",
                       "stdout", "stderr", "stdin", "reason", "extra", "container", "licenses", "mcslabel", "wckey",
                       "flags", "failednode", "reservation"})
_DATE = r"(?:\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?|Unknown|None|)"
_DUR = r"(?:(?:\d+-)?(?:\d+:)?\d+:\d+(?:\.\d+)?|\d+(?:\.\d+)?|UNLIMITED|Partition_Limit|INVALID|Unknown|)"
_INT = r"(?:\d+(?:\.\d+)?|UNLIMITED|Partition_Limit|Unknown|)"
_NAME = r"[\w.@+\-()]*"
_TRES = r"[\w/:=,.+\-]*"
# What a value of each typed field looks like: a rejoined row is accepted only if every typed field matches.
_SHAPES: dict[str, re.Pattern[str]] = {
    name: re.compile(shape)
    for names, shape in (
        (("jobid", "jobidraw"), r"\d+(?:_(?:\d+|\[[\d\-,%:]+\]))?(?:\+\d+)?(?:\.[\w-]+)?"),
        (("submit", "start", "end", "eligible"), _DATE),
        (("elapsed", "timelimit", "cputime", "totalcpu", "usercpu", "systemcpu", "suspended", "reserved", "resvcpu",
          "avecpu", "mincpu", "planned", "plannedcpu"), _DUR),
        (("elapsedraw", "timelimitraw", "cputimeraw", "resvcpuraw", "plannedcpuraw", "consumedenergyraw", "qosraw",
          "nnodes", "ncpus", "alloccpus", "reqcpus", "allocnodes", "ntasks", "uid", "gid", "priority", "restarts",
          "associd", "dbindex", "wckeyid"), _INT),
        (("reqnodes",), r"[\d\-]*"),
        (("state",), r"[A-Z_]+\+?(?: by \d+)?"),
        (("exitcode", "derivedexitcode"), r"(?:-?\d+:\d+)?"),
        (("nodelist", "failednode"), r"[\w\[\]\-,.]*|None assigned|\(null\)"),
        (("alloctres", "reqtres", "allocgres", "reqgres", "tresusageinave", "tresusageinmax", "tresusageinmaxnode",
          "tresusageinmaxtask", "tresusageinmin", "tresusageinminnode", "tresusageinmintask", "tresusageintot",
          "tresusageoutave", "tresusageoutmax", "tresusageoutmaxnode", "tresusageoutmaxtask", "tresusageoutmin",
          "tresusageoutminnode", "tresusageoutmintask", "tresusageouttot"), _TRES),
        (("user", "group", "account", "qos", "cluster", "qosreq"), _NAME),
        (("partition",), r"[\w.@+\-,]*"),
        (("reqmem", "maxrss", "averss", "maxvmsize", "avevmsize", "maxdiskread", "maxdiskwrite", "avediskread",
          "avediskwrite", "maxpages", "avepages"), r"[\d.]*[KMGTP]?[ncB]?"),
    )
    for name in names
}
REPAIRED_ROW = "repaired_row"  # the delimiter inside a field (or a line break): rejoined by the header's columns
TRUNCATED_FIELD = "truncated_field"  # a fixed-width value cut short by sacct ('+'): read as far as it goes
_DELIMITER_NAMES = {"tab": "\t", "\\t": "\t", "pipe": "|", "bar": "|", "comma": ",", "semicolon": ";", "colon": ":"}
MAX_CONTINUATION = 20  # lines a field with line breaks may span before the row is given up as malformed
_MAX_ALIGNMENTS = 5000  # rejoin search steps before a row counts as ambiguous


def delimiter_option(value: object) -> str | None:
    """``--delimiter`` as given: a name (tab, pipe, comma, table), ``\\t``, or the characters themselves."""
    if value is None or value == "":
        return None
    text = str(value)
    if text.lower() in ("table", "fixed", "fixed-width"):
        return "table"
    return _DELIMITER_NAMES.get(text.lower(), text)


def shown(d: str) -> str:
    return {"\t": "tab", "|": "'|'", ",": "','", " ": "space"}.get(d, repr(d))


def is_ruler(line: str) -> bool:
    s = line.strip()
    return bool(s) and "-" in s and set(s) <= {"-", " "}


def known_split(header: str) -> str | None:
    """The delimiter between sacct field names in ``header`` (any characters, even letters); None if none fits.

    Starting from a field name at the header's start, each way of reaching the next field name gives a
    candidate; the first whose split yields only field names (allowing -p's trailing delimiter) wins.
    """
    low = header.lower()
    for first in _LONGEST_FIRST:
        if not low.startswith(first):
            continue
        e = len(first)
        for j in range(e + 1, min(len(low), e + 12) + 1):
            if not any(low.startswith(n, j) for n in _LONGEST_FIRST):
                continue
            d = header[e:j]
            if (d.isspace() and d != "\t") or any(n in d.lower() for n in SACCT_NAMES):
                continue  # spaces: a fixed-width table; a field name inside: not one delimiter
            parts = low.split(d.lower())
            if parts and parts[-1] == "":
                parts.pop()
            if len(parts) >= 2 and all(p in SACCT_NAMES for p in parts):
                return d
    return None


def uniform_split(header: str) -> str | None:
    """The one separator between identifier-like names (for fields newer than ``SACCT_NAMES``); else None."""
    names = re.findall(r"[A-Za-z][A-Za-z0-9_]*", header)
    seps = re.split(r"[A-Za-z][A-Za-z0-9_]*", header)
    if len(names) < 2 or seps[0] != "":
        return None
    middle = set(seps[1:-1])
    if len(middle) != 1:
        return None
    (d,) = middle
    if not d or seps[-1] not in ("", d) or (d.isspace() and d != "\t"):
        return None  # spaces between names: a fixed-width table, which needs its ruler
    return d


def guess_delimiter(header: str) -> str | None:
    """The delimiter a header seems to use, from sacct's field names, else from a uniform separator."""
    return known_split(header) or uniform_split(header)


def header_fields(header: str, d: str) -> tuple[list[str], bool]:
    """(names, trailing): split on ``d``; ``trailing`` is -p's delimiter after the last name."""
    parts = header.split(d)
    trailing = len(parts) > 1 and parts[-1].strip() == ""
    if trailing:
        parts.pop()
    return [p.strip() for p in parts], trailing


def _one_column_error(path: Path, lineno: int, header: str, d: str, given: bool) -> InputError:
    """Why the header did not split: name the delimiter the header does seem to use."""
    seems = guess_delimiter(header)
    src = " given with --delimiter" if given else ""
    if seems is not None and seems != d:
        return InputError(path, f"delimiter looks like {shown(seems)} but the header has 1 column when split on "
                          f"the delimiter {shown(d)}{src}: {'drop --delimiter or give' if given else 'give'} "
                          f"--delimiter {'tab' if seems == chr(9) else seems}", lineno)
    return InputError(path, f"the header has 1 column when split on the delimiter {shown(d)}{src}, and no other "
                      f"delimiter fits it ({header[:60]!r}): not sacct output, or sacct -n (no header line); "
                      "name the columns with --columns (the sacct --format list)", lineno)


class Layout:
    """How one sacct file is laid out: the header's names and how a line splits into values."""

    def __init__(self, names: list[str], delimiter: str | None, trailing: bool = False,
                 spans: list[tuple[int, int]] | None = None) -> None:
        self.names = names
        self.delimiter = delimiter  # None: fixed-width table
        self.trailing = trailing
        self.spans = spans
        self.width = len(names)
        low = [n.lower().rstrip("+") for n in names]
        self.low = low
        self.shapes = [_SHAPES.get(n) for n in low]
        d = delimiter or ""
        # A column may take extra pieces if it is free text, or if its values may contain the delimiter
        # (a ',' delimiter inside a node list or a TRES list).
        self.absorbs = [n in FREE_TEXT or (shape is not None and d != "" and shape.fullmatch(f"a{d}a") is not None)
                        for n, shape in zip(low, self.shapes, strict=True)]

    def describe(self) -> str:
        if self.delimiter is None:
            return f"fixed-width table, {self.width} columns"
        mode = "-p, trailing delimiter" if self.trailing else "-P"
        return f"delimiter {shown(self.delimiter)} ({mode}), {self.width} columns"

    def split(self, line: str) -> list[str]:
        if self.delimiter is None:
            assert self.spans is not None
            return [line[a:b + 1].strip() for a, b in self.spans]
        d = self.delimiter
        if self.trailing and line.endswith(d):
            line = line[: -len(d)]
        return line.split(d)

    def fits(self, j: int, value: str) -> bool:
        shape = self.shapes[j]
        return shape is None or shape.fullmatch(value.strip()) is not None

    def rejoin(self, pieces: list[str], used: list[int]) -> tuple[list[str] | None, str]:
        """Rejoin a row split into too many pieces: the extra pieces go back into the columns that can hold
        the delimiter, so that every typed column keeps a value of its shape.

        Returns (values, note) when every such reading agrees on the columns a job is made of (``used``),
        else (None, why). The search is depth-first with memoised dead ends, capped at ``_MAX_ALIGNMENTS``.
        """
        d, w, n = self.delimiter or "", self.width, len(pieces)
        dead: set[tuple[int, int]] = set()
        found: dict[tuple[str, ...], list[str]] = {}
        steps = 0

        def walk(j: int, i: int, acc: list[str]) -> None:
            nonlocal steps
            steps += 1
            if steps > _MAX_ALIGNMENTS or len(found) > 1 or (j, i) in dead:
                return
            if j == w:
                if i == n:
                    found.setdefault(tuple(acc[k] for k in used), list(acc))
                return
            before = len(found)
            most = n - i - (w - j - 1) if self.absorbs[j] else 1
            for k in range(1, max(most, 0) + 1):
                if steps > _MAX_ALIGNMENTS or len(found) > 1:
                    break
                value = d.join(pieces[i:i + k])
                if self.fits(j, value):
                    acc.append(value)
                    walk(j + 1, i + k, acc)
                    acc.pop()
            if len(found) == before and steps <= _MAX_ALIGNMENTS:
                dead.add((j, i))

        walk(0, 0, [])
        holders = [self.names[j] for j in range(w) if self.absorbs[j]]
        if len(found) == 1 and steps <= _MAX_ALIGNMENTS:
            values = next(iter(found.values()))
            where = [self.names[j] for j in range(w) if d in values[j] or "\n" in values[j]]
            return values, f"{n - w} extra piece(s) rejoined in {', '.join(where) or 'a free-text field'}"
        if not holders:
            return None, (f"{n} fields, header has {w}, and no column can hold the delimiter {shown(d)}")
        if not found:
            return None, (f"{n} fields, header has {w}: no way to rejoin the delimiter {shown(d)} inside "
                          f"{', '.join(holders)} gives every typed field a valid value")
        return None, (f"{n} fields, header has {w}: the delimiter {shown(d)} inside {', '.join(holders)} can be "
                      "rejoined in more than one way; rerun sacct with a --delimiter that the data does not hold")


def layout_of(path: Path, lineno: int, header: str, second: str | None, given: str | None) -> Layout:
    """The file's layout from its header and the line after it (a ruler makes it a fixed-width table)."""
    if given == "table" or (given is None and second is not None and is_ruler(second)):
        if second is None or not is_ruler(second):
            raise InputError(path, "--delimiter table: the line under the header is not sacct's '----' ruler",
                             lineno + 1)
        spans = [(m.start(), m.end()) for m in re.finditer(r"-+", second)]
        return Layout([header[a:b + 1].strip() for a, b in spans], None, spans=spans)
    if re.match(r"\s*\d+(?:[_.+][\w\[\]\-]*)?\s*(?:[^\w\s.\[\]-]|$)", header):
        raise InputError(path, "the first line starts with a job id, not a header: sacct -n/--noheader prints no "
                         "header line: name its columns with --columns (the --format list it was made with, e.g. "
                         "--columns xdmod for XDMoD's archive layout)", lineno)
    d = given if given is not None else guess_delimiter(header)
    if d is None:
        if re.fullmatch(r"\s*[A-Za-z][A-Za-z0-9_]*\s*", header):  # one field, e.g. -o JobID
            return Layout([header.strip()], "|")
        seps = set(re.split(r"[A-Za-z][A-Za-z0-9_]*", header.strip())[1:-1])
        if seps and all(s.isspace() for s in seps):
            raise InputError(path, "looks like sacct's fixed-width table, but the line under the header is not "
                             "its '----' ruler; rerun sacct with -P (or keep the ruler line)", lineno)
        raise InputError(path, f"cannot tell the delimiter of this sacct header ({header[:60]!r}): it mixes "
                         "separators; give one with --delimiter", lineno)
    names, trailing = header_fields(header, d)
    if len(names) == 1 and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", names[0]):
        raise _one_column_error(path, lineno, header, d, given is not None)
    return Layout(names, d, trailing)


# The column lists of sacct archives that sites keep headerless (``sacct -P --noheader --format=...``),
# by name for ``--columns``. xdmod: Open XDMoD's Slurm shredder input (resource-manager-slurm docs, the
# list its xdmod-slurm-helper runs); apel: the APEL accounting client's Slurm parser input.
ARCHIVE_LAYOUTS: dict[str, tuple[str, ...]] = {
    "xdmod": ("JobID", "JobIDRaw", "Cluster", "Partition", "Account", "Group", "GID", "User", "UID", "Submit",
              "Eligible", "Start", "End", "Elapsed", "ExitCode", "State", "NNodes", "NCPUS", "ReqCPUS", "ReqMem",
              "ReqGRES", "ReqTRES", "Timelimit", "NodeList", "JobName"),
    "apel": ("JobID", "JobName", "User", "Group", "Start", "End", "Elapsed", "CPUTimeRAW", "Partition", "NCPUS",
             "NNodes", "NodeList", "MaxRSS", "MaxVMSize", "State"),
}


def parse_columns(value: object) -> list[str]:
    """``--columns``: a name from ``ARCHIVE_LAYOUTS``, or sacct's ``--format`` list (``JobID,JobName%30,...``;
    a ``%width`` suffix is dropped, as it only sets the width of sacct's fixed-width table)."""
    text = str(value).strip()
    if text.lower() in ARCHIVE_LAYOUTS:
        return list(ARCHIVE_LAYOUTS[text.lower()])
    names = [re.sub(r"%-?\d*$", "", c.strip()) for c in re.split(r"[,\s]+", text) if c.strip()]
    if not names or not all(re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", n) for n in names):
        raise ValueError(f"--columns {text!r}: expected sacct field names separated by commas (the sacct --format "
                         f"list) or one of {', '.join(ARCHIVE_LAYOUTS)}")
    return names


def headerless_layout(path: Path, lineno: int, first: str, names: list[str], given: str | None) -> tuple[Layout, bool]:
    """The layout of a file whose columns are named by ``--columns``; (layout, whether ``first`` is a header
    line naming the same columns anyway, to be skipped). The delimiter is ``given`` or sacct's '|'; a row
    ending in one more delimiter is sacct -p's."""
    if given == "table":
        raise InputError(path, "--columns names the fields of sacct -P/-p output; a fixed-width table has its "
                         "own header (drop --columns)", lineno)
    # sacct's '|' unless a tab splits the row into the named columns (a '|' may sit inside a field)
    d = given or next((c for c in ("|", "\t") if len(first.split(c)) in (len(names), len(names) + 1)),
                      "\t" if "|" not in first and "\t" in first else "|")
    if d not in first and len(names) > 1:
        seems = guess_delimiter(first)
        raise InputError(path, f"--columns gives {len(names)} columns but the first line holds no delimiter "
                         f"{shown(d)}" + (f" (it seems to use {shown(seems)}: give --delimiter)" if seems else ""),
                         lineno)
    parts = first.split(d)
    trailing = len(parts) == len(names) + 1 and parts[-1].strip() == ""
    layout = Layout(names, d, trailing)
    low = [p.strip().lower().rstrip("+") for p in layout.split(first)]
    return layout, low == [n.lower() for n in names]
