"""What several launchers share: the environment every rank gets, the host list as MPI and Horovod read it, and
this node's own address and interface."""

from __future__ import annotations

import importlib.util
import ipaddress
import json
from typing import TYPE_CHECKING

from hpcsched.runtime import hostaddr

if TYPE_CHECKING:
    from hpcsched.runtime.rpc import pb


def torch_importable() -> bool:
    """Whether torch is importable here, without importing it (that costs seconds)."""
    return importlib.util.find_spec("torch") is not None


def host_slots(hosts: list[str]) -> dict[str, int]:
    """``a:1,a:1,b:2`` -> ``{a: 2, b: 2}``: launchers count slots per host name, so two hpcsched nodes on one
    address (loopback) are one host to MPI and Horovod."""
    slots: dict[str, int] = {}
    for h in hosts:
        name, _, n = h.rpartition(":")
        if not name or not n.isdigit():
            raise ValueError(f"bad host {h!r}: expected host:slots")
        slots[name] = slots.get(name, 0) + int(n)
    return slots


def merged_hosts(hosts: list[str], alias: dict[str, str] | None = None) -> str:
    """``a:1,a:1,b:2`` -> ``a:2,b:2``, the ``-H`` list of mpirun and horovodrun; ``alias`` renames hosts
    (``local_alias``)."""
    return ",".join(f"{(alias or {}).get(h, h)}:{n}" for h, n in host_slots(hosts).items())


def program(command: list[str], python: str) -> list[str]:
    """The job's command, a ``.py`` file run by the tasks' Python."""
    return [python, *command] if command[0].endswith(".py") else list(command)


def own_host(t: pb.LaunchTask) -> str:
    """This node's address as the controller placed it (its entry in the task's host list)."""
    if not t.hosts:
        return t.master_addr
    return t.hosts[min(t.node_rank, len(t.hosts) - 1)].rpartition(":")[0]


def interface(t: pb.LaunchTask) -> str | None:
    """The interface that carries this node's placed address: where Gloo, MPI and Horovod must talk. Left to
    them (None) when no interface here holds it (a host name, IPv6)."""
    return hostaddr.interface_of(own_host(t))


def rank_env(t: pb.LaunchTask, devices: str) -> dict[str, str]:
    """What every launcher's ranks get: the job's env, the rendezvous, the node's devices. Gloo on CPU, NCCL on GPU
    is the program's choice. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` because restarts after a lost node failed
    with the shared store (gloo "connectFullMesh failed", then a store timeout)."""
    env = dict(t.env) | agents_env(t)
    nic = interface(t)
    if nic and "GLOO_SOCKET_IFNAME" not in env:  # else Gloo uses the host name's address, or falls back to lo
        env["GLOO_SOCKET_IFNAME"] = nic
    env.update({
        "MASTER_ADDR": t.master_addr, "MASTER_PORT": str(t.master_port), "WORLD_SIZE": str(t.world_size),
        "HPCSCHED_NODE_RANK": str(t.node_rank), "CUDA_VISIBLE_DEVICES": devices,
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    })
    env.setdefault("OMP_NUM_THREADS", "1")  # N processes on N cores: one thread each, no oversubscription
    return env


def local_alias(t: pb.LaunchTask) -> dict[str, str]:
    """``{own address: "localhost"}`` when this node's own entry is a loopback address no interface here holds
    exactly (a worker given ``--host 127.0.0.11``, as on the loopback Slurm's nodes), else ``{}``. mpirun and
    horovodrun take a host they hold no interface address of for a remote one and reach it through the rsh agent,
    which this node's worker refuses (the launcher, not a held slot, is its task here): node 0's own ranks must be
    started as local ones."""
    own = own_host(t)
    slots = host_slots(list(t.hosts))
    if own in slots and "localhost" not in slots and _is_loopback(own) and not hostaddr.holds_exactly(own):
        return {own: "localhost"}
    return {}


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def agents_env(t: pb.LaunchTask) -> dict[str, str]:
    """What the rsh agent reads to find each host's worker (see ``rsh_agent``); empty for a one-host job."""
    return {"HPCSCHED_AGENTS": json.dumps(dict(sorted(t.agents.items())))} if t.agents else {}
