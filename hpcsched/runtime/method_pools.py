"""How long each call waited for a server thread, and (optionally) thread pools of their own for some methods.

Why: a heartbeat whose handler takes 0.03 ms was seen at 1.4 s p99 by its client at 10,000 workers (handler p99
117 ms). Every call of the Controller service runs in one pool of 48 threads, first come first served, so the
difference is the queue: behind a registration storm, or behind calls waiting for the controller's lock while a
scheduling step holds it. ``MethodPools`` times that wait: it is the first interceptor, interceptors run on the
server's polling thread when a call arrives (before any pool), so it stamps the arrival, and the call's start minus
it is timed as ``<Method> (queued)`` beside the handler's own time (``rpc_stats_file``).

Pools per method (``pools``; none by default): gRPC Python runs a unary handler in the pool its behavior names in
``experimental_thread_pool`` (grpcio's ``_server._select_thread_pool_for_behavior``, an experimental hook; a grpcio
without it runs every call in the default pool). Tried at 10,000 workers + 100,000 queued jobs on this shared
machine (bench/RESULTS.md, load 20-31): Heartbeat and Register pools of 32 + 16 threads, then 8 + 4, did not
shorten the client-side heartbeat tail or the registration (every extra runnable thread competes for the GIL with
the one polling thread that takes each arriving call, and the machine was CPU-starved), so they are not the
default: a quiet machine has to decide (``ControllerServer(method_pools=...)``, ``POOLS``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent import futures

import grpc

# What was tried (module docstring): method -> threads of its own pool.
POOLS = {"Heartbeat": 8, "Register": 4}


class MethodPools(grpc.ServerInterceptor):
    """Times every call's wait for a thread (``on_queued(method + " (queued)", seconds)``), and runs each method of
    ``sizes`` (method -> threads) in a thread pool of its own."""

    def __init__(self, sizes: dict[str, int], on_queued: Callable[[str, float], None]) -> None:
        self.pools = {m: futures.ThreadPoolExecutor(max_workers=n, thread_name_prefix=f"rpc-{m.lower()}")
                      for m, n in sizes.items()}
        self._on_queued = on_queued

    def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001, ANN201 (grpc's signature)
        arrived = time.perf_counter()
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        inner, queued, on_queued = handler.unary_unary, method + " (queued)", self._on_queued

        def behavior(request, context: grpc.ServicerContext):  # noqa: ANN001, ANN202
            on_queued(queued, time.perf_counter() - arrived)
            return inner(request, context)

        pool = self.pools.get(method)
        if pool is not None:
            behavior.experimental_thread_pool = pool
        return handler._replace(unary_unary=behavior)

    def shutdown(self) -> None:
        """Once the server has stopped: its calls have ended, the threads go."""
        for pool in self.pools.values():
            pool.shutdown(wait=False)
