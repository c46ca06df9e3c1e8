"""The policy registry: name -> declared policy, filled by the policy modules themselves.

Each module of the ``hpcsched.policies`` package registers its policies with the ``register`` decorator as
it is imported; the registry imports every module of the package the first time it is asked for a name, so
adding a policy is one new module there (``docs/extending.md``). A name registered twice is an error, so two
modules can never silently shadow each other. A policy that needs an optional package (``requires``) is
listed as unavailable, with the reason, where that package is missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Iterator

from hpcsched.allocator import DeclaredPolicy, Policy, PolicyHints


class Registry:
    """Name -> ``DeclaredPolicy`` for the policy modules of one package (loaded on first use)."""

    def __init__(self, package: str) -> None:
        self.package = package
        self._items: dict[str, DeclaredPolicy] = {}
        self._missing: dict[str, str] = {}  # name -> why it is not available here
        self._loaded = False

    def register(self, name: str, hints: PolicyHints = PolicyHints(), requires: tuple[str, ...] = (),
                 extra: str | None = None) -> Callable[[Policy], DeclaredPolicy]:
        """Decorator: register the policy under ``name`` with its hints; returns the declared policy.

        ``requires``: importable modules it needs; where one is missing the name is listed as unavailable
        (``pip install 'hpcsched[EXTRA]'``) instead of registered."""

        def add(fn: Policy) -> DeclaredPolicy:
            if name in self._items or name in self._missing:
                raise ValueError(f"policy {name!r} is registered twice")
            declared = DeclaredPolicy(name, fn, hints)
            gone = [m for m in requires if importlib.util.find_spec(m) is None]
            if gone:
                how = f" (pip install 'hpcsched[{extra}]')" if extra else ""
                self._missing[name] = f"needs {', '.join(gone)}{how}"
            else:
                self._items[name] = declared
            return declared

        return add

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        pkg = importlib.import_module(self.package)
        for mod in pkgutil.iter_modules(pkg.__path__):
            if not mod.name.startswith("_") and mod.name != "registry":
                importlib.import_module(f"{self.package}.{mod.name}")

    def get(self, name: str) -> DeclaredPolicy:
        """The policy registered as ``name``. A policy whose module is named after it (``srsf`` in
        ``srsf.py``, ``oldest-small-first`` in ``oldest_small_first.py``) is found by importing that module
        alone, so a run of one policy does not import every other's dependencies; any other name loads the
        whole package first."""
        if name not in self._items and not self._loaded:
            module = f"{self.package}.{name.replace('-', '_')}"
            if importlib.util.find_spec(module) is not None:
                importlib.import_module(module)
        if name not in self._items:
            self._load()
        try:
            return self._items[name]
        except KeyError:
            if name in self._missing:
                raise KeyError(f"policy {name!r} is not available here: it {self._missing[name]}") from None
            raise KeyError(f"unknown policy {name!r}; known: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        self._load()
        return sorted(self._items)

    def unavailable(self) -> dict[str, str]:
        """Registered names that cannot run here, with the reason."""
        self._load()
        return dict(self._missing)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
