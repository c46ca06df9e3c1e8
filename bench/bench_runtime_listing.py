"""Listing under load (issue 15, items 3-4): ListJobs latency at 1k and 10k jobs, and heartbeat latency while
40 clients list at once.

Why: one unpaged ListJobs cost 695 ms at 10k jobs and 40 concurrent listings held a heartbeat 11.5 s, past the
worker deadline (the worker re-registered). A real controller process is started on a state file filled
beforehand with N jobs (90% completed, 10% pending: a controller with history), as a user would start it.

1. ``list``: one client lists every job (``Client.jobs()``: all pages where the controller pages) ``--repeat``
   times; wall time per complete listing, and per RPC.
2. ``load``: ``--workers`` simulated workers (one process, a thread each) register and heartbeat every
   ``--interval`` s, timing each Heartbeat RPC; after ``--quiet-s`` seconds alone, ``--listers`` client
   processes each list every job in a loop for ``--seconds``. Reported: heartbeat p50 / p99 / max alone and
   under the listings, re-registrations asked of a worker (``reregister``, or a failed heartbeat), complete
   listings done and failed (DEADLINE_EXCEEDED at the client's 10 s), and their latency. Target (issue 15):
   10k jobs, 40 listings, heartbeat p99 < 200 ms, no worker re-registers.

    .venv/bin/python bench/bench_runtime_listing.py [--jobs 1000,10000] [--listers 40] [--seconds 20]
    .venv/bin/python bench/bench_runtime_listing.py --jobs 100000 --listers 0 --repeat 3 --filters

3. ``--filters``: one page (500 rows) of each filter in FILTERS (``hpcsched jobs -t/-u/-n``), from the start and
   from the middle of the job table, timed as RPCs; the filters are served by index ranges, so a page costs about
   the same at 100,000 jobs as at 1,000 (except an unanchored name pattern, which scans).

Runs against whatever tree it sits in (``ROOT``), so the same file measures the code before a change from a
copy of the old tree (``git archive``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TOKEN = "bench-token-0e1d"


def _quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def _fill_state(path: Path, n: int) -> None:
    """N jobs, 90% completed and 10% pending, of ten users (user0..user9), written through the store as the
    controller would have (in batches of 5,000: 100,000 single inserts took minutes on a loaded node)."""
    from hpcsched.runtime.jobfile import parse_job_spec
    from hpcsched.runtime.store import Store

    st = Store(path)
    now = time.time()
    for k in range(0, n, 5000):
        specs = [(parse_job_spec(f"name: bench-job-{i:05d}-resnet50-lr0.1\ncommand: [workloads/ddp_train.py, --model, "
                                 "cnn]\nprocs: 2\nsteps: 400\n", "bench.yaml"), None)
                 for i in range(k, min(n, k + 5000))]
        st.add_jobs(specs, now)
    with st.tx():  # submit times one second apart, owners round-robin, 9 in 10 completed
        st.db.execute("UPDATE jobs SET submit_time = ? + seq, owner = 'user' || (seq % 10)", (now - n - 1,))
        st.db.execute("UPDATE jobs SET state = 'completed', steps_done = 400, end_time = ?, message = 'done', "
                      "last_loss = 0.5, first_loss = 2.3 WHERE (seq - 1) % 10 != 0", (now,))
    st.close()


FILTERS = {  # name -> ListJobsRequest fields: what `hpcsched jobs -t/-u/-n` sends
    "none": {},
    "state=pending": {"states": ["pending"]},
    "state=pending,failed": {"states": ["pending", "failed"]},
    "user=user3": {"owner": "user3"},
    "user=user1,state=pending": {"owner": "user1", "states": ["pending"]},
    "name=exact": {"name": "bench-job-04242-resnet50-lr0.1"},
    "name=prefix*": {"name": "bench-job-042*"},
    "name=*infix*": {"name": "*-0424?-*"},
}


def _filtered_pages(address: str, n: int, repeat: int) -> dict:
    """Per filter: the first page's and a page from the middle's RPC time (median of ``repeat``), and rows."""
    from hpcsched.runtime.auth import metadata, open_channel
    from hpcsched.runtime.rpc import pb, pb_grpc

    stub, md = pb_grpc.ControllerStub(open_channel(address)), metadata(TOKEN)
    out = {}
    for label, kw in FILTERS.items():
        row = {}
        for where, token in (("first", ""), ("middle", f"j{n // 2}")):
            times, rows = [], 0
            for _ in range(repeat):
                t0 = time.perf_counter()
                reply = stub.ListJobs(pb.ListJobsRequest(page_token=token, **kw), metadata=md, timeout=60)
                times.append(time.perf_counter() - t0)
                rows = len(reply.jobs)
            row[f"{where}_ms"] = round(statistics.median(times) * 1e3, 1)
            row[f"{where}_rows"] = rows
        out[label] = row
    return out


def _start_controller(d: Path) -> tuple[subprocess.Popen, str]:
    token = d / "token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, (TOKEN + "\n").encode())
    os.close(fd)
    (d / "controller.yaml").write_text(
        f"listen: 127.0.0.1:0\naddress_file: {d}/addr\nstate: {d}/state.db\ncheckpoint_root: {d}/ckpt\n"
        f"token_file: {token}\nheartbeat_interval_s: 1.0\nworker_timeout_s: 10\nrpc_stats_file: {d}/rpc.json\n")
    log = open(d / "controller.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "hpcsched.runtime", "controller", "-c", str(d / "controller.yaml")],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                            env=os.environ | {"PYTHONPATH": str(ROOT)})
    deadline = time.time() + 120
    while not (d / "addr").exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError((d / "controller.log").read_text())
        time.sleep(0.1)
    return proc, (d / "addr").read_text().split()[0]


def _list_all(address: str, timeout: float = 10.0) -> tuple[int, int]:
    """(jobs, RPCs) of one complete listing."""
    from hpcsched.runtime.client import Client

    c = Client(address, TOKEN, timeout=timeout)
    try:
        calls = [0]
        stub_call = c._call

        def counted(method, request):
            calls[0] += 1
            return stub_call(method, request)

        c._call = counted
        return len(c.jobs()), calls[0]
    finally:
        c.close()


def _lister(address: str, start_at: float, until: float, out: multiprocessing.Queue) -> None:
    """One listing client: complete listings in a loop, as repeated ``hpcsched jobs`` calls would."""
    from hpcsched.runtime.client import ClientError

    done, failed, lat = 0, 0, []
    time.sleep(max(0.0, start_at - time.time()))
    while time.time() < until:
        t0 = time.perf_counter()
        try:
            _list_all(address)
            done += 1
            lat.append(time.perf_counter() - t0)
        except ClientError as e:
            failed += 1
            out.put(("error", str(e)[:200]))
    out.put(("lister", done, failed, lat))


def _workers(address: str, n: int, interval: float, stop: threading.Event, t_listing: list[float]) -> dict:
    """``n`` simulated workers heartbeating from threads; latency of each Heartbeat, split alone / under load."""
    import grpc

    from hpcsched.runtime.auth import metadata, open_channel
    from hpcsched.runtime.credentials import credential_metadata
    from hpcsched.runtime.rpc import pb, pb_grpc

    md = metadata(TOKEN)
    res: dict[str, list] = {"alone": [], "load": [], "reregister": [], "failed": []}

    def one(i: int) -> None:
        ch = open_channel(address)
        stub = pb_grpc.ControllerStub(ch)
        wid = f"bench-w{i}"
        cred = stub.Register(pb.RegisterRequest(worker_id=wid, host="127.0.0.1", slots=4, cpus=4, launchers=[]),
                             timeout=10, metadata=md).credential
        time.sleep(interval * i / n)
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                r = stub.Heartbeat(pb.HeartbeatRequest(worker_id=wid), timeout=10,
                                   metadata=md + credential_metadata(cred))
                dt = time.perf_counter() - t0
                (res["load"] if t_listing and time.time() >= t_listing[0] else res["alone"]).append(dt)
                if r.reregister:
                    res["reregister"].append(wid)
                    cred = stub.Register(pb.RegisterRequest(worker_id=wid, host="127.0.0.1", slots=4, cpus=4),
                                         timeout=10, metadata=md).credential
            except grpc.RpcError as e:
                res["failed"].append(e.code().name)
            stop.wait(max(0.0, interval - (time.perf_counter() - t0)))
        ch.close()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return {"threads": threads, "res": res}


def run(n: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-listing-") as tmp:
        d = Path(tmp)
        t0 = time.perf_counter()
        _fill_state(d / "state.db", n)
        fill_s = time.perf_counter() - t0
        proc, address = _start_controller(d)
        try:
            listings, rpcs = [], 0
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                got, rpcs = _list_all(address, timeout=60)
                listings.append(time.perf_counter() - t0)
                assert got == n, f"listed {got} of {n} jobs"
            out: dict = {"jobs": n, "fill_s": round(fill_s, 1),
                         "list_p50_ms": round(statistics.median(listings) * 1e3, 1),
                         "list_max_ms": round(max(listings) * 1e3, 1), "rpcs_per_listing": rpcs}
            if args.filters:
                out["filtered_pages"] = _filtered_pages(address, n, args.repeat)
            if args.listers:
                stop = threading.Event()
                t_listing: list[float] = []
                w = _workers(address, args.workers, args.interval, stop, t_listing)
                time.sleep(args.quiet_s)
                ctx = multiprocessing.get_context("spawn")
                q = ctx.Queue()
                start_at = time.time() + 8.0  # the listers' interpreters start first (imports: seconds at load)
                until = start_at + args.seconds
                procs = [ctx.Process(target=_lister, args=(address, start_at, until, q)) for _ in range(args.listers)]
                for p in procs:
                    p.start()
                t_listing.append(start_at)
                done = failed = 0
                lat: list[float] = []
                errors: list[str] = []
                for _ in range(args.listers):
                    while True:
                        m = q.get(timeout=args.seconds + 120)
                        if m[0] == "error":
                            errors.append(m[1])
                            continue
                        break
                    done, failed, lat = done + m[1], failed + m[2], lat + m[3]
                for p in procs:
                    p.join(timeout=30)
                time.sleep(1.0)
                stop.set()
                for t in w["threads"]:
                    t.join(timeout=15)
                r = w["res"]
                ms = lambda xs, q: round(_quantile(xs, q) * 1e3, 1)  # noqa: E731
                out |= {
                    "heartbeats_alone": len(r["alone"]), "hb_alone_p50_ms": ms(r["alone"], 0.5),
                    "hb_alone_p99_ms": ms(r["alone"], 0.99), "heartbeats_under_listing": len(r["load"]),
                    "hb_load_p50_ms": ms(r["load"], 0.5), "hb_load_p99_ms": ms(r["load"], 0.99),
                    "hb_load_max_ms": ms(r["load"], 1.0), "reregistered": len(r["reregister"]),
                    "heartbeats_failed": len(r["failed"]), "listers": args.listers, "listings_done": done,
                    "listings_failed": failed, "listing_p50_s": round(_quantile(lat, 0.5), 2),
                    "listing_max_s": round(_quantile(lat, 1.0), 2), "errors": sorted(set(errors))[:3],
                }
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        rpc = d / "rpc.json"
        if rpc.exists():
            stats = json.loads(rpc.read_text())
            out["server_heartbeat_p99_ms"] = round(stats.get("Heartbeat", {}).get("p99_ms", float("nan")), 1)
            out["server_listjobs_p99_ms"] = round(stats.get("ListJobs", {}).get("p99_ms", float("nan")), 1)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", default="1000,10000", help="comma-separated job counts")
    ap.add_argument("--repeat", type=int, default=5, help="sequential complete listings timed per job count")
    ap.add_argument("--listers", type=int, default=40, help="concurrent listing processes (0: skip the load phase)")
    ap.add_argument("--load-at", default="10000", help="job counts that get the load phase")
    ap.add_argument("--workers", type=int, default=4, help="simulated heartbeating workers")
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between one worker's heartbeats")
    ap.add_argument("--quiet-s", type=float, default=5.0, help="heartbeats alone before the listings")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the listers list")
    ap.add_argument("--filters", action="store_true", help="also time filtered pages (state, user, name: FILTERS), "
                    "the first and one from the middle")
    args = ap.parse_args()
    load_at = {int(x) for x in args.load_at.split(",") if x}
    for n in (int(x) for x in args.jobs.split(",")):
        a = argparse.Namespace(**vars(args))
        if n not in load_at:
            a.listers = 0
        print(json.dumps(run(n, a)), flush=True)


if __name__ == "__main__":
    main()
