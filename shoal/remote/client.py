"""RemoteVectorEnv: a Gymnasium vector env whose envs live on one or more env servers.

``--env remote://HOST:PORT[,HOST:PORT...][/ENV_ID]`` makes every runner (and the evaluator)
open a session on each server; the vector env is their envs side by side, stepped with one
concurrent request per server. The token comes from ``SHOAL_TOKEN`` or the file named by
``SHOAL_TOKEN_FILE``; ``SHOAL_TLS_CA`` names a CA certificate to connect with TLS.

When a server stops answering (restarted, network cut), the client reopens a session with
backoff for up to ``reconnect_s``: that server's envs start new episodes, the step reports
their episodes as truncated at the last observation seen (counted in ``dropped_episodes``),
and training goes on. A server still down after ``reconnect_s`` fails the run, naming it.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from shoal.errors import ShoalError
from shoal.remote import shoal_pb2 as pb
from shoal.remote.wire import WireError, decode, decode_final_info, decode_space, encode

SCHEME = "remote://"
STREAM_RETRY_S = 30.0
"""How long a client steps by unary calls after a server refused it a step stream."""
# Failures a session comes back from (reopened): the server restarting or unreachable for a while,
# the session closed as idle (NOT_FOUND), or the step stream ended by the server (CANCELLED: as
# idle, or as it stops).
RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.DEADLINE_EXCEEDED,
               grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED)


def parse_url(url: str) -> tuple[list[str], str]:
    """``remote://h1:p1,h2:p2/EnvId`` -> (["h1:p1", "h2:p2"], "EnvId"); env id may be empty."""
    if not url.startswith(SCHEME):
        raise ShoalError(f"not a remote env: {url!r} (expected remote://HOST:PORT[,HOST:PORT...][/ENV_ID])")
    hosts, _, env_id = url[len(SCHEME):].partition("/")
    addresses = [a.strip() for a in hosts.split(",") if a.strip()]
    for a in addresses:
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ShoalError(f"bad env server address {a!r} in {url!r}: expected HOST:PORT (a port in 1-65535)")
    if not addresses:
        raise ShoalError(f"no env server address in {url!r}")
    return addresses, env_id


def client_token() -> str | None:
    """The bearer token for shoal's servers, from SHOAL_TOKEN or SHOAL_TOKEN_FILE."""
    if os.environ.get("SHOAL_TOKEN"):
        return os.environ["SHOAL_TOKEN"].strip()
    path = os.environ.get("SHOAL_TOKEN_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as e:
            raise ShoalError(f"cannot read SHOAL_TOKEN_FILE {path}: {e.strerror}") from None
    return None


def open_channel(address: str, max_message_bytes: int = 16 << 20) -> grpc.Channel:
    """A channel to ``address``, with TLS when SHOAL_TLS_CA names a CA certificate."""
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes)]
    ca = os.environ.get("SHOAL_TLS_CA")
    if ca:
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(Path(ca).read_bytes()), options=options)
    return grpc.insecure_channel(address, options=options)


class Connection:
    """Calls to one server's EnvService."""

    def __init__(self, address: str, token: str | None, timeout_s: float):
        self.address, self.timeout_s = address, timeout_s
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.channel = open_channel(address)
        self.calls = {name: self.channel.unary_unary(
            f"/shoal.v1.EnvService/{name}", request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=reply.FromString) for name, reply in (
                ("Describe", pb.EnvInfo), ("Open", pb.OpenReply), ("Reset", pb.ResetReply),
                ("Step", pb.StepReply), ("Close", pb.CloseReply))}
        self.stream: StepStream | None = None
        self.unary_until = 0.0  # steps go as unary calls until then (the server had no room for a stream)
        self.sent: Any = None  # the step request sent last, and its unary call's future

    def __call__(self, name: str, request: Any) -> Any:
        return self.calls[name](request, timeout=self.timeout_s, metadata=self.metadata)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
        self.channel.close()

    # -- the step stream: one long call, one reply per request --------------------------------
    def send_step(self, request: pb.StepRequest) -> None:
        """Send a step on the stream (opened on first use, and again after a failure), or as a
        unary call while the server has no room for a stream."""
        if self.stream is None and time.monotonic() < self.unary_until:
            self.sent = (request, self.calls["Step"].future(request, timeout=self.timeout_s, metadata=self.metadata))
            return
        if self.stream is None:
            self.stream = StepStream(self.channel.stream_stream(
                "/shoal.v1.EnvService/StepStream", request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.StepReply.FromString), self.metadata, self.timeout_s)
        self.sent = (request, None)
        self.stream.send(request)

    def receive_step(self) -> pb.StepReply:
        """The reply to the step sent last; a failed or timed-out stream is dropped, to reopen. A
        stream the server refused (RESOURCE_EXHAUSTED before any reply: it holds as many as it
        has sessions) sends its step as a unary call instead, and so do the steps of the next
        STREAM_RETRY_S seconds."""
        request, future = self.sent
        if future is not None:
            return future.result()
        stream = self.stream
        try:
            reply = stream.receive()
            stream.answered = True
            return reply
        except BaseException as e:
            stream.close()
            self.stream = None
            if isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and not stream.answered:
                self.unary_until = time.monotonic() + STREAM_RETRY_S
                return self("Step", request)
            raise


class StreamTimeout(grpc.RpcError):
    """No reply on a step stream within the timeout (streams have no per-message deadline)."""

    def __init__(self, timeout_s: float):
        super().__init__(f"no reply within {timeout_s:g} s")
        self.timeout_s = timeout_s

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return f"no reply within {self.timeout_s:g} s"


class StepStream:
    """A long-lived StepStream call. One watchdog thread per stream cancels it when a reply takes
    longer than the timeout (a Timer per step would cost a thread start each time)."""

    def __init__(self, method: Any, metadata: tuple, timeout_s: float):
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.replies = method(iter(self.requests.get, None), metadata=metadata)
        self.timeout_s = timeout_s
        self.sent_at: float | None = None
        self.timed_out = False
        self.answered = False  # a reply came (the server took the stream)
        self.closed = threading.Event()
        threading.Thread(target=self._watch, daemon=True, name="shoal-step-watchdog").start()

    def send(self, request: pb.StepRequest) -> None:
        self.sent_at = time.monotonic()
        self.requests.put(request)

    def receive(self) -> pb.StepReply:
        try:
            return next(self.replies)
        except grpc.RpcError:
            if self.timed_out:
                raise StreamTimeout(self.timeout_s) from None
            raise
        finally:
            self.sent_at = None

    def _watch(self) -> None:
        while not self.closed.wait(min(0.5, self.timeout_s / 4)):
            sent = self.sent_at
            if sent is not None and time.monotonic() - sent > self.timeout_s:
                self.timed_out = True
                self.replies.cancel()
                return

    def close(self) -> None:
        self.closed.set()
        self.requests.put(None)
        self.replies.cancel()


def describe(url: str, timeout_s: float = 10.0) -> pb.EnvInfo:
    """What the first server of ``url`` serves (spaces, envs per session)."""
    addresses, env_id = parse_url(url)
    conn = Connection(addresses[0], client_token(), timeout_s)
    try:
        return _fail_clearly(addresses[0], lambda: conn("Describe", pb.DescribeRequest(env_id=env_id)))
    finally:
        conn.close()


class ServerError(ShoalError, grpc.RpcError):
    """A failed call to one of shoal's servers, said in one line that names the server. It is also
    a ``grpc.RpcError``: ``code()`` and ``details()`` are the status the server (or grpc) gave."""

    def __init__(self, kind: str, address: str, error: grpc.RpcError):
        self._code, self._details = error.code(), error.details()
        super().__init__(f"{kind} server {address}: {_describe_error(kind, error)}")

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _describe_error(kind: str, e: grpc.RpcError) -> str:
    code = e.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"unreachable (is `shoal serve-{kind}` running there?)"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return f"{code.name}: {e.details()} (give the server's token in SHOAL_TOKEN or SHOAL_TOKEN_FILE)"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and kind == "env" and "sessions" in (e.details() or ""):
        return (f"{code.name}: {e.details()} (a training run holds a session on each server for each of its runners "
                "and one for its evaluator)")
    return f"{code.name}: {e.details()}"


def _fail_clearly(address: str, fn: Any) -> Any:
    try:
        return fn()
    except grpc.RpcError as e:
        raise ServerError("env", address, e) from None


class RemoteVectorEnv(gym.vector.VectorEnv):
    """The envs of one or more env servers as one vector env (same-step autoreset): one URL
    (``remote://H1:P1,H2:P2[/ENV_ID]``), or a list of them, as a config's ``env`` takes them."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, url: str | list[str], *, timeout_s: float = 10.0, reconnect_s: float = 30.0):
        if not isinstance(url, str):  # several servers' URLs, as a config's env takes them
            from shoal.config import env_setting

            url = env_setting(url)
        self.url, self.timeout_s, self.reconnect_s = url, timeout_s, reconnect_s
        self.addresses, self.env_id = parse_url(url)
        token = client_token()
        self.conns = [Connection(a, token, timeout_s) for a in self.addresses]
        self.sessions: list[str] = []
        self.sizes: list[int] = []
        infos = []
        for conn in self.conns:
            reply = _fail_clearly(conn.address, lambda: conn("Open", pb.OpenRequest(env_id=self.env_id)))
            self.sessions.append(reply.session)
            self.sizes.append(reply.info.num_envs)
            infos.append(reply.info)
        first = infos[0]
        for conn, info in zip(self.conns, infos):
            if (info.observation_space, info.action_space) != (first.observation_space, first.action_space):
                raise ShoalError(f"env server {conn.address} serves {info.env_id!r} with other spaces than "
                                 f"{self.conns[0].address} ({first.env_id!r})")
            if info.num_envs < 1:
                raise self._misbehaved(self.conns.index(conn), f"opened a session of {info.num_envs} envs")
        self.spec_id = first.env_id
        self.num_envs = sum(self.sizes)
        try:
            self.single_observation_space = decode_space(first.observation_space)
            self.single_action_space = decode_space(first.action_space)
        except WireError as e:
            raise self._misbehaved(0, f"described its spaces wrongly ({e})") from None
        space = self.single_observation_space
        # the dtype kinds each array of a reply may come in (cast to the space's dtype): numbers
        # for a float box, integers for integer spaces; flags as bools
        self._obs_kinds = "fiu" if space.dtype.kind == "f" else "iub"
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.bounds = np.cumsum([0, *self.sizes])
        self.last_obs: np.ndarray | None = None
        self.reconnects = 0
        self.env_restarts = 0  # envs the servers replaced after they raised
        self.last_error = ""  # what the last of them said
        self.dropped_episodes = 0

    # -- Gymnasium API -----------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        replies = [self._retrying(i, "Reset", lambda i=i: self._reset_request(i, seed)) for i in range(len(self.conns))]
        obs = np.concatenate([self._checked(i, "Reset", "obs", lambda r=r: r.obs, self._obs_kinds)
                              for i, r in enumerate(replies)])
        self.last_obs = obs
        return obs.copy(), {}

    def _reset_request(self, i: int, seed: int | None) -> pb.ResetRequest:
        req = pb.ResetRequest(session=self.sessions[i])
        if seed is not None:
            req.seed = int(seed) + int(self.bounds[i])  # env k of the whole vector gets seed + k
        return req

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        actions = np.asarray(actions)
        requests = [pb.StepRequest(session=self.sessions[i], actions=encode(actions[self.bounds[i]:self.bounds[i + 1]]))
                    for i in range(len(self.conns))]
        # Every server's request goes out before any reply is read, so the servers step together.
        sent = []
        for conn, request in zip(self.conns, requests):
            try:
                conn.send_step(request)
                sent.append(None)
            except grpc.RpcError as e:
                sent.append(e)
        parts, final_infos = [], []
        errors = np.zeros(self.num_envs, bool)
        for i, conn in enumerate(self.conns):
            try:
                if sent[i] is not None:
                    raise sent[i]
                r = conn.receive_step()
                parts.append(self._step_arrays(i, r))
                final_infos.append((self.bounds[i], self._final_info(i, r)))
                if r.HasField("env_errors"):  # envs the server replaced after they raised
                    failed = self._checked(i, "Step", "env_errors", lambda: r.env_errors, "b", ())
                    errors[self.bounds[i]:self.bounds[i + 1]] |= failed
                    self.env_restarts += int(failed.sum())
                    self.last_error = f"{r.env_error} (on {conn.address})"
            except grpc.RpcError as e:
                if e.code() not in RETRY_CODES:
                    raise ServerError("env", self.conns[i].address, e) from None
                parts.append(self._recover(i, e))
                errors[self.bounds[i]:self.bounds[i + 1]] = True
        obs, rewards, terminated, truncated, final = (np.concatenate(x) for x in zip(*parts))
        done = terminated | truncated
        info: dict[str, Any] = {}
        if done.any():
            info["final_obs"] = np.array(list(final), dtype=object)
            info["_final_obs"] = done
            info["final_info"] = _join_final_infos(final_infos, self.num_envs)
        if errors.any():  # those episodes were cut by a server failure, not ended by the env
            info["_env_error"] = errors
        self.last_obs = obs
        return obs.copy(), rewards.astype(np.float64), terminated.copy(), truncated.copy(), info

    # -- replies, as proto/shoal.proto has them (a server in any language may get them wrong) -------
    def _misbehaved(self, i: int, what: str) -> ShoalError:
        return ShoalError(f"env server {self.conns[i].address} {what}: it does not keep to proto/shoal.proto")

    def _checked(self, i: int, call: str, name: str, field: Any, kinds: str, shape: tuple[int, ...] | None = None
                 ) -> np.ndarray:
        """Server ``i``'s reply array ``name`` (``field()``, decoded) with one row per env of its
        session, each of ``shape`` (None: an observation's), in a dtype of one of ``kinds``
        (NumPy's dtype kinds), as the space's dtype, or a :class:`ShoalError` naming the server."""
        n = self.sizes[i]
        space = self.single_observation_space
        shape = (n, *(space.shape if shape is None else shape))
        try:
            x = decode(field())
        except WireError as e:
            raise self._misbehaved(i, f"replied to {call} with a malformed {name} array ({e})") from None
        if x.shape != shape or x.dtype.kind not in kinds:
            want = {"b": "bool", "fiu": "numbers", "iub": "integers"}.get(kinds, kinds)
            raise self._misbehaved(i, f"replied to {call} with {name} of shape {x.shape} ({x.dtype}), where its {n} "
                                      f"envs need shape {shape} ({want})")
        if kinds == "b":
            return x
        dtype = space.dtype if name in ("obs", "final_obs") else np.dtype(np.float64)
        if dtype.kind in "iu" and x.size and not np.can_cast(x.dtype, dtype):  # a cast would wrap what is outside
            low, high = x.min(), x.max()
            if low < np.iinfo(dtype).min or high > np.iinfo(dtype).max:
                raise self._misbehaved(i, f"replied to {call} with {name} values from {low} to {high} ({x.dtype}), "
                                          f"outside the range of its space's {dtype}")
        return x.astype(dtype, copy=False)

    def _step_arrays(self, i: int, r: pb.StepReply) -> tuple[np.ndarray, ...]:
        """A step reply's obs, rewards, terminated, truncated and final_obs, checked."""
        return (self._checked(i, "Step", "obs", lambda: r.obs, self._obs_kinds),
                self._checked(i, "Step", "rewards", lambda: r.rewards, "fiu", ()),
                self._checked(i, "Step", "terminated", lambda: r.terminated, "b", ()),
                self._checked(i, "Step", "truncated", lambda: r.truncated, "b", ()),
                self._checked(i, "Step", "final_obs", lambda: r.final_obs, self._obs_kinds))

    def _final_info(self, i: int, r: pb.StepReply) -> dict[str, np.ndarray]:
        """A step reply's final_info entries, one value per env of the session."""
        try:
            entries = decode_final_info(r.info)
        except WireError as e:
            raise self._misbehaved(i, f"replied to Step with a malformed info entry ({e})") from None
        for key, value in entries.items():
            if value.shape != (self.sizes[i],):
                raise self._misbehaved(i, f"replied to Step with info entry final_info/{key[:50]} of shape "
                                          f"{value.shape}, where its {self.sizes[i]} envs need one value each")
        return entries

    def close_extras(self, **kwargs: Any) -> None:
        for conn, session in zip(self.conns, self.sessions):
            try:
                conn("Close", pb.CloseRequest(session=session))
            except grpc.RpcError:
                pass  # the server is gone or the session expired: nothing to release
            conn.close()

    # -- failures ------------------------------------------------------------------------------
    def _recover(self, i: int, error: grpc.RpcError) -> tuple[np.ndarray, ...]:
        """Server ``i`` failed a step: reopen a session and start new episodes there; the old
        ones end here, truncated at the last observation seen."""
        lo, hi = self.bounds[i], self.bounds[i + 1]
        reply = self._reopen(i, error)
        n = hi - lo
        self.reconnects += 1
        self.dropped_episodes += n
        obs = self._checked(i, "Reset", "obs", lambda: reply.obs, self._obs_kinds)
        last = self.last_obs[lo:hi] if self.last_obs is not None else obs
        return (obs, np.zeros(n), np.zeros(n, bool), np.ones(n, bool), np.array(last))

    def _reopen(self, i: int, error: grpc.RpcError) -> pb.ResetReply:
        conn = self.conns[i]
        deadline = time.monotonic() + self.reconnect_s
        delay = 0.1
        while True:
            try:
                reply = conn("Open", pb.OpenRequest(env_id=self.env_id))
                self.sessions[i] = reply.session
                return conn("Reset", pb.ResetRequest(session=reply.session))
            except grpc.RpcError as e:
                error = e
                if e.code() not in RETRY_CODES and e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise ServerError("env", conn.address, e) from None
            if time.monotonic() + delay > deadline:
                raise ShoalError(f"env server {conn.address} did not come back within {self.reconnect_s:g} s: "
                                 f"{_describe_error('env', error)}")
            time.sleep(delay)
            delay = min(2.0, delay * 2)

    def _retrying(self, i: int, name: str, request: Any) -> Any:
        """A call to server ``i`` that reopens the session once if the server lost it."""
        try:
            return self.conns[i](name, request())
        except grpc.RpcError as e:
            if e.code() not in RETRY_CODES:
                raise ServerError("env", self.conns[i].address, e) from None
            self._reopen(i, e)
            self.reconnects += 1
            return _fail_clearly(self.conns[i].address, lambda: self.conns[i](name, request()))

    # -- checkpoints: a remote env is reconnected, not copied --------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "timeout_s": self.timeout_s, "reconnect_s": self.reconnect_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], timeout_s=state["timeout_s"], reconnect_s=state["reconnect_s"])
        self.reset()


def _join_final_infos(parts: list[tuple[int, dict[str, np.ndarray]]], num_envs: int) -> dict[str, np.ndarray]:
    """The servers' ``final_info`` entries (each server's from its first env on) as one, for all
    the envs: a key some server did not send is masked out (``_KEY`` False) for its envs."""
    joined: dict[str, np.ndarray] = {}
    for start, entries in parts:
        for key, value in entries.items():
            if key not in joined:
                joined[key] = np.zeros(num_envs, value.dtype)
                if not key.startswith("_"):
                    joined.setdefault("_" + key, np.zeros(num_envs, bool))
            joined[key][start:start + len(value)] = value
            if not key.startswith("_") and "_" + key not in entries:
                joined["_" + key][start:start + len(value)] = True
    return joined
