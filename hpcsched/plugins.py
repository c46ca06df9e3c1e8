"""A registry of named plug-ins filled by the modules of one package: the shape every extension point shares.

Each module of the package registers what it defines with the registry's ``register`` decorator as it is
imported; the registry imports every module of the package the first time it is asked for a name, so adding a
plug-in is one new module there (``docs/extending.md``). A name registered twice is an error (two modules can
never silently shadow each other), as the Kubernetes scheduling framework's ``Register`` refuses a duplicate.
Policies (``hpcsched.policies``), admission steps (``hpcsched.admission``) and placement steps
(``hpcsched.placements``) are such registries.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class PluginRegistry(Generic[T]):
    """Name -> plug-in for the modules of ``package`` (loaded on first use); ``kind`` names them in errors."""

    def __init__(self, package: str, kind: str) -> None:
        self.package = package
        self.kind = kind
        self._items: dict[str, T] = {}
        self._missing: dict[str, str] = {}  # name -> why it is not available here
        self._loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the plug-in under ``name``; a second registration of the name is an error."""

        def add(item: T) -> T:
            self._add(name, item)
            return item

        return add

    def _add(self, name: str, item: T, missing: str | None = None) -> None:
        if name in self._items or name in self._missing:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        if missing is not None:
            self._missing[name] = missing
        else:
            self._items[name] = item

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        pkg = importlib.import_module(self.package)
        for mod in pkgutil.iter_modules(pkg.__path__):
            if not mod.name.startswith("_") and mod.name != "registry":
                importlib.import_module(f"{self.package}.{mod.name}")

    def get(self, name: str) -> T:
        """The plug-in registered as ``name``. One whose module is named after it (``load-based`` in
        ``load_based.py``) is found by importing that module alone, so a run that uses one plug-in does not
        import every other's dependencies; any other name loads the whole package first."""
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
                raise KeyError(f"{self.kind} {name!r} is not available here: it {self._missing[name]}") from None
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        self._load()
        return sorted(self._items)

    def unavailable(self) -> dict[str, str]:
        """Registered names that cannot run here, with the reason."""
        self._load()
        return dict(self._missing)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
