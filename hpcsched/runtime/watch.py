"""Orders pushed to workers: the controller's ``Orders.Watch`` service (``OrdersHub``).

Why: a worker learns of a launch or a stop in the reply to its next heartbeat, and at 10,000 workers the interval
is 10 s (it grows with the fleet so the controller's heartbeat load stays bounded, ``liveness``), so a job waited
up to 10 s for its launch order. Here each worker keeps one server-streaming ``Watch`` call open, and the
controller sends an event on it when that worker has new orders; the worker heartbeats at once and its reply
carries them. Orders keep riding every heartbeat reply, so nothing depends on the stream: a worker that never
watches (an older one), or whose stream broke, still gets them, one interval later.

Why a server of its own, on a port of its own (``RegisterReply.watch_port``): the Controller service runs on a
thread pool, where each open stream would hold a thread for its whole life (10,000 threads). This one is an
asyncio gRPC server on one thread: an open stream costs a coroutine and a connection, nothing while idle.

Who may watch: a worker's stream carries the credential its registration issued (``credentials``), checked against
that worker and daemon instance; a join token alone is refused, so a task cannot watch for another worker (it would
learn nothing but when that worker gets orders, but the rule is the same as for heartbeats).

Events coalesce: several nudges to a worker before its stream sends make one event (a worker beats once for them
all). A nudge to a worker without an open stream is remembered (``_MISSED_S``) and sent when it opens one, so a
worker whose stream broke (the controller's connection dropped) beats at once on reconnecting.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable

import grpc

from hpcsched.runtime.credentials import CREDENTIAL_HEADER, WorkerCredentials
from hpcsched.runtime.rpc import pb, pb_grpc

log = logging.getLogger("hpcsched.runtime.watch")

_MISSED_S = 60.0  # a nudge to a worker without a stream is kept this long for the stream it may open
_MISSED_MAX = 100_000  # and at most this many such workers are remembered (older ones go first)
_START_TIMEOUT_S = 30.0


class _Watcher:
    """One open stream: the reasons it has to send, and whether a newer stream of the same worker replaced it."""

    __slots__ = ("wake", "reasons", "replaced")

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.reasons: set[str] = set()
        self.replaced = False


class OrdersHub(pb_grpc.OrdersServicer):
    """The ``Orders`` service and its server (module docstring). ``start`` binds it and returns its port;
    ``nudge`` may be called from any thread; ``stop`` ends every stream and the server."""

    def __init__(self, credentials: WorkerCredentials, host: str,
                 server_creds: grpc.ServerCredentials | None = None) -> None:
        self.credentials = credentials
        self.host = host
        self.server_creds = server_creds
        self.port = 0
        self._watchers: dict[str, _Watcher] = {}  # worker -> its open stream (the loop's thread only)
        self._missed: dict[str, tuple[float, set[str]]] = {}  # worker -> (first missed nudge, reasons)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="orders-hub", daemon=True)
        self.events_sent = 0  # events written to streams (each makes a worker heartbeat)
        self.nudges_unwatched = 0  # nudges to a worker with no open stream (its next heartbeat carries the orders)
        self.refused = 0  # Watch calls refused: no credential, or not the one issued to that worker's daemon
        self.opened = 0  # Watch streams accepted (workers subscribed to lease pushes open none)

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> int:
        """Bind ``host:0`` and serve; the port bound. Raises what binding raised."""
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT_S):
            raise RuntimeError(f"the Orders service did not start within {_START_TIMEOUT_S:g} s")
        if self._error is not None:
            raise self._error
        return self.port

    def stop(self) -> None:
        if self._thread.ident is None:  # never started (the controller failed before it listened)
            return
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:  # the loop ended meanwhile
                pass
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by start(); after it, logged (the heartbeat path still works)
            if not self._ready.is_set():
                self._error = e
                self._ready.set()
            else:
                log.error("the Orders service stopped: %s (workers get their orders in heartbeat replies)", e)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        server = grpc.aio.server()
        pb_grpc.add_OrdersServicer_to_server(self, server)
        target = f"[{self.host}]:0" if ":" in self.host else f"{self.host}:0"
        port = server.add_secure_port(target, self.server_creds) if self.server_creds is not None \
            else server.add_insecure_port(target)
        if not port:
            raise RuntimeError(f"cannot bind the Orders service on {self.host}")
        self.port = port
        await server.start()
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            for w in self._watchers.values():
                w.replaced = True
                w.wake.set()
            await server.stop(grace=0.5)

    # ---------------------------------------------------------------------------------------------- nudges
    def nudge(self, workers: Iterable[str], reason: str) -> None:
        """Tell these workers to heartbeat now (they have new orders). Thread-safe, never blocks; a no-op before
        ``start`` and after ``stop``."""
        loop = self._loop
        ids = list(workers)
        if loop is None or not ids or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._nudge_now, ids, reason)
        except RuntimeError:  # the loop closed meanwhile: the heartbeat replies still carry the orders
            pass

    def _nudge_now(self, workers: list[str], reason: str) -> None:
        now = time.monotonic()
        for wid in workers:
            w = self._watchers.get(wid)
            if w is not None:
                w.reasons.add(reason)
                w.wake.set()
                continue
            self.nudges_unwatched += 1
            _, reasons = self._missed.setdefault(wid, (now, set()))
            reasons.add(reason)
        if len(self._missed) > _MISSED_MAX:  # drop the oldest: insertion order is first-missed order
            for wid in list(self._missed)[:len(self._missed) - _MISSED_MAX]:
                del self._missed[wid]

    def watching(self, worker_id: str) -> bool:
        """Whether that worker has a stream open now (any thread: one dict lookup)."""
        return worker_id in self._watchers

    def counters(self) -> dict[str, int]:
        return {"watching": len(self._watchers), "watch_events_sent": self.events_sent,
                "nudges_unwatched": self.nudges_unwatched, "watch_refused": self.refused,
                "watch_streams_opened": self.opened}

    # ------------------------------------------------------------------------------------------- the RPC
    async def Watch(self, request: pb.WatchRequest, context: grpc.aio.ServicerContext):  # noqa: N802 (gRPC's name)
        got = dict(context.invocation_metadata() or ()).get(CREDENTIAL_HEADER, "")
        if self.credentials.check(request.worker_id, request.instance, got if isinstance(got, str) else "") is not True:
            self.refused += 1
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "Watch needs the credential this controller issued to that worker's daemon at "
                                "registration: register (again), then watch")
        wid = request.worker_id
        self.opened += 1
        me = _Watcher()
        old = self._watchers.get(wid)
        if old is not None:  # the same worker reconnected: the older stream ends
            old.replaced = True
            old.wake.set()
        self._watchers[wid] = me
        missed = self._missed.pop(wid, None)
        if missed is not None and time.monotonic() - missed[0] <= _MISSED_S:
            me.reasons |= missed[1]
            me.wake.set()
        try:
            while True:
                await me.wake.wait()
                me.wake.clear()
                if me.replaced:
                    return
                reasons, me.reasons = me.reasons, set()
                self.events_sent += 1
                yield pb.WatchEvent(reason=",".join(sorted(reasons)))
        finally:
            if self._watchers.get(wid) is me:
                del self._watchers[wid]
