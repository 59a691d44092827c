"""gRPC plumbing both servers share: bearer tokens, raw-bytes handlers, limits, health, TLS.

Handlers receive the request's raw bytes and parse them themselves, so a malformed message
gets INVALID_ARGUMENT with a readable reason (gRPC's own deserialiser would answer INTERNAL).
Every handler runs inside a guard: a bad request fails that call only, never the server.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
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


class GrpcServer:
    """A gRPC server with shoal's guards, for one service's handlers."""

    def __init__(self, service: str, handlers: dict[str, tuple[Callable[[Any, Any], Any], Any]], *,
                 streams: dict[str, tuple[Callable[[Any, Any], Any], Any]] | None = None,
                 host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, workers: int = 16,
                 tls_cert: str | None = None, tls_key: str | None = None):
        if not is_loopback(host) and token is None:
            raise ShoalError(f"binding {host} exposes the server beyond this machine: give it a token "
                             "(--token-file), or bind 127.0.0.1")
        self.token, self.service = token, service
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes),
                   ("grpc.so_reuseport", 0)]
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=options,
                                  maximum_concurrent_rpcs=workers * 8)
        serialize = lambda m: m.SerializeToString()  # noqa: E731
        methods = {name: grpc.unary_unary_rpc_method_handler(self._guard(fn, request_cls), response_serializer=serialize)
                   for name, (fn, request_cls) in handlers.items()}
        for name, (fn, request_cls) in (streams or {}).items():
            methods[name] = grpc.stream_stream_rpc_method_handler(self._guard_stream(fn, request_cls),
                                                                   response_serializer=serialize)
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, methods)])
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        address = f"{host}:{port}"
        if tls_cert or tls_key:
            if not (tls_cert and tls_key):
                raise ShoalError("TLS needs both --tls-cert and --tls-key")
            try:
                creds = grpc.ssl_server_credentials([(Path(tls_key).read_bytes(), Path(tls_cert).read_bytes())])
            except OSError as e:
                raise ShoalError(f"cannot read TLS files: {e}") from None
            self.port = self.server.add_secure_port(address, creds)
        else:
            self.port = self.server.add_insecure_port(address)
        if self.port == 0:
            raise ShoalError(f"cannot listen on {address} (in use, or not an address of this machine)")
        self.host = host

    def _check_token(self, context: grpc.ServicerContext) -> None:
        if self.token is not None:
            given = dict(context.invocation_metadata()).get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    @staticmethod
    def _handle(fn: Callable[[Any, Any], Any], request_cls: Any, raw: bytes, context: grpc.ServicerContext) -> Any:
        """Parse ``raw`` and run ``fn``; failures become the call's status."""
        try:
            request = request_cls.FromString(raw)
        except DecodeError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {request_cls.__name__} message")
        try:
            return fn(request, context)
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
            for raw in raws:
                yield self._handle(fn, request_cls, raw, context)
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
        """Stop serving; calls in progress get ``grace`` seconds to finish."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()

    def wait(self) -> None:
        """Block until the server stops."""
        self.server.wait_for_termination()
