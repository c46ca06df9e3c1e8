"""Several "hosts" on one machine for multi-host tests: Linux network namespaces, each with its own address
and host name, joined by a bridge, so nothing that assumes localhost (an address, an interface, a host name)
survives a test.

Layout (``NetnsHosts(3)``): a hub namespace holds the bridge and the controller's address (``.1``); host
namespaces ``h1..hN`` each hold one end of a veth pair (``eth0``, ``.2``, ``.3``, ...) whose other end is on
the bridge. Addresses come from ``10.213.X.0/24`` (X random per run) and exist only inside these
namespaces: traffic never leaves them (no address or route is added to the machine's own namespace). A
process started on a host gets that namespace and a UTS namespace of its own whose host name is the host's
name (``ip netns exec NS unshare --uts``). With ``resolvable`` (the default) the host names resolve, inside the
namespaces only, to their namespace addresses, as a cluster's DNS makes them: ``ip netns exec`` mounts
``/etc/netns/NS/hosts`` over ``/etc/hosts``. Horovod's Gloo segfaults on a host name that does not resolve
(seen here); without it, a library that falls back to loopback on such a name (Gloo) shows.

The test process stays in the machine's namespace and cannot reach 10.213.X.*; it talks to the controller
through ``NsClient``, a small Python process started in the hub namespace that relays client calls as JSON
lines over pipes.

Everything is removed on ``close()`` (a context manager, also registered with ``atexit``): every process
started through it (its whole session), then any process still inside the namespaces, then the
namespaces (the veth pairs and the bridge go with them). Namespaces left by a test process that was
SIGKILLed are removed by the next run (their names carry the creating pid). ``why_not()`` says why the
helper cannot run here (not root, no ``ip`` or ``unshare``, namespaces refused).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

PREFIX = "hpcsns"  # namespace names: hpcsns<pid>-hub, hpcsns<pid>-h1, ...
ETC_NETNS = Path("/etc/netns")  # ip netns exec mounts /etc/netns/NS/* over /etc/* for processes in NS


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def why_not() -> str | None:
    """Why network-namespace hosts cannot be made here, or None when they can (probed, not guessed)."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the tests as root)"
    for tool in ("ip", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"no {tool!r} command (apt-get install iproute2 util-linux hostname)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def remove_stale() -> list[str]:
    """Remove namespaces left by test processes that no longer exist (SIGKILLed: no cleanup ran)."""
    gone = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _kill_inside(name)
            _ip("netns", "del", name, check=False)
            shutil.rmtree(ETC_NETNS / name, ignore_errors=True)
            gone.append(name)
    return gone


def _kill_inside(ns: str) -> None:
    for pid in _ip("netns", "pids", ns, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


class NetnsHosts:
    """``n`` hosts (``h1``..``hn``) plus the hub; see the module docstring."""

    def __init__(self, n: int, resolvable: bool = True) -> None:
        remove_stale()
        self.tag = f"{PREFIX}{os.getpid()}-{random.randrange(16**3):03x}"
        self.subnet = f"10.213.{random.randrange(1, 255)}"
        self.hub = f"{self.tag}-hub"
        self.names = [f"h{i}" for i in range(1, n + 1)]
        self.ns = {name: f"{self.tag}-{name}" for name in self.names}
        self.addr = {name: f"{self.subnet}.{i + 2}" for i, name in enumerate(self.names)}
        self.hub_addr = f"{self.subnet}.1"
        self.procs: list[subprocess.Popen] = []
        self.resolvable = resolvable
        self._closed = False
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        if self.resolvable:
            names = "".join(f"{self.addr[h]} {h}\n" for h in self.names) + f"{self.hub_addr} hub\n"
            for ns in [self.hub, *self.ns.values()]:
                etc = ETC_NETNS / ns
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "hosts").write_text(f"127.0.0.1 localhost\n::1 localhost\n{names}")
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "set", "lo", "up")
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "addr", "add", f"{self.hub_addr}/24", "dev", "br0")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        short = self.tag[-3:]
        for i, name in enumerate(self.names, 1):
            ns = self.ns[name]
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            # Created inside the host namespace (names are per namespace), the peer moved to the hub.
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"v{short}{i}")
            _ip("-n", ns, "link", "set", f"v{short}{i}", "netns", self.hub)
            _ip("-n", self.hub, "link", "set", f"v{short}{i}", "master", "br0")
            _ip("-n", self.hub, "link", "set", f"v{short}{i}", "up")
            _ip("-n", ns, "addr", "add", f"{self.addr[name]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def namespace(self, host: str) -> str:
        return self.hub if host == "hub" else self.ns[host]

    def argv(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run on ``host`` (a name or "hub"): its network namespace and its own host name."""
        return ["ip", "netns", "exec", self.namespace(host), "unshare", "--uts", "--", "sh", "-c",
                'hostname "$0" && exec "$@"', host, *argv]

    def popen(self, host: str, argv: list[str], log: Path, cwd: Path | None = None,
              env: dict[str, str] | None = None, stdin: int | None = None, stdout: int | None = None
              ) -> subprocess.Popen:
        """Start a process on ``host`` in its own session (so close() reaches its whole tree)."""
        out = open(log, "ab")  # noqa: SIM115 - the child keeps it; closed with the test's files
        p = subprocess.Popen(self.argv(host, argv), cwd=cwd, env=env, stdin=stdin,
                             stdout=out if stdout is None else stdout, stderr=out, start_new_session=True)
        self.procs.append(p)
        return p

    def run(self, host: str, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(host, argv), capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        for ns in [*self.ns.values(), self.hub]:
            _kill_inside(ns)
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self) -> NetnsHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_PROXY = r"""
import json, sys
from google.protobuf.json_format import MessageToDict
from hpcsched.runtime.client import Client, ClientError
c = Client(sys.argv[1], sys.argv[2] or None)
for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["op"] == "submit":
            out = c.submit(req["yaml"], req["source"])
        elif req["op"] == "cancel":
            out = MessageToDict(c.cancel(req["job_id"]))
        else:
            out = [MessageToDict(m, always_print_fields_with_no_presence=True, preserving_proto_field_name=True)
                   for m in getattr(c, req["op"])()]
        print(json.dumps({"ok": out}), flush=True)
    except ClientError as e:
        print(json.dumps({"error": str(e)}), flush=True)
"""


class NsClient:
    """The controller's client, run inside a namespace (the test process is outside every one): ``jobs()`` and
    ``workers()`` return dicts keyed as the protocol's fields; a refused call raises with the controller's
    message."""

    def __init__(self, hosts: NetnsHosts, host: str, address: str, token: str | None, log: Path) -> None:
        self.proc = hosts.popen(host, [sys.executable, "-c", _PROXY, address, token or ""], log,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def _call(self, **req: object) -> object:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the namespace client exited ({self.proc.poll()}); see its log")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply["ok"]

    def submit(self, path: Path) -> str:
        return str(self._call(op="submit", yaml=path.read_text(), source=str(path)))

    def jobs(self) -> dict[str, dict]:
        return {j["job_id"]: j for j in self._call(op="jobs")}  # type: ignore[union-attr]

    def workers(self) -> list[dict]:
        return list(self._call(op="workers"))  # type: ignore[arg-type]

    def cancel(self, job_id: str) -> dict:
        return dict(self._call(op="cancel", job_id=job_id))  # type: ignore[arg-type]
