"""Issue 25's "done when", checked against one fleet run's figures (``fleet.run_fleet``): what ``bench_fleet.py``
prints last and writes as ``done_when`` in its JSON, so the final figures come from one command.

Each goal: what it asks, the target, what was measured, and whether it was met (None: not measurable by this run,
with why). The CPU goal compares two runs at the same job churn: the run given as ``baseline`` (e.g. 1,000
workers) against this one (e.g. 10,000): within 2x, per second of the churn (first submit to the end of the
run, ``churn_cpu_pct``), where the goal's "per second ... at the same job churn" is; the registration storm before
it is paid once per fleet start and is 10x larger at 10x the workers, so the whole-run ratio, storm included, is
said beside it (and used for a baseline from before the split). "While slots are free": submit -> launch is
measured over the runnable jobs (``--jobs``), which the fleet has room for unless the run is sized otherwise; a run
where some never launched says so.
"""

from __future__ import annotations

REGISTER_S = 30.0
HEARTBEAT_P99_MS = 250.0
LAUNCH_P99_MS = 5000.0
DECISION_P99_MS = 1000.0
RSS_MB = 2048.0
CPU_RATIO = 2.0
ALL_DONE_S = 120.0  # Theta: 4,392 workers and 2,000 short jobs, every job completed within 2 minutes


def _goal(what: str, target: str, measured: object, met: bool | None, note: str = "") -> dict:
    if isinstance(measured, float):
        measured = round(measured, 1)
    return {"goal": what, "target": target, "measured": measured, "met": met, **({"note": note} if note else {})}


def goals(r: dict, baseline: dict | None = None) -> list[dict]:
    """The goals for run ``r`` (and its CPU against ``baseline``, a run's JSON at another fleet size)."""
    reg, hb, s2l, ja, ctl = r["registration"], r["heartbeat"], r["submit_to_launch"], r["jobs_after"], r["controller"]
    step = ctl.get("rpc_handler", {}).get("scheduling_step", {})
    out = [
        _goal("every worker registered within 30 s of starting", f"<= {REGISTER_S:g} s", reg["all_registered_s"],
              reg["all_registered_s"] is not None and reg["all_registered_s"] <= REGISTER_S),
        _goal("no re-registration", "0", reg["reregistrations"], reg["reregistrations"] == 0),
        _goal("heartbeat p99 (client side, after registration)", f"< {HEARTBEAT_P99_MS:g} ms", hb.get("p99_ms"),
              hb.get("p99_ms") is not None and hb["p99_ms"] < HEARTBEAT_P99_MS),
        _goal("submit -> launch order p99 (runnable jobs)", f"< {LAUNCH_P99_MS:g} ms", s2l.get("p99_ms"),
              s2l.get("p99_ms") is not None and s2l["p99_ms"] < LAUNCH_P99_MS and not s2l["never_launched"],
              f"{s2l['never_launched']} never launched" if s2l["never_launched"] else ""),
        _goal("a decision's p99 (scheduling steps that planned)", f"< {DECISION_P99_MS:g} ms", step.get("p99_ms"),
              None if not step else step["p99_ms"] < DECISION_P99_MS,
              "" if step else "the controller wrote no scheduling_step figure"),
        _goal("controller peak RSS", f"< {RSS_MB:g} MB", ctl["peak_rss_mb"], ctl["peak_rss_mb"] < RSS_MB),
    ]
    if baseline is None:
        out.append(_goal("controller CPU per second of churn flat (within 2x) from 1,000 to 10,000 workers",
                         f"<= {CPU_RATIO:g}x", None, None, "give --baseline RUN.json (the other fleet size)"))
    else:
        bctl = baseline["controller"]
        whole = _ratio(bctl["cpu_pct"], ctl["cpu_pct"])
        split = "churn_cpu_pct" in bctl and "churn_cpu_pct" in ctl
        key = "churn_cpu_pct" if split else "cpu_pct"
        base, here = bctl[key], ctl[key]
        ratio = _ratio(base, here)
        notes = [] if baseline["options"]["jobs"] == r["options"]["jobs"] else ["not the same job churn"]
        notes.append(f"whole run, registration storm included: {bctl['cpu_pct']}% vs {ctl['cpu_pct']}%, {whole}x"
                     if split else "the baseline has no churn-phase figure: whole runs, storm included")
        out.append(_goal(f"controller CPU per second of churn flat (within 2x): {baseline['workers']} workers "
                         f"{base}% vs {r['workers']} workers {here}% of a core", f"<= {CPU_RATIO:g}x", ratio,
                         ratio is not None and ratio <= CPU_RATIO, "; ".join(notes)))
    jobs, last = r["submit"]["jobs"], ja["last_done_s"]
    out.append(_goal(f"every one of the {jobs} jobs completed within {ALL_DONE_S:g} s of the first submit",
                     f"<= {ALL_DONE_S:g} s", last,
                     ja["harness_saw_done"] == jobs and last is not None and last <= ALL_DONE_S,
                     f"{ja['harness_saw_done']} of {jobs} seen done" if ja["harness_saw_done"] != jobs else ""))
    return out


def _ratio(a: float, b: float) -> float | None:
    lo, hi = sorted((a, b))
    return round(hi / lo, 2) if lo > 0 else None


def table(gs: list[dict]) -> str:
    """The goals as lines: MET / NOT MET / n/a, the goal, measured against target."""
    lines = ["issue 25, done when:"]
    for g in gs:
        mark = "n/a    " if g["met"] is None else "MET    " if g["met"] else "NOT MET"
        lines.append(f"  {mark} {g['goal']}: {g['measured']} (target {g['target']})"
                     + (f"; {g['note']}" if g.get("note") else ""))
    return "\n".join(lines)
