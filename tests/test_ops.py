"""What operators see (issue 31): ``metrics_listen`` serves ``/metrics`` and the status page under the API's
authentication (a read-only role), the totals over the state agree with ``hpcsched calc``'s, and the latency
histograms keep the server's timings. Real controller, real gRPC and HTTP on loopback port 0."""

from __future__ import annotations

import base64
import json
import re
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from runtime_procs import TOKEN, controller_config, start_controller, stop, write_secret

from hpcsched.errors import InputError
from hpcsched.metrics.pilots import pilot_metrics
from hpcsched.runtime.auth import metadata, open_channel
from hpcsched.runtime.config import ControllerConfig, read_controller_config
from hpcsched.runtime.credentials import credential_metadata
from hpcsched.runtime.node_source import SourceView
from hpcsched.runtime.ops_metrics import BUCKETS_S, histogram_buckets
from hpcsched.runtime.ops_snapshot import LOCK_WAIT_S
from hpcsched.runtime.ops_tally import StateTally
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.server import ControllerServer, RpcTimings
from hpcsched.runtime.store import Store

ROOT = Path(__file__).resolve().parents[1]
READONLY, WORKER = "readonly-token-91c2", "worker-token-5d0e"
JOB = "name: train\ncommand: [a.py]\nprocs: 2\nsteps: 1000\n"


def _get(url: str, token: str | None = None, headers: dict[str, str] | None = None,
         context: ssl.SSLContext | None = None) -> tuple[int, str, dict[str, str]]:
    req = urllib.request.Request(url, headers=headers or ({"Authorization": f"Bearer {token}"} if token else {}))
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page: (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture
def ops(tmp_path: Path):
    """A controller with tokens per role (user, worker, readonly) and its metrics listener on port 0."""
    write_secret(tmp_path / "ro.token", READONLY)
    write_secret(tmp_path / "worker.token", WORKER)
    cfg = read_controller_config(controller_config(
        tmp_path, worker_timeout_s=600, metrics_listen="127.0.0.1:0", metrics_address_file="run/metrics.addr",
        readonly_token_file="ro.token", worker_token_file="worker.token"))
    srv = ControllerServer(cfg)
    addr = srv.start()
    metrics_addr = (tmp_path / "run" / "metrics.addr").read_text().strip()
    yield srv, addr, f"http://{metrics_addr}"
    srv.stop()


def test_metrics_and_page_need_a_reading_token(ops) -> None:
    srv, addr, url = ops
    stub = pb_grpc.ControllerStub(open_channel(addr, None))
    for k in range(3):
        stub.Register(pb.RegisterRequest(worker_id=f"n{k}", host="h", slots=4, instance="i"),
                      metadata=metadata(WORKER), timeout=30)
    job_id = stub.Submit(pb.SubmitRequest(spec_yaml=JOB, source="j.yaml"), metadata=metadata(TOKEN), timeout=30).job_id

    for path in ("/metrics", "/"):
        status, body, headers = _get(url + path)
        assert status == 401 and "Bearer" in headers.get("WWW-Authenticate", ""), (path, status, body)
        assert _get(f"{url}{path}?token={READONLY}")[0] == 401  # a token in the URL would end up in logs
        assert _get(url + path, "not-a-token")[0] == 401
        assert _get(url + path, WORKER)[0] == 403  # a worker's token reads nothing
        for token in (READONLY, TOKEN):
            assert _get(url + path, token)[0] == 200, (path, token)
    assert _get(url + "/nope", READONLY)[0] == 404
    # what a browser sends by itself: Basic, the token as the password (any user name)
    basic = {"Authorization": "Basic " + base64.b64encode(f"ops:{READONLY}".encode()).decode()}
    assert _get(url + "/", headers=basic)[0] == 200
    assert "Basic" in _get(url + "/")[2]["WWW-Authenticate"]  # so a browser asks for it
    worker_basic = {"Authorization": "Basic " + base64.b64encode(f"ops:{WORKER}".encode()).decode()}
    assert _get(url + "/", headers=worker_basic)[0] == 403
    assert _get(url + "/", headers={"Authorization": "Basic !!notbase64"})[0] == 401

    status, text, headers = _get(url + "/metrics", READONLY)
    assert headers["Content-Type"].startswith("text/plain; version=")
    got = samples(text)
    assert got["hpcsched_workers", (("state", "alive"),)] == 3
    assert got["hpcsched_jobs", (("state", "pending"),)] + got["hpcsched_jobs", (("state", "running"),)] == 1
    assert got["hpcsched_slots", (("kind", "free"),)] + got["hpcsched_slots", (("kind", "used"),)] == 12
    assert got["hpcsched_submitted_jobs_total", ()] == 1
    assert got["hpcsched_heartbeat_seconds_count", ()] == 0  # registered, never beat
    assert got["hpcsched_decision_seconds_count", ()] >= 1  # the submit woke a scheduling step that planned
    for name in ("hpcsched_preemptions_total", "hpcsched_lost_steps_total", "hpcsched_harvested_node_hours_total",
                 "hpcsched_nonoptimal_decisions_total", "hpcsched_refused_heartbeats_total",
                 "hpcsched_shrunk_to_fit_total", "hpcsched_grows_waited_total"):
        assert got[name, ()] == 0, name

    status, page, _ = _get(url + "/", READONLY)
    assert job_id in page and "pending" in page and 'id="utilisation-plot"' in page and "n2" in page

    # the listener counts its own cost: the scrapes and the page above, the sampler's first sample
    got = samples(_get(url + "/metrics", READONLY)[1])
    assert got["hpcsched_metrics_requests_total", (("what", "metrics"),)] >= 7  # refused requests included
    assert got["hpcsched_metrics_requests_total", (("what", "page"),)] >= 7
    assert got["hpcsched_metrics_requests_total", (("what", "sample"),)] >= 1
    assert got["hpcsched_metrics_cpu_seconds_total", (("what", "metrics"),)] > 0

    # every series the dashboard plots is one this endpoint exports
    families = {f.name for f in text_string_to_metric_families(_get(url + "/metrics", READONLY)[1])}
    dashboard = (ROOT / "docs" / "grafana-dashboard.json").read_text()
    plotted = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in re.findall(r"hpcsched_[a-z_]+", dashboard)}
    assert len(plotted) >= 15 and plotted <= families, plotted - families

    # the read-only role on the API: lists, never submits
    stub.ListJobs(pb.ListJobsRequest(), metadata=metadata(READONLY), timeout=30)
    with pytest.raises(grpc.RpcError) as e:
        stub.Submit(pb.SubmitRequest(spec_yaml=JOB, source="j.yaml"), metadata=metadata(READONLY), timeout=30)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_refused_submit_is_counted_by_reason(tmp_path: Path) -> None:
    srv = ControllerServer(read_controller_config(controller_config(
        tmp_path, metrics_listen="127.0.0.1:0", max_pending_per_user=1)))
    addr = srv.start()
    try:
        stub, md = pb_grpc.ControllerStub(open_channel(addr, None)), metadata(TOKEN)
        stub.Submit(pb.SubmitRequest(spec_yaml=JOB, source="a.yaml"), metadata=md, timeout=30)
        with pytest.raises(grpc.RpcError) as e:
            stub.Submit(pb.SubmitRequest(spec_yaml=JOB, source="b.yaml"), metadata=md, timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        reply = stub.SubmitMany(pb.SubmitManyRequest(jobs=[pb.SubmitRequest(spec_yaml=JOB, source="c.yaml")] * 2),
                                metadata=md, timeout=30)
        assert all(r.error for r in reply.results)
        got = samples(_get(f"http://{srv.ops.address}/metrics", TOKEN)[1])
        assert got["hpcsched_refused_requests_total", (("method", "Submit"), ("reason", "quota"))] == 1
        assert got["hpcsched_refused_requests_total", (("method", "SubmitMany"), ("reason", "quota"))] == 2
    finally:
        srv.stop()


@pytest.mark.parametrize("lease_server", [True, False])
def test_liveness_at_scale_is_exported(tmp_path: Path, lease_server: bool) -> None:
    """The lease server's state, registrations committed in groups and shed calls, as /metrics series."""
    srv = ControllerServer(read_controller_config(controller_config(
        tmp_path, metrics_listen="127.0.0.1:0", worker_timeout_s=600, lease_server=str(lease_server).lower())))
    addr = srv.start()
    try:
        url = f"http://{srv.ops.address}/metrics"
        if lease_server:  # its own process: it says its port once it listens (then registrations get slots)
            deadline = time.time() + 60
            while not samples(_get(url, TOKEN)[1])["hpcsched_lease_server_up", ()] or not srv.leases.port:
                assert time.time() < deadline, "the lease server did not come up"
                time.sleep(0.1)
        stub = pb_grpc.ControllerStub(open_channel(addr, None))
        for k in range(3):
            stub.Register(pb.RegisterRequest(worker_id=f"n{k}", host="h", slots=4, instance="i"),
                          metadata=metadata(TOKEN), timeout=30)
        got = samples(_get(url, TOKEN)[1])
        assert got["hpcsched_lease_server_up", ()] == int(lease_server)
        assert got["hpcsched_lease_slots_used", ()] == (3 if lease_server else 0)
        assert got["hpcsched_registrations_total", ()] == 3
        assert 1 <= got["hpcsched_register_groups_total", ()] <= 3
        for kind in ("heartbeat", "register", "other"):
            assert got["hpcsched_shed_calls_total", (("kind", kind),)] == 0
        for name in ("hpcsched_lease_renewals_total", "hpcsched_lease_refused_total",
                     "hpcsched_lease_table_full_total", "hpcsched_lease_server_exits_total",
                     "hpcsched_orders_events_total", "hpcsched_lease_only_heartbeats_total",
                     "hpcsched_lease_pushes_total", "hpcsched_lease_subscriptions_total",
                     "hpcsched_lease_push_unsubscribed_total", "hpcsched_lease_wakeups_dropped_total"):
            assert got[name, ()] == 0, name
        assert got["hpcsched_orders_watching", ()] == got["hpcsched_lease_subscribed", ()] == 0
        if lease_server:  # it dies: said at once, and counted
            srv.leases.process.proc.kill()
            srv.leases.process.proc.wait(timeout=30)
            got = samples(_get(url, TOKEN)[1])
            assert (got["hpcsched_lease_server_up", ()], got["hpcsched_lease_server_exits_total", ()]) == (0, 1)
    finally:
        srv.stop()


def test_metrics_listen_is_checked_with_the_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"controller\.yaml:\d+: metrics_listen: expected HOST:PORT"):
        read_controller_config(controller_config(tmp_path, metrics_listen="localhost"))
    p = controller_config(tmp_path)
    write_secret(tmp_path / "ro.token", READONLY)
    p.write_text("listen: 127.0.0.1:0\nreadonly_token_file: ro.token\n")
    with pytest.raises(InputError, match="readonly_token set without a user's token"):
        read_controller_config(p)
    write_secret(tmp_path / "ro.token", TOKEN)  # the same credential as the user's
    with pytest.raises(InputError, match="token and readonly_token are the same credential"):
        read_controller_config(controller_config(tmp_path, readonly_token_file="ro.token"))


def test_a_taken_metrics_port_fails_the_start_naming_the_key(tmp_path: Path) -> None:
    first = ControllerServer(read_controller_config(controller_config(tmp_path, metrics_listen="127.0.0.1:0")))
    try:
        other = tmp_path / "other"
        other.mkdir()
        with pytest.raises(InputError, match="metrics_listen: cannot bind"):
            ControllerServer(read_controller_config(controller_config(other, metrics_listen=first.ops.address)))
        again = ControllerServer(read_controller_config(controller_config(other)))  # the failed one let its state go
        again.ctl.store.close()
    finally:
        first.ops.stop()
        first.ctl.store.close()


def _event(st: Store, t: float, job: str | None, kind: str, **detail: object) -> None:
    st.db.execute("INSERT INTO events VALUES (?,?,?,?)", (t, job, kind, json.dumps(detail)))


def test_the_totals_tailed_from_the_state_agree_with_calc(tmp_path: Path) -> None:
    """Preemptions, lost steps and harvested node-hours as ``hpcsched calc`` counts them (``pilot_metrics``), read
    in two parts as two scrapes would: the second read adds only what came after the first."""
    st = Store(tmp_path / "state.db")
    tally = StateTally(st.reader())
    _event(st, 100.0, None, "pilot", event="running", slurm_job="41", worker="pilot-41")
    _event(st, 100.0, None, "pilot", event="adopt", state="RUNNING", slurm_job="42", worker="pilot-42")
    _event(st, 150.0, "j1", "stop", reason="preempt", worker_left="pilot-41")
    for i, (gen, step, resumed) in enumerate(((1, 10, None), (1, 40, None), (2, 30, 30), (2, 55, None))):
        st.add_progress("j1", gen, {"time": 110.0 + i, "step": step, "resumed_from": resumed})
    _event(st, 160.0, None, "worker_lost", worker="w1", silent_s=12.0)
    _event(st, 170.0, None, "worker_left", worker="w2")
    _event(st, 171.0, None, "worker_draining", worker="w3")  # not gone yet
    first = tally.read(now=200.0)
    assert (first.preemptions, first.lost_steps, first.workers_lost, first.workers_left) == (1, 10, 1, 1)
    assert first.harvested_node_hours == pytest.approx(2 * 100.0 / 3600)
    _event(st, 300.0, None, "pilot", event="gone", slurm_job="41", worker="pilot-41")
    _event(st, 310.0, None, "pilot", event="cancel", slurm_job="42", worker="pilot-42")
    _event(st, 320.0, "j2", "stop", reason="preempt", worker_left="pilot-42")  # its pilot was cancelled: not counted
    _event(st, 330.0, "j3", "stop", reason="resize")
    _event(st, 340.0, None, "pilot", event="gone", slurm_job="42", worker="pilot-42", cancelled=True)
    # no checkpoint said: lost from its first step
    st.add_progress("j1", 3, {"time": 350.0, "step": 20, "resumed_from": None})
    second = tally.read(now=400.0)
    calc = pilot_metrics(st.events(), st.progress(), end=400.0)
    assert second.preemptions == calc["preemptions"] == 1
    assert second.lost_steps == calc["lost_steps"] == 10 + 35
    assert second.harvested_node_hours == pytest.approx(calc["harvested_node_hours"])
    assert second.harvested_node_hours == pytest.approx((200.0 + 240.0) / 3600)
    tally.close()
    st.close()


def test_histograms_keep_the_timings_within_a_fine_bucket() -> None:
    t = RpcTimings()
    values = [0.00015] * 5 + [0.003] * 3 + [0.2, 7.0]
    for v in values:
        t.add("Heartbeat", v)
    edges, counts, total = t.histogram("Heartbeat")
    assert total == pytest.approx(sum(values))
    got = dict(histogram_buckets(edges, counts))
    for le in BUCKETS_S:  # each value is more than 5% from every edge: its count is exact
        assert got[repr(le)] == sum(1 for v in values if v <= le), le
    assert got["+Inf"] == len(values)
    _, empty, zero = t.histogram("never-called")
    assert not any(empty) and zero == 0


def test_the_page_cuts_long_tables_and_says_so(ops) -> None:
    srv, addr, url = ops
    stub = pb_grpc.ControllerStub(open_channel(addr, None))
    reply = stub.SubmitMany(pb.SubmitManyRequest(jobs=[pb.SubmitRequest(
        spec_yaml="name: many\ncommand: [a.py]\nprocs: 1\narray: 520\n", source="m.yaml")]),
        metadata=metadata(TOKEN), timeout=60)
    assert len(reply.results[0].job_ids) == 520
    page = _get(url + "/", READONLY)[1]
    assert "more active jobs past these 500" in page
    assert reply.results[0].job_ids[499] in page and reply.results[0].job_ids[500] not in page


class _Source:
    """A node source's view as the Slurm one gives it (node_source.SourceView): what the page and the pilot series
    read; its polling is tested with the pilot manager's own tests."""

    name = "slurm"

    def __init__(self, view: SourceView) -> None:
        self._view = view

    def view(self) -> SourceView:
        return self._view

    def stop(self) -> None:
        return None


def test_pilots_and_refused_nodes_are_shown_with_why(ops) -> None:
    srv, addr, url = ops
    stub = pb_grpc.ControllerStub(open_channel(addr, None))
    stub.Register(pb.RegisterRequest(worker_id="pilot-101", host="c1", slots=4, instance="i"),
                  metadata=metadata(WORKER), timeout=30)
    srv.source = _Source(SourceView("slurm", time.time(), {
        "c1": ("pilot running, worker alive", "101"), "c2": ("pilot pending", "102"),
        "c3": ("down: not responding (DOWN*)", ""), "c4": ("idle, not claimed: max_pilots (2) reached", "")},
        {"pilot-101": ("101", "c1", "RUNNING"), "pilot-102": ("102", "c2", "PENDING"),
         "pilot-99": ("99", "c9", "GONE")}))
    got = samples(_get(url + "/metrics", READONLY)[1])
    assert got["hpcsched_pilots", (("state", "running"),)] == 1 and got["hpcsched_pilots", (("state", "pending"),)] == 1
    assert ("hpcsched_pilots", (("state", "gone"),)) not in got  # gone pilots are history, not the pool
    for use in ("idle", "down", "pilot running", "pilot pending"):  # the words before the first punctuation
        assert got["hpcsched_source_nodes", (("use", use),)] == 1, use
    page = _get(url + "/", READONLY)[1]
    assert "<td>c3</td><td>down: not responding (DOWN*)</td>" in page
    assert "<td>idle, not claimed: max_pilots (2) reached</td>" in page
    assert "<td>101 c1 RUNNING</td>" in page and "node source: slurm" in page


def test_with_own_jobs_only_a_user_sees_only_their_jobs_on_the_page(tmp_path: Path) -> None:
    alice = write_secret(tmp_path / "alice.token", "alice-tok-4e")
    write_secret(tmp_path / "worker.token", WORKER)
    config = controller_config(tmp_path, worker_token_file="worker.token", own_jobs_only="true",
                               metrics_listen="127.0.0.1:0")
    config.write_text(config.read_text() + f"user_tokens:\n  alice: {alice}\n")
    srv = ControllerServer(read_controller_config(config))
    addr = srv.start()
    try:
        stub = pb_grpc.ControllerStub(open_channel(addr, None))
        mine = stub.Submit(pb.SubmitRequest(spec_yaml=JOB, source="a.yaml"), metadata=metadata("alice-tok-4e"),
                           timeout=30).job_id
        other = stub.Submit(pb.SubmitRequest(spec_yaml=JOB, source="u.yaml"), metadata=metadata(TOKEN),
                            timeout=30).job_id
        url = f"http://{srv.ops.address}/"
        page = _get(url, "alice-tok-4e")[1]
        assert f"<td>{mine}</td>" in page and f"<td>{other}</td>" not in page
        page = _get(url, TOKEN)[1]  # the 'user' token is a user too: its own job only
        assert f"<td>{other}</td>" in page and f"<td>{mine}</td>" not in page
    finally:
        srv.stop()


def test_the_controller_process_serves_metrics_and_says_where(tmp_path: Path) -> None:
    """``hpcsched controller`` as a user starts it: the bound address in its log and in metrics_address_file."""
    proc, _ = start_controller(tmp_path, controller_config(tmp_path, metrics_listen="127.0.0.1:0",
                                                           metrics_address_file="run/metrics.addr"))
    try:
        addr_file = tmp_path / "run" / "metrics.addr"
        deadline = time.monotonic() + 60  # written right after the API's address
        while not addr_file.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        address = addr_file.read_text().strip()
        status, text, _ = _get(f"http://{address}/metrics", TOKEN)
        assert status == 200 and "hpcsched_workers" in text
        assert f"metrics and status page on http://{address}/" in (tmp_path / "controller.log").read_text()
    finally:
        stop(proc)


def test_lost_and_departed_workers_are_counted_apart(tmp_path: Path) -> None:
    """What an alert on a lost worker counts: one worker falls silent past worker_timeout_s, another leaves."""
    timeout_s = 1.0
    srv = ControllerServer(read_controller_config(controller_config(
        tmp_path, worker_timeout_s=timeout_s, metrics_listen="127.0.0.1:0")))
    addr = srv.start()
    try:
        stub, md = pb_grpc.ControllerStub(open_channel(addr, None)), metadata(TOKEN)
        for w in ("silent", "leaver"):
            reply = stub.Register(pb.RegisterRequest(worker_id=w, host="h", slots=1, instance="i"), metadata=md,
                                  timeout=30)
        stub.Leave(pb.LeaveRequest(worker_id="leaver", final=True, instance="i"),
                   metadata=md + credential_metadata(reply.credential), timeout=30)
        url = f"http://{srv.ops.address}/metrics"
        deadline = time.monotonic() + 30 * timeout_s + 30  # reaped at a scheduling step past the timeout
        while (got := samples(_get(url, TOKEN)[1]))["hpcsched_worker_losses_total", ()] < 1:
            assert time.monotonic() < deadline, got
            time.sleep(timeout_s / 4)
        assert got["hpcsched_worker_losses_total", ()] == 1 and got["hpcsched_worker_leaves_total", ()] == 1
        assert got["hpcsched_workers", (("state", "lost"),)] == 2  # neither is heard any more
    finally:
        srv.stop()


def test_a_busy_controller_lock_gets_the_previous_reading_not_a_hung_scrape(ops) -> None:
    """A scrape while the controller's lock is held (a long step) answers after LOCK_WAIT_S with the previous pool
    reading, and says how old it is, instead of waiting for the lock."""
    srv, addr, url = ops
    _get(url + "/metrics", READONLY)  # a first reading to fall back on
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with srv.ctl.lock:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert held.wait(30)
        t0 = time.monotonic()
        status, text, _ = _get(url + "/metrics", READONLY)
        waited = time.monotonic() - t0
    finally:
        release.set()
        holder.join(30)
    got = samples(text)
    assert status == 200 and got["hpcsched_metrics_stale_reads_total", ()] == 1
    assert got["hpcsched_pool_age_seconds", ()] >= LOCK_WAIT_S and waited >= LOCK_WAIT_S
    assert got["hpcsched_workers", (("state", "alive"),)] == 0  # the previous reading's figures
    got = samples(_get(url + "/metrics", READONLY)[1])  # the lock free again: a fresh reading
    assert got["hpcsched_metrics_stale_reads_total", ()] == 1 and got["hpcsched_pool_age_seconds", ()] < LOCK_WAIT_S


def test_metrics_listen_off_loopback_needs_tokens(tmp_path: Path) -> None:
    """As the API's listen: without tokens, loopback only (192.0.2.1, TEST-NET, is never bound: the check is first)."""
    (tmp_path / "c.yaml").write_text("listen: 127.0.0.1:0\nstate: state.db\nmetrics_listen: 192.0.2.1:0\n")
    with pytest.raises(InputError, match="metrics_listen: 192.0.2.1 is not a loopback address and no token is set"):
        ControllerServer(read_controller_config(tmp_path / "c.yaml"))
    again = ControllerServer(ControllerConfig(state=tmp_path / "state.db"))  # the refused one let its state go
    again.ctl.store.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test certificate")
def test_with_tls_the_listener_speaks_https_with_the_apis_certificate(tmp_path: Path) -> None:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(tmp_path / "c.pem")], check=True, capture_output=True)
    srv = ControllerServer(read_controller_config(controller_config(
        tmp_path, tls_cert="c.pem", tls_key="k.pem", metrics_listen="127.0.0.1:0")))
    srv.start()
    try:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "c.pem"))
        status, text, _ = _get(f"https://{srv.ops.address}/metrics", TOKEN, context=ctx)
        assert status == 200 and "hpcsched_workers" in text
        with pytest.raises(urllib.error.URLError):  # no certificate to trust: refused, nothing sent in the clear
            _get(f"https://{srv.ops.address}/metrics", TOKEN, context=ssl.create_default_context())
    finally:
        srv.stop()
