"""Server threads per method, and how long each call waited for one.

Why: every call of the Controller service ran in one pool of 48 threads, first come first served. In a
registration storm of 10,000 workers the heartbeats of the workers already registered queued behind thousands of
Register calls (808 of them timed out), and after it, while a scheduling step held the controller's lock, the calls
waiting for that lock (SubmitMany, Register, Leave, heartbeats with news) could take every thread, so a heartbeat
whose handler takes 0.03 ms waited out the step in the queue (client p99 1.4 s, handler p99 117 ms). Heartbeats
and registrations now have pools of their own (``POOLS``): neither waits behind the other nor behind the rest.

How: gRPC Python runs a unary handler in the pool its behavior names in ``experimental_thread_pool`` (grpcio's
``_server._select_thread_pool_for_behavior``, an experimental hook); a grpcio without it ignores the attribute and
every call runs in the default pool, as before. ``MethodPools`` is the first interceptor, so it wraps the handler
the others return. Interceptors run on the server's polling thread when a call arrives, before any pool, so it
also stamps the arrival: a call's start minus it is its wait for a thread, timed as ``<Method> (queued)``
beside the handler's own time (``rpc_stats_file``): the controller's queue, told apart from its client's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent import futures

import grpc

# method -> threads of its own pool. Heartbeat: lease-only ones take microseconds, the others wait for the lock;
# Register: each holds the lock briefly, and more threads would only queue on it (a storm's excess waits in this
# pool's own queue, and a call past its deadline is dropped there unhandled).
POOLS = {"Heartbeat": 32, "Register": 16}


class MethodPools(grpc.ServerInterceptor):
    """Runs each method of ``pools`` in its own thread pool and times every call's wait for a thread
    (``on_queued(method + " (queued)", seconds)``)."""

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
