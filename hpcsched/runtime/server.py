"""The controller process: gRPC service over ``Controller``, the scheduling thread, the address file.

The service only translates messages; a bad job file becomes INVALID_ARGUMENT with the file and line.
The bound address is written to ``address_file`` (write-then-rename, so a reader never sees half a
line) because with ``listen: 127.0.0.1:0`` nobody knows the port until the server has bound it.

Every RPC's time in its handler (lock wait included) goes into a per-method log-scale histogram; its
quantiles are logged at stop and written to ``rpc_stats_file`` when one is configured, so a benchmark
can tell the controller's share of a latency from its client's.

While a controller runs, the interpreter's GIL switch interval is 0.5 ms instead of 5 ms. A heartbeat
releases the GIL in every SQLite call; while the scheduling thread computes a plan, each re-acquisition
otherwise waits a full 5 ms interval (the convoy effect), and ten of them made a 0.2 ms heartbeat 50 ms.
And the objects alive once it has started (modules, policies: ~37,000) are frozen out of the garbage
collector (``gc.freeze``): every full collection scanned them all, 10-25 ms with every thread stopped.
"""

from __future__ import annotations

import bisect
import functools
import gc
import json
import logging
import math
import os
import sqlite3
import sys
import threading
import time
from collections import Counter
from concurrent import futures
from pathlib import Path

import grpc

from hpcsched.errors import InputError
from hpcsched.runtime.auth import ADMIN, READONLY, USER, WORKER, TokenInterceptor, server_credentials
from hpcsched.runtime.config import ControllerConfig, parse_address
from hpcsched.runtime.controller import Controller
from hpcsched.runtime.controller_members import Refused, Shed
from hpcsched.runtime.credentials import WorkerCredentials
from hpcsched.runtime.diskguard import DiskGuard
from hpcsched.runtime.diskspace import check_at_start, is_disk_full, parse_floor
from hpcsched.runtime.hostaddr import is_loopback_host
from hpcsched.runtime.jobrecord import submitted_spec
from hpcsched.runtime.lease import LeaseTable, now_ns
from hpcsched.runtime.lease_server import LeaseProcess
from hpcsched.runtime.listing import Busy
from hpcsched.runtime.liveness import RETRY_AFTER_HEADER
from hpcsched.runtime.method_pools import MethodPools
from hpcsched.runtime.node_source import ControllerDemand, NodeSource, SourceView, StaticNodeSource, build, reachable
from hpcsched.runtime.ratelimit import LogThrottle, cause
from hpcsched.runtime.rpc import pb, pb_grpc
from hpcsched.runtime.submission import QUOTA_KEY, LimitExceeded, clip
from hpcsched.runtime.watch import OrdersHub

log = logging.getLogger("hpcsched.runtime.server")


_SWITCH_INTERVAL_S = 0.0005


class RpcTimings:
    """Handler seconds per RPC method in log-spaced buckets (5% wide, 10 us to 100 s): bounded memory for
    a controller that runs for weeks, quantiles good to a bucket."""

    _EDGES = tuple(1e-5 * 1.05 ** k for k in range(int(math.log(1e7) / math.log(1.05)) + 2))

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}
        self._max: dict[str, float] = {}
        self._sum: dict[str, float] = {}  # seconds in all, per method (a Prometheus histogram's _sum)

    def add(self, method: str, seconds: float) -> None:
        k = min(bisect.bisect_left(self._EDGES, seconds), len(self._EDGES) - 1)
        with self._lock:
            counts = self._counts.get(method)
            if counts is None:
                counts = self._counts[method] = [0] * len(self._EDGES)
            counts[k] += 1
            self._max[method] = max(self._max.get(method, 0.0), seconds)
            self._sum[method] = self._sum.get(method, 0.0) + seconds

    def histogram(self, method: str) -> tuple[tuple[float, ...], list[int], float]:
        """(bucket upper edges, a copy of the method's counts per bucket, its seconds in all); no calls: zeros."""
        with self._lock:
            counts = self._counts.get(method)
            return self._EDGES, list(counts) if counts else [0] * len(self._EDGES), self._sum.get(method, 0.0)

    def summary(self) -> dict[str, dict[str, float]]:
        """method -> calls and p50 / p99 / max in ms (a quantile is its bucket's upper edge)."""
        out = {}
        with self._lock:
            for method, counts in self._counts.items():
                n = sum(counts)
                out[method] = {"calls": n, "p50_ms": self._quantile(counts, n, 0.5) * 1e3,
                               "p99_ms": self._quantile(counts, n, 0.99) * 1e3, "max_ms": self._max[method] * 1e3}
        return out

    def _quantile(self, counts: list[int], n: int, q: float) -> float:
        seen, rank = 0, math.ceil(q * n)
        for k, c in enumerate(counts):
            seen += c
            if seen >= rank:
                return self._EDGES[k]
        return self._EDGES[-1]


def _timed(method):
    """Time the handler, and turn the controller's refusals into status codes: InputError -> INVALID_ARGUMENT
    (a bad request: it names the field), Refused -> FAILED_PRECONDITION (another daemon holds the worker's name),
    Busy -> RESOURCE_EXHAUSTED (too many queries at once: retry), a SQLite error -> RESOURCE_EXHAUSTED when its
    disk is full, else UNAVAILABLE, logged once per cause and interval (``ratelimit``) instead of gRPC's traceback
    per failed call, LimitExceeded -> RESOURCE_EXHAUSTED (a per-user limit: the message says which). Each refusal
    for a limit (a quota, busy, a full disk) is counted per method and reason (``/metrics``)."""
    @functools.wraps(method)
    def wrapper(self, request, context):
        t0 = time.perf_counter()
        left = context.time_remaining()
        if left is not None and left <= 0:  # its caller gave up while it waited for a thread: no lock, no write
            with self._refused_lock:  # many handler threads: += alone could lose counts
                self.expired += 1
            self.timings.add(method.__name__ + " (expired)", time.perf_counter() - t0)
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the call waited past its deadline for a server thread")
        try:
            return method(self, request, context)
        except InputError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Refused as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except Shed as e:  # too many heartbeats wait for the lock: this one's lease is renewed, its news comes again
            self.count_refused(method.__name__, "shed")
            self.timings.add(method.__name__ + " (shed)", time.perf_counter() - t0)  # also in the method's own
            if e.retry_after_s is not None:  # a shed Register: when to come back (``pacing``)
                context.set_trailing_metadata(((RETRY_AFTER_HEADER, str(round(e.retry_after_s * 1e3))),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except Busy as e:
            self.count_refused(method.__name__, "busy")
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"controller busy with queries: {e}")
        except LimitExceeded as e:  # a per-user quota: the client does not retry it
            self.count_refused(method.__name__, "quota")
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except sqlite3.Error as e:  # one line per cause and interval, not a traceback per call (a full disk)
            if is_disk_full(e):
                self.count_refused(method.__name__, "disk_full")
                self.store_errors.error("disk full", "cannot write the state %s: its disk is full (%s); refusing "
                                        "what needs a write until space is freed", self.ctl.cfg.state, e)
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "the controller's state disk is full: this call "
                              "needs a write and was refused; an operator must free space on it")
            self.store_errors.error(cause(e), "state %s: %s in %s", self.ctl.cfg.state, cause(e), method.__name__)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"the controller could not use its state ({type(e).__name__}); "
                          "retry later")
        finally:
            self.timings.add(method.__name__, time.perf_counter() - t0)
    return wrapper


class _Service(pb_grpc.ControllerServicer):
    def __init__(self, ctl: Controller, timings: RpcTimings, auth: TokenInterceptor | None = None,
                 own_jobs_only: bool = False) -> None:
        self.ctl = ctl
        self.timings = timings
        self.store_errors = LogThrottle(log)  # SQLite errors in handlers (``_timed``)
        self.refused: Counter[tuple[str, str]] = Counter()  # (method, reason) -> calls or files refused for a limit
        self._refused_lock = threading.Lock()  # handlers run on many threads: += alone could lose counts
        self.auth = auth
        self.own_jobs_only = own_jobs_only
        self.source: NodeSource = StaticNodeSource()  # where workers come from (ControllerServer sets it)
        self.watch_port = 0  # the Orders service's port (ControllerServer sets it once it listens)
        # calls whose deadline had passed when a thread took them: dropped unhandled (in a registration storm the
        # handlers registered workers whose daemons had given up, which then registered again)
        self.expired = 0

    def count_refused(self, method: str, reason: str, n: int = 1) -> None:
        with self._refused_lock:
            self.refused[method, reason] += n

    def refusals(self) -> dict[tuple[str, str], int]:
        """(method, reason) -> refusals so far (a copy: ``/metrics`` reads it from its own thread)."""
        with self._refused_lock:
            return dict(self.refused)

    @_timed
    def Register(self, request, context):
        reply = self.ctl.register(request)
        reply.watch_port = self.watch_port  # where it hears of new orders at once (watch.py); 0: heartbeats only
        return reply

    @_timed
    def Heartbeat(self, request, context):
        return self.ctl.heartbeat(request)

    def _who(self, context) -> tuple[str, str]:
        """(role, name) of the caller; (admin, '') when the controller runs without tokens."""
        if self.auth is None:
            return ADMIN, ""
        return self.auth.caller(context.invocation_metadata()) or (USER, "")

    def _owner_filter(self, context) -> str | None:
        """The only owner whose jobs this caller sees and cancels, or None for all (``own_jobs_only``)."""
        role, name = self._who(context)
        return name if self.own_jobs_only and role == USER else None

    @_timed
    def Submit(self, request, context):
        src = clip(request.source or "<submitted job>", 200)
        job_id, duplicate = self.ctl.submit_once(submitted_spec(request, src), src, request.request_id,
                                                 owner=self._who(context)[1])
        return pb.SubmitReply(job_id=job_id, duplicate=duplicate)

    @_timed
    def SubmitMany(self, request, context):
        items = self.ctl.submit_many(list(request.jobs), owner=self._who(context)[1])
        quota = sum(1 for i in items if i.error and QUOTA_KEY in i.error)  # a file past the pending-jobs limit
        if quota:
            self.count_refused("SubmitMany", "quota", quota)
        return pb.SubmitManyReply(results=[pb.SubmitResult(job_ids=i.job_ids, duplicate=i.duplicate, error=i.error)
                                           for i in items])

    @_timed
    def ListJobs(self, request, context):
        jobs, token = self.ctl.jobs_page(request.page_size, request.page_token, owner=self._owner_filter(context),
                                         filters=request)
        mark_pilot_jobs(jobs, self.source.view())
        return pb.ListJobsReply(jobs=jobs, next_page_token=token)

    @_timed
    def Cancel(self, request, context):
        ok, msg = self.ctl.cancel(request.job_id, owner=self._owner_filter(context))
        return pb.CancelReply(cancelled=ok, message=msg)

    @_timed
    def ListWorkers(self, request, context):
        workers, token = self.ctl.workers_page(request.page_size, request.page_token)
        reply = pb.ListWorkersReply(workers=workers, next_page_token=token)
        view = self.source.view()
        mark_pilot_workers(reply.workers, view)
        if request.with_nodes and not request.page_token:
            reply.node_source = view.name
            if view.nodes:
                reply.nodes_time = view.time
                reply.nodes.extend(pb.SourceNode(node=n, use=use, source_job_id=job)
                                   for n, (use, job) in view.nodes.items())
        return reply

    @_timed
    def Leave(self, request, context):
        return self.ctl.leave(request)


def mark_pilot_workers(workers, view: SourceView) -> None:
    """Fill the pilot fields of ``WorkerInfo`` rows from the node source's view: its workers now, and those that
    left (state ``GONE``) that it or a predecessor on this state had."""
    for w in workers:
        if w.worker_id in view.workers:
            w.source_job_id, w.source_node, w.pilot_state = view.workers[w.worker_id]
            w.pilot = True


def mark_pilot_jobs(jobs, view: SourceView) -> None:
    """``JobInfo.pilot_jobs``: the batch jobs (Slurm's, PBS's) of the node source's workers among each job's workers."""
    for j in jobs:
        j.pilot_jobs.extend(view.workers[w][0] for w in j.workers if w in view.workers)


class ControllerServer:
    """A running controller; ``start`` returns once it listens, ``stop`` ends it."""

    def __init__(self, cfg: ControllerConfig, max_workers: int = 48, method_pools: dict[str, int] | None = None) \
            -> None:
        """``max_workers``: server threads. Queries hold at most QUERY_SLOTS + QUERY_QUEUE (16) of them, so at
        least 32 are left for heartbeats and submits however many listings arrive. ``method_pools``: methods run in
        thread pools of their own (method -> threads; an experiment, none by default: ``method_pools``)."""
        self.cfg = cfg
        self.roles = _roles(cfg)
        host, port = parse_address(cfg.listen, "listen")
        _check_open_listen(host, bool(self.roles), cfg.insecure)
        floor = parse_floor(cfg.state_min_free)
        check_at_start(cfg.state, floor)  # before the store writes anything on a disk that is already full
        self.ctl = Controller(cfg)
        self.auth = TokenInterceptor(tokens=self.roles, users=cfg.user_tokens) if self.roles else None
        self.credentials = WorkerCredentials()  # after the tokens: only an authenticated call gets this far
        self.disk = DiskGuard(cfg.state, floor)
        self.timings = RpcTimings()
        # first: it wraps what the others return, and stamps each call's arrival (method_pools: "<Method> (queued)")
        self.pools = MethodPools(method_pools or {}, self.timings.add)
        interceptors = [i for i in (self.pools, self.auth, self.credentials, self.disk) if i is not None]
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), interceptors=interceptors)
        self.service = _Service(self.ctl, self.timings, self.auth, cfg.own_jobs_only)
        self.ctl.on_step = self.timings.add  # scheduling steps' durations beside the RPCs' (rpc_stats_file)
        pb_grpc.add_ControllerServicer_to_server(self.service, self.server)
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if cfg.tls_cert and cfg.tls_key:
            bound = self.server.add_secure_port(target, server_credentials(cfg.tls_cert, cfg.tls_key))
        else:
            bound = self.server.add_insecure_port(target)
        if not bound:
            raise InputError("listen", f"cannot bind {cfg.listen}")
        # Orders pushed to workers (watch.py): its own asyncio server beside this thread-pool one, same host
        self.orders = OrdersHub(self.credentials, host, server_credentials(cfg.tls_cert, cfg.tls_key)
                                if cfg.tls_cert and cfg.tls_key else None)
        # lease renewals answered by a process of its own (lease.py); without it every heartbeat comes here
        self.leases = LeaseTable() if cfg.lease_server else None
        if self.leases is not None:
            self.leases.process = LeaseProcess(self.leases.shared.fd, self.leases.shared.slots, host,
                                               (cfg.tls_cert, cfg.tls_key) if cfg.tls_cert and cfg.tls_key else None,
                                               wake_fd=self.leases.wake_r)
            self.ctl.leases = self.leases
            self.credentials.on_issue, self.credentials.on_forget = self._lease_issued, self.leases.release
        self.address = f"{host}:{bound}"
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self.ctl.run_forever, args=(self._stop,), daemon=True, name="scheduler")
        self._switch_interval: float | None = None
        self.source: NodeSource = StaticNodeSource()
        self._backups = threading.Thread(target=self._backup_loop, daemon=True, name="backups") \
            if cfg.backup_dir else None
        self.ops = None  # metrics_listen: /metrics and the status page (bound now: a taken port fails the start)
        if cfg.metrics_listen:
            from hpcsched.runtime.metrics_http import OpsServer  # prometheus_client only where it is used

            try:
                self.ops = OpsServer(self, cfg.metrics_listen, cfg.metrics_address_file)
            except InputError:  # nothing has started: give the state back (its owner lock included)
                self.ctl.store.close()
                raise

    def start(self) -> str:
        self._switch_interval = sys.getswitchinterval()  # restored at stop (tests run controllers in-process)
        sys.setswitchinterval(_SWITCH_INTERVAL_S)
        self.ctl.store.start_checkpointer()
        gc.collect()
        gc.freeze()  # unfrozen at stop
        self.service.watch_port = self.orders.start()  # before the first Register, whose reply names it
        if self.leases is not None:  # its port is named in replies once it listens (until then: heartbeats only)
            self.leases.process.start()
            self.leases.close_wake_reader()  # the lease server holds its own copy now
        self.ctl.nudge = self._nudge
        self.server.start()
        self.ctl.started()
        self._loop.start()
        if self._backups is not None:
            self._backups.start()
        # node_source (hpcsched.runtime.node_source): slurm harvests idle nodes with pilot jobs; static does nothing
        self.source = build(self.cfg.source_name(), self.cfg.pilots,
                            ControllerDemand(self.ctl), reachable(self.address),
                            self.cfg.worker_token or self.cfg.token, self.cfg.state)
        self.service.source = self.source
        self.ctl.arriving = self.source.arriving
        self.source.start()
        if self.ops is not None:
            self.ops.start()
        log.info("controller listening on %s (auth %s, TLS %s, policy %s, state %s)", self.address,
                 ("roles " + ", ".join(sorted(self.roles)) if len(self.roles) > 1 else "one token") if self.roles
                 else "OFF", "on" if self.cfg.tls_cert else "off",
                 self.cfg.policy if self.cfg.executor != "rounds"
                 else f"{self.cfg.hetero_policy} in Gavel's rounds of {self.cfg.round_s:g} s", self.cfg.state)
        if not self.roles and not is_loopback_host(self.address.rpartition(":")[0].strip("[]")):
            log.warning("INSECURE (--insecure): no tokens on %s, which is not loopback: anyone who can reach it can "
                        "submit jobs, which run as the workers' user, and act as a worker. Set token_file and "
                        "worker_token_file in the controller config", self.address)
        if set(self.roles) - {READONLY} == {ADMIN}:
            log.warning("one token for every role: whoever can submit jobs can also act as a worker (heartbeats, "
                        "Leave, Register); set worker_token_file (and admin_token_file) in the controller config")
        if self.cfg.address_file:  # last: whoever waits on it finds a controller that has started and said so
            _write_atomic(self.cfg.address_file, self.address + "\n")
        return self.address

    def _nudge(self, workers, reason: str) -> None:
        """Tell workers they have new orders: pushed by the lease server on their subscribed lease connections, said
        in their next renewal's reply, and on their Watch stream for those that watch (workers without a lease slot,
        and older workers that watch although they have one)."""
        ids = list(workers)
        if self.leases is None:
            self.orders.nudge(ids, reason)
            return
        unslotted = set(self.leases.want(ids, push=True))
        self.orders.nudge([w for w in ids if w in unslotted or self.orders.watching(w)], reason)

    def _lease_issued(self, worker_id: str, instance: str, credential: str, reply: pb.RegisterReply) -> None:
        """A registration's slot in the lease table, named in its reply with the lease server's port (none while
        the lease server is not listening, or the table is full: that worker beats the controller)."""
        port = self.leases.port if self.leases is not None else 0
        if not port:
            return
        slot = self.leases.assign(worker_id, instance, credential, now_ns())
        if slot >= 0:
            reply.lease_port, reply.lease_slot = port, slot

    def _backup_loop(self) -> None:
        """A backup at start (the state as this controller found it), then every ``backup_interval_s``. A failed
        backup is logged as an error and tried again at the next interval; it never stops the controller."""
        assert self.cfg.backup_dir is not None
        while True:
            try:
                dest = backup(self.cfg.state, self.cfg.backup_dir, self.cfg.backup_keep)
                log.info("state backed up to %s", dest)
            except Exception as e:  # disk full, permissions: say so, keep running
                log.error("state backup into %s failed: %s", self.cfg.backup_dir, e)
            if self._stop.wait(self.cfg.backup_interval_s):
                return

    def wait(self) -> None:
        self.server.wait_for_termination()

    def stop(self) -> None:
        if self.ops is not None:  # first: a scrape reads the store this closes
            self.ops.stop()
        self.source.stop()  # its workers leave through this server
        self._stop.set()
        self.ctl.wakeup.set()
        self.server.stop(grace=1).wait()
        self.pools.shutdown()
        self.orders.stop()
        self._loop.join(timeout=5)
        if self.leases is not None:
            self.leases.process.stop()
        if self._backups is not None:
            self._backups.join(timeout=30)
        self.ctl.batches.close()  # queued step-time fits dropped (their reports are in the store); a running one ends
        self.ctl.store.close()
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            gc.unfreeze()
        stats = self.timings.summary()
        for method, st in sorted(stats.items()):
            log.info("rpc %s: %d calls, handler p50 %.2f ms, p99 %.2f ms, max %.1f ms", method, st["calls"],
                     st["p50_ms"], st["p99_ms"], st["max_ms"])
        counters = self.ctl.counters() | self.orders.counters() | {"expired_calls": self.service.expired}
        if self.leases is not None:
            counters |= self.leases.counters()
            self.leases.close()
        log.info("controller: %s", ", ".join(f"{k} {v:g}" for k, v in counters.items() if not k.startswith("refused")))
        if counters["refused_task_reports"] or counters["refused_heartbeats"]:  # a forged or broken worker: say so
            log.warning("controller refused %d task reports (not placed on their worker) and %d oversized heartbeats",
                        counters["refused_task_reports"], counters["refused_heartbeats"])
        if self.cfg.rpc_stats_file:
            _write_atomic(self.cfg.rpc_stats_file, json.dumps(stats | {"controller": counters}, indent=1) + "\n")


def backup(store_path: Path, backup_dir: Path, keep: int) -> Path:
    """One online copy of the state into ``backup_dir`` (``state-YYYYmmdd-HHMMSS.db``, 0600), keeping the newest
    ``keep``: what an operator restores when the state is damaged (docs/runtime.md, operations)."""
    from hpcsched.runtime.store import Store

    name = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    dest = backup_dir / f"{store_path.stem}-{name}.db"
    reader = Store(store_path, query_only=True)
    try:
        reader.backup_to(dest)
    finally:
        reader.close()
    old = sorted(backup_dir.glob(f"{store_path.stem}-*.db"))
    for p in old[:-keep] if keep > 0 else []:
        p.unlink(missing_ok=True)
    return dest


def _roles(cfg: ControllerConfig) -> dict[str, str]:
    """role -> token. ``token`` alone: the one token holds every role (the set-up before roles; logged at start).
    ``readonly_token`` adds the read-only role to either set-up."""
    if cfg.worker_token or cfg.admin_token or cfg.user_tokens:
        roles = {role: t for role, t in ((USER, cfg.token), (WORKER, cfg.worker_token), (ADMIN, cfg.admin_token))
                 if t}
    else:
        roles = {ADMIN: cfg.token} if cfg.token else {}
    if cfg.readonly_token and roles:
        roles[READONLY] = cfg.readonly_token
    return roles


def _check_open_listen(host: str, tokens: bool, insecure: bool) -> None:
    """A controller without tokens runs any command anyone sends it, as the workers' user: allowed on loopback (the
    quick start), refused elsewhere unless the operator says ``--insecure`` (then warned about at every start)."""
    if tokens or insecure or is_loopback_host(host):
        return
    raise InputError("listen", f"{host} is not a loopback address and no token is set: anyone who can reach it could "
                               "run commands as the workers' user. Set token_file (and worker_token_file) in the "
                               "controller config, listen on 127.0.0.1, or pass --insecure to accept the risk")


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
