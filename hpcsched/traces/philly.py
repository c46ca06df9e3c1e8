"""Philly (Microsoft, ATC'19) DL job traces in the three layouts they circulate in.

``philly`` -- the CSV published with Sia (SOSP'23): ``timestamp,duration,num_gpus,gpu_time,cluster``.
``timestamp`` is the submit time as a naive datetime (read as UTC -> epoch seconds, like every naive
datetime in hpcsched), ``duration`` seconds, ``num_gpus`` GPUs, ``cluster`` the virtual cluster
(kept as ``queue``). Rows are not sorted by submit (counted as ``unsorted_submit``) and carry no job
id: a job's id is its data row number (1 = first job), stable for a given file. ``gpu_time`` is
duration x GPUs and only checked. (No fill rule is applied to this reader.)

``tiresias`` -- the Tiresias simulator's CSV (SymbioticLab/Tiresias), the layout Muri later extended:
``job_id,num_gpu,submit_time,iterations,model_name,duration,interval`` in SECONDS (Muri's traces are in
milliseconds and carry batch_size / iteration_time / resource_time_*, which is how the two are told
apart). Other columns (Tiresias' ``tf_job.csv`` has start_time, model_size, ...) are ignored.

``philly-joblog`` -- the raw ``cluster_job_log`` of msr-fiddle/philly-traces: a JSON array with one
object per job (``jobid``, ``vc``, ``user``, ``status`` Pass/Killed/Failed, ``submitted_time`` and
``attempts``, each with ``start_time``, ``end_time`` and ``detail`` = [{``ip``, ``gpus``: [...]}]).
Read in blocks, object by object (also JSON Lines), so memory does not grow with the file. A job's GPUs
are those of its first attempt that lists any (jobs whose attempts differ are counted in
``meta['attempts']``); its run time is the length of the union of its attempts (attempts overlap in the
log); start = first attempt start, end = last attempt end. Jobs that never ran (no attempt with both
times) are skipped and counted in ``meta['skipped']``; a last attempt without an end (still running at
the snapshot) is counted as ``censored``. Auto-detection reads the first lines, so a log that is one
line longer than 16 MB needs ``--format philly-joblog``.

What the Tiresias and raw layouts lack (model for the raw log; stage profiles for both; iterations for
the raw log) is filled by the seeded rule of ``hpcsched.traces.synth`` (``DLFill``; reader option
``seed``, default 0), each filled value counted in ``meta['filled']``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hpcsched.errors import InputError
from hpcsched.model import Job, JobStatus
from hpcsched.traces.base import (
    CENSORED,
    MALFORMED_ROW,
    UNKNOWN_FIELD,
    TraceFormat,
    TraceReport,
    count_field,
    csv_header_is,
    csv_records,
)

COLUMNS = ("timestamp", "duration", "num_gpus")


def _read(path: Path, report: TraceReport) -> Iterator[Job]:
    report.meta["time_base"] = "epoch"
    report.convert("timestamp (naive datetime, read as UTC) -> submit epoch s; id = data row number")
    row_no = 0
    for lineno, row in csv_records(path, COLUMNS, report, what="Philly CSV"):
        row_no += 1
        try:
            submit = datetime.fromisoformat(row["timestamp"].strip()).replace(tzinfo=UTC).timestamp()
            duration = float(row["duration"])
            gpus = count_field(row["num_gpus"], "num_gpus")
        except ValueError as e:
            report.anomaly(MALFORMED_ROW, lineno, str(e))
            continue
        if not math.isfinite(duration):
            report.anomaly(MALFORMED_ROW, lineno, "duration is not finite")
            continue
        yield Job(
            id=str(row_no),
            submit=submit,
            gpus=gpus,
            duration=duration,
            status=JobStatus.COMPLETED,
            queue=(row.get("cluster") or "").strip() or None,
            extra={"line": lineno},
        )


FORMAT = TraceFormat("philly", "jobs", "Philly-derived DL jobs CSV (Sia artifacts)",
                     lambda lines: csv_header_is(lines, *COLUMNS), _read)


# ------------------------------------------------------------------------------------------------------------
# Tiresias-style CSV (SymbioticLab/Tiresias simulator input, the layout Muri extended): SECONDS, not ms.

TIRESIAS_COLUMNS = ("job_id", "num_gpu", "submit_time", "duration")
_MURI_MARKS = ("batch_size", "resource_time_0", "iteration_time")


def sniff_tiresias(first_lines: list[str]) -> bool:
    """Tiresias' header (job_id, num_gpu, submit_time, duration, ...) without Muri's ms-trace columns.

    Muri's traces carry batch_size / iteration_time / resource_time_*, Tiresias' do not; the two differ in
    units (ms vs s), so this sniffer runs before Muri's.
    """
    line = next((s for s in first_lines if s.strip()), "")
    cols = {c.strip().strip('"') for c in line.split(",")}
    return set(TIRESIAS_COLUMNS) <= cols and not cols & set(_MURI_MARKS)


def _finite(text: str, name: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{name}: not a finite number: {text!r}")
    return v


def _read_tiresias(path: Path, report: TraceReport) -> Iterator[Job]:
    from hpcsched.traces.synth import DLFill

    report.meta["time_base"] = "relative"
    report.convert("Tiresias CSV: submit_time and duration in seconds (relative), num_gpu -> gpus")
    fill = DLFill(report)
    for lineno, row in csv_records(path, TIRESIAS_COLUMNS, report, what="Tiresias CSV"):
        try:
            jid = row["job_id"].strip()
            submit = _finite(row["submit_time"], "submit_time")
            duration = _finite(row["duration"], "duration")
            gpus = count_field(row["num_gpu"], "num_gpu")
            iters_text = (row.get("iterations") or "").strip()
            iterations = count_field(iters_text, "iterations") if iters_text else None
        except ValueError as e:
            report.anomaly(MALFORMED_ROW, lineno, str(e))
            continue
        f = fill(jid, duration, (row.get("model_name") or "").strip() or None, iterations or None)
        yield Job(id=jid, submit=submit, gpus=gpus, duration=duration, iterations=f.iterations,
                  iteration_time=f.iteration_time, profile=f.profile, model=f.model, status=JobStatus.COMPLETED,
                  extra={"line": lineno})


TIRESIAS_FORMAT = TraceFormat("tiresias", "jobs", "Tiresias-style DL job CSV (seconds; Philly-derived)",
                              sniff_tiresias, _read_tiresias)


# ------------------------------------------------------------------------------------------------------------
# The raw Philly job log (msr-fiddle/philly-traces ``cluster_job_log``): JSON, one object per job.

JOBLOG_STATUS = {"pass": JobStatus.COMPLETED, "killed": JobStatus.CANCELLED, "failed": JobStatus.FAILED}
_BLOCK = 1 << 20
_MAX_OBJECT = 16 << 20  # a longer job object is damage, not a job


def sniff_joblog(first_lines: list[str]) -> bool:
    """A JSON array / stream of objects whose first keys include Philly's ``jobid`` and ``attempts`` or times."""
    head = "\n".join(first_lines).lstrip()
    return head[:1] in ("[", "{") and '"jobid"' in head and ('"attempts"' in head or '"submitted_time"' in head)


def _text_blocks(path: Path) -> Iterator[str]:
    """Decoded text of the file in blocks (gzip read transparently); every read error is one InputError.

    The raw log can be one huge line, so this does not go through line-based reading.
    """
    import codecs
    import gzip
    import zlib

    if not path.exists():
        raise InputError(path, "no such file")
    if path.is_dir():
        raise InputError(path, "is a directory, expected a trace file")
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        with path.open("rb") as probe:
            gz = probe.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gz else path.open("rb")) as f:
            while True:
                block = f.read(_BLOCK)
                if not block:
                    break
                if b"\x00" in block:
                    raise InputError(path, "binary data (NUL byte): not a JSON job log")
                yield decoder.decode(block)
            yield decoder.decode(b"", final=True)
    except InputError:
        raise
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise InputError(path, f"corrupt or truncated gzip ({e})") from None
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror or e}") from None


def json_objects(path: Path, report: TraceReport) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, object) for each top-level JSON object of a file: a JSON array of objects, or objects one after
    another (JSON Lines), in blocks, so the memory is one object, not the file.

    An object that does not parse is counted as malformed (at its first line) and reading resumes at the
    next ``{`` that starts a line, so one damaged job costs one job.
    """
    decoder = json.JSONDecoder()
    blocks = _text_blocks(path)
    buf, pos, eof = "", 0, False
    line, line_pos = 1, 0  # the line number at buf[line_pos]
    seen_open = False

    def more() -> bool:
        nonlocal buf, pos, line, line_pos, eof
        if eof:
            return False
        try:
            nxt = next(blocks)
        except StopIteration:
            eof = True
            return False
        if pos > _BLOCK:  # drop what is consumed, keeping the line count exact
            line += buf.count("\n", line_pos, pos)
            buf, line_pos, pos = buf[pos:], 0, 0
        buf += nxt
        return True

    def skip_to_next_line_object() -> None:
        nonlocal pos
        i = buf.find("\n", pos)
        while True:
            if i < 0:
                pos = len(buf)
                if not more():
                    return
                i = buf.find("\n", pos)
                continue
            j = i + 1
            while j < len(buf) and buf[j] in " \t\r":
                j += 1
            if j == len(buf):  # the next line starts in the next block
                pos = i
                if not more():
                    pos = len(buf)
                    return
                i = buf.find("\n", pos)
                continue
            if buf[j] == "{":
                pos = j
                return
            i = buf.find("\n", j)

    while True:
        while pos < len(buf) and buf[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(buf):
            if not more():
                break
            continue
        line += buf.count("\n", line_pos, pos)
        line_pos = pos
        ch = buf[pos]
        if ch == "[" and not seen_open:
            seen_open = True
            pos += 1
            continue
        if ch == "]":
            pos += 1
            continue
        if ch != "{":
            report.anomaly(MALFORMED_ROW, line, f"expected a job object, found {buf[pos:pos + 20]!r}")
            skip_to_next_line_object()
            continue
        while True:
            try:
                obj, end = decoder.raw_decode(buf, pos)
                break
            except json.JSONDecodeError as e:
                incomplete = e.pos >= len(buf) - 16 or e.msg.startswith("Unterminated string")
                if incomplete and len(buf) - pos < _MAX_OBJECT and more():
                    continue
                obj, end = None, -1
                detail = f"job object does not parse ({e.msg})"
                break
            except (ValueError, RecursionError) as e:  # too many digits, nesting too deep
                obj, end, detail = None, -1, f"job object does not parse ({type(e).__name__}: {str(e)[:80]})"
                break
        if obj is None:
            report.anomaly(MALFORMED_ROW, line, detail)
            skip_to_next_line_object()
            continue
        pos = end
        if not isinstance(obj, dict):
            report.anomaly(MALFORMED_ROW, line, "not a JSON object")
            continue
        yield line, obj


def _when(value: object) -> float | None:
    """A Philly time ('2017-10-07 01:12:09', naive: read as UTC) -> epoch s; None, null, '' and 'None' -> None."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"not a time: {value!r}")
    text = value.strip()
    if text in ("", "None", "null"):
        return None
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def _attempt_gpus(attempt: dict[str, Any]) -> tuple[int, int]:
    """(GPUs, machines) of one attempt's ``detail``."""
    detail = attempt.get("detail") or []
    if not isinstance(detail, list):
        raise ValueError("attempt detail is not a list")
    gpus = 0
    for machine in detail:
        if not isinstance(machine, dict) or not isinstance(machine.get("gpus") or [], list):
            raise ValueError("attempt detail entry is not {ip, gpus: [...]}")
        gpus += len(machine.get("gpus") or [])
    return gpus, len(detail)


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total


def _read_joblog(path: Path, report: TraceReport) -> Iterator[Job]:
    from hpcsched.traces.synth import DLFill

    report.meta["time_base"] = "epoch"
    report.convert("Philly job log: submitted_time and attempt times (naive, read as UTC) -> epoch s")
    report.convert("gpus = GPUs listed in the first attempt's detail; start = first attempt start, end = last "
                   "attempt end; duration = length of the union of attempts that have both times (time it held GPUs)")
    report.convert("a job with no attempt that has both times never ran: skipped, counted in meta 'skipped'")
    skipped: dict[str, int] = report.meta.setdefault("skipped", {"no_attempts": 0, "no_run_time": 0})
    odd: dict[str, int] = report.meta.setdefault("attempts", {"gpus_differ": 0, "missing_times": 0, "overlapping": 0})
    fill = DLFill(report)
    for lineno, obj in json_objects(path, report):
        try:
            jid = obj.get("jobid")
            if not isinstance(jid, str) or not jid.strip():
                raise ValueError("no jobid")
            submit = _when(obj.get("submitted_time"))
            if submit is None:
                raise ValueError("no submitted_time")
            attempts = obj.get("attempts") or []
            if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
                raise ValueError("attempts is not a list of objects")
            sizes = [_attempt_gpus(a) for a in attempts]
            spans: list[tuple[float, float]] = []
            missing = 0
            starts: list[float] = []
            for a in attempts:
                s, e = _when(a.get("start_time")), _when(a.get("end_time"))
                if s is not None:
                    starts.append(s)
                if s is None or e is None:
                    missing += 1
                elif e >= s:
                    spans.append((s, e))
            last_end = _when(attempts[-1].get("end_time")) if attempts else None
        except (ValueError, TypeError, OverflowError) as e:
            report.anomaly(MALFORMED_ROW, lineno, str(e))
            continue
        if not attempts:
            skipped["no_attempts"] += 1
            continue
        if not spans:
            skipped["no_run_time"] += 1
            continue
        if missing:
            odd["missing_times"] += 1
            report.anomaly(UNKNOWN_FIELD, lineno, "attempt start_time/end_time")
        if attempts[-1].get("end_time") in (None, "None", ""):
            report.anomaly(CENSORED, lineno, "still running when the log was taken: run time is a lower bound")
        with_gpus = [g for g, _ in sizes if g > 0]
        if len(set(with_gpus)) > 1:
            odd["gpus_differ"] += 1
        if len(spans) > 1 and _union_length(spans) < sum(e - s for s, e in spans):
            odd["overlapping"] += 1
        gpus = with_gpus[0] if with_gpus else 0
        machines = next((m for g, m in sizes if g > 0), 0)
        duration = _union_length(spans)
        status = JOBLOG_STATUS.get(str(obj.get("status", "")).strip().lower(), JobStatus.UNKNOWN)
        f = fill(jid.strip(), duration)
        yield Job(id=jid.strip(), submit=submit, gpus=gpus, duration=duration,
                  start=min(starts) if starts else None, end=last_end,
                  iterations=f.iterations, iteration_time=f.iteration_time, profile=f.profile, model=f.model,
                  status=status, user=str(obj.get("user") or "") or None, queue=str(obj.get("vc") or "") or None,
                  extra={"line": lineno, "attempts": len(attempts), "machines": machines})


JOBLOG_FORMAT = TraceFormat("philly-joblog", "jobs", "Philly raw job log JSON (msr-fiddle/philly-traces "
                            "cluster_job_log)", sniff_joblog, _read_joblog)
