"""What operators see, through the programs they use (issue 31): a real Prometheus server (Debian's ``prometheus``)
scrapes the controller's ``/metrics`` with a read-only token and answers queries on its HTTP API; headless
Chromium (Debian's ``chromium``) opens the status page: its DOM holds the job ids and states, its screenshot the
plot. Each skips, with the reason, where its program is missing (.ci/run installs both). Loopback only; every port
is picked free (port 0, or asked of the kernel for Prometheus, which cannot say the port it bound)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from runtime_procs import TOKEN, controller_config, write_secret

from hpcsched.runtime.auth import metadata, open_channel
from hpcsched.runtime.config import read_controller_config
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.server import ControllerServer

PROMETHEUS = shutil.which("prometheus")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
READONLY = "readonly-token-91c2"
ROOT = Path(__file__).resolve().parents[1]
SCRAPE_S = 1.0  # Prometheus' scrape interval here; every deadline below is a multiple of it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _populate(addr: str, token: str, workers: int = 3) -> list[str]:
    """Workers registered (they stay alive: worker_timeout_s is long) and three jobs submitted, as clients would."""
    stub = pb_grpc.ControllerStub(open_channel(addr, None))
    for k in range(workers):
        stub.Register(pb.RegisterRequest(worker_id=f"node-{k:02d}", host=f"host-{k}", slots=4, instance="i"),
                      metadata=metadata(token), timeout=30)
    return [stub.Submit(pb.SubmitRequest(spec_yaml=f"name: train-{i}\ncommand: [a.py]\nprocs: {p}\nsteps: 500\n",
                                         source=f"j{i}.yaml"), metadata=metadata(token), timeout=30).job_id
            for i, p in enumerate((2, 64, 1))]  # 64 procs never fits 12 slots: it stays pending


def _query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed (apt-get install prometheus)")
def test_a_prometheus_server_scrapes_the_controller(tmp_path: Path) -> None:
    write_secret(tmp_path / "ro.token", READONLY)
    srv = ControllerServer(read_controller_config(controller_config(
        tmp_path, worker_timeout_s=600, metrics_listen="127.0.0.1:0", readonly_token_file="ro.token")))
    addr = srv.start()
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    # the alert rules docs/runtime.md shows, evaluated by this server
    rules = re.search(r"\*\*Alerts\*\*.*?```yaml\n(.*?)```", (ROOT / "docs" / "runtime.md").read_text(), re.S)
    assert rules, "docs/runtime.md: no Alerts block"
    (prom_dir / "rules.yml").write_text(rules.group(1))
    (prom_dir / "prometheus.yml").write_text(
        f"global: {{scrape_interval: {SCRAPE_S:g}s, evaluation_interval: {SCRAPE_S:g}s}}\n"
        f"rule_files: [{prom_dir / 'rules.yml'}]\n"
        "scrape_configs:\n"
        "  - job_name: hpcsched\n"
        f"    authorization: {{credentials_file: {tmp_path / 'ro.token'}}}\n"
        f"    static_configs: [{{targets: ['{srv.ops.address}']}}]\n")
    port = _free_port()
    log = open(prom_dir / "log", "w")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={prom_dir / 'prometheus.yml'}",
                             f"--storage.tsdb.path={prom_dir / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        job_ids = _populate(addr, TOKEN)
        # Prometheus starts (a few s on a loaded machine), then scrapes every SCRAPE_S: 60 scrapes' time is ample
        deadline = time.monotonic() + 60 * SCRAPE_S + 30
        alive: list[dict] = []
        while time.monotonic() < deadline and prom.poll() is None:
            try:
                alive = _query(port, 'hpcsched_workers{state="alive"}')
                submitted = _query(port, "hpcsched_submitted_jobs_total")
                done = submitted and submitted[0]["value"][1] == str(len(job_ids))
                if alive and alive[0]["value"][1] == "3" and done:
                    break
            except OSError:  # not listening yet
                pass
            time.sleep(SCRAPE_S / 2)
        assert prom.poll() is None, (prom_dir / "log").read_text()[-3000:]
        assert alive and alive[0]["value"][1] == "3", (alive, (prom_dir / "log").read_text()[-2000:])
        up = _query(port, 'up{job="hpcsched"}')
        assert up[0]["value"][1] == "1"  # the scrape with the read-only token succeeded
        assert _query(port, 'hpcsched_jobs{state="pending"}')[0]["value"][1] in ("1", "2", "3")
        slots = _query(port, "sum(hpcsched_slots)")
        assert slots[0]["value"][1] == "12"
        decisions = _query(port, "hpcsched_decision_seconds_count")
        assert float(decisions[0]["value"][1]) >= 1
        p99 = _query(port, "histogram_quantile(0.99, hpcsched_decision_seconds_bucket)")
        assert 0 < float(p99[0]["value"][1]) <= 10
        families = _query(port, 'count by (__name__) ({__name__=~"hpcsched_.+"})')
        names = {r["metric"]["__name__"] for r in families}
        # (hpcsched_pilots has no series with node_source static: no pilot, no state to count)
        assert {"hpcsched_heartbeat_seconds_bucket", "hpcsched_preemptions_total", "hpcsched_lost_steps_total",
                "hpcsched_harvested_node_hours_total", "hpcsched_nonoptimal_decisions_total",
                "hpcsched_refused_heartbeats_total", "hpcsched_metrics_collect_seconds"} <= names, names
        # every query of the Grafana dashboard is valid PromQL here, and those on always-present series answer
        dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
        exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
        while time.monotonic() < deadline:  # rate() and increase() need two scrapes in their window
            if float(_query(port, 'count_over_time(up{job="hpcsched"}[1m])')[0]["value"][1]) >= 3:
                break
            time.sleep(SCRAPE_S / 2)
        empty = [e for e in exprs if not _query(port, e.replace("$job", "hpcsched").replace("$__range", "1m"))]
        # no series without pilots, nodes of a node source or a refusal: those alone may answer nothing
        assert all(re.search("hpcsched_(pilots|source_nodes|refused_requests)", e) for e in empty), empty
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=10) as r:
            groups = json.load(r)["data"]["groups"]
        health = {rule["name"]: rule["health"] for g in groups for rule in g["rules"]}
        assert len(health) == 3 and set(health.values()) == {"ok"}, health  # loaded and evaluated without error
    finally:
        os.killpg(prom.pid, 15)
        prom.wait(timeout=30)
        log.close()
        srv.stop()


def _chromium(profile: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # root in CI: Chromium refuses to run as root with its sandbox; --disable-gpu: no GPU on a CI runner; a profile
    # of its own: another Chromium on the machine holding the default one would make this one hand over and exit
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--hide-scrollbars", f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_the_status_page_in_headless_chromium(tmp_path: Path) -> None:
    """Chromium sends no Authorization header from its command line: this controller runs without tokens on
    loopback (the quick start); test_ops checks the page's authentication."""
    (tmp_path / "controller.yaml").write_text(
        "listen: 127.0.0.1:0\nstate: run/state.db\ncheckpoint_root: run/ckpt\nworker_timeout_s: 600\n"
        "metrics_listen: 127.0.0.1:0\n")
    srv = ControllerServer(read_controller_config(tmp_path / "controller.yaml"))
    addr = srv.start()
    try:
        job_ids = _populate(addr, "")
        url = f"http://{srv.ops.address}/"
        dom = _chromium(tmp_path / "chromium", "--dump-dom", url)
        assert dom.returncode == 0, dom.stderr[-2000:]
        for jid in job_ids:
            assert f"<td>{jid}</td>" in dom.stdout, jid
        assert "<td>pending</td>" in dom.stdout
        assert "<td>node-02</td>" in dom.stdout and "<td>alive</td>" in dom.stdout
        assert '<svg id="utilisation-plot"' in dom.stdout and "<polyline" in dom.stdout
        shot = tmp_path / "page.png"
        run = _chromium(tmp_path / "chromium", f"--screenshot={shot}", "--window-size=1000,900", url)
        assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
        from PIL import Image

        img = Image.open(shot).convert("RGB")
        colours = img.getcolors(maxcolors=1 << 20) or []
        assert len(colours) > 20  # text, tables, the plot: not a blank page
        # the plot's live-slots frame and its blue line: pixels of the line's colour (#1f5fa8) or the fill's
        blue = sum(n for n, (r, g, b) in colours if b > 150 and r < 120 and b - r > 80)
        assert blue > 200, f"no plot drawn: {blue} blue pixels"
    finally:
        srv.stop()
