"""A Prometheus-like scraper for the fleet harness (``bench_fleet.py --scrape-s S``): GETs the controller's
``/metrics`` every S seconds with its token while the fleet runs, and reads the controller's own account of what
the metrics listener cost it (``hpcsched_metrics_cpu_seconds_total``: each request's and sample's CPU time on its
own thread), so the figure is the listener's share of the controller's CPU, apart from the heartbeats'."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def _get(url: str, token: str) -> str:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()


def listener_cost(text: str) -> dict[str, float]:
    """``what`` -> CPU seconds, ``what_requests`` -> count, and the last collect's seconds, from a /metrics page."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "hpcsched_metrics_cpu_seconds_total":
                out[s.labels["what"]] = s.value
            elif s.name == "hpcsched_metrics_requests_total":
                out[s.labels["what"] + "_requests"] = s.value
            elif s.name == "hpcsched_metrics_collect_seconds":
                out["last_collect_s"] = s.value
    return out


class Scraper:
    """Scrapes every ``every_s`` from ``start()`` until ``stop()``; ``figures`` summarises (module docstring)."""

    def __init__(self, address_file: Path, token: str, every_s: float) -> None:
        self.url = f"http://{address_file.read_text().strip()}/metrics"
        self.token = token
        self.every_s = every_s
        self.wall_s: list[float] = []
        self.errors = 0
        self.last_cost: dict[str, float] = {}  # from the last scrape that answered
        self.final_read = "ok"
        self._task: asyncio.Task | None = None
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.time()
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            t = time.perf_counter()
            try:
                text = await asyncio.to_thread(_get, self.url, self.token)
                self.wall_s.append(time.perf_counter() - t)
                self.last_cost = listener_cost(text)
            except OSError:
                self.errors += 1
            await asyncio.sleep(max(0.0, self.every_s - (time.perf_counter() - t)))

    async def stop(self) -> dict:
        """Stops scraping and reads the listener's cost once more (this read's own CPU is not in it)."""
        if self._task is not None:
            self._task.cancel()
        try:
            cost = listener_cost(await asyncio.to_thread(_get, self.url, self.token))
        except OSError as e:  # an overloaded controller that does not answer: the last scrape's account, said so
            self.final_read = f"failed ({e}); figures from the last scrape that answered"
            cost = self.last_cost
        window = time.time() - self._t0
        scrapes = cost.get("metrics_requests", 0.0)
        cpu = cost.get("metrics", 0.0) + cost.get("sample", 0.0)
        per_scrape = cost.get("metrics", 0.0) / scrapes if scrapes else 0.0
        samples = cost.get("sample_requests", 0.0)
        per_sample = cost.get("sample", 0.0) / samples if samples else 0.0
        walls = sorted(self.wall_s)
        return {"every_s": self.every_s, "scrapes": int(scrapes), "errors": self.errors, "final_read": self.final_read,
                "scrape_wall_s_p50": round(walls[len(walls) // 2], 4) if walls else None,
                "scrape_wall_s_max": round(walls[-1], 4) if walls else None,
                "cpu_ms_per_scrape": round(1e3 * per_scrape, 2), "cpu_ms_per_sample": round(1e3 * per_sample, 2),
                "last_collect_s": round(cost.get("last_collect_s", 0.0), 4),
                "listener_cpu_s": round(cpu, 3), "window_s": round(window, 1),
                # the budget's terms: one scrape and one plot sample every 15 s
                "cpu_pct_of_core_at_15s": round(100 * (per_scrape + per_sample) / 15.0, 3)}
