"""Scheduling policies, each a pure function of a ``Snapshot``, registered by name.

``get_policy(name)`` is how the simulator, the runtime and the CLI find them. A new policy is one module
in this package that decorates its function with ``register(name, hints=PolicyHints(...))``; the registry
imports every module here on first use (``hpcsched.policies.registry``).
"""

from __future__ import annotations

from hpcsched.policies.registry import Registry

REGISTRY = Registry(__name__)
register = REGISTRY.register
get_policy = REGISTRY.get

__all__ = ["REGISTRY", "Registry", "get_policy", "register"]
