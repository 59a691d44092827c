"""gRPC plumbing both servers share: bearer tokens, raw-bytes handlers, limits, health, TLS.

Handlers receive the request's raw bytes and parse them themselves, so a malformed message
gets INVALID_ARGUMENT with a readable reason (gRPC's own deserialiser would answer INTERNAL).
Every handler runs inside a guard: a bad request fails that call only, never the server.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import ipaddress
import logging
import math
import socket
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any, Callable

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from shoal.errors import ShoalError
from shoal.remote.wire import WireError

log = logging.getLogger("shoal.remote")
DEFAULT_MAX_MESSAGE_BYTES = 16 << 20


class Abort(Exception):
    """Fail the current call with a status code and a message for the client."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def read_token(token_file: str | None) -> str | None:
    """The token in ``token_file`` (first line, stripped), or None without a file."""
    if token_file is None:
        return None
    try:
        token = Path(token_file).read_text().strip()
    except OSError as e:
        raise ShoalError(f"cannot read token file {token_file}: {e.strerror}") from None
    if len(token) < 16:
        raise ShoalError(f"token in {token_file} is too short: use at least 16 characters")
    return token


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0)]


def _bind(server: Any, host: str, port: int, token: str | None, tls_cert: str | None, tls_key: str | None) -> int:
    """Listen on host:port (TLS when given the files); the port bound. Refuses a non-loopback
    host without a token."""
    if not is_loopback(host) and token is None:
        raise ShoalError(f"binding {host} exposes the server beyond this machine: give it a token "
                         "(--token-file), or bind 127.0.0.1")
    if not 0 <= port <= 65535:
        raise ShoalError(f"port {port} is not a TCP port (0-65535; 0 picks a free one)")
    address = f"{host}:{port}"
    if port:  # ask the OS first: grpcio would log its own multi-line error before failing
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpcio binds
            try:
                probe.bind((host.strip("[]"), port))
            except OSError as e:
                raise ShoalError(f"cannot listen on {address}: {e.strerror or e}") from None
    if tls_cert or tls_key:
        if not (tls_cert and tls_key):
            raise ShoalError("TLS needs both --tls-cert and --tls-key")
        try:
            creds = grpc.ssl_server_credentials([(Path(tls_key).read_bytes(), Path(tls_cert).read_bytes())])
        except OSError as e:
            raise ShoalError(f"cannot read TLS files: {e}") from None
    try:  # grpcio returns 0 or raises, by version, when it cannot bind
        bound = server.add_secure_port(address, creds) if tls_cert else server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise ShoalError(f"cannot listen on {address} (in use, or not an address of this machine)")
    return bound


def _token_ok(token: str | None, context: Any) -> bool:
    if token is None:
        return True
    given = dict(context.invocation_metadata() or ()).get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


def _parse(request_cls: Any, raw: bytes) -> Any:
    try:
        return request_cls.FromString(raw)
    except DecodeError:
        raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {request_cls.__name__} message") from None


UNAUTHENTICATED = (grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")


def _service(service: str, handlers: dict[str, tuple[Callable[[Any, Any], Any], Any]],
             streams: dict[str, tuple[Callable[[Any, Any], Any], Any]] | None,
             unary: Callable[[Any, Any], Any], stream: Callable[[Any, Any], Any]) -> Any:
    """The service's generic handler: each method's function wrapped by ``unary`` or ``stream``
    (the server's guards), replies serialised from their messages."""
    serialize = lambda m: m.SerializeToString()  # noqa: E731
    methods = {name: grpc.unary_unary_rpc_method_handler(unary(fn, cls), response_serializer=serialize)
               for name, (fn, cls) in handlers.items()}
    for name, (fn, cls) in (streams or {}).items():
        methods[name] = grpc.stream_stream_rpc_method_handler(stream(fn, cls), response_serializer=serialize)
    return grpc.method_handlers_generic_handler(service, methods)


def over_limit(holders: list[str], client: str, limit: float, per_client: float, what: str, flag: str = "") -> str:
    """Why ``client`` may not hold one more of ``what`` where ``holders`` name the client of each
    one held: the server's ``limit`` of them, or a client's ``per_client`` ("" if it may)."""
    if len(holders) >= limit:
        return f"server holds its maximum of {limit} {what}"
    if holders.count(client) >= per_client:
        return f"client {client} holds its maximum of {per_client} {what} here{flag}"
    return ""


class _Stream:
    """An open stream call: who opened it, when its last message was answered, whether one is
    being handled now."""

    def __init__(self, context: Any, client: str):
        self.context, self.client = context, client
        self.last, self.busy, self.ended = time.monotonic(), False, False


class OpenStreams:
    """The open stream calls of a sync server, within limits. Each holds a worker thread for its
    life, waiting for its next message, so streams that send nothing could take every thread and
    leave none for other calls: at most ``limit`` are open at once and ``per_client`` from one
    client (``client_of(context)``); one idle for longer than ``idle_s`` between messages is
    ended (cancelled), and idle ones make room before a new one is refused (RESOURCE_EXHAUSTED)."""

    def __init__(self, limit: float, per_client: float, idle_s: float, client_of: Callable[[Any], str]):
        self.limit, self.per_client, self.idle_s, self.client_of = limit, per_client, idle_s, client_of
        self._open: dict[int, _Stream] = {}
        self._lock = threading.Lock()

    def enter(self, context: Any) -> _Stream:
        """Count in the stream of ``context``, or raise Abort(RESOURCE_EXHAUSTED) saying why not."""
        stream = _Stream(context, self.client_of(context))
        why = self._admit(stream)
        if why and self.end_idle():
            why = self._admit(stream)
        if why:
            raise Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{why}; close one or retry later")
        return stream

    def _admit(self, stream: _Stream) -> str:
        """Count ``stream`` in, or say why it may not open now."""
        with self._lock:
            why = over_limit([s.client for s in self._open.values() if not s.ended], stream.client, self.limit,
                             self.per_client, "open streams")
            if not why:
                self._open[id(stream)] = stream
        return why

    def leave(self, stream: _Stream) -> None:
        with self._lock:
            self._open.pop(id(stream), None)

    def end_idle(self) -> int:
        """End the streams idle for longer than ``idle_s``; how many."""
        now = time.monotonic()
        with self._lock:
            idle = [s for s in self._open.values() if not (s.busy or s.ended) and now - s.last > self.idle_s]
            for s in idle:
                s.ended = True
        for s in idle:
            s.context.cancel()
        if idle:
            log.info("ended %d idle stream(s)", len(idle))
        return len(idle)

    def __len__(self) -> int:
        with self._lock:
            return sum(not s.ended for s in self._open.values())


STOP_SLACK_S = 5.0
"""How long past its grace a stopping server's gRPC shutdown is waited for."""


class GrpcServer:
    """A gRPC server with shoal's guards, for one service's handlers."""

    def __init__(self, service: str, handlers: dict[str, tuple[Callable[[Any, Any], Any], Any]], *,
                 streams: dict[str, tuple[Callable[[Any, Any], Any], Any]] | None = None,
                 host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, workers: int = 16,
                 tls_cert: str | None = None, tls_key: str | None = None, open_streams: OpenStreams | None = None):
        self.token, self.service = token, service
        # the stream calls' limits (none given: none)
        self.streams = (open_streams if open_streams is not None  # (one with no stream open is falsy)
                        else OpenStreams(math.inf, math.inf, math.inf, lambda context: ""))
        options = _options(max_message_bytes)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=options,
                                  maximum_concurrent_rpcs=workers * 8)
        self.server.add_generic_rpc_handlers([_service(service, handlers, streams, self._guard, self._guard_stream)])
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = _bind(self.server, host, port, token, tls_cert, tls_key)
        self.host = host

    def _check_token(self, context: grpc.ServicerContext) -> None:
        if not _token_ok(self.token, context):
            context.abort(*UNAUTHENTICATED)

    @staticmethod
    def _handle(fn: Callable[[Any, Any], Any], request_cls: Any, raw: bytes, context: grpc.ServicerContext) -> Any:
        """Parse ``raw`` and run ``fn``; failures become the call's status."""
        try:
            return fn(_parse(request_cls, raw), context)
        except Abort as e:
            context.abort(e.code, e.message)
        except WireError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def _guard(self, fn: Callable[[Any, Any], Any], request_cls: Any) -> Callable[[bytes, Any], Any]:
        def handler(raw: bytes, context: grpc.ServicerContext) -> Any:
            self._check_token(context)
            return self._handle(fn, request_cls, raw, context)
        return handler

    def _guard_stream(self, fn: Callable[[Any, Any], Any], request_cls: Any) -> Callable[[Any, Any], Any]:
        def handler(raws: Any, context: grpc.ServicerContext) -> Any:
            self._check_token(context)  # once per stream
            try:
                stream = self.streams.enter(context)
            except Abort as e:
                context.abort(e.code, e.message)
            try:
                for raw in raws:
                    stream.busy = True
                    reply = self._handle(fn, request_cls, raw, context)
                    stream.busy, stream.last = False, time.monotonic()
                    yield reply
            finally:
                self.streams.leave(stream)
        return handler

    @property
    def address(self) -> str:
        """host:port the server listens on."""
        return f"{self.host}:{self.port}"

    def start(self) -> "GrpcServer":
        """Start serving (in background threads)."""
        self.server.start()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.health.set(self.service, health_pb2.HealthCheckResponse.SERVING)
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving; calls in progress get ``grace`` seconds to finish (and gRPC STOP_SLACK_S
        more to end them)."""
        self.health.enter_graceful_shutdown()
        if not self.server.stop(grace).wait((grace or 0.0) + STOP_SLACK_S):
            log.warning("the gRPC server had not stopped %.0f s after its grace", STOP_SLACK_S)

    def wait(self) -> None:
        """Block until the server stops."""
        self.server.wait_for_termination()


class AioGrpcServer:
    """The same guards on grpc.aio, its event loop in a thread of its own, for services whose
    calls wait on each other (the policy server's batches): a coroutine per call costs far less
    than a thread per call, and a stream of requests less than a call per request (BENCHMARKS.md,
    policy server). Handlers may be plain functions or coroutines; stream handlers take one
    request at a time and their replies go back in order.
    """

    def __init__(self, service: str, handlers: dict[str, tuple[Callable[[Any, Any], Any], Any]], *,
                 streams: dict[str, tuple[Callable[[Any, Any], Any], Any]] | None = None,
                 host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_calls: int = 1024,
                 tls_cert: str | None = None, tls_key: str | None = None):
        self.token, self.service, self.host = token, service, host
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="shoal-grpc-aio").start()

        async def build() -> Any:  # grpc.aio objects belong to the loop they are made in
            server = grpc.aio.server(options=_options(max_message_bytes), maximum_concurrent_rpcs=max_calls)
            server.add_generic_rpc_handlers([_service(service, handlers, streams, self._unary, self._stream)])
            self.health = health.aio.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
            return server, _bind(server, host, port, token, tls_cert, tls_key)

        try:
            self.server, self.port = self._run(build())
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            raise

    def _run(self, coroutine: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    @staticmethod
    async def _call(fn: Callable[[Any, Any], Any], request_cls: Any, raw: bytes, context: Any) -> Any:
        try:
            reply = fn(_parse(request_cls, raw), context)
            return await reply if inspect.isawaitable(reply) else reply
        except Abort as e:
            await context.abort(e.code, e.message)
        except WireError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def _unary(self, fn: Callable[[Any, Any], Any], request_cls: Any) -> Callable[[bytes, Any], Any]:
        async def handler(raw: bytes, context: Any) -> Any:
            if not _token_ok(self.token, context):
                await context.abort(*UNAUTHENTICATED)
            return await self._call(fn, request_cls, raw, context)
        return handler

    def _stream(self, fn: Callable[[Any, Any], Any], request_cls: Any) -> Callable[[Any, Any], Any]:
        async def handler(raws: Any, context: Any) -> Any:
            if not _token_ok(self.token, context):  # once per stream
                await context.abort(*UNAUTHENTICATED)
            async for raw in raws:
                yield await self._call(fn, request_cls, raw, context)
        return handler

    @property
    def address(self) -> str:
        """host:port the server listens on."""
        return f"{self.host}:{self.port}"

    def start(self) -> "AioGrpcServer":
        """Start serving (on the loop's thread)."""
        async def start() -> None:
            await self.server.start()
            await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
            await self.health.set(self.service, health_pb2.HealthCheckResponse.SERVING)
        self._run(start())
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving; calls in progress get ``grace`` seconds to finish. Then the loop ends,
        whether or not grpc.aio's stop has returned by STOP_SLACK_S seconds past the grace: it can
        hang on calls it has already ended (grpc/grpc#28999, #37239), and a server asked to stop
        (Ctrl-C, SIGTERM) must not outlive the request."""
        async def stop() -> None:
            await self.health.enter_graceful_shutdown()
            await self.server.stop(grace)
        if self.loop.is_running():
            try:
                self._run(stop(), timeout=(grace or 0.0) + STOP_SLACK_S)
            except futures.TimeoutError:
                log.warning("the gRPC server had not stopped %.0f s after its grace; stopping its loop anyway",
                            STOP_SLACK_S)
            self.loop.call_soon_threadsafe(self.loop.stop)

    def wait(self) -> None:
        """Block until the server stops."""
        self._run(self.server.wait_for_termination())
