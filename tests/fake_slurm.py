"""A fake Slurm command layer: ``sinfo``, ``squeue``, ``sbatch``, ``scancel`` and ``scontrol show reservation``
answered from a state held in memory (``FakeSlurm.run``, as the pilot manager's ``run``) or in a JSON file (as
programs on PATH: ``install(bin_dir, state_file)`` writes one small script per tool that calls this module).

It prints what slurm-wlm 22.05 prints on the loopback cluster for the options the pilot manager uses (checked
against the real commands by tests/test_slurm_fake.py): ``sinfo -N -h [-p P] -o '%N %T'`` one line per node per
partition, ``squeue -h [-r] [-t S,..] [--name N] -o FMT`` with %i %P %j %T %N %S %Y (array elements as
ARRAYID_TASK, pending ones with no node), ``sbatch --parsable`` the id, ``scancel ID..`` silent (an unknown id
too, exit 0). What it cannot fake it refuses (AssertionError / exit 2), so a caller's new option is noticed here
instead of answered wrongly.

Jobs stay PENDING until ``start(id)`` (tests drive them), or start at submit on an idle node of their partition
when ``auto_start`` is set (the benchmark at 10,000 nodes).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from hpcsched.slurm.commands import SlurmError

_FUTURE = "2027-11-28T05:52:50"  # what squeue printed as %S for a pending job backfill has no plan for


class View:
    """The controller's side a Slurm node source asks (``node_source.ControllerView``), for the fakes and tests: a
    demand in slots the test sets, and the workers registered so far (``w``: worker -> (alive, slots, used)),
    returned as a copy, as the controller's own view builds a new dict on every call."""

    def __init__(self, demand: int = 0) -> None:
        self.demand = demand
        self.w: dict[str, tuple[bool, int, int]] = {}

    def demand_slots(self) -> int:
        return self.demand

    def workers(self) -> dict[str, tuple[bool, int, int]]:
        return dict(self.w)


class FakeSlurm:
    def __init__(self, nodes: int = 4, partitions: tuple[str, ...] = ("batch", "scavenger"), prefix: str = "n",
                 auto_start: bool = False) -> None:
        self.nodes = {f"{prefix}{i}": "idle" for i in range(1, nodes + 1)}
        self.partitions = list(partitions)
        self.jobs: dict[str, dict] = {}  # id -> name, state, node, argv, partition, start, sched
        self.next_id = 100
        self.calls: list[list[str]] = []
        self.reservations = "No reservations in the system\n"
        self.pending = ""  # other users' pending jobs, as squeue -t PD -o '%i|%P|%j|%S|%Y' prints them
        self.auto_start = auto_start

    # ------------------------------------------------------------------------------------ state file
    def to_json(self) -> dict:
        return {"nodes": self.nodes, "partitions": self.partitions, "jobs": self.jobs, "next_id": self.next_id,
                "reservations": self.reservations, "pending": self.pending, "auto_start": self.auto_start}

    @classmethod
    def from_json(cls, d: dict) -> FakeSlurm:
        f = cls(0)
        f.nodes, f.partitions, f.jobs, f.next_id = d["nodes"], d["partitions"], d["jobs"], d["next_id"]
        f.reservations, f.pending, f.auto_start = d["reservations"], d["pending"], d["auto_start"]
        return f

    # ------------------------------------------------------------------------------------ driving
    def start(self, jid: str, node: str | None = None) -> str:
        """Run pending job ``jid`` on ``node``, its --nodelist, or the first idle node no job holds."""
        j = self.jobs[jid]
        held = {x["node"] for x in self.jobs.values() if x["state"] == "RUNNING"}
        node = node or j["node"] or next(n for n, st in self.nodes.items() if st == "idle" and n not in held)
        j["state"], j["node"], j["start"] = "RUNNING", node, time.strftime("%Y-%m-%dT%H:%M:%S")
        self.nodes[node] = "allocated"
        return node

    def end(self, jid: str) -> None:
        j = self.jobs.pop(jid)
        if j["state"] == "RUNNING" and j["node"]:
            self.nodes[j["node"]] = "idle"

    # ------------------------------------------------------------------------------------ the tools
    def run(self, argv: list[str]) -> str:
        self.calls.append(list(argv))
        tool, args = Path(argv[0]).name, list(argv[1:])
        if tool == "sinfo":
            return self._sinfo(args)
        if tool == "squeue":
            return self._squeue(args)
        if tool == "sbatch":
            return self._sbatch(args)
        if tool == "scancel":
            return self._scancel(args)
        if tool == "scontrol" and args[-2:] == ["show", "reservation"]:
            return self.reservations
        raise AssertionError(f"the fake Slurm does not know {argv}")

    def _sinfo(self, args: list[str]) -> str:
        opts = _opts(args, flags={"-N", "-h"}, valued={"-p", "-o"})
        assert opts.get("-o") == "%N %T" and "-N" in opts and "-h" in opts, args
        parts = [opts["-p"]] if "-p" in opts else self.partitions
        return "".join(f"{n} {st}\n" for n, st in self.nodes.items() for _ in parts)

    def _squeue(self, args: list[str]) -> str:
        opts = _opts(args, flags={"-h", "-r"}, valued={"-t", "-o", "--name", "-j"})
        fmt = opts["-o"]
        states = set(opts["-t"].upper().split(",")) if "-t" in opts else None
        if states is not None:
            states = {{"PD": "PENDING", "R": "RUNNING"}.get(s, s) for s in states}
        ids = set(opts["-j"].split(",")) if "-j" in opts else None
        lines = []
        for jid, j in self.jobs.items():
            if ("--name" in opts and j["name"] != opts["--name"]) or (states is not None and j["state"] not in states) \
                    or (ids is not None and jid not in ids):
                continue
            lines.append(_format(fmt, {"%i": jid, "%P": j["partition"], "%j": j["name"], "%T": j["state"],
                                       "%N": j["node"] if j["state"] != "PENDING" else "",
                                       "%S": j["start"] or _FUTURE, "%Y": j.get("sched") or "(null)"}))
        for line in self.pending.splitlines():  # foreign pending jobs (fit-idle-window's backfill plan)
            jid, part, name, start, sched = line.split("|")
            if (states is None or "PENDING" in states) and "--name" not in opts:
                lines.append(_format(fmt, {"%i": jid, "%P": part, "%j": name, "%T": "PENDING", "%N": "",
                                           "%S": start, "%Y": sched}))
        return "".join(x + "\n" for x in lines)

    def _sbatch(self, args: list[str]) -> str:
        opts = _opts(args, flags={"--parsable"}, valued={"--job-name", "-J", "--nodes", "-N", "--nodelist", "-w",
                                                          "--time", "--output", "--chdir", "--partition", "-p",
                                                          "--qos", "--account", "--array"}, prefix_ok=("--signal=",
                                                                                                     "--array=",
                                                                                                     "--begin=",
                                                                                                     "--constraint="),
                     stop_at_positional=True)
        array = opts.get("--array") or opts.get("--array=")
        jid = str(self.next_id)
        self.next_id += 1
        base = {"name": opts.get("--job-name") or opts.get("-J") or "sbatch", "state": "PENDING",
                "node": opts.get("--nodelist") or opts.get("-w") or "", "argv": ["sbatch", *args],
                "partition": opts.get("--partition") or opts.get("-p") or self.partitions[0], "start": "",
                "sched": None}
        if array:
            lo, _, hi = array.partition("-")
            ids = [f"{jid}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
        else:
            ids = [jid]
        for i in ids:
            self.jobs[i] = dict(base)
        if self.auto_start:
            held = {x["node"] for x in self.jobs.values() if x["state"] == "RUNNING"}
            free = (n for n, st in self.nodes.items() if st == "idle" and n not in held)
            for i in ids:
                node = self.jobs[i]["node"] or next(free, None)
                if node is not None:
                    self.start(i, node)
        return jid + "\n"

    def _scancel(self, args: list[str]) -> str:
        """Cancels the ids it has; an id it does not have (a job that has ended) is passed over silently with exit
        status 0, as slurm-wlm 22.05's scancel does."""
        for a in args:
            if a in self.jobs:
                self.end(a)
        return ""


def _format(fmt: str, fields: dict[str, str]) -> str:
    out = fmt
    for k, v in fields.items():
        out = out.replace(k, v)
    assert "%" not in out, f"the fake squeue does not know a field of {fmt!r}"
    return out


def _opts(args: list[str], flags: set[str], valued: set[str], prefix_ok: tuple[str, ...] = (),
          stop_at_positional: bool = False) -> dict[str, str]:
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a in flags:
            out[a] = ""
        elif a in valued:
            out[a] = args[i + 1]
            i += 1
        elif "=" in a and a.split("=", 1)[0] in valued:
            k, v = a.split("=", 1)
            out[k] = v
        elif a.startswith(prefix_ok) and prefix_ok:
            k, v = a.split("=", 1)
            out[k + "="] = v
        elif stop_at_positional and not a.startswith("-"):
            break
        else:
            raise AssertionError(f"the fake Slurm does not know option {a!r} in {args}")
        i += 1
    return out


# ------------------------------------------------------------------------------------------- as programs
TOOLS = ("sinfo", "squeue", "sbatch", "scancel", "scontrol")


def install(bin_dir: Path, state: Path) -> None:
    """Programs named after the tools in ``bin_dir`` that answer from ``state`` (put ``bin_dir`` first on PATH)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve()
    for tool in TOOLS:
        p = bin_dir / tool
        p.write_text(f"#!/bin/sh\nexec {sys.executable} {here} {state} {tool} \"$@\"\n")
        p.chmod(0o755)


def save(fake: FakeSlurm, state: Path) -> None:
    tmp = state.with_name(state.name + ".tmp")
    tmp.write_text(json.dumps(fake.to_json()))
    os.replace(tmp, state)


def main(argv: list[str]) -> int:
    state, tool, args = Path(argv[0]), argv[1], argv[2:]
    with open(state.with_name(state.name + ".calls"), "a") as f:  # one line per call: what a caller cost Slurm
        f.write(tool + "\n")
    fake = FakeSlurm.from_json(json.loads(state.read_text()))
    try:
        out = fake.run([tool, *args])
    except SlurmError as e:
        sys.stderr.write(str(e).split(": ", 1)[-1] + "\n")
        save(fake, state)
        return 1
    except AssertionError as e:
        sys.stderr.write(f"fake {tool}: {e}\n")
        return 2
    if tool in ("sbatch", "scancel"):
        save(fake, state)
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main(sys.argv[1:]))
