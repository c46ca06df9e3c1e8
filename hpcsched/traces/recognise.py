"""Files no reader takes but whose kind is plain from their first lines: the error then says what they are.

"unrecognised trace format" sends a site operator guessing; a log recognised as, say, LSF's ``lsb.events``
or sacct's JSON gets its name and what to do instead (which related format is read, or which option).
"""

from __future__ import annotations

import re

# A sacct -n row: a job id (123, 123_4, 123_[1-9], 123+0, 123.batch) and an ISO date-time among its fields.
_SACCT_ROW_ID = re.compile(r"\s*\d+(?:_(?:\d+|\[[\d\-,%:]+\]))?(?:\+\d+)?(?:\.[\w-]+)?\s*$")
_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def _headerless_sacct(lines: list[str]) -> str | None:
    rows = [s for s in lines if s.strip()][:5]
    for d, name in (("|", "'|'"), ("\t", "tab")):
        if rows and all(d in r and _SACCT_ROW_ID.fullmatch(r.split(d, 1)[0]) and _ISO.search(r) for r in rows):
            hint = "" if d == "|" else " --delimiter tab"
            return (f"looks like sacct output without its header line (sacct -n/--noheader, {name}-delimited): "
                    f"name its columns, e.g. --format slurm-sacct{hint} --columns xdmod (Open XDMoD's archive "
                    "layout) or --columns with the sacct --format list it was made with")
    return None


def _first_words(lines: list[str]) -> list[str]:
    return [s.strip() for s in lines if s.strip()][:5]


def recognised_unsupported(lines: list[str]) -> str | None:
    """What the file is and what to do instead, for a kind hpcsched recognises but does not read; else None."""
    if (msg := _headerless_sacct(lines)) is not None:
        return msg
    first = _first_words(lines)
    if not first:
        return None
    head = first[0]
    if re.match(r'"(JOB_NEW|JOB_START|JOB_STATUS|JOB_SIGNAL|MBD_START|JOB_MODIFY2?)"\s', head):
        return ("looks like LSF's lsb.events (scheduler event stream): not supported; LSF's accounting file "
                "lsb.acct (JOB_FINISH records) is: --format lsf-acct")
    if head.startswith(("{", "[")) and re.search(r'"(jobs|job_id|meta)"\s*:', " ".join(first)) and \
            re.search(r'"(slurm|job_id|association)"', " ".join(lines[:40])):
        return ("looks like sacct --json / slurmrestd output: not supported; export the same jobs with "
                "sacct -P --format=... (hpcsched reads every -p/-P/--delimiter layout)")
    if re.match(r"(ClusterId|GlobalJobId|ProcId|Owner|JobStatus)\s*=", head):
        return "looks like HTCondor history (ClassAds): not supported; convert it to SWF first"
    if head.startswith("---") and any(s.lstrip().startswith(("jobs:", "- job_id:", "account:")) for s in first):
        return "looks like sacct --yaml output: not supported; export the same jobs with sacct -P --format=..."
    return None
