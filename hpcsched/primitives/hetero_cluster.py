"""Heterogeneous cluster strings: GPU types, servers per type, GPUs per server and optional prices.

Grammar (comma-separated parts, one per GPU type, in the order the types are listed)::

    TYPE=SERVERS[xGPUS_PER_SERVER][@PRICE_PER_HOUR]

- ``v100=8,p100=8,k80=8``: 8 servers of one GPU each per type, i.e. Gavel's ``-c`` with
  ``--num_gpus_per_server 1:1:1`` (the issue's contract: ``type=count`` means one GPU per server);
- ``v100=8x4``: 8 servers of 4 GPUs (32 V100s); multi-GPU jobs are packed within a server when they fit;
- ``v100=8@2.48`` / ``v100=8x4@2.48``: the price of one GPU of that type per hour (for cost policies).

Types are lower-cased (Gavel's throughput table keys are ``v100``, ``p100``, ``k80``). Every error names
the part that is wrong, because a cluster string comes from a command line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_PART = re.compile(r"(?P<type>[A-Za-z][\w.-]*)=(?P<servers>\d+)(?:x(?P<gpus>\d+))?(?:@(?P<price>[^@]+))?")


@dataclass(frozen=True, slots=True)
class HeteroCluster:
    """Servers of several GPU types; tuples are parallel, in the order the string lists the types."""

    types: tuple[str, ...]
    servers: tuple[int, ...]
    gpus_per_server: tuple[int, ...]
    prices: tuple[float | None, ...]  # $ per GPU-hour, None where not given

    def __post_init__(self) -> None:
        n = len(self.types)
        if not n:
            raise ValueError("a cluster needs at least one GPU type")
        if not (len(self.servers) == len(self.gpus_per_server) == len(self.prices) == n):
            raise ValueError("HeteroCluster: types, servers, gpus_per_server and prices must be parallel")
        if len(set(self.types)) != n:
            raise ValueError(f"HeteroCluster: a GPU type is listed twice: {', '.join(self.types)}")
        for t, s, g in zip(self.types, self.servers, self.gpus_per_server, strict=True):
            if s < 1 or g < 1:
                raise ValueError(f"{t}: need >= 1 server and >= 1 GPU per server, got {s}x{g}")

    def gpus(self, gpu_type: str) -> int:
        """GPUs of ``gpu_type`` (KeyError naming the types the cluster has)."""
        i = self._index(gpu_type)
        return self.servers[i] * self.gpus_per_server[i]

    def price(self, gpu_type: str) -> float | None:
        return self.prices[self._index(gpu_type)]

    @property
    def total_gpus(self) -> int:
        return sum(s * g for s, g in zip(self.servers, self.gpus_per_server, strict=True))

    def gpu_counts(self) -> dict[str, int]:
        """{type: GPUs}, Gavel's ``cluster_spec``."""
        return {t: self.gpus(t) for t in self.types}

    def __str__(self) -> str:
        parts = []
        for t, s, g, p in zip(self.types, self.servers, self.gpus_per_server, self.prices, strict=True):
            parts.append(f"{t}={s}{f'x{g}' if g != 1 else ''}{f'@{p:g}' if p is not None else ''}")
        return ",".join(parts)

    def _index(self, gpu_type: str) -> int:
        try:
            return self.types.index(gpu_type.lower())
        except ValueError:
            raise KeyError(f"GPU type {gpu_type!r} not in the cluster (it has {', '.join(self.types)})") from None


def parse_hetero_cluster(text: str) -> HeteroCluster:
    """Parse ``v100=8,p100=8x4,k80=8@0.45`` (see the module docstring); ValueError names the bad part."""
    if not text.strip():
        raise ValueError("empty cluster string; expected e.g. v100=8,p100=8,k80=8")
    types: list[str] = []
    servers: list[int] = []
    gpus: list[int] = []
    prices: list[float | None] = []
    for raw in text.split(","):
        part = raw.strip()
        m = _PART.fullmatch(part)
        if m is None:
            raise ValueError(f"cluster part {part!r}: expected TYPE=SERVERS[xGPUS_PER_SERVER][@PRICE_PER_HOUR], "
                             "e.g. v100=8 or v100=8x4@2.48")
        gpu_type = m.group("type").lower()
        if gpu_type in types:
            raise ValueError(f"cluster part {part!r}: GPU type {gpu_type!r} given twice")
        n_servers = int(m.group("servers"))
        per_server = int(m.group("gpus")) if m.group("gpus") is not None else 1
        if n_servers < 1 or per_server < 1:
            raise ValueError(f"cluster part {part!r}: need >= 1 server and >= 1 GPU per server")
        price: float | None = None
        if m.group("price") is not None:
            try:
                price = float(m.group("price"))
            except ValueError:
                raise ValueError(f"cluster part {part!r}: price {m.group('price')!r} is not a number") from None
            if not (price >= 0 and math.isfinite(price)):
                raise ValueError(f"cluster part {part!r}: price must be a finite number >= 0 per GPU-hour")
        types.append(gpu_type)
        servers.append(n_servers)
        gpus.append(per_server)
        prices.append(price)
    return HeteroCluster(tuple(types), tuple(servers), tuple(gpus), tuple(prices))


def looks_hetero(text: str) -> bool:
    """True when ``text`` is a cluster string rather than a path (it has ``=`` and no path separator)."""
    return "=" in text and "/" not in text
