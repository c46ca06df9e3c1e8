"""The controller's read-only status page (``/`` on the metrics listener): the pool, the queue, the jobs' progress,
and the utilisation of the harvested pool over time as a plot.

Plain HTML with an inline SVG drawn here: no JavaScript, no build step, nothing fetched from elsewhere (a site's
controller host often reaches no CDN), and a headless browser or ``curl`` shows the same. The page refreshes
itself every 30 s (a meta tag). Long tables are cut at ``MAX_ROWS`` rows, and the page says how many it left out.

The utilisation history is sampled by the metrics server every ``SAMPLE_S`` into a bounded ring
(``UtilisationHistory``): a controller that runs for months keeps its last ``HISTORY`` samples (12 h at 15 s),
in memory only (a restarted controller starts a new plot; Prometheus keeps the long history).
"""

from __future__ import annotations

import html
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpcsched.runtime.ops_snapshot import PoolSnapshot
from hpcsched.runtime.ops_tally import Totals

JobInfo = Any  # the generated ``pb.JobInfo`` (its stubs are generated at run time: no static type to name)
SAMPLE_S = 15.0
HISTORY = 2880
MAX_ROWS = 500
PLOT_W, PLOT_H, PAD = 720, 220, 48


@dataclass(frozen=True, slots=True)
class Sample:
    time: float
    used: int
    total: int
    workers: int
    pilots: int


def sample_of(pool: PoolSnapshot) -> Sample:
    live = pool.workers_by_state.get("alive", 0) + pool.workers_by_state.get("leaving", 0)
    return Sample(pool.time, pool.slots_used, pool.slots_total, live, pool.pilots_by_state.get("running", 0))


class UtilisationHistory:
    """The last ``size`` samples of the pool (thread-safe: the sampler adds, page requests read)."""

    def __init__(self, size: int = HISTORY) -> None:
        self._samples: deque[Sample] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, pool: PoolSnapshot) -> None:
        with self._lock:
            self._samples.append(sample_of(pool))

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)


def plot_svg(samples: Sequence[Sample]) -> str:
    """Slots in use and live slots over time, as an inline SVG (``id="utilisation-plot"``)."""
    w, h = PLOT_W, PLOT_H
    x0, x1, y0, y1 = PAD, w - 12, h - 32, 16
    if not samples:
        body = f'<text x="{w / 2}" y="{h / 2}" text-anchor="middle">no sample yet</text>'
        return _svg(w, h, body)
    pts = list(samples) if len(samples) > 1 else [samples[0], Sample(samples[0].time + 1, *_rest(samples[0]))]
    t0, t1 = pts[0].time, pts[-1].time
    top = max(1, max(s.total for s in pts))

    def xy(t: float, v: int) -> str:
        x = x0 + (t - t0) / max(t1 - t0, 1e-9) * (x1 - x0)
        return f"{x:.1f},{y0 - v / top * (y0 - y1):.1f}"

    def steps(value: str) -> str:
        """A sample holds until the next one (a step, not a slope the pool never had)."""
        out = []
        for i, s in enumerate(pts):
            if i:
                out.append(xy(s.time, getattr(pts[i - 1], value)))
            out.append(xy(s.time, getattr(s, value)))
        return " ".join(out)

    used, total = steps("used"), steps("total")
    area = f"{x0},{y0} {used} {x1},{y0}"
    last = pts[-1]
    share = f"{100 * last.used / last.total:.0f}%" if last.total else "no live slot"
    body = (
        f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="#f7f7f7" stroke="#999"/>'
        f'<polygon points="{area}" fill="#4c9be8" fill-opacity="0.55"/>'
        f'<polyline points="{used}" fill="none" stroke="#1f5fa8" stroke-width="2"/>'
        f'<polyline points="{total}" fill="none" stroke="#333" stroke-width="1.5" stroke-dasharray="5,3"/>'
        f'<text x="{x0 - 6}" y="{y1 + 10}" text-anchor="end" font-size="11">{top}</text>'
        f'<text x="{x0 - 6}" y="{y0}" text-anchor="end" font-size="11">0</text>'
        f'<text x="{x0}" y="{h - 14}" font-size="11">{_clock(t0)}</text>'
        f'<text x="{x1}" y="{h - 14}" text-anchor="end" font-size="11">{_clock(t1)}</text>'
        f'<text x="{(x0 + x1) / 2}" y="{h - 2}" text-anchor="middle" font-size="12">slots in use (blue) of live '
        f'slots (dashed), UTC; now {last.used}/{last.total} ({share})</text>')
    return _svg(w, h, body)


def _rest(s: Sample) -> tuple[int, int, int, int]:
    return s.used, s.total, s.workers, s.pilots


def _svg(w: int, h: int, body: str) -> str:
    return (f'<svg id="utilisation-plot" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
            f'viewBox="0 0 {w} {h}" role="img" aria-label="utilisation of the pool over time">{body}</svg>')


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


def _table(cls: str, headers: Sequence[str], rows: Sequence[Sequence[object]], total: int | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows[:MAX_ROWS])
    n = len(rows) if total is None else total
    more = f'<p class="more">{n - min(len(rows), MAX_ROWS):,} more not shown</p>' if n > MAX_ROWS else ""
    if not rows:
        body = f'<tr><td colspan="{len(headers)}">none</td></tr>'
    return f'<table class="{cls}"><tr>{head}</tr>{body}</table>{more}'


def _progress(j: JobInfo) -> str:
    if j.steps_total:
        return f"{j.steps_done}/{j.steps_total} ({100 * j.steps_done / j.steps_total:.0f}%)"
    return str(j.steps_done) if j.steps_done else "-"


def render(pool: PoolSnapshot, totals: Totals, jobs: Sequence[JobInfo], more_jobs: bool,
           samples: Sequence[Sample], title: str) -> str:
    """The page as HTML: ``jobs`` are the active jobs shown (``more_jobs``: there are others past them). The plot
    ends with ``pool`` itself: the page's own reading, so it is current however long ago the last sample was."""
    now = pool.time
    samples = [s for s in samples if s.time < pool.time] + [sample_of(pool)]
    counts = " · ".join(f"{s} {n}" for s, n in pool.workers_by_state.items())
    pilots = " · ".join(f"{s} {n}" for s, n in sorted(pool.pilots_by_state.items())) or "none"
    states = " · ".join(f"{s} {n:,}" for s, n in sorted(totals.jobs_by_state.items())) or "none"
    workers = _table("workers", ("worker", "state", "slots used", "GPUs", "pilot (job, node, state)", "host"),
                     [(w.id, w.state, f"{w.used}/{w.slots}", f"{w.gpus} {w.gpu_type}".strip(),
                       " ".join(w.pilot) if w.pilot else "-", w.host) for w in pool.workers])
    nodes = _table("nodes", ("node", "what it does for the controller, or why it is not used", "pilot job"),
                   [(n, use, job or "-") for n, (use, job) in pool.nodes.items()])
    job_rows = [(j.job_id, j.name, j.owner or "-", j.state, j.procs or j.target_procs, _progress(j),
                 f"{now - j.submit_time:.0f} s" if j.submit_time else "-", j.message[:120]) for j in jobs]
    job_table = _table("jobs", ("job", "name", "user", "state", "size", "progress", "age", "message"), job_rows)
    if more_jobs:
        job_table += f'<p class="more">more active jobs past these {len(jobs):,}: hpcsched jobs lists them all</p>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="30">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1em; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 2px 8px; text-align: left; }}
th {{ background: #eee; }}
.summary span {{ margin-right: 2em; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p class="summary"><span>as of {_clock(now)} UTC</span><span>node source: {html.escape(pool.source)}</span>
<span>slots in use: {pool.slots_used}/{pool.slots_total}</span></p>
<h2>Utilisation of the pool</h2>
{plot_svg(samples)}
<h2>Queue and jobs</h2>
<p>jobs: {html.escape(states)}; submitted {totals.submitted:,}; preemptions {totals.preemptions:,};
lost steps {totals.lost_steps:,}; harvested {totals.harvested_node_hours:,.2f} node-h</p>
{job_table}
<h2>Pool</h2>
<p>workers: {html.escape(counts)}; pilots: {html.escape(pilots)}</p>
{workers}
<h3>Nodes of the node source</h3>
{nodes}
</body></html>
"""
