"""``hpcsched controller | worker | submit | jobs | cancel | workers | profile | backup``: run and use the runtime."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

# gRPC, yaml and rich are imported inside the commands: `hpcsched --help` and the daemons' start-up do not pay for
# what they do not use.
from hpcsched.errors import InputError

if TYPE_CHECKING:
    from hpcsched.runtime.rpc import pb

# The client commands share how they find and authenticate to the controller.
_CONTROLLER = typer.Option(None, "--controller",
                           help="controller HOST:PORT (else $HPCSCHED_CONTROLLER, else --address-file)")
_ADDRESS_FILE = typer.Option(None, "--address-file", help="file holding the controller's HOST:PORT")
_TOKEN_FILE = typer.Option(None, "--token-file", help="shared token (else $HPCSCHED_TOKEN)")
_TLS_CA = typer.Option(None, "--tls-ca", help="CA certificate: talk TLS to the controller")


def _logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _client(controller: str | None, address_file: Path | None, token_file: Path | None, tls_ca: Path | None):
    from hpcsched.runtime.client import Client, resolve_address, resolve_token

    return Client(resolve_address(controller, address_file), resolve_token(token_file), tls_ca)


def _fail(e: Exception) -> None:
    print(f"error: {e}", file=sys.stderr)
    raise typer.Exit(1)


def controller(
    config: Path = typer.Option(..., "--config", "-c", help="controller YAML (listen, state, token_file, policy...)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    insecure: bool = typer.Option(False, "--insecure", help="allow a controller without tokens on an address that "
                                  "is not loopback (anyone who reaches it runs commands as the workers' user); "
                                  "warned about at every start"),
) -> None:
    """Run the controller: scheduler, job API and state store. Stops on SIGINT/SIGTERM."""
    import dataclasses

    from hpcsched.runtime.config import read_controller_config
    from hpcsched.runtime.server import ControllerServer
    from hpcsched.runtime.stop_signal import until_signal

    _logging(verbose)
    cfg = dataclasses.replace(read_controller_config(config), insecure=insecure)
    srv = ControllerServer(cfg)
    stopping = until_signal()  # before start: a SIGTERM while starting stops it cleanly, its log said
    print(srv.start(), flush=True)  # the bound address: with port 0, this is how a script learns it
    stopping.wait()
    srv.stop()


def worker(
    controller: str = typer.Option(None, "--controller", help="controller HOST:PORT"),
    address_file: Path = typer.Option(None, "--address-file", help="file the controller writes its HOST:PORT to: "
                                      "read at start (without --controller) and again whenever the controller is "
                                      "unreachable (it restarted on a new port)"),
    config: Path = typer.Option(None, "--config", "-c", help="worker YAML (controller, name, slots, gpus, gpu_type, "
                                "token_file)"),
    name: str = typer.Option(None, "--name", help="worker id (default: the host name)"),
    slots: int = typer.Option(None, "--slots", help="processes this node runs at once (default: GPUs, else 1)"),
    gpus: int = typer.Option(None, "--gpus", help="GPUs offered (default: what torch sees)"),
    gpu_type: str = typer.Option(None, "--gpu-type", help="GPU type advertised to the controller, e.g. v100 (default: "
                                 "from nvidia-smi; cpu without GPUs; unknown when it cannot tell)"),
    host: str = typer.Option(None, "--host", help="address other nodes reach this node at (default: the address "
                             "its traffic to the controller leaves from; 127.0.0.1 for a controller on loopback)"),
    token_file: Path = typer.Option(None, "--token-file", help="shared token (else $HPCSCHED_TOKEN)"),
    tls_ca: Path = typer.Option(None, "--tls-ca", help="CA certificate: talk TLS to the controller"),
    work_dir: Path = typer.Option(None, "--work-dir", help="task logs and progress files"),
    stop_grace: float = typer.Option(None, "--stop-grace", help="on SIGTERM: seconds its tasks get to checkpoint "
                                     "before SIGKILL (default 30)"),
    orphan_timeout: float = typer.Option(None, "--orphan-timeout", help="leave (checkpoint and stop its tasks, "
                                         "exit) once the controller has been unreachable this many seconds "
                                         "(default: never; pilot jobs set it)"),
    run_as: str = typer.Option(None, "--run-as", help="run every task as this unprivileged local user (the worker "
                               "must be root)"),
    cgroups: str = typer.Option(None, "--cgroups", help="auto (a cgroup v2 leaf per task where writable, else "
                                "process groups + subreaper) or off"),
    task_python: Path = typer.Option(None, "--task-python", help="the Python tasks run under (default: the worker's "
                                     "own; give one the task users can run where that is private to root)"),
    token_fd: int = typer.Option(None, "--token-fd", hidden=True, help="the token on this inherited descriptor"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run a worker daemon for this node: registers, heartbeats, launches and kills tasks."""
    import socket

    from hpcsched.runtime import worker_start
    from hpcsched.runtime.client import resolve_token
    from hpcsched.runtime.worker import Worker
    from hpcsched.runtime.worker_config import WorkerConfig, read_worker_config

    worker_start.reexec_without_token(os.environ)  # returns only when the token is not in the environment
    _logging(verbose)
    file = read_worker_config(config) if config else {}
    flags = {"controller": controller, "name": name, "slots": slots, "gpus": gpus, "gpu_type": gpu_type, "host": host,
             "tls_ca": tls_ca, "work_dir": work_dir, "stop_grace_s": stop_grace, "address_file": address_file,
             "orphan_timeout_s": orphan_timeout, "run_as": run_as, "cgroups": cgroups,
             "task_python": task_python}
    kw = file | {k: v for k, v in flags.items() if v is not None}
    if kw.get("cgroups", "auto") not in ("auto", "off"):
        raise InputError("--cgroups", f"expected auto or off, got {kw['cgroups']!r}")
    token = resolve_token(token_file) if token_file else kw.pop("token", None) or resolve_token(None)
    if token_fd is not None:
        token = worker_start.read_token_fd(token_fd)
    kw.pop("token", None)
    os.environ.pop("HPCSCHED_TOKEN", None)  # read: no child of this daemon inherits it
    if not kw.get("controller") and kw.get("address_file"):
        from hpcsched.runtime.client import resolve_address

        kw["controller"] = resolve_address(None, kw["address_file"])
    if not kw.get("controller"):
        raise InputError(config, "no controller address: pass --controller HOST:PORT, --address-file FILE or set "
                                 "controller: in the file")
    if "gpus" not in kw:
        kw["gpus"] = _visible_gpus()
    kw.setdefault("slots", kw["gpus"] or 1)
    _gpu_type(kw, "--gpu-type" if gpu_type is not None else f"gpu_type: in {config}")
    kw.setdefault("name", socket.gethostname())
    if "host" not in kw:  # the node's address on the controller's network, not an assumed 127.0.0.1
        from hpcsched.runtime.hostaddr import address_towards

        kw["host"] = address_towards(kw["controller"])
    kw.setdefault("work_dir", Path("hpcsched-worker") / kw["name"])
    cfg = WorkerConfig(token=token, cpus=os.cpu_count() or 1, **kw)
    worker_start.check_node(cfg.work_dir, cfg.min_free_mb)
    try:
        daemon = Worker(cfg)
    except ValueError as e:  # an identity the config names (run_as, users) that cannot be used here
        raise InputError(config or "worker", str(e)) from None
    except OSError as e:  # its work dir, its agent's port
        raise InputError(cfg.work_dir, f"cannot start the worker: {e.strerror or e}") from None
    from hpcsched.runtime.stop_signal import until_signal

    daemon.run(until_signal())
    # Everything is said and every task has stopped (Worker.leave): skip the interpreter's teardown (thread joins,
    # gRPC's, the collector), 0.2-0.9 s on a loaded node. A pilot's node is free only once this process is gone:
    # that time is added to the start of the batch job that preempted it.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)


def _gpu_type(kw: dict, given_by: str) -> None:
    """Set ``kw["gpu_type"]``: the one given (checked, lower-cased), else detected; the worker log says which."""
    import logging

    from hpcsched.runtime import gputype
    from hpcsched.runtime.jobfile import gpu_type_name

    wlog = logging.getLogger("hpcsched.runtime.worker")
    if "gpu_type" in kw:
        try:
            kw["gpu_type"] = gpu_type_name(kw["gpu_type"])
        except ValueError as e:
            raise InputError(given_by, str(e)) from None
        wlog.info("GPU type %s (from %s)", kw["gpu_type"], given_by)
        return
    kw["gpu_type"], how = gputype.detect(kw["gpus"])
    (wlog.warning if kw["gpu_type"] == "unknown" else wlog.info)("GPU type %s (%s)", kw["gpu_type"], how)


def _visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def submit(
    job_files: list[Path] = typer.Argument(..., help="job YAML files: name, command, launcher, procs, min/max_procs, "
                                           "steps, env, array"),
    array: int = typer.Option(None, "--array", min=1, max=100_000, help="N jobs from each file (as `array: N` in "
                              "it, like sbatch --array=0-(N-1)): named NAME[i], with HPCSCHED_ARRAY_INDEX=i in their "
                              "env"),
    controller: str = _CONTROLLER,
    address_file: Path = _ADDRESS_FILE,
    token_file: Path = _TOKEN_FILE,
    tls_ca: Path = _TLS_CA,
    as_json: bool = typer.Option(False, "--json", help="print {job_id} as JSON (many files or an array: "
                                 "{results: [{file, job_ids, duplicate, error}], submitted, refused})"),
) -> None:
    """Submit training jobs; relative paths in a command resolve from its job file's folder.

    One file: one Submit, as before. Many files or an array: batches of up to 500 files in one SubmitMany call each;
    each file is validated and answered on its own (a bad file is reported, the others are still submitted), one
    line per file with its job ids. Exit status 1 when any file was refused."""
    from hpcsched.runtime.client import ClientError

    if len(job_files) == 1 and array is None:
        record = _prepared(job_files[0], None)[0]
        try:
            job_id = _client(controller, address_file, token_file, tls_ca).submit(record, str(job_files[0]))
        except ClientError as e:
            _fail(e)
        print(json.dumps({"job_id": job_id}) if as_json else job_id)
        return
    from concurrent.futures import ThreadPoolExecutor

    from hpcsched.runtime.client import BATCH_FILES

    c = _client(controller, address_file, token_file, tls_ca)
    results: dict[str, dict] = {}
    sent = []
    dirs: dict[tuple[str, str], str] = {}
    # Every file is checked here (file:line errors) before it is sent; a chunk is sent from a thread while the next
    # is checked, so the client's parsing and the controller's overlap (two processes, two cores).
    with ThreadPoolExecutor(1) as pool:
        chunk: list[tuple[str | pb.JobRecord, str, int]] = []
        for k, f in enumerate(job_files):
            try:
                record, n = _prepared(f, array, dirs)
                chunk.append((record, str(f), n))
            except InputError as e:
                results[str(f)] = {"file": str(f), "job_ids": [], "duplicate": False, "error": str(e)}
            if chunk and (len(chunk) >= BATCH_FILES or k == len(job_files) - 1):
                sent.append((chunk, pool.submit(c.submit_many, chunk)))
                chunk = []
        for chunk, fut in sent:
            for (_, src, _), r in zip(chunk, fut.result(), strict=True):
                results[src] = {"file": src, "job_ids": list(r.job_ids), "duplicate": r.duplicate, "error": r.error}
    ordered = [results[str(f)] for f in job_files if str(f) in results]
    refused = sum(1 for r in ordered if r["error"])
    if as_json:
        print(json.dumps({"results": ordered, "submitted": sum(len(r["job_ids"]) for r in ordered),
                          "refused": refused}, indent=1))
    else:
        for r in ordered:
            if r["error"]:
                print(f"error: {r['error']}", file=sys.stderr)
            else:
                print(" ".join(r["job_ids"]))
    if refused:
        raise typer.Exit(1)


def _prepared(job_file: Path, array: int | None, dirs: dict[tuple[str, str], str] | None = None
              ) -> tuple[pb.JobRecord, int]:
    """A job file read once, validated here (file:line errors) and normalised: its workdir resolved from the
    file's folder as the user sees it, ``--array`` applied; as the typed record the controller receives (it checks
    the values again, but reads no YAML). With the jobs it makes (an array's N). ``dirs``: resolved workdirs by
    (folder, workdir), shared by the files of one command (10,000 files in one folder resolve it once)."""
    import dataclasses

    from hpcsched.runtime.jobfile import MAX_PATH_CHARS, parse_job_spec, read_job_file
    from hpcsched.runtime.jobrecord import to_record

    spec = parse_job_spec(read_job_file(job_file), str(job_file))
    # A symlinked job file's relative paths are from the folder of the file it points to.
    folder = str(job_file.resolve().parent if job_file.is_symlink() else job_file.absolute().parent)
    cache = {} if dirs is None else dirs
    workdir = cache.get((folder, spec.workdir))
    if workdir is None:
        workdir = cache[(folder, spec.workdir)] = str((Path(folder).resolve() / spec.workdir).resolve())
    spec = dataclasses.replace(spec, workdir=workdir, array=array if array is not None else spec.array)
    # Of what changed here only the resolved workdir can newly break a limit (its length; --array is bounded by its
    # option): checked directly, as the controller would refuse it without a line to point to.
    if len(workdir) > MAX_PATH_CHARS:
        raise InputError(job_file, f"with its workdir resolved to {workdir[:80]!r}...: workdir: {len(workdir)} "
                                   f"characters; the limit is {MAX_PATH_CHARS}")
    return to_record(spec), spec.array or 1


_OUTPUT = typer.Option("table", "--output", "-o", help="table (fits the terminal; 80 columns in a pipe), wide (every "
                       "column, whole), json (as --json), yaml")


def _output(output: str, as_json: bool) -> str:
    from hpcsched.runtime.views import OUTPUTS

    if output not in OUTPUTS:
        raise InputError("--output", f"unknown output {output!r}; expected one of {', '.join(OUTPUTS)}")
    return "json" if as_json else output


def jobs(
    controller: str = _CONTROLLER,
    address_file: Path = _ADDRESS_FILE,
    token_file: Path = _TOKEN_FILE,
    tls_ca: Path = _TLS_CA,
    as_json: bool = typer.Option(False, "--json", help="one object per job (same as -o json)"),
    output: str = _OUTPUT,
    state: list[str] = typer.Option(None, "--state", "-t", help="only jobs in these states (repeat, or comma-separate: "
                                    "pending,running)"),
    user: str = typer.Option("", "--user", "-u", help="only this user's jobs"),
    name: str = typer.Option("", "--name", "-n", help="only jobs of this name; with * or ?, a pattern ('sweep[*')"),
    sort: str = typer.Option("id", "--sort", help="id (submit order), name, user, state, size, progress, age"),
    reverse: bool = typer.Option(False, "--reverse", help="sort the other way"),
) -> None:
    """List jobs: id, name, user, state, size, progress and age (-o wide: loss, checkpoint, workers, message...).

    The filters are applied by the controller; the table fits the terminal (names elided in the middle)."""
    from hpcsched.runtime.client import ClientError
    from hpcsched.runtime.tables import terminal_width
    from hpcsched.runtime.views import JOB_SORTS, dump, jobs_table, sort_jobs

    output = _output(output, as_json)
    if sort not in JOB_SORTS:
        raise InputError("--sort", f"unknown key {sort!r}; expected one of {', '.join(JOB_SORTS)}")
    states = tuple(s.strip() for v in state or () for s in v.split(",") if s.strip())
    try:
        rows = _client(controller, address_file, token_file, tls_ca).jobs(states=states, owner=user, name=name)
    except ClientError as e:
        _fail(e)
    rows = sort_jobs(list(rows), sort, reverse)
    if output in ("json", "yaml"):
        print(dump(rows, output))
        return
    print(jobs_table(rows, output == "wide", terminal_width()))


def cancel(
    job_ids: list[str] = typer.Argument(None, help="job ids"),
    controller: str = _CONTROLLER,
    address_file: Path = _ADDRESS_FILE,
    token_file: Path = _TOKEN_FILE,
    tls_ca: Path = _TLS_CA,
    state: list[str] = typer.Option(None, "--state", "-t", help="also every job in these states (as `jobs -t`)"),
    user: str = typer.Option("", "--user", "-u", help="also every job of this user (as `jobs -u`)"),
    name: str = typer.Option("", "--name", "-n", help="also every job of this name or pattern: 'sweep[*' cancels an "
                             "array"),
) -> None:
    """Cancel jobs: a running one checkpoints and stops.

    The ids given, and with filters every job that matches them all (like scancel -t/-u/-n; finished jobs are left
    alone). Exit status 1 when any was not cancelled."""
    from hpcsched.runtime.client import ClientError

    states = tuple(s.strip() for v in state or () for s in v.split(",") if s.strip())
    if not job_ids and not (states or user or name):
        raise InputError("cancel", "which jobs? give job ids, or --state/--user/--name to cancel every job matching")
    failed = 0
    try:
        c = _client(controller, address_file, token_file, tls_ca)
        ids = list(job_ids or ())
        if states or user or name:
            live = tuple(s for s in states or ("pending", "running", "stopping"))
            ids += [j.job_id for j in c.jobs(states=live, owner=user, name=name) if j.job_id not in ids]
            if not ids:
                print("no job matches")
        for job_id in ids:
            r = c.cancel(job_id)
            print(f"{job_id}: {r.message}")
            failed += not r.cancelled
    except ClientError as e:
        _fail(e)
    if failed:
        raise typer.Exit(1)


def workers(
    controller: str = _CONTROLLER,
    address_file: Path = _ADDRESS_FILE,
    token_file: Path = _TOKEN_FILE,
    tls_ca: Path = _TLS_CA,
    as_json: bool = typer.Option(False, "--json", help="one object per worker (keys: the WorkerInfo fields)"),
    output: str = _OUTPUT,
    sort: str = typer.Option("id", "--sort", help="id, state, used, host"),
    reverse: bool = typer.Option(False, "--reverse", help="sort the other way"),
    nodes: bool = typer.Option(False, "--nodes", help="the nodes the controller's node source sees instead "
                               "(node_source slurm, pbs): what each does for it (a pilot) or why it is not used"),
) -> None:
    """List the workers the controller knows: state, slots in use, GPUs and their type, pilot, host.

    Which workers are harvested pilots (node_source slurm, pbs: their batch job, node and state, on one line);
    ``--nodes``: the nodes the node source sees instead, with what each does for it or why it is not used."""
    from hpcsched.runtime.client import ClientError
    from hpcsched.runtime.tables import terminal_width
    from hpcsched.runtime.views import WORKER_SORTS, dump, nodes_table, sort_workers, workers_table

    output = _output(output, as_json)
    if sort not in WORKER_SORTS:
        raise InputError("--sort", f"unknown key {sort!r}; expected one of {', '.join(WORKER_SORTS)}")
    try:
        c = _client(controller, address_file, token_file, tls_ca)
        if nodes:
            reply = c.nodes()
        else:
            rows = c.workers()
    except ClientError as e:
        _fail(e)
    if nodes:
        listed = [{"node": n.node, "use": n.use, "source_job_id": n.source_job_id, "slurm_job_id": n.source_job_id}
                  for n in reply.nodes]
        if output in ("json", "yaml"):
            data = {"node_source": reply.node_source, "time": reply.nodes_time, "nodes": listed}
            if output == "yaml":
                import yaml

                print(yaml.safe_dump(data, sort_keys=False).rstrip())
            else:
                print(json.dumps(data, indent=1))
            return
        source = reply.node_source or "static"
        if source == "static":
            print("node source static: workers register themselves; the controller watches no batch system's nodes")
            return
        if not reply.nodes_time:
            print(f"node source {source}: the pilot manager has not polled its batch system yet")
            return
        import time

        print(f"{source} nodes as of {time.strftime('%H:%M:%S', time.localtime(reply.nodes_time))}")
        print(nodes_table(reply.nodes, None if output == "wide" else terminal_width()))
        return
    rows = sort_workers(list(rows), sort, reverse)
    if output in ("json", "yaml"):
        print(dump(rows, output))
        return
    print(workers_table(rows, output == "wide", terminal_width()))


def profile(
    state: Path = typer.Option(..., "--state", help="the controller's SQLite state file"),
    out: Path = typer.Option(Path("out/profile"), "--out",
                             help="folder for profiles.csv (Muri) and scaling-JNPs.csv / scaling-Jbnd.csv (BFTrainer)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Write measured stage times (Muri CSV) and scaling curves (BFTrainer JNPs + Jbnd CSV) for the simulator."""
    from hpcsched.runtime.profile import write_profiles
    from hpcsched.runtime.store import Store

    if not state.exists():
        raise InputError(state, "no such state file")
    store = Store(state)
    try:
        res = write_profiles(store, out)
    finally:
        store.close()
    print(json.dumps(res) if as_json else f"{res['jobs']} jobs -> {res['profiles']}, {res['scaling']}, {res['bounds']}")


def backup(
    state: Path = typer.Option(..., "--state", help="the controller's SQLite state file (it may be running)"),
    out: Path = typer.Option(..., "--out", help="folder for the copy (state-YYYYmmdd-HHMMSS.db, mode 0600)"),
    keep: int = typer.Option(0, "--keep", help="keep only the newest N copies in --out (0: keep all)"),
) -> None:
    """Copy the state while the controller runs (SQLite online backup): restore one over a damaged state."""
    from hpcsched.runtime.server import backup as take_backup

    if not state.exists():
        raise InputError(state, "no such state file")
    print(take_backup(state, out, keep))


def register(app: typer.Typer) -> None:
    for fn in (controller, worker, submit, jobs, cancel, workers, profile):
        app.command(fn.__name__)(fn)


def main() -> None:
    """``python -m hpcsched.runtime``: the runtime commands alone, without loading the simulator's modules
    (daemons start in a fraction of the time on a busy node)."""
    app = typer.Typer(name="hpcsched-runtime", no_args_is_help=True, pretty_exceptions_enable=False,
                      add_completion=False, help="hpcsched runtime: controller, worker and the job client.")
    register(app)
    app.command("backup")(backup)  # an operator's tool: only here, not among `hpcsched`'s user commands
    try:
        app()
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
