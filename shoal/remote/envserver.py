"""The env server: N copies of a Gymnasium env per client session, stepped as one batch.

``shoal serve-env CartPole-v1 --num-envs 16`` serves them on 127.0.0.1; trainers connect with
``--env remote://HOST:PORT`` (:class:`shoal.remote.client.RemoteVectorEnv`), and clients in any
language with ``proto/shoal.proto``. Each session owns its envs; idle sessions (a client that
vanished) are closed after ``session_timeout_s``; at most ``max_sessions`` exist at once, and at
most ``max_sessions_per_client`` of them are one client's (a client: the host its calls come from).
Step streams, which hold a thread each, are held to the same numbers and ended as idle with them.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import grpc
import numpy as np

from shoal.envs import NO_OPTIONS, EnvOptions, make_vector_env
from shoal.errors import ShoalError
from shoal.remote import shoal_pb2 as pb
from shoal.remote.server import Abort, GrpcServer, OpenStreams, log, over_limit
from shoal.remote.wire import check_actions, decode, encode, encode_info, encode_space

SERVICE = "shoal.v1.EnvService"
ENV_ERROR_LOG_INTERVAL_S = 10.0
"""Envs that raise are logged at once, then at most once per this many seconds, with a count."""


def client_of(context: Any) -> str:
    """Who a call comes from: the peer's host without its port ("ipv4:10.0.0.5", "ipv6:[::1]"),
    which every channel and process of one machine shares."""
    peer = context.peer() or ""
    return peer.rpartition(":")[0] if peer.startswith(("ipv4:", "ipv6:")) else peer


class Session:
    """One client's vector env."""

    def __init__(self, env_id: str, num_envs: int, kwargs: dict[str, Any] | None = None,
                 options: EnvOptions = NO_OPTIONS, client: str = ""):
        self.env_id, self.client = env_id, client
        self.env = make_vector_env(env_id, num_envs, kwargs, options)
        self.lock = threading.Lock()
        self.last_used = time.monotonic()
        self.needs_reset = True


class EnvServer:
    """Hosts sessions of ``env_id`` (or of the ``allow``-ed ids a client asks for): an env id, or in
    Python a ``gymnasium.Env`` subclass, as a config's ``env`` takes it. ``shoal.EnvServer(MyEnv,
    8, port=50051).start()`` serves in background threads until ``stop()``; as a context manager,
    for the ``with`` block."""

    def __init__(self, env_id: str | type, num_envs: int = 8, *, allow: tuple[str, ...] = (), max_sessions: int = 16,
                 max_sessions_per_client: int | None = None, session_timeout_s: float = 300.0,
                 env_kwargs: dict[str, Any] | None = None, env_options: EnvOptions = NO_OPTIONS,
                 **server_options: Any):
        from shoal.config import env_setting

        env_id = env_setting(env_id)
        if num_envs < 1:
            raise ShoalError("--num-envs must be at least 1")
        if max_sessions_per_client is not None and max_sessions_per_client < 1:
            raise ShoalError(f"--max-sessions-per-client must be at least 1, got {max_sessions_per_client}")
        self.max_sessions_per_client = max_sessions if max_sessions_per_client is None else max_sessions_per_client
        self.env_id, self.num_envs = env_id, num_envs
        self.env_kwargs = dict(env_kwargs or {})  # for env_id's envs; allowed ids are made as they are
        self.env_options = env_options  # for every id served
        self.allowed = {env_id, *allow}
        self.info: dict[str, pb.EnvInfo] = {}
        for eid in sorted(self.allowed):  # every allowed id must build, before serving anything
            env = make_vector_env(eid, 1, self.env_kwargs if eid == env_id else None, env_options)
            self.info[eid] = pb.EnvInfo(env_id=eid, num_envs=num_envs,
                                        observation_space=encode_space(env.single_observation_space),
                                        action_space=encode_space(env.single_action_space))
            env.close()
        self.max_sessions, self.session_timeout_s = max_sessions, session_timeout_s
        self.sessions: dict[str, Session] = {}
        self.lock = threading.Lock()
        self.steps_served = 0  # env steps, all sessions
        self.env_failures = 0  # envs that raised and were replaced, all sessions
        self._failures_unlogged, self._failures_logged_at = 0, -float("inf")
        self.server = GrpcServer(SERVICE, {
            "Describe": (self.describe, pb.DescribeRequest), "Open": (self.open, pb.OpenRequest),
            "Reset": (self.reset, pb.ResetRequest), "Step": (self.step, pb.StepRequest),
            "Close": (self.close, pb.CloseRequest)}, streams={"StepStream": (self.step, pb.StepRequest)},
            # an open StepStream holds a worker thread: one per session at most, so that 8 are
            # always left for the other calls
            open_streams=OpenStreams(max_sessions, self.max_sessions_per_client, session_timeout_s,
                                     lambda context: client_of(context)),  # this module's, when called
            **{"workers": max_sessions + 8, **server_options})
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, daemon=True)

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def address(self) -> str:
        return self.server.address

    def start(self) -> "EnvServer":
        self.server.start()
        self._reaper.start()
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        self._stop.set()
        self.server.stop(grace)
        with self.lock:
            for s in self.sessions.values():
                s.env.close()
            self.sessions.clear()

    def wait(self) -> None:
        self.server.wait()

    def __enter__(self) -> "EnvServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _reap_loop(self) -> None:
        while not self._stop.wait(min(5.0, self.session_timeout_s / 4)):
            self.reap()

    def reap(self) -> int:
        """Close sessions idle for longer than the timeout, and end step streams as idle; returns
        how many sessions."""
        self.server.streams.end_idle()
        now = time.monotonic()
        with self.lock:
            idle = [k for k, s in self.sessions.items() if now - s.last_used > self.session_timeout_s]
            closed = [self.sessions.pop(k) for k in idle]
        for s in closed:
            s.env.close()
        if closed:
            log.info("closed %d idle session(s)", len(closed))
        return len(closed)

    # -- handlers -----------------------------------------------------------------------------
    def _env_id(self, requested: str) -> str:
        env_id = requested or self.env_id
        if env_id not in self.allowed:
            raise Abort(grpc.StatusCode.NOT_FOUND,
                        f"environment {env_id[:100]!r} is not served here; served: {', '.join(sorted(self.allowed))}")
        return env_id

    def _session(self, key: str) -> Session:
        with self.lock:
            s = self.sessions.get(key)
        if s is None:
            raise Abort(grpc.StatusCode.NOT_FOUND, "unknown or expired session: open a new one")
        s.last_used = time.monotonic()
        return s

    def describe(self, req: pb.DescribeRequest, context: Any) -> pb.EnvInfo:
        return self.info[self._env_id(req.env_id)]

    def open(self, req: pb.OpenRequest, context: Any) -> pb.OpenReply:
        env_id = self._env_id(req.env_id)
        client = client_of(context)
        if self._full(client) and (not self.reap() or self._full(client)):  # idle sessions make room first
            raise Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self._full(client)}; close one or retry later")
        key = uuid.uuid4().hex
        session = Session(env_id, self.num_envs, self.env_kwargs if env_id == self.env_id else None, self.env_options,
                          client)
        with self.lock:
            self.sessions[key] = session
        return pb.OpenReply(session=key, info=self.info[env_id])

    def _full(self, client: str) -> str:
        """Why ``client`` may not open another session now ("" if it may)."""
        with self.lock:
            holders = [s.client for s in self.sessions.values()]
        return over_limit(holders, client, self.max_sessions, self.max_sessions_per_client, "sessions",
                          " (--max-sessions-per-client)")

    def reset(self, req: pb.ResetRequest, context: Any) -> pb.ResetReply:
        s = self._session(req.session)
        if req.HasField("seed") and req.seed < 0:  # Gymnasium refuses it: the client's mistake, not the env's
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"seed must be 0 or more, got {req.seed}")
        with s.lock:
            obs, info = self._call(req.session, s, lambda: s.env.reset(seed=req.seed if req.HasField("seed") else None))
            s.needs_reset = False
        return pb.ResetReply(obs=encode(obs), info=encode_info(info, self.num_envs))

    def step(self, req: pb.StepRequest, context: Any) -> pb.StepReply:
        s = self._session(req.session)
        actions = check_actions(s.env.single_action_space, decode(req.actions), self.num_envs)
        with s.lock:
            if s.needs_reset:
                raise Abort(grpc.StatusCode.FAILED_PRECONDITION, "call Reset before the first Step")
            obs, rewards, terminated, truncated, info = self._call(req.session, s, lambda: s.env.step(actions))
            self.steps_served += self.num_envs
        final = np.zeros_like(obs)
        done = terminated | truncated
        for b in np.flatnonzero(done):
            final[b] = info["final_obs"][b]
        reply = pb.StepReply(obs=encode(obs), rewards=encode(np.asarray(rewards, np.float64)),
                             terminated=encode(np.asarray(terminated, bool)), truncated=encode(np.asarray(truncated, bool)),
                             final_obs=encode(final), info=encode_info(info, self.num_envs))
        errors = info.get("_env_error")
        if errors is not None:  # envs that raised were replaced: the client drops and counts their episodes
            reply.env_errors.CopyFrom(encode(np.asarray(errors, bool)))
            reply.env_error = s.env.last_error[:500]
            self._log_env_failures(int(errors.sum()), s)
        return reply

    def _log_env_failures(self, count: int, s: Session) -> None:
        """Warn of envs that raised: the first time at once, then at most once per
        ENV_ERROR_LOG_INTERVAL_S with how many since, so an env broken for good (every step of
        every session) does not flood the server's log."""
        with self.lock:
            self.env_failures += count
            self._failures_unlogged += count
            now = time.monotonic()
            if now - self._failures_logged_at < ENV_ERROR_LOG_INTERVAL_S:
                return
            since = now - self._failures_logged_at
            count, self._failures_unlogged, self._failures_logged_at = self._failures_unlogged, 0, now
        when = f" in the last {since:.0f} s" if since != float("inf") else ""
        log.warning("%d env(s) of %s raised%s and were replaced; the last said %s", count, s.env_id, when,
                    s.env.last_error)

    def close(self, req: pb.CloseRequest, context: Any) -> pb.CloseReply:
        with self.lock:
            s = self.sessions.pop(req.session, None)
        if s is not None:
            s.env.close()
        return pb.CloseReply()

    def _call(self, key: str, s: Session, fn: Any) -> Any:
        """Run an env call; an env that raises loses its session (the client reopens), nothing else."""
        try:
            return fn()
        except Exception as e:  # the env's own failure: report it, keep serving everyone else
            with self.lock:
                self.sessions.pop(key, None)
            s.env.close()
            raise Abort(grpc.StatusCode.INTERNAL, f"the environment raised {type(e).__name__}: {str(e)[:200]}") from e
