"""Submit throughput (issue 25): jobs stored per second from one client, for 1, 100 and 10,000 jobs, three ways.

1. ``single``: one Submit RPC per job file, its text as written (``Client.submit`` in a loop: what a client that
   sends the file's text does, without a process start per file); each job is stored when its call returns.
   ``record``: the same, each file read and checked here and sent as its typed record (``JobRecord``: what
   ``hpcsched submit FILE`` does for each file); the controller then reads no YAML.
2. ``batch``: ``hpcsched submit F1 F2 ... FN`` as a user runs it (one process: start-up, reading and checking every
   file, SubmitMany calls of up to 500 files each).
3. ``array``: ``hpcsched submit --array N FILE`` (one file, N instances).

Each measurement gets a fresh controller (a real ``python -m hpcsched.runtime controller`` process, default config)
and state file, and is timed from the first call (``single``) or the process start (``batch``, ``array``) to the
last reply; the jobs stored are then counted through ListJobs and must equal N. Target: >= 500 jobs/s from one
client in batches. Also the CPU seconds the client (the CLI process, or this one for ``single``) and the controller
spent: on a shared machine the wall rate follows the load, the CPU per job does not.

    .venv/bin/python bench/bench_submit.py [--sizes 1,100,10000] [--modes single,record,batch,array] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TOKEN = "bench-token-51b7"
_CLI = ("batch", "array")  # modes run as a CLI process (its CPU is the child's); the others run in this one


def _controller(d: Path) -> tuple[subprocess.Popen, str]:
    tok = d / "token"
    fd = os.open(tok, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, TOKEN.encode() + b"\n")
    os.close(fd)
    (d / "controller.yaml").write_text("listen: 127.0.0.1:0\naddress_file: run/addr\nstate: run/state.db\n"
                                       "token_file: token\n")
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "hpcsched.runtime", "controller", "-c", "controller.yaml"], cwd=d,
                            stdout=open(d / "controller.log", "w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 60
    while not (d / "run" / "addr").exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError((d / "controller.log").read_text())
        time.sleep(0.05)
    return proc, (d / "run" / "addr").read_text().strip()


def _files(d: Path, n: int) -> list[Path]:
    out = []
    for i in range(n):
        p = d / f"job{i:05d}.yaml"
        p.write_text(f"name: sweep-{i:05d}-resnet50\ncommand: [workloads/ddp_train.py, --model, cnn, --lr, '0.{i}']\n"
                     "launcher: torchrun\nprocs: 2\nsteps: 400\n")
        out.append(p)
    return out


def measure(mode: str, n: int) -> dict:
    from hpcsched.runtime.client import Client
    from hpcsched.runtime.jobfile import parse_job_spec, read_job_file
    from hpcsched.runtime.jobrecord import to_record

    with tempfile.TemporaryDirectory(prefix="bench-submit-") as tmp:
        d = Path(tmp)
        files = _files(d, 1 if mode == "array" else n)
        proc, addr = _controller(d)
        try:
            c = Client(addr, TOKEN, timeout=60)
            env = os.environ | {"PYTHONPATH": str(ROOT), "HPCSCHED_TOKEN": TOKEN, "HPCSCHED_CONTROLLER": addr}
            ctl0, me0, kids0 = _cpu(proc.pid), resource.getrusage(resource.RUSAGE_SELF), \
                resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            if mode == "single":
                for f in files:
                    c.submit(f.read_text(), str(f))
            elif mode == "record":
                for f in files:
                    c.submit(to_record(parse_job_spec(read_job_file(f), str(f))), str(f))
            else:
                args = ["--array", str(n), str(files[0])] if mode == "array" else [str(f) for f in files]
                done = subprocess.run([sys.executable, "-m", "hpcsched.runtime", "submit", *args], env=env,
                                      capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(done.stderr[-2000:])
            wall = time.perf_counter() - t0
            ctl_cpu = _cpu(proc.pid) - ctl0
            me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            client_cpu = (kids.ru_utime + kids.ru_stime - kids0.ru_utime - kids0.ru_stime) if mode in _CLI else \
                (me.ru_utime + me.ru_stime - me0.ru_utime - me0.ru_stime)
            stored = len(c.jobs())
            c.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    if stored != n:
        raise RuntimeError(f"{mode} {n}: {stored} jobs stored, expected {n}")
    # CPU seconds of each side, whatever the machine's load: client and controller run in two processes (and
    # overlap in batch mode), so on two free cores the rate is bounded by the busier side.
    return {"mode": mode, "jobs": n, "wall_s": round(wall, 3), "jobs_per_s": round(n / wall, 1),
            "client_cpu_s": round(client_cpu, 2), "controller_cpu_s": round(ctl_cpu, 2),
            "jobs_per_busier_cpu_s": round(n / max(client_cpu, ctl_cpu, 1e-3), 1)}


def _cpu(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,100,10000")
    ap.add_argument("--modes", default="single,record,batch,array")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    rows = []
    for mode in a.modes.split(","):
        for n in (int(x) for x in a.sizes.split(",")):
            r = measure(mode, n) | {"load": open("/proc/loadavg").read().split()[0]}
            print(json.dumps(r), flush=True)
            rows.append(r)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
