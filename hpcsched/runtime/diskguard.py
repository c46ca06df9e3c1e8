"""Submits refused while the state's disk is under its free-space floor (``diskspace``), before SQLite has to.

Every ``Submit*`` call (a batch submit too) is refused with RESOURCE_EXHAUSTED and the reason while the free space
is under the floor; the free space is measured at most once per ``CHECK_EVERY_S``, not at every call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from hpcsched.runtime.diskspace import Floor, shortage

CHECK_EVERY_S = 1.0


class DiskGuard(grpc.ServerInterceptor):
    """Refuses ``Submit*`` calls while the state's disk is under the floor (module docstring); counts them."""

    def __init__(self, state: Path, floor: Floor, clock: Callable[[], float] = time.monotonic) -> None:
        self.state, self.floor, self.clock = state, floor, clock
        self._lock = threading.Lock()
        self._checked = -1e18
        self._why = ""
        self.refused = 0

    def shortage(self) -> str:
        """The current shortage ('' if none), re-measured at most once per CHECK_EVERY_S."""
        with self._lock:
            now = self.clock()
            if now - self._checked >= CHECK_EVERY_S:
                self._checked = now
                try:
                    self._why = shortage(self.state, self.floor)
                except OSError:  # the folder went away: the store's own error says more; do not refuse for it
                    self._why = ""
            return self._why

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if not method.startswith("Submit"):
            return continuation(handler_call_details)
        why = self.shortage()
        if not why:
            return continuation(handler_call_details)
        self.refused += 1

        def refuse(request, context: grpc.ServicerContext):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"submits are refused for now: {why}")

        return grpc.unary_unary_rpc_method_handler(refuse)
