"""The registry of Gavel's allocation policies: name -> how to make a fresh one, filled by the policy modules.

The same plug-in registry as the simulator's policies, admission and placement steps (``hpcsched.plugins``):
each module of ``hpcsched.hetero.policies`` registers its policies as it is imported, so adding a Gavel policy
is one new module there (``docs/extending.md``), and ``tests/test_gavel_registry.py`` checks every registered
one against the allocation contract. What is registered is a factory, not a policy: policies keep per-run
state (FIFO's queue, finish-time fairness's progress), so each run makes its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from hpcsched.hetero.policies.base import GavelPolicy
from hpcsched.plugins import PluginRegistry


@dataclass(frozen=True)
class GavelOptions:
    """What a run may set on a fresh policy: FIFO's seed, the entity weights of hierarchical water filling."""

    seed: int = 0
    entity_weights: Mapping[str, float] = field(default_factory=dict)


GavelFactory = Callable[[GavelOptions], GavelPolicy]


@dataclass(frozen=True)
class GavelEntry:
    """A registered policy: its name, one line for listings, whether it solves a program (a policy that solves
    none runs the same with either ``--solver``), and its factory."""

    name: str
    summary: str
    solves: bool
    make: GavelFactory


class GavelRegistry(PluginRegistry[GavelEntry]):
    """Name -> ``GavelEntry`` for the modules of ``hpcsched.hetero.policies`` (loaded on first use)."""

    def __init__(self, package: str) -> None:
        super().__init__(package, "Gavel policy")

    def register(self, name: str, summary: str = "", solves: bool = True,  # type: ignore[override]
                 ) -> Callable[[GavelFactory], GavelFactory]:
        """Decorator: register the factory under ``name`` with a one-line ``summary``."""

        def add(make: GavelFactory) -> GavelFactory:
            self._add(name, GavelEntry(name, summary, solves, make))
            return make

        return add


REGISTRY = GavelRegistry("hpcsched.hetero.policies")
register = REGISTRY.register
