"""The controller's Prometheus series, collected when scraped (``ControllerCollector``).

Why a custom collector and not gauges kept up to date: a controller at 10,000 workers handles hundreds of
heartbeats a second, and updating a gauge at each would put that cost on every one; read at a scrape (every 15 s
or so) from the state already in memory, the cost is per scrape and the heartbeat path is unchanged. Counters that
the controller already keeps (refusals, non-optimal decisions) are read as they are; the totals over the state
(submits, preemptions, lost steps, harvested node-hours) are tailed from it (``ops_tally``).

Latency histograms come from the server's per-method timings (``server.RpcTimings``: 5%-wide buckets from 10 us to
100 s), summed into Prometheus' buckets below at each scrape: a bucket's count is exact to within one of those 5%
buckets (an observation in the fine bucket that straddles an edge is counted above it).

Every series is named ``hpcsched_*``; docs/runtime.md lists them and docs/grafana-dashboard.json plots them.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from hpcsched.runtime.ops_snapshot import PoolReader, node_use_class
from hpcsched.runtime.ops_tally import StateTally

if TYPE_CHECKING:
    from hpcsched.runtime.server import ControllerServer

# Upper edges of the latency histograms (seconds): a heartbeat is ~0.2 ms, a scheduling step up to seconds.
BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
JOB_STATES = ("pending", "running", "stopping", "completed", "failed", "cancelled")


def histogram_buckets(edges: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Cumulative Prometheus buckets (``BUCKETS_S`` and +Inf) from fine per-bucket ``counts`` with upper ``edges``."""
    cumulative, total = [], 0
    for c in counts:
        total += c
        cumulative.append(total)
    out = []
    for le in BUCKETS_S:
        k = bisect.bisect_right(edges, le * (1 + 1e-9))  # fine buckets whose upper edge is within this one
        out.append((repr(le), float(cumulative[k - 1]) if k else 0.0))
    out.append(("+Inf", float(total)))
    return out


class ListenerCost:
    """CPU seconds the metrics listener's threads spent (scrapes, pages, utilisation samples), each measured on its
    own thread's CPU clock (``time.thread_time``): the endpoint's cost to the controller, exported so that it can be
    watched where it runs (the 1%-of-a-core budget at 10,000 workers; bench/bench_fleet.py --scrape-s)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cpu_s: dict[str, float] = {}
        self.requests: dict[str, int] = {}

    def add(self, what: str, cpu_s: float) -> None:
        with self._lock:
            self.cpu_s[what] = self.cpu_s.get(what, 0.0) + cpu_s
            self.requests[what] = self.requests.get(what, 0) + 1

    def read(self) -> tuple[dict[str, float], dict[str, int]]:
        with self._lock:
            return dict(self.cpu_s), dict(self.requests)


class ControllerCollector(Collector):
    """The series of one controller server (module docstring). Scrapes are serialised: two at once would only
    double the work."""

    def __init__(self, server: ControllerServer) -> None:
        self.server = server
        self.pool = PoolReader(server)
        self.tally = StateTally(server.ctl.store.reader())
        self._lock = threading.Lock()
        self.cost = ListenerCost()
        self.last_collect_s = 0.0
        self._pool_time = time.time()  # the previous scrape's own time (exported: the endpoint's cost)

    def close(self) -> None:
        self.tally.close()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            t0 = time.perf_counter()
            metrics = self._metrics()
            self.last_collect_s = time.perf_counter() - t0
        yield from metrics
        cpu, requests = self.cost.read()
        c = CounterMetricFamily("hpcsched_metrics_cpu_seconds", "CPU seconds the metrics listener's threads spent, by "
                                "what (metrics: scrapes, page: the status page, sample: the plot's samples); this "
                                "scrape's own not yet counted", labels=["what"])
        n = CounterMetricFamily("hpcsched_metrics_requests", "Requests served (or samples taken) by the metrics "
                                "listener, by what", labels=["what"])
        for what in ("metrics", "page", "sample"):
            c.add_metric([what], cpu.get(what, 0.0))
            n.add_metric([what], requests.get(what, 0))
        yield c
        yield n
        g = GaugeMetricFamily("hpcsched_pool_age_seconds", "Age of the pool figures (workers, pilots, slots) in "
                              "this scrape: near 0, unless the controller's lock was busy past 1 s and the "
                              "previous reading was served")
        g.add_metric([], max(0.0, time.time() - self._pool_time))
        yield g
        c = CounterMetricFamily("hpcsched_metrics_stale_reads", "Scrapes that served the previous pool reading "
                                "because the controller's lock was busy")
        c.add_metric([], self.pool.stale_reads)
        yield c
        g = GaugeMetricFamily("hpcsched_metrics_collect_seconds", "Seconds the previous scrape of this endpoint "
                              "took to collect (its cost to the controller)")
        g.add_metric([], self.last_collect_s)
        yield g

    def _metrics(self) -> list[Metric]:
        srv, ctl = self.server, self.server.ctl
        pool = self.pool.read()
        self._pool_time = pool.time
        totals = self.tally.read(time.time())
        out: list[Metric] = []

        workers = GaugeMetricFamily("hpcsched_workers", "Workers the state knows, by state (lost: not heard, "
                                    "lost or left, as `hpcsched workers` says; hpcsched_worker_losses_total "
                                    "counts the losses)", labels=["state"])
        for state, n in pool.workers_by_state.items():
            workers.add_metric([state], n)
        out.append(workers)
        pilots = GaugeMetricFamily("hpcsched_pilots", "Pilot jobs of the node source (slurm), by their external "
                                   "state (pending, running, ...); none with node_source static", labels=["state"])
        for state, n in sorted(pool.pilots_by_state.items()):
            pilots.add_metric([state], n)
        out.append(pilots)
        nodes = GaugeMetricFamily("hpcsched_source_nodes", "Nodes the node source sees, by what each does for the "
                                  "controller or why it is not used (the text's first words)", labels=["use"])
        uses: dict[str, int] = {}
        for use, _ in pool.nodes.values():
            uses[node_use_class(use)] = uses.get(node_use_class(use), 0) + 1
        for use, n in sorted(uses.items()):
            nodes.add_metric([use], n)
        out.append(nodes)
        jobs = GaugeMetricFamily("hpcsched_jobs", "Jobs by state", labels=["state"])
        for state in JOB_STATES:
            jobs.add_metric([state], totals.jobs_by_state.get(state, 0))
        out.append(jobs)
        slots = GaugeMetricFamily("hpcsched_slots", "Slots of the live workers (alive or leaving), used or free",
                                  labels=["kind"])
        slots.add_metric(["used"], pool.slots_used)
        slots.add_metric(["free"], pool.slots_total - pool.slots_used)
        out.append(slots)

        for name, method, doc in (
                ("hpcsched_heartbeat_seconds", "Heartbeat", "Heartbeat handler time, lock wait included"),
                ("hpcsched_decision_seconds", "scheduling_step", "Scheduling steps that planned: their time"),
                ("hpcsched_quiet_step_seconds", "quiet_step", "Scheduling steps with nothing to plan: their time")):
            edges, counts, total_s = srv.timings.histogram(method)
            h = HistogramMetricFamily(name, doc)
            h.add_metric([], histogram_buckets(edges, counts), total_s)
            out.append(h)

        for name, value, doc in (
                ("hpcsched_submitted_jobs", totals.submitted, "Jobs submitted (stored) over the state's life"),
                ("hpcsched_preemptions", totals.preemptions, "Job stops for a preemption (a worker or pilot leaving "
                 "or preempted), not for a pilot this controller cancelled"),
                ("hpcsched_lost_steps", totals.lost_steps, "Steps lost past the last checkpoint, summed over every "
                 "restart of a job"),
                ("hpcsched_harvested_node_hours", totals.harvested_node_hours, "Node-hours held by pilot jobs "
                 "(harvested idle nodes), running ones counted to now"),
                ("hpcsched_worker_losses", totals.workers_lost, "Workers lost: silent past worker_timeout_s, their "
                 "tasks fenced (over the state's life)"),
                ("hpcsched_worker_leaves", totals.workers_left, "Workers that left (a final Leave; over the state's "
                 "life)"),
                ("hpcsched_nonoptimal_decisions", ctl.nonoptimal_decisions, "Scheduling steps whose MILP sizing was "
                 "not optimal (since this controller started)"),
                ("hpcsched_shrunk_to_fit", ctl.shrunk_to_fit, "Elastic jobs started below the size they were "
                 "sized to, no placement fitting that size (shrink_to_fit; since start)"),
                ("hpcsched_grows_waited", ctl.grows_waited, "In-place grows of elastic jobs that waited for slots "
                 "stopping jobs held instead of a stop and relaunch (since start)"),
                ("hpcsched_refused_heartbeats", ctl.refused_heartbeats, "Heartbeats refused unprocessed (more "
                 "entries than the worker's slots allow; since start)"),
                ("hpcsched_refused_task_reports", ctl.refused_reports, "Task reports refused: not placed on the "
                 "reporting worker, or another job's (since start)")):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            out.append(c)
        out += liveness_metrics(srv)
        refused = CounterMetricFamily("hpcsched_refused_requests", "Calls (or SubmitMany files) refused for a "
                                      "limit: quota (max_pending_per_user), busy (query slots), disk_full; since "
                                      "start", labels=["method", "reason"])
        for (method, reason), n in sorted(srv.service.refusals().items()):
            refused.add_metric([method, reason], n)
        out.append(refused)
        return out


def liveness_metrics(srv: ControllerServer) -> list[Metric]:
    """How liveness and registration hold up at scale, read from counters kept in memory (no lock): the lease
    server (up, renewals, refusals, slots, a full table, exits), the pushed-orders streams, registrations committed
    in groups and calls shed. Why exported: at thousands of workers these say whether workers renew where they
    should (the lease server) and whether a storm is being shed, before heartbeats go late."""
    ctl = srv.ctl
    out: list[Metric] = []

    def one(family: type[CounterMetricFamily] | type[GaugeMetricFamily], name: str, doc: str, value: float) -> None:
        m = family(name, doc)
        m.add_metric([], value)
        out.append(m)

    leases = srv.leases
    up = leases is not None and leases.process is not None and leases.process.check()
    one(GaugeMetricFamily, "hpcsched_lease_server_up", "1 while the lease server runs; 0 when it is off "
        "(lease_server: false) or exited (workers then renew at the controller's heartbeats)", int(up))
    lc = leases.counters() if leases is not None else {}
    for key, doc in (("lease_renewals", "Lease renewals the lease server answered"),
                     ("lease_refused", "Renewals the lease server refused (a slot not holding that worker's "
                      "registration: lost, left or registered anew)"),
                     ("lease_table_full", "Registrations given no lease slot because the table was full (they "
                      "renew at the controller)"),
                     ("lease_server_exits", "Times the lease server exited without being stopped"),
                     ("lease_pushes", "Orders pushed on workers' subscribed lease connections"),
                     ("lease_subscriptions", "Lease connections subscribed to pushes"),
                     ("lease_push_unsubscribed", "Wake-ups for a worker with no subscribed lease connection (it "
                      "hears of its orders at its next renewal or heartbeat)"),
                     ("lease_wakeups_dropped", "Wake-ups the controller could not hand the lease server (a full "
                      "pipe, or no lease server): those workers hear of their orders at their next beat")):
        one(CounterMetricFamily, f"hpcsched_{key}", doc + " (since start)", lc.get(key, 0))
    one(GaugeMetricFamily, "hpcsched_lease_slots_used", "Lease slots held by registered workers",
        lc.get("lease_slots_used", 0))
    one(GaugeMetricFamily, "hpcsched_lease_subscribed", "Workers whose lease connection is subscribed to pushes now",
        lc.get("lease_subscribed", 0))
    oc = srv.orders.counters()
    one(GaugeMetricFamily, "hpcsched_orders_watching", "Workers with an Orders.Watch stream open now",
        oc["watching"])
    one(CounterMetricFamily, "hpcsched_orders_events", "Orders events sent on Watch streams (since start)",
        oc["watch_events_sent"])
    one(CounterMetricFamily, "hpcsched_register_groups", "Registration groups committed, one lock hold and one "
        "transaction each (since start)", ctl.registrations.groups)
    one(CounterMetricFamily, "hpcsched_registrations", "Registrations committed (since start)",
        ctl.registrations.committed)
    one(CounterMetricFamily, "hpcsched_lease_only_heartbeats", "Heartbeats the controller answered without its "
        "lock (nothing to reconcile; since start)", ctl.lease_only_beats)
    shed = CounterMetricFamily("hpcsched_shed_calls", "Calls refused at once because enough already waited "
                               "(RESOURCE_EXHAUSTED, the caller told when to come back), by method kind; since start",
                               labels=["kind"])
    shed.add_metric(["heartbeat"], ctl.shed_beats)
    shed.add_metric(["register"], ctl.registrations.refused)
    shed.add_metric(["other"], ctl.call_waiters.refused)
    out.append(shed)
    return out
