"""A fake PBS Pro: ``pbsnodes``, ``qstat``, ``qsub`` and ``qdel`` answered from a cluster held in memory
(``FakePbs.run``) or in a JSON file (as programs on PATH: ``install(bin_dir, state_file)``).

It prints PBS Pro's JSON for the options the pilot source uses: ``pbsnodes -a -F json`` (``timestamp``,
``pbs_version``, ``pbs_server``, ``nodes``: per node ``Mom``, ``ntype``, ``state`` (free, job-exclusive),
``pcpus``, ``jobs``, ``resources_available``, ``resources_assigned``, ``sharing``, ``last_state_change_time``)
and ``qstat -f -F json`` (``Jobs``: per job ``Job_Name``, ``Job_Owner``, ``job_state``, ``queue``, ``server``,
``exec_host`` as ``node/0*N``, ``exec_vnode``, ``Resource_List`` with ``ncpus``, ``nodect``, ``select``,
``walltime``; no ``Jobs`` key when there are none, as PBS prints it). ``qsub`` prints the new id
(``SEQ.SERVER``), ``qdel`` is silent, and for an unknown id prints ``qdel: Unknown Job Id ID`` and exits 35,
as PBS Pro does. What it cannot fake it refuses (exit 2), so a caller's new option is noticed here.

The scheduler is first-come first-served over whole nodes: at every command a queued job starts when the nodes
it asks for (``host=NODE`` in its select, else any) are free. A started job with a script really runs it
(``bash SCRIPT``, ``PBS_JOBID`` set, in its own session, output to its ``-o`` file): a pilot's worker registers
with the controller under test. ``qdel`` sends the job's processes SIGTERM, as PBS does (its kill_delay is not
faked), and the job leaves ``qstat`` once its script has exited. Other users' batch jobs are ``add_batch`` jobs:
they hold nodes, run nothing, and end with ``finish``.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SERVER = "fakepbs"
VERSION = "2022.1.1.20220926110806"


class FakePbs:
    def __init__(self, nodes: int = 4, ncpus: int = 8, prefix: str = "n", run_scripts: bool = True) -> None:
        self.run_scripts = run_scripts  # False: a started job runs nothing (a source's unit tests)
        self.nodes = {f"{prefix}{i}": {"ncpus": ncpus, "up": True} for i in range(1, nodes + 1)}
        self.jobs: dict[str, dict] = {}  # id -> name, owner, state, nodes, ncpus, host, nodect, walltime, script...
        self.next_id = 1000
        self.calls: list[list[str]] = []

    def to_json(self) -> dict:
        return {"nodes": self.nodes, "jobs": self.jobs, "next_id": self.next_id, "run_scripts": self.run_scripts}

    @classmethod
    def from_json(cls, d: dict) -> FakePbs:
        f = cls(0)
        f.nodes, f.jobs, f.next_id, f.run_scripts = d["nodes"], d["jobs"], d["next_id"], d["run_scripts"]
        return f

    # ------------------------------------------------------------------------------------ driving
    def add_batch(self, name: str = "sim", nodect: int = 1, owner: str = "alice") -> str:
        """Another user's batch job asking for ``nodect`` whole nodes; it queues until they are free."""
        jid = self._new({"name": name, "owner": owner, "nodect": nodect, "host": "", "ncpus": 1, "script": None,
                         "walltime": "01:00:00", "out": None})
        self._schedule()
        return jid

    def finish(self, jid: str) -> None:
        self.jobs.pop(jid, None)
        self._schedule()

    def _new(self, job: dict) -> str:
        jid = f"{self.next_id}.{SERVER}"
        self.next_id += 1
        self.jobs[jid] = job | {"state": "Q", "nodes": [], "pid": None, "qtime": time.time()}
        return jid

    def _held(self) -> set[str]:
        return {n for j in self.jobs.values() if j["state"] in ("R", "E") for n in j["nodes"]}

    def _schedule(self) -> None:
        """Reap jobs whose script ended, then start queued jobs first-come first-served on free whole nodes."""
        for jid, j in list(self.jobs.items()):
            if j["pid"] is not None and not _alive(j["pid"]):
                del self.jobs[jid]
        for jid, j in sorted(self.jobs.items(), key=lambda kv: kv[1]["qtime"]):
            if j["state"] != "Q":
                continue
            free = [n for n, st in self.nodes.items() if st["up"] and n not in self._held()]
            want = [j["host"]] if j["host"] else free[:j["nodect"]]
            if len(want) < j["nodect"] or any(n not in free for n in want):
                if not j["host"]:
                    break  # FCFS: nothing starts ahead of a job waiting for nodes
                continue
            j["state"], j["nodes"], j["stime"] = "R", want, time.time()
            if j["script"] and self.run_scripts:
                j["pid"] = self._launch(jid, j)

    @staticmethod
    def _launch(jid: str, j: dict) -> int:
        out = open(j["out"] or os.devnull, "ab")  # noqa: SIM115  (the child keeps it)
        p = subprocess.Popen(["bash", j["script"]], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=os.environ | {"PBS_JOBID": jid, "PBS_JOBNAME": j["name"]}, start_new_session=True)
        out.close()
        return p.pid

    # ------------------------------------------------------------------------------------ the tools
    def run(self, argv: list[str]) -> str:
        self.calls.append(list(argv))
        tool, args = Path(argv[0]).name, list(argv[1:])
        self._schedule()
        if tool == "pbsnodes" and args == ["-a", "-F", "json"]:
            return self._pbsnodes()
        if tool == "qstat" and args == ["-f", "-F", "json"]:
            return self._qstat()
        if tool == "qsub":
            return self._qsub(args)
        if tool == "qdel" and args:
            return self._qdel(args)
        raise AssertionError(f"the fake PBS does not know {argv}")

    def _pbsnodes(self) -> str:
        out = {}
        for n, st in self.nodes.items():
            jobs = [jid for jid, j in self.jobs.items() if n in j["nodes"] and j["state"] in ("R", "E")]
            d = {"Mom": f"{n}.cluster", "ntype": "PBS",
                 "state": "down,offline" if not st["up"] else "job-exclusive" if jobs else "free",
                 "pcpus": st["ncpus"],
                 "resources_available": {"arch": "linux", "host": n, "mem": "263672488kb", "ncpus": st["ncpus"],
                                         "vnode": n},
                 "resources_assigned": {"ncpus": st["ncpus"]} if jobs else {},
                 "resv_enable": "True", "sharing": "default_excl", "license": "l",
                 "last_state_change_time": 1699617414}
            if jobs:
                d["jobs"] = jobs
            out[n] = d
        return json.dumps({"timestamp": int(time.time()), "pbs_version": VERSION, "pbs_server": SERVER,
                           "nodes": out}, indent=4) + "\n"

    def _qstat(self) -> str:
        jobs = {}
        for jid, j in self.jobs.items():
            select = f"{j['nodect']}:ncpus={j['ncpus']}" if not j["host"] else f"1:host={j['host']}:ncpus={j['ncpus']}"
            d = {"Job_Name": j["name"], "Job_Owner": f"{j['owner']}@login1", "job_state": j["state"],
                 "queue": "workq", "server": SERVER, "Checkpoint": "u", "ctime": time.ctime(j["qtime"]),
                 "Resource_List": {"ncpus": j["ncpus"] * j["nodect"], "nodect": j["nodect"], "place": "excl",
                                   "select": select, "walltime": j["walltime"]},
                 "Rerunable": "False", "euser": j["owner"], "egroup": "users"}
            if j["nodes"]:
                d["exec_host"] = "+".join(f"{n}/0*{j['ncpus']}" for n in j["nodes"])
                d["exec_vnode"] = "+".join(f"({n}:ncpus={j['ncpus']})" for n in j["nodes"])
            jobs[jid] = d
        out = {"timestamp": int(time.time()), "pbs_version": VERSION, "pbs_server": SERVER}
        if jobs:
            out["Jobs"] = jobs
        return json.dumps(out, indent=4) + "\n"

    def _qsub(self, args: list[str]) -> str:
        job = {"name": "STDIN", "owner": os.environ.get("USER", "root"), "nodect": 1, "host": "", "ncpus": 1,
               "walltime": "01:00:00", "out": None}
        i = 0
        while i < len(args) - 1:
            flag, val = args[i], args[i + 1]
            if flag == "-N":
                job["name"] = val
            elif flag == "-l" and val.startswith("select="):
                chunk = dict(kv.split("=", 1) for kv in val.removeprefix("select=").split(":")[1:])
                job["nodect"] = int(val.removeprefix("select=").split(":")[0])
                job["host"], job["ncpus"] = chunk.get("host", ""), int(chunk.get("ncpus", 1))
            elif flag == "-l" and val.startswith("walltime="):
                job["walltime"] = val.removeprefix("walltime=")
            elif flag == "-o":
                job["out"] = val
            elif flag not in ("-j", "-q", "-A"):
                raise AssertionError(f"the fake qsub does not know {flag}")
            i += 2
        job["script"] = args[-1]
        if not Path(job["script"]).is_file():
            raise AssertionError(f"qsub: script {job['script']} not found")
        jid = self._new(job)
        self._schedule()
        return jid + "\n"

    def _qdel(self, args: list[str]) -> str:
        unknown = [a for a in args if a not in self.jobs]
        for jid in args:
            j = self.jobs.get(jid)
            if j is None:
                continue
            if j["pid"] is not None and j["state"] == "R":
                j["state"] = "E"
                try:
                    os.killpg(j["pid"], signal.SIGTERM)
                except ProcessLookupError:
                    pass
            elif j["pid"] is None:  # queued, or running nothing: gone at once
                del self.jobs[jid]
        self._schedule()
        if unknown:
            raise QdelUnknown("".join(f"qdel: Unknown Job Id {u}\n" for u in unknown))
        return ""


class QdelUnknown(Exception):
    """qdel's exit 35 with its message."""


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # our own child (in-memory use): reap it
        return done == 0
    except ChildProcessError:  # another process's child (the programs): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        stat = Path(f"/proc/{pid}/stat")
        return not (stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z")


def kill_all(fake: FakePbs) -> None:
    """SIGKILL every job's processes (a test's cleanup)."""
    for j in fake.jobs.values():
        if j["pid"] is not None:
            try:
                os.killpg(j["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


# ------------------------------------------------------------------------------------------- as programs
TOOLS = ("pbsnodes", "qstat", "qsub", "qdel")


def install(bin_dir: Path, state: Path) -> None:
    """Programs named after the tools in ``bin_dir`` that answer from ``state`` (put ``bin_dir`` first on PATH)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve()
    for tool in TOOLS:
        p = bin_dir / tool
        p.write_text(f"#!/bin/sh\nexec {sys.executable} {here} {state} {tool} \"$@\"\n")
        p.chmod(0o755)


def save(fake: FakePbs, state: Path) -> None:
    tmp = state.with_name(state.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(fake.to_json()))
    os.replace(tmp, state)


def load(state: Path) -> FakePbs:
    return FakePbs.from_json(json.loads(state.read_text()))


def edit(state: Path, change):
    """Apply ``change(fake)`` to the cluster in ``state`` under the programs' lock; its result."""
    with open(state.with_name(state.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fake = load(state)
        out = change(fake)
        save(fake, state)
    return out


def main(argv: list[str]) -> int:
    state, tool, args = Path(argv[0]), argv[1], argv[2:]
    with open(state.with_name(state.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one command at a time, as the server serialises them
        with open(state.with_name(state.name + ".calls"), "a") as f:  # one line per call: what a caller cost PBS
            f.write(tool + "\n")
        fake = load(state)
        try:
            out = fake.run([tool, *args])
        except QdelUnknown as e:
            save(fake, state)
            sys.stderr.write(str(e))
            return 35
        except AssertionError as e:
            sys.stderr.write(f"fake {tool}: {e}\n")
            return 2
        save(fake, state)
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
