"""Scheduling policies, each a pure function of a ``Snapshot``, registered by name.

``get_policy(name)`` is how the simulator, the runtime and the CLI find them; a new policy is one
module plus one ``register`` line below.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

from hpcsched.allocator import Policy


class Registry:
    """Name -> policy. Rejects duplicates so two modules cannot silently shadow each other."""

    def __init__(self) -> None:
        self._items: dict[str, Policy] = {}

    def register(self, name: str, policy: Policy) -> None:
        if name in self._items:
            raise ValueError(f"policy {name!r} is registered twice")
        self._items[name] = policy

    def get(self, name: str) -> Policy:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(self._items))}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _build() -> Registry:
    reg = Registry()
    # Each policy module adds itself here.
    from hpcsched.policies import fifo, las, srsf, srtf, themis, tiresias  # baselines (issue 3)

    for name, fn in (("fifo", fifo.fifo), ("srtf", srtf.srtf), ("srsf", srsf.srsf), ("las", las.las),
                     ("tiresias", tiresias.tiresias), ("themis", themis.themis)):
        reg.register(name, fn)
    from hpcsched.interleave import policies as interleave  # Muri-S/L and Muri-S+ (issue 4)

    for fn in (interleave.muri_s(), interleave.muri_l(), interleave.muri_s_plus()):
        reg.register(fn.name, fn)
    if importlib.util.find_spec("cvxpy") is not None:  # optional extra: the reference's solver form
        reg.register("themis-cvxpy", themis.themis_cvxpy)
    if importlib.util.find_spec("ecos") is not None:  # optional: the reference's solver on its exact program
        reg.register("themis-ecos", themis.themis_ecos)
    return reg


REGISTRY = _build()
get_policy = REGISTRY.get
