"""The fleet harness: a real ``hpcsched controller`` process against thousands of simulated workers (issue 25).

``run_fleet(FleetOptions)`` writes a controller config into a temporary directory (static node source, the chosen
policy, one token, ``listen: 127.0.0.1:0``: the address is read from its address file), starts the controller as a
user does (``python -m hpcsched.runtime controller``), optionally fills its queue with ``pending`` jobs no worker can
run (a GPU type none advertises), starts the simulated workers (``fleet_worker``) in ``procs`` processes, all at once
(a registration storm) unless ``ramp_s`` spreads them, waits until every one has registered, submits ``jobs`` jobs
through the real Submit RPC (``submit_concurrency`` calls in flight; the batch RPC ``SubmitMany`` when the
controller's protocol has it), lets the fleet run ``duration`` seconds from the first submit, counts the jobs'
states with the controller's own listing, makes every worker leave, stops the controller and returns the figures
(``figures``: what ``bench_fleet.py`` prints and writes as JSON).

What each figure is, so one can tell the controller's share from the harness's:
- registration: seconds from the workers' start to the last worker's first answered Register; ``registrations``
  beyond one per worker are re-registrations (after a ``reregister`` reply or a failed call);
- heartbeat latency: client side, every Heartbeat RPC (send to reply) after the last registration;
- submit -> launch: from a job's Submit call being sent to the first heartbeat reply that carries one of its
  LaunchTasks (same clock: every process is on this machine);
- controller CPU: utime+stime from /proc/PID/stat (the controller and its lease server) over the measured window
  (workers' start to the end of ``duration``), as % of one core; and split in two: the registration storm (workers'
  start to the first submit: CPU seconds, and per registration) and the job churn (first submit to the end of
  ``duration``: % of one core, ``churn_cpu_pct``). The storm is paid once per fleet start and grows with the fleet;
  the churn's per-second cost is what must stay flat with the fleet size at the same churn. Peak RSS: VmHWM from
  /proc/PID/status at the end;
- harness CPU: each harness process's own CPU time over the same window; a process near 100% of a core, or a
  large event-loop lag, means the harness, not the controller, set the latencies.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
from fleet_scrape import Scraper
from fleet_worker import LEAVE_BUDGET_S, SimOptions, channel_options, raise_nofile, worker_process

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the suite's process helpers
from runtime_procs import start_controller  # noqa: E402

from hpcsched.runtime.auth import metadata
from hpcsched.runtime.rpc import pb, pb_grpc

TOKEN = "fleet-harness-token"
PENDING_GPU_TYPE = "h100"  # what the unrunnable pending jobs ask for; the simulated workers advertise ``cpu``
_CLK = os.sysconf("SC_CLK_TCK")
_ACTIVE = ("pending", "running", "stopping")


@dataclass(slots=True)
class FleetOptions:
    workers: int = 1000
    jobs: int = 500
    duration: float = 60.0  # seconds from the first submit to the count of jobs done
    slots: int = 4
    pending: int = 0  # unrunnable jobs queued before the workers start
    pending_kind: str = "too-big"  # why they cannot run (``pending_yaml``)
    typed_workers: int = 0  # workers that advertise PENDING_GPU_TYPE: they run the ``mix`` backlog's jobs
    procs: int = 0  # harness processes driving the workers (0: one per 1,000 workers, at most 4)
    channels: int = 0  # gRPC channels per harness process (0: one per worker, each its own TCP connection)
    job_seconds: float = 20.0  # a job's mean run time once started (uniform 0.5x-1.5x)
    iteration_s: float = 0.1
    startup_s: float = 0.5
    max_procs: int = 4  # job sizes 1..max_procs
    elastic_frac: float = 0.2
    seed: int = 1
    policy: str = "fifo"
    heartbeat_interval_s: float | None = None  # None: the controller's default
    worker_timeout_s: float | None = None
    schedule_interval_s: float | None = None
    submit_concurrency: int = 16
    submit_batch: int = 100  # jobs per SubmitMany call, when the controller has it (1: one Submit call per job)
    ramp_s: float = 0.0
    connect_ms: int = 0  # > 0: the workers' grpc.min_reconnect_backoff_ms instead of the real worker's
    register_timeout: float = 180.0
    watch: bool = True  # workers open Orders.Watch (pushed orders) where the controller offers it
    watch_share: int = 50  # workers whose Watch streams share a channel per harness process (0: one each)
    lease: bool = True  # the controller runs its lease server and workers with no task renew there (lease.py)
    sample_controller: str = ""  # a path: sample the controller's stacks into it (bench/stack_sampler.py)
    until_done: bool = False  # end once the harness has seen every submitted job reach its last step
    scrape_s: float = 0.0  # > 0: the controller serves /metrics (metrics_listen) and it is scraped this often
    quiet: bool = False


def controller_config(d: Path, o: FleetOptions) -> Path:
    """The controller's YAML in ``d`` (token file 0600, as the controller requires)."""
    tok = d / "token"
    fd = os.open(tok, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(TOKEN + "\n")
    cfg: dict[str, object] = {"listen": "127.0.0.1:0", "address_file": "run/controller.addr", "state": "run/state.db",
                              "checkpoint_root": "run/ckpt", "token_file": "token", "policy": o.policy,
                              "stop_grace_s": 10, "rpc_stats_file": "run/rpc_stats.json"}
    if o.scrape_s > 0:
        cfg |= {"metrics_listen": "127.0.0.1:0", "metrics_address_file": "run/metrics.addr"}
    for key in ("heartbeat_interval_s", "worker_timeout_s", "schedule_interval_s"):
        if getattr(o, key) is not None:
            cfg[key] = getattr(o, key)
    if not o.lease:  # every heartbeat to the controller, as before lease servers (a key older controllers refuse)
        cfg["lease_server"] = "false"
    p = d / "controller.yaml"
    p.write_text("".join(f"{k}: {v}\n" for k, v in cfg.items()))
    return p


def stop_controller(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (the controller's lease server)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def tree_cpu_s(pid: int) -> dict[int, float]:
    """pid -> CPU seconds of a process and of each of its live children."""
    out = {}
    for p in [pid, *children(pid)]:
        try:
            out[p] = proc_cpu_s(p)
        except OSError:  # it ended meanwhile
            continue
    return out


def proc_status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def job_yaml(i: int, rng: random.Random, o: FleetOptions) -> str:
    """Job ``i`` of the mix: 1..max_procs processes (small ones likelier), ``elastic_frac`` of them elastic
    (min_procs < max_procs), steps for about ``job_seconds`` (0.5x-1.5x) at ``iteration_s`` a step."""
    sizes = list(range(1, o.max_procs + 1))
    procs = rng.choices(sizes, weights=[1.0 / s for s in sizes])[0]
    lo = hi = procs
    if o.max_procs > 1 and rng.random() < o.elastic_frac:
        lo, hi = rng.randint(1, procs), rng.randint(procs, o.max_procs)
        if lo == hi:
            lo, hi = (lo - 1, hi) if lo > 1 else (lo, hi + 1)
    steps = max(1, round(o.job_seconds * rng.uniform(0.5, 1.5) / o.iteration_s))
    return (f"name: fleet-{i}\nlauncher: direct\nprocs: {procs}\nmin_procs: {lo}\nmax_procs: {hi}\n"
            f"steps: {steps}\ncommand: [fleet-sim-task, '{i}']\n")


PENDING_KINDS = ("gpu-type", "launcher", "too-big", "mix")


def pending_yaml(i: int, kind: str = "gpu-type", rng: random.Random | None = None,
                 o: FleetOptions | None = None) -> str:
    """A queued job: it asks for a GPU type no simulated worker advertises, a launcher none has (``mpirun``),
    or more processes than the whole fleet holds (``too-big``: 1,000,000); ``mix``: a job of the runnable mix
    (sizes, elastic, lengths: ``job_yaml``) of the GPU type only the ``--typed-workers`` advertise (none, the
    default: a backlog no worker can run, passed over by the planner as a class). With typed workers, FIFO holds
    the runnable jobs behind the backlog: the decision core admits jobs against the free slots of every type
    (``core.decide._admit``), so the backlog's jobs take the admission budget though only typed workers fit them."""
    if kind == "mix":
        assert rng is not None and o is not None
        return job_yaml(i, rng, o).replace("name: fleet-", "name: fleet-backlog-", 1) + \
            f"gpu_type: {PENDING_GPU_TYPE}\n"
    launcher = "mpirun" if kind == "launcher" else "direct"
    procs = 1_000_000 if kind == "too-big" else 1
    gpu = f"gpu_type: {PENDING_GPU_TYPE}\n" if kind == "gpu-type" else ""
    return (f"name: fleet-pending-{i}\nlauncher: {launcher}\nprocs: {procs}\nsteps: 100\n{gpu}"
            f"command: [fleet-sim-task, pending, '{i}']\n")


def _q(values, p: float) -> float | None:
    """The p-quantile in ms, None when there is nothing."""
    if not len(values):
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(p * len(s)))] * 1e3, 2)


def _quantiles(values) -> dict[str, float | None]:
    return {"n": len(values), "p50_ms": _q(values, 0.5), "p90_ms": _q(values, 0.9), "p99_ms": _q(values, 0.99),
            "max_ms": _q(values, 1.0)}


class Submitter:
    """Submits job files through the real Submit RPC, ``concurrency`` calls in flight, or ``SubmitMany`` batches
    when the controller's protocol has that RPC. Records each job's send time for submit -> launch."""

    def __init__(self, address: str, concurrency: int, batch: int) -> None:
        self.channel = grpc.aio.insecure_channel(address, options=channel_options(-1))
        self.stub = pb_grpc.ControllerStub(self.channel)
        self.md = metadata(TOKEN)
        self.concurrency, self.batch = concurrency, batch
        self.sent_at: dict[str, float] = {}
        self.failed: dict[str, int] = {}
        self.shed = 0  # SubmitMany calls the controller shed (others waited for its lock): their jobs sent again
        self.jitter = random.Random(7)
        # SubmitMany when the controller's protocol has it and batches are asked for (batch > 1)
        self.many = batch > 1 and hasattr(self.stub, "SubmitMany") and hasattr(pb, "SubmitManyRequest")

    async def submit(self, texts: list[tuple[str, str]]) -> tuple[float, int]:
        """Submit (source, yaml) pairs; (seconds from the first send to the last reply, jobs accepted)."""
        work = list(texts)
        t0 = time.perf_counter()
        ok = 0

        async def one_by_one() -> None:
            nonlocal ok
            while work:
                source, text = work.pop()
                sent = time.time()
                try:
                    reply = await self.stub.Submit(pb.SubmitRequest(spec_yaml=text, source=source,
                                                                    request_id=uuid.uuid4().hex),
                                                   timeout=60, metadata=self.md)
                except grpc.RpcError as e:
                    self.failed[e.code().name] = self.failed.get(e.code().name, 0) + 1
                    continue
                self.sent_at[reply.job_id] = sent
                ok += 1

        async def batches() -> None:
            nonlocal ok
            while work:
                chunk = [work.pop() for _ in range(min(self.batch, len(work)))]
                sent = time.time()
                try:
                    ids = await self._submit_many(chunk)
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.UNIMPLEMENTED:  # a controller from before SubmitMany
                        self.many = False
                        work.extend(chunk)
                        await one_by_one()
                        return
                    if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "busy" in (e.details() or ""):
                        self.shed += 1  # shed while others waited for the controller's lock: sent again
                        work.extend(chunk)
                        await asyncio.sleep(self.jitter.uniform(0.05, 0.5))
                        continue
                    self.failed[e.code().name] = self.failed.get(e.code().name, 0) + len(chunk)
                    continue
                for jid in ids:
                    self.sent_at[jid] = sent
                ok += len(ids)

        await asyncio.gather(*((batches if self.many else one_by_one)() for _ in range(self.concurrency)))
        return time.perf_counter() - t0, ok

    async def _submit_many(self, chunk: list[tuple[str, str]]) -> list[str]:
        """One SubmitMany call (``jobs``: the SubmitRequests; ``results``: one per item, its ``job_ids`` or its
        ``error``); items the controller refused are counted as failed, with the first refusal's message."""
        req = pb.SubmitManyRequest(jobs=[pb.SubmitRequest(spec_yaml=t, source=s, request_id=uuid.uuid4().hex)
                                         for s, t in chunk])
        reply = await self.stub.SubmitMany(req, timeout=60, metadata=self.md)
        ids: list[str] = []
        for item in reply.results:
            if item.error:
                self.failed["refused in batch"] = self.failed.get("refused in batch", 0) + 1
                self.failed.setdefault("first refusal", item.error[:300])
            ids.extend(item.job_ids)
        return ids

    async def job_states(self) -> dict[str, str]:
        """job id -> state, from the controller's paged listing."""
        out: dict[str, str] = {}
        token = ""
        while True:
            for attempt in range(20):
                try:
                    reply = await self.stub.ListJobs(pb.ListJobsRequest(page_size=1000, page_token=token), timeout=60,
                                                     metadata=self.md)
                    break
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or attempt == 19:
                        raise
                    await asyncio.sleep(0.5)
            out.update((j.job_id, j.state) for j in reply.jobs)
            token = reply.next_page_token
            if not token:
                return out

    async def workers_alive(self) -> int:
        """Workers the controller still counts alive (its paged ListWorkers)."""
        alive, token = 0, ""
        while True:
            reply = await self.stub.ListWorkers(pb.ListWorkersRequest(page_size=1000, page_token=token), timeout=60,
                                                metadata=self.md)
            alive += sum(w.alive for w in reply.workers)
            token = reply.next_page_token
            if not token:
                return alive

    async def close(self) -> None:
        await self.channel.close()


def _say(o: FleetOptions, text: str) -> None:
    if not o.quiet:
        print(text, file=sys.stderr, flush=True)


def run_fleet(o: FleetOptions, keep_dir: Path | None = None) -> dict:
    """Run one scenario (module docstring) and return its figures."""
    d = Path(tempfile.mkdtemp(prefix="hpcsched-fleet-"))
    try:
        return asyncio.run(_run(o, d))
    finally:  # a failed run's directory too: copied when asked for (its log says why), never left behind
        if keep_dir is not None:
            shutil.copytree(d, keep_dir, dirs_exist_ok=True)
        shutil.rmtree(d, ignore_errors=True)


async def _run(o: FleetOptions, d: Path) -> dict:
    # the controller inherits it: a descriptor per worker connection, two per worker with the Orders stream
    nofile = raise_nofile(o.workers * (1 + (o.watch and o.watch_share <= 0) + o.lease) + 4096)
    procs = o.procs or min(4, max(1, -(-o.workers // 1000)))
    load_start = loadavg()
    sampler = (str(Path(__file__).with_name("stack_sampler.py")), str(Path(o.sample_controller).resolve())) \
        if o.sample_controller else ()
    ctl, address = start_controller(d, controller_config(d, o), timeout_s=120, python_args=sampler)
    _say(o, f"controller pid {ctl.pid} at {address}, state in {d}; load {load_start}")
    sub = Submitter(address, o.submit_concurrency, o.submit_batch)
    out: dict = {"options": asdict(o), "harness_processes": procs, "nofile_limit": nofile,
                 "channels": "one per worker (own TCP connection)" if o.channels <= 0
                 else f"{o.channels} per harness process, workers multiplexed over them", "load_start": load_start}
    ctx = multiprocessing.get_context("spawn")  # never fork a process that has gRPC threads
    workers: list = []
    scraper = Scraper(d / "run" / "metrics.addr", TOKEN, o.scrape_s) if o.scrape_s > 0 else None
    try:
        if o.pending:
            mix = random.Random(o.seed + 1)
            unrunnable = [(f"pending-{i}.yaml", pending_yaml(i, o.pending_kind, mix, o)) for i in range(o.pending)]
            secs, ok = await sub.submit(unrunnable)
            pending_ids = set(sub.sent_at)
            out["pending_submit"] = {"jobs": ok, "seconds": round(secs, 2), "jobs_per_s": round(ok / secs, 1)}
            _say(o, f"queued {ok} unrunnable jobs in {secs:.1f} s ({ok / secs:.0f}/s)")
        else:
            pending_ids = set()
        sub.sent_at.clear()
        q, go, stop = ctx.Queue(), ctx.Event(), ctx.Event()
        opts = SimOptions(address, TOKEN, str(d), o.slots, o.iteration_s, o.startup_s, ramp_s=o.ramp_s,
                          connect_ms=o.connect_ms, watch=o.watch, watch_share=o.watch_share, lease=o.lease,
                          typed_workers=o.typed_workers, typed_gpu=PENDING_GPU_TYPE)
        workers = [ctx.Process(target=worker_process, args=(opts, list(range(k, o.workers, procs)), o.workers,
                                                            o.channels, q, go, stop), daemon=True)
                   for k in range(procs)]
        for p in workers:
            p.start()
        ready = 0
        while ready < procs:
            kind, _, _ = q.get(timeout=120)
            ready += kind == "ready"
        progress: dict[int, dict] = {}
        stats: dict[int, dict] = {}

        def drain() -> None:
            while True:
                try:
                    kind, pid, body = q.get_nowait()
                except queue.Empty:
                    return
                if kind == "progress":
                    progress[pid] = body
                elif kind == "stats":
                    stats[pid] = body

        cpu0, t0 = tree_cpu_s(ctl.pid), time.time()
        if scraper is not None:
            scraper.start()
        go.set()
        _say(o, f"{o.workers} workers starting in {procs} processes ({out['channels']})")
        last_say = 0.0
        while True:
            await asyncio.sleep(0.25)
            drain()
            registered = sum(p["registered"] for p in progress.values())
            if registered >= o.workers or time.time() - t0 > o.register_timeout:
                break
            if time.time() - last_say > 5:
                last_say = time.time()
                _say(o, f"  {time.time() - t0:5.1f} s: {registered}/{o.workers} registered")
        _say(o, f"  {time.time() - t0:5.1f} s: {registered}/{o.workers} registered")
        t_reg_done = time.time()
        rng = random.Random(o.seed)
        texts = [(f"fleet-{i}.yaml", job_yaml(i, rng, o)) for i in range(o.jobs)]
        cpu_submit, t_submit = tree_cpu_s(ctl.pid), time.time()  # the storm's CPU ends here, the churn's starts
        submit_task = asyncio.create_task(sub.submit(texts))
        end = t_submit + o.duration
        last_say, hb_last, hb_t = 0.0, 0, time.time()
        while time.time() < end:
            await asyncio.sleep(0.25)
            drain()
            if o.until_done and submit_task.done() and \
                    sum(p["jobs_done"] for p in progress.values()) >= len(sub.sent_at):
                break
            if time.time() - last_say >= 5:
                hb = sum(p["heartbeats"] for p in progress.values())
                now = time.time()
                _say(o, f"  {now - t_submit:5.1f} s: submitted {len(sub.sent_at)}/{o.jobs}, jobs launched "
                        f"{sum(p['launched_jobs'] for p in progress.values())}, tasks done "
                        f"{sum(p['tasks_done'] for p in progress.values())}, {(hb - hb_last) / (now - hb_t):.0f} "
                        f"heartbeats/s, errors {sum(p['errors'] for p in progress.values())}, load "
                        f"{loadavg()[0]:.1f}")
                last_say, hb_last, hb_t = now, hb, now
        submit_s, submitted = await submit_task
        t_end = time.time()
        cpu1 = tree_cpu_s(ctl.pid)
        ctl_cpu = cpu1.get(ctl.pid, 0.0) - cpu0.get(ctl.pid, 0.0)
        lease_cpu = sum(c - cpu0.get(p, 0.0) for p, c in cpu1.items() if p != ctl.pid)  # its lease server
        lease_pids = [p for p in cpu1 if p != ctl.pid]
        lease_rss_kb = sum(proc_status_kb(p, "VmHWM") for p in lease_pids)
        if scraper is not None:
            out["metrics_listener"] = await scraper.stop()
        hwm_kb, rss_kb = proc_status_kb(ctl.pid, "VmHWM"), proc_status_kb(ctl.pid, "VmRSS")
        load_end = loadavg()
        t_list = time.perf_counter()
        states = await sub.job_states()
        list_s = time.perf_counter() - t_list
        if o.until_done:  # the last exits are on their way to the controller (one heartbeat each): wait for them
            settle = time.time() + 10 * (o.heartbeat_interval_s or 1.0)
            while time.time() < settle and any(states.get(j) in _ACTIVE for j in sub.sent_at):
                await asyncio.sleep(0.2)
                states = await sub.job_states()
        stop.set()
        deadline = time.time() + LEAVE_BUDGET_S + 30  # each process sends its figures once its goodbyes are said
        while len(stats) < procs and time.time() < deadline:
            await asyncio.sleep(0.25)
            drain()
        for p in workers:
            p.join(timeout=10)
        alive_after = await sub.workers_alive()  # every goodbye heard: none left alive
    finally:
        stop_controller(ctl)
        for p in workers:
            if p.is_alive():
                p.kill()
        await sub.close()
    server = {}
    with_stats = d / "run" / "rpc_stats.json"
    if with_stats.exists():
        server = json.loads(with_stats.read_text())
    out.update(_figures(o, stats, sub, states, pending_ids, t0, t_reg_done, t_submit, t_end, submit_s, submitted))
    out["jobs_after"]["elapsed_s"] = round(t_end - t_submit, 1)
    out["jobs_after"]["states_listed_after_s"] = round(list_s, 1)  # how late the ``states`` are
    window = t_end - t0
    # per process, as above: one that started within a phase counts from 0
    storm_cpu = sum(c - cpu0.get(p, 0.0) for p, c in cpu_submit.items())
    churn_cpu = sum(c - cpu_submit.get(p, 0.0) for p, c in cpu1.items())
    registrations = out["registration"]["registrations"]
    # cpu_pct: the controller's process and its lease server together (the controller's cost as a site pays it)
    out["controller"] = {"cpu_pct": round(100 * (ctl_cpu + lease_cpu) / window, 1),
                         "cpu_s": round(ctl_cpu + lease_cpu, 1),
                         "process_cpu_pct": round(100 * ctl_cpu / window, 1),
                         "lease_server_cpu_pct": round(100 * lease_cpu / window, 1),
                         "lease_server_peak_rss_mb": round(lease_rss_kb / 1024, 1),
                         "window_s": round(window, 1),
                         "registration_cpu_s": round(storm_cpu, 1), "registration_window_s": round(t_submit - t0, 1),
                         "registration_cpu_ms_each": round(1000 * storm_cpu / registrations, 2)
                         if registrations else None,
                         "churn_cpu_pct": round(100 * churn_cpu / (t_end - t_submit), 1),
                         "churn_window_s": round(t_end - t_submit, 1), "peak_rss_mb": round(hwm_kb / 1024, 1),
                         "rss_end_mb": round(rss_kb / 1024, 1), "rpc_handler": server,
                         "list_all_jobs_s": round(list_s, 2)}
    out["harness"] = {"processes": procs,
                      "cpu_pct_total": round(100 * sum(s["cpu_s"] for s in stats.values()) / window, 1),
                      "cpu_pct_max_process": round(100 * max((s["cpu_s"] for s in stats.values()), default=0)
                                                   / window, 1),
                      "loop_lag": _quantiles([x for s in stats.values() for x in s["loop_lag"]]),
                      "leave_s": round(max((s["leave_s"] for s in stats.values()), default=0), 1),
                      "leaves_said": sum(s["leaves_said"] for s in stats.values()),
                      "processes_reported": len(stats),
                      "workers_alive_after_leave": alive_after}
    out["submit_rpc"] = "SubmitMany" if sub.many else "Submit"  # after the submits: it falls back on UNIMPLEMENTED
    out["load_end"] = load_end
    out["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return out


def _figures(o: FleetOptions, stats: dict[int, dict], sub: Submitter, states: dict[str, str], pending_ids: set,
             t0: float, t_reg_done: float, t_submit: float, t_end: float, submit_s: float, submitted: int) -> dict:
    first_reg = [t for s in stats.values() for t in s["first_registered_at"].values()]
    registrations = sum(s["registrations"] for s in stats.values())
    hb = [(at, lat, ren) for s in stats.values()
          for at, lat, ren in zip(s["hb_at"], s["hb_lat"], s["hb_renewal"], strict=True)]
    steady = [lat for at, lat, _ in hb if at >= t_reg_done]
    launch_at: dict[str, float] = {}
    done_at: dict[str, float] = {}
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    intervals: dict[float, int] = {}
    for s in stats.values():
        for jid, at in s["launch_seen_at"].items():
            launch_at[jid] = min(at, launch_at.get(jid, at))
        for jid, at in s["job_done_at"].items():
            done_at[jid] = min(at, done_at.get(jid, at))
        for k, v in s["errors"].items():
            errors[k] = errors.get(k, 0) + v
        for k, v in s["error_examples"].items():
            examples.setdefault(k, v)
        for k, v in s["intervals_seen"].items():
            intervals[k] = intervals.get(k, 0) + v
    lat = [launch_at[j] - sent for j, sent in sub.sent_at.items() if j in launch_at]
    ours = [states.get(j, "unknown") for j in sub.sent_at]
    counts = {st: ours.count(st) for st in sorted(set(ours))}
    done_lat = [done_at[j] - t_submit for j in sub.sent_at if j in done_at]
    return {
        "workers": o.workers,
        "registration": {"registered": len(first_reg),
                         "all_registered_s": round(max(first_reg) - t0, 2) if len(first_reg) >= o.workers else None,
                         "last_registered_s": round(max(first_reg) - t0, 2) if first_reg else None,
                         "registrations": registrations, "reregistrations": registrations - len(first_reg),
                         "reregister_replies": sum(s["reregister_replies"] for s in stats.values()),
                         # shed calls whose controller said when to come back (``liveness.RETRY_AFTER_HEADER``)
                         "retry_after_told": sum(s.get("retry_after_told", 0) for s in stats.values()),
                         "register_latency": _quantiles([x for s in stats.values() for x in s["reg_lat"]])},
        "heartbeat": _quantiles(steady) | {"all_calls": len(hb),
                                           "per_s": round(len(steady) / max(1e-9, t_end - t_reg_done), 1),
                                           "lease_lapses": sum(s["lease_lapses"] for s in stats.values()),
                                           # the same beats split: renewals at the lease server, heartbeats here
                                           "renewals": _quantiles([lat for at, lat, r in hb if at >= t_reg_done and r]),
                                           "to_controller": _quantiles([lat for at, lat, r in hb
                                                                        if at >= t_reg_done and not r]),
                                           "lease_fallbacks": sum(s["lease_fallbacks"] for s in stats.values()),
                                           "lease_connect": _quantiles([x for s in stats.values()
                                                                        for x in s["lease_connect"]]),
                                           "intervals_s": {str(k): v for k, v in sorted(intervals.items())}},
        "rpc_errors": errors,
        "rpc_error_examples": examples,
        "submit": {"jobs": submitted, "seconds": round(submit_s, 2),
                   "jobs_per_s": round(submitted / submit_s, 1) if submit_s > 0 else None, "failed": sub.failed,
                   "shed_calls": sub.shed},
        "submit_to_launch": _quantiles(lat) | {"never_launched": len(sub.sent_at) - len(lat)},
        "jobs_after": {"seconds": o.duration, "states": counts, "done": counts.get("completed", 0),
                       "pending_unrunnable": len(pending_ids),
                       "harness_saw_done": len(done_lat),
                       # at the end of the window itself: the listing above comes later (seconds at 100,000 jobs)
                       "done_at_end": sum(t <= t_end - t_submit for t in done_lat),
                       "last_done_s": round(max(done_lat), 1) if done_lat else None},
        "tasks": {k: sum(s[k] for s in stats.values())
                  for k in ("launches", "tasks_done", "tasks_checkpointed", "tasks_killed")},
        "watch": {"streams_opened": sum(s["watch_opened"] for s in stats.values()),
                  "events": sum(s["watch_events"] for s in stats.values()),
                  # orders pushed over the workers' lease connections instead (no Watch stream then)
                  "lease_subscriptions": sum(s.get("lease_subscriptions", 0) for s in stats.values()),
                  "lease_pushes": sum(s.get("lease_pushes", 0) for s in stats.values())},
    }
