"""The policy registry: name -> declared policy, filled by the policy modules themselves.

Each module of the ``hpcsched.policies`` package registers its policies with the ``register`` decorator as
it is imported; the registry imports every module of the package the first time it is asked for a name, so
adding a policy is one new module there (``docs/extending.md``). A name registered twice is an error, so two
modules can never silently shadow each other. A policy that needs an optional package (``requires``) is
listed as unavailable, with the reason, where that package is missing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from hpcsched.allocator import DeclaredPolicy, Policy, PolicyHints
from hpcsched.plugins import PluginRegistry


class Registry(PluginRegistry[DeclaredPolicy]):
    """Name -> ``DeclaredPolicy`` for the policy modules of one package (loaded on first use)."""

    def __init__(self, package: str) -> None:
        super().__init__(package, "policy")

    def register(self, name: str, hints: PolicyHints = PolicyHints(), requires: tuple[str, ...] = (),  # type: ignore[override]
                 extra: str | None = None) -> Callable[[Policy], DeclaredPolicy]:
        """Decorator: register the policy under ``name`` with its hints; returns the declared policy.

        ``requires``: importable modules it needs; where one is missing the name is listed as unavailable
        (``pip install 'hpcsched[EXTRA]'``) instead of registered."""

        def add(fn: Policy) -> DeclaredPolicy:
            declared = DeclaredPolicy(name, fn, hints)
            gone = [m for m in requires if importlib.util.find_spec(m) is None]
            how = f" (pip install 'hpcsched[{extra}]')" if extra else ""
            self._add(name, declared, f"needs {', '.join(gone)}{how}" if gone else None)
            return declared

        return add
