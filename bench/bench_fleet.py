"""Fleet benchmark (issue 25): one real controller against N simulated workers speaking the real gRPC protocol.

A real ``hpcsched controller`` process (static node source, fifo unless --policy, one token, config in a temporary
directory, port 0) and --workers simulated worker daemons (bench/fleet_worker.py: register, heartbeat at the interval
the controller gives, run the LaunchTasks they get as simulated tasks that report progress every --iteration-s and
exit 0 at their last step, obey KillTask and forget, Leave at the end) in a few harness processes (asyncio +
grpc.aio). Once every worker has registered, --jobs jobs (1..--max-procs processes, --elastic-frac of them elastic,
lasting about --job-seconds each) are submitted through the real Submit RPC (or SubmitMany batches when the
controller has it), and the fleet runs --duration seconds from the first submit. --pending N first queues N jobs no
worker can run (a GPU type none has), to see what a long queue costs the controller.

Printed (a table on stdout, progress on stderr) and written with --json: time until every worker registered,
re-registrations, heartbeat latency p50/p90/p99/max (client side, after registration), submit throughput, submit ->
launch-order latency p50/p99, job states after --duration, controller CPU (% of one core, /proc/PID/stat) and peak
RSS (VmHWM), the harness processes' own CPU and event-loop lag (a harness process near 100% of a core means the
harness, not the controller, is the bottleneck: add --procs), and the load average at start and end.

Examples:
    .venv/bin/python bench/bench_fleet.py --workers 1000 --jobs 500 --duration 60 --json /tmp/fleet-1000.json
    .venv/bin/python bench/bench_fleet.py --workers 1000 --jobs 500 --duration 60 --pending 20000
    .venv/bin/python bench/bench_fleet.py --workers 4392 --jobs 2000 --job-seconds 10 --duration 120  # Theta
The last lines check issue 25's "done when" (bench/fleet_goals.py; ``done_when`` in the JSON); the CPU goal needs
--baseline, the JSON of a run at another fleet size with the same --jobs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleet_goals  # noqa: E402
from fleet import PENDING_KINDS, FleetOptions, run_fleet  # noqa: E402


def table(r: dict) -> str:
    """The figures as a two-column table (plain text: fits 80 columns)."""
    def ms(q: dict) -> str:
        if not q.get("n"):
            return "none"
        return f"{q['p50_ms']:.0f} / {q['p90_ms']:.0f} / {q['p99_ms']:.0f} / {q['max_ms']:.0f} ms (n={q['n']})"

    reg, hb, sub, s2l, ja = r["registration"], r["heartbeat"], r["submit"], r["submit_to_launch"], r["jobs_after"]
    ctl, h = r["controller"], r["harness"]
    rows = [
        ("workers", f"{r['workers']} x {r['options']['slots']} slots, {r['harness_processes']} harness processes"
                    + ("" if r["harness"]["processes_reported"] == r["harness_processes"] else
                       f" (ONLY {r['harness']['processes_reported']} SENT THEIR FIGURES: the rest are missing below)")),
        ("channels", r["channels"]),
        ("all registered after", f"{reg['all_registered_s']} s" if reg["all_registered_s"] is not None
         else f"NOT ALL: {reg['registered']} (last at {reg['last_registered_s']} s)"),
        ("re-registrations", f"{reg['reregistrations']} ({reg['reregister_replies']} reregister replies)"),
        ("register p50/p90/p99/max", ms(reg["register_latency"])),
        ("heartbeat p50/p90/p99/max", ms(hb)),
        ("heartbeats/s, interval(s)",
         f"{hb['per_s']}, {', '.join(f'{k} s x{v}' for k, v in hb['intervals_s'].items())}"),
        ("  renewals (lease server)", ms(hb["renewals"])),
        ("  connecting to it (apart)", ms(hb["lease_connect"])),
        ("  heartbeats to the controller", ms(hb["to_controller"])),
        ("lease lapses", str(hb["lease_lapses"]) + (f"; {hb['lease_fallbacks']} renewals failed (sent to the "
                                                    "controller)" if hb["lease_fallbacks"] else "")),
        ("orders watch", f"{r['watch']['streams_opened']} streams opened, {r['watch']['events']} events"
                         if r["options"]["watch"] else "off (--no-watch): orders with heartbeats only"),
        ("orders pushed (lease)", f"{r['watch'].get('lease_subscriptions', 0)} lease connections subscribed, "
                                  f"{r['watch'].get('lease_pushes', 0)} pushes"),
        ("rpc errors", ", ".join(f"{k}: {v}" for k, v in r["rpc_errors"].items()) or "none"),
        ("submit", f"{sub['jobs']} jobs in {sub['seconds']} s = {sub['jobs_per_s']} jobs/s via {r['submit_rpc']}"
                   + (f"; failed {sub['failed']}" if sub["failed"] else "")),
    ]
    if "pending_submit" in r:
        ps = r["pending_submit"]
        rows.append(("queued unrunnable", f"{ps['jobs']} jobs at {ps['jobs_per_s']} jobs/s"))
    rows += [
        ("submit->launch p50/p90/p99/max", ms(s2l) + (f", {s2l['never_launched']} never launched"
                                                       if s2l["never_launched"] else "")),
        (f"jobs done after {ja['elapsed_s']:g} s", f"{ja['done_at_end']} of {sub['jobs']} (their last step reported)"),
        (f"job states {ja['states_listed_after_s']:g} s later",
         ", ".join(f"{k} {v}" for k, v in ja["states"].items()) + " (the controller's listing)"),
        ("last job done (harness)", f"{ja['last_done_s']} s after the first submit ({ja['harness_saw_done']} seen)"),
        ("controller CPU", f"{ctl['cpu_pct']}% of a core ({ctl['cpu_s']} s over {ctl['window_s']} s)"
                           + (f"; of it the lease server {ctl['lease_server_cpu_pct']}% (peak RSS "
                              f"{ctl['lease_server_peak_rss_mb']} MB)" if "lease_server_cpu_pct" in ctl else "")),
        ("  registration storm", f"{ctl['registration_cpu_s']} CPU s over {ctl['registration_window_s']} s, "
                                 f"{ctl['registration_cpu_ms_each']} ms per registration"),
        ("  job churn after it", f"{ctl['churn_cpu_pct']}% of a core over {ctl['churn_window_s']} s"),
        ("controller peak RSS", f"{ctl['peak_rss_mb']} MB"),
        ("harness CPU", f"{h['cpu_pct_total']}% of a core in all, busiest process {h['cpu_pct_max_process']}%"),
        ("harness loop lag p50/p99/max", ms(h["loop_lag"])),
        ("leave", f"{h['leaves_said']} of {reg['registered']} workers said goodbye in {h['leave_s']} s; "
                  f"{h['workers_alive_after_leave']} still alive to the controller"),
        ("load start / end", f"{r['load_start']} / {r['load_end']}"),
    ]
    if "metrics_listener" in r:
        m = r["metrics_listener"]
        rows += [("/metrics scrapes", f"{m['scrapes']} every {m['every_s']:g} s ({m['errors']} failed), wall p50 "
                                      f"{m['scrape_wall_s_p50']} s, max {m['scrape_wall_s_max']} s"),
                 ("/metrics last read", m["final_read"]),
                 ("/metrics CPU", f"{m['cpu_ms_per_scrape']} ms a scrape, {m['cpu_ms_per_sample']} ms a plot sample: "
                                  f"{m['cpu_pct_of_core_at_15s']}% of a core at one of each every 15 s")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = FleetOptions()
    ap.add_argument("--workers", type=int, default=d.workers, help="simulated worker daemons (default %(default)s)")
    ap.add_argument("--jobs", type=int, default=d.jobs, help="jobs submitted once all are registered (%(default)s)")
    ap.add_argument("--duration", type=float, default=d.duration,
                    help="seconds from the first submit to the count of jobs done (%(default)s)")
    ap.add_argument("--slots", type=int, default=d.slots, help="slots per worker (%(default)s)")
    ap.add_argument("--pending", type=int, default=d.pending,
                    help="jobs no worker can run, queued before the workers start (%(default)s)")
    ap.add_argument("--typed-workers", type=int, default=d.typed_workers,
                    help="workers that advertise the queued jobs' GPU type: they drain a --pending-kind mix backlog "
                         "(%(default)s)")
    ap.add_argument("--pending-kind", choices=PENDING_KINDS, default=d.pending_kind,
                    help="why the --pending jobs cannot run: a GPU type no worker has, a launcher none has "
                         "(mpirun), or more processes than the fleet holds; mix: the runnable jobs' mix of sizes "
                         "(some elastic) of a GPU type only --typed-workers have (%(default)s)")
    ap.add_argument("--procs", type=int, default=d.procs,
                    help="harness processes (0: one per 1,000 workers, at most 4; default %(default)s)")
    ap.add_argument("--channels", type=int, default=d.channels,
                    help="gRPC channels per harness process, workers multiplexed over them (0: one per worker, "
                         "each its own TCP connection, as real daemons; default %(default)s)")
    ap.add_argument("--job-seconds", type=float, default=d.job_seconds,
                    help="a job's mean run time once started, 0.5x-1.5x (%(default)s)")
    ap.add_argument("--iteration-s", type=float, default=d.iteration_s, help="seconds per simulated step (%(default)s)")
    ap.add_argument("--startup-s", type=float, default=d.startup_s,
                    help="a simulated task's start-up before its first report (%(default)s)")
    ap.add_argument("--max-procs", type=int, default=d.max_procs, help="job sizes 1..this (%(default)s)")
    ap.add_argument("--elastic-frac", type=float, default=d.elastic_frac,
                    help="share of jobs with min_procs < max_procs (%(default)s)")
    ap.add_argument("--seed", type=int, default=d.seed, help="job mix seed (%(default)s)")
    ap.add_argument("--policy", default=d.policy, help="controller policy (%(default)s)")
    ap.add_argument("--heartbeat-interval", type=float, default=None, dest="heartbeat_interval_s",
                    help="controller heartbeat_interval_s (default: the controller's own)")
    ap.add_argument("--worker-timeout", type=float, default=None, dest="worker_timeout_s",
                    help="controller worker_timeout_s (default: the controller's own)")
    ap.add_argument("--schedule-interval", type=float, default=None, dest="schedule_interval_s",
                    help="controller schedule_interval_s (default: the controller's own)")
    ap.add_argument("--submit-concurrency", type=int, default=d.submit_concurrency,
                    help="submit calls in flight (%(default)s)")
    ap.add_argument("--submit-batch", type=int, default=d.submit_batch,
                    help="jobs per SubmitMany call when the controller has that RPC; 1: one Submit call per job, as "
                         "before SubmitMany (%(default)s)")
    ap.add_argument("--ramp-s", type=float, default=d.ramp_s,
                    help="spread the workers' start over this long (0: all at once, a registration storm)")
    ap.add_argument("--connect-ms", type=int, default=d.connect_ms,
                    help="an experiment: the workers' grpc.min_reconnect_backoff_ms, gRPC's minimum connect timeout "
                         "too, instead of the real worker's (gRPC's 20 s default; the worker had 200 ms until the "
                         "fleet runs showed a registration storm's connections failing). 0: the real worker's "
                         "options (default %(default)s)")
    ap.add_argument("--register-timeout", type=float, default=d.register_timeout,
                    help="give up waiting for every registration after this long; the jobs are submitted anyway "
                         "(%(default)s)")
    ap.add_argument("--until-done", action="store_true",
                    help="end as soon as every submitted job has reached its last step (at most --duration)")
    ap.add_argument("--scrape-s", type=float, default=d.scrape_s,
                    help="serve /metrics (metrics_listen) and scrape it every this many seconds, as Prometheus "
                         "would; the listener's CPU is reported (0: no listener, the default)")
    ap.add_argument("--no-lease", dest="lease", action="store_false",
                    help="no lease server (controller lease_server: false): every heartbeat goes to the controller")
    ap.add_argument("--no-watch", dest="watch", action="store_false",
                    help="workers do not open Orders.Watch: launch orders come with heartbeats only (older workers)")
    ap.add_argument("--watch-share", type=int, default=d.watch_share,
                    help="workers whose Watch streams share one channel (0: a connection each, as real workers; "
                         "10,000 workers then need 20,000 descriptors in the controller) (%(default)s)")
    ap.add_argument("--sample-controller", default="", metavar="FILE",
                    help="run the controller under bench/stack_sampler.py, its report (JSON) into FILE")
    ap.add_argument("--json", type=Path, help="write every figure here as JSON")
    ap.add_argument("--baseline", type=Path, metavar="RUN.json",
                    help="a run's --json at another fleet size (same --jobs): the CPU goal compares against it")
    ap.add_argument("--keep", type=Path, help="copy the controller's directory (config, log, state) here")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    a = ap.parse_args(argv)
    if a.workers < 1 or a.jobs < 0 or a.duration <= 0 or a.slots < 1 or a.iteration_s <= 0 or a.max_procs < 1:
        ap.error("need --workers >= 1, --jobs >= 0, --duration > 0, --slots >= 1, --iteration-s > 0, --max-procs >= 1")
    opts = FleetOptions(**{k: getattr(a, k) for k in FleetOptions.__dataclass_fields__})
    try:
        baseline = json.loads(a.baseline.read_text()) if a.baseline else None
    except (OSError, ValueError) as e:
        ap.error(f"--baseline {a.baseline}: {e}")
    r = run_fleet(opts, a.keep)
    r["done_when"] = fleet_goals.goals(r, baseline)
    print(table(r))
    print(fleet_goals.table(r["done_when"]))
    if a.json:
        a.json.write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
