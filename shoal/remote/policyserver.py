"""The policy server: external simulators send observations and get actions back.

``shoal serve-policy RUN_DIR`` serves a trained policy over gRPC (``PolicyService`` in
``proto/shoal.proto``). Requests from many clients are gathered by ``@shoal.batched`` into one
forward pass per policy (bounded by ``max_batch`` requests and ``max_wait_ms``); several
policies are served by id; with ``follow`` the server swaps in newer weights (a running Ray
trainer's weight store, named in its run directory's ``live.json``, else the newest checkpoint),
and every reply names the version that computed it.

It runs on grpc.aio (:class:`AioGrpcServer`): each call is a coroutine that hands its request
to the batcher's thread and awaits the result, and ``ActStream`` carries a client's requests
over one call. With ``max_batch`` 1 there is nothing to gather: each request's forward pass
runs in its handler, without the hand-off to the batcher's thread.
"""

from __future__ import annotations

import copy
import json
import logging
import queue
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import grpc
import gymnasium as gym
import numpy as np
import torch

from shoal import checkpoint as ckpt
from shoal.batching import batched
from shoal.errors import ShoalError
from shoal.policy import ONE_HOT_SPACES, Memory, Policy, one_hot, set_weights
from shoal.remote import shoal_pb2 as pb
from shoal.remote.client import ServerError, client_token, open_channel
from shoal.remote.server import DEFAULT_MAX_MESSAGE_BYTES, Abort, AioGrpcServer, log
from shoal.remote.wire import WireError, decode, encode, encode_space
from shoal.rundir import LIVE

TRAINER_POLICY_ID = "default"  # the id a single-policy trainer publishes under

SERVICE = "shoal.v1.PolicyService"


class PolicyServer:
    """Serves policies by id; ``sources`` maps each id to a run directory or checkpoint (one path:
    the "default" policy's). ``shoal.PolicyServer("runs/mine", port=50061).start()`` serves in
    background threads until ``stop()``; as a context manager, for the ``with`` block."""

    def __init__(self, sources: str | Path | dict[str, str | Path], *, follow: bool = False, poll_s: float = 1.0,
                 max_batch: int = 64, max_wait_ms: float = 2.0, device: str = "cpu", **server_options: Any):
        from shoal import devices

        if isinstance(sources, (str, Path)):
            sources = {"default": sources}
        if not sources:
            raise ShoalError("name at least one run directory or checkpoint to serve")
        self.device = devices.resolve(device)  # where the forward passes run
        self.sources = {pid: Path(p) for pid, p in sources.items()}
        self.policies: dict[str, Policy] = {pid: _first_policy(p, follow).to(self.device)
                                            for pid, p in self.sources.items()}
        self.stores: dict[str, Any] = {}  # policy id -> the WeightStore actor of its running trainer
        self.unreachable: dict[str, int] = {}  # policy id -> mtime of a live.json that led nowhere
        self.default = next(iter(self.policies))
        self.lock = threading.Lock()
        self.max_batch = max_batch
        self.max_obs_numbers = server_options.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES) // 4
        self.infer = batched(max_batch, max_wait_ms)(self._infer_batch)  # one batcher per server
        self.server = AioGrpcServer(SERVICE, {"Describe": (self.describe, pb.PolicyRequest),
                                              "Act": (self.act, pb.ActRequest)},
                                    streams={"ActStream": (self.act, pb.ActRequest)}, **server_options)
        self.follow, self.poll_s = follow, poll_s
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        if follow:
            self.refresh()  # a running trainer's newest weights from the start
            untrained = [str(self.sources[pid]) for pid, p in self.policies.items() if p.version < 0]
            if untrained:  # never serve the untrained stand-in of _first_policy
                self.server.stop(grace=0)
                raise ShoalError(f"{', '.join(untrained)}: no checkpoint yet, and the running trainer's weight "
                                 "store cannot be reached (see the warning above)")

    @property
    def address(self) -> str:
        return self.server.address

    def start(self) -> "PolicyServer":
        self.server.start()
        if self.follow:
            self._watcher.start()
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        self._stop.set()
        self.server.stop(grace)

    def wait(self) -> None:
        self.server.wait()

    def __enter__(self) -> "PolicyServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- hot swap -----------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.refresh()

    def refresh(self) -> list[str]:
        """Load newer weights of the followed sources: from the running trainer's weight store
        while its run directory names one (ray backend), else from its newest checkpoint.
        Returns the ids that changed."""
        from shoal.algorithm import load_policy

        changed = []
        for pid, source in self.sources.items():
            if self._refresh_from_store(pid, source):
                changed.append(pid)
                continue
            try:
                path = ckpt.resolve(source)
                version = ckpt.read_meta(path)["policy_version"]
                if version > self.policies[pid].version:
                    policy = load_policy(path).to(self.device)
                    with self.lock:
                        self.policies[pid] = policy
                    changed.append(pid)
                    log.info("policy %s: now version %d from %s", pid, version, path)
            except (ShoalError, OSError, KeyError) as e:  # a run mid-write, or gone: keep serving what we have
                log.warning("policy %s: cannot follow %s: %s", pid, source, e)
        return changed

    def _refresh_from_store(self, pid: str, source: Path) -> bool:
        """Subscribe to the trainer's weight store named in ``source/live.json``; whether newer
        weights came. A store that cannot be reached (the run ended, the cluster is gone) is
        dropped with a warning, and the checkpoints are followed instead."""
        live = source / LIVE
        try:
            stamp = live.stat().st_mtime_ns
        except OSError:  # no trainer running (or not on Ray)
            self.stores.pop(pid, None)
            return False
        if self.unreachable.get(pid) == stamp:
            return False  # tried that file already: a trainer that was killed left it behind
        try:
            if pid not in self.stores:  # first: it sets how Ray authenticates, which Ray reads as it is imported
                self.stores[pid] = _store_actor(json.loads(live.read_text()))
                log.info("policy %s: following the weight store of the run in %s", pid, source)
            import ray

            current = self.policies[pid]
            got = ray.get(self.stores[pid].latest.remote(TRAINER_POLICY_ID, current.version), timeout=10)
            if got is None:
                return False
            version, [ref] = got
            weights = ray.get(ref, timeout=10)
        except Exception as e:  # noqa: BLE001 - Ray raises many types for a vanished actor or cluster
            self.stores.pop(pid, None)
            self.unreachable[pid] = stamp
            log.warning("policy %s: cannot follow the trainer of %s (%s); following its checkpoints",
                        pid, source, str(e).strip().splitlines()[0][:200])
            return False
        module = copy.deepcopy(current.module)  # batches in flight keep the policy they started with
        set_weights(module, weights)
        with self.lock:
            self.policies[pid] = Policy(module, version, current.config, current.saved_env_observation_space)
        return True

    # -- handlers -------------------------------------------------------------------------------
    def _policy(self, policy_id: str) -> Policy:
        with self.lock:
            policy = self.policies.get(policy_id or self.default)
        if policy is None:
            raise Abort(grpc.StatusCode.NOT_FOUND,
                        f"no policy {policy_id[:100]!r}; served: {', '.join(sorted(self.policies))}")
        return policy

    def describe(self, req: pb.PolicyRequest, context: Any) -> pb.PolicyInfo:
        policy = self._policy(req.policy_id)
        own = policy.saved_env_observation_space  # a server never makes the env to find out
        return pb.PolicyInfo(policy_id=req.policy_id or self.default, version=policy.version,
                             observation_space=encode_space(policy.observation_space),
                             action_space=encode_space(policy.action_space), policy_ids=sorted(self.policies),
                             env_observation_space=encode_space(own) if own is not None else None,
                             lstm_size=policy.module.lstm_size if policy.module.recurrent else 0)

    async def act(self, req: pb.ActRequest, context: Any) -> pb.ActReply:
        policy = self._policy(req.policy_id)
        obs = decode(req.obs)
        shape = policy.observation_space.shape
        own = policy.saved_env_observation_space  # as the checkpoint recorded it: a server makes no env
        if own is not None and obs.dtype.kind in "iu" and policy.module.mask_dim:
            raise WireError(f"this policy's observations end with an action mask of {policy.module.mask_dim} "
                            f"entries: send flat vectors of {shape[0]} numbers, the observation (one-hot), "
                            "then the mask")
        if own is not None and obs.dtype.kind in "iu":  # the env's own integers (FrozenLake's states)
            numbers = obs.size * gym.spaces.flatdim(own) // max(1, int(np.prod(own.shape)))
            if numbers > self.max_obs_numbers:  # bound what a small message of integers may become
                raise WireError(f"{obs.size} integers of {own} one-hot into {numbers} numbers, more than the "
                                f"{self.max_obs_numbers} of a message at the size limit: send fewer per request")
            try:
                obs = np.asarray(one_hot(own, obs, shape))
            except ShoalError as e:
                raise WireError(str(e)) from None
        single = obs.shape == shape  # one observation: one action back, as policy.act does
        if single:
            obs = obs[None]
        if obs.ndim != len(shape) + 1 or obs.shape[1:] != shape or obs.shape[0] < 1:
            also = f", or the env's own observation(s) in {own}" if own is not None else ""
            raise WireError(f"obs must have shape [{', '.join(map(str, shape))}] (one) or "
                            f"[n, {', '.join(map(str, shape))}] (a batch){also}, got {list(obs.shape)}")
        if obs.dtype.kind not in "fiu" or not np.all(np.isfinite(obs)):
            raise WireError("obs must be finite numbers")
        if policy.module.image and (obs.min() < 0 or obs.max() > 255):
            raise WireError("obs are images: their values must be in [0, 255]")
        pixels = policy.observation_space.pixels if policy.module.mixed else 0
        if pixels and (obs[:, :pixels].min() < 0 or obs[:, :pixels].max() > 255):
            raise WireError(f"obs begin with images' pixels: their first {pixels} values must be in [0, 255]")
        request = (policy, obs, req.deterministic, _memory(policy, req, len(obs), single))
        if self.max_batch == 1:
            [(actions, version, memory)] = self._infer_batch([request])
        else:
            actions, version, memory = await self.infer.acall(request)
        one = (lambda a: a[0]) if single else (lambda a: a)  # noqa: E731
        reply = pb.ActReply(actions=encode(one(actions)), version=version)
        if memory is not None:
            reply.lstm_h.CopyFrom(encode(one(memory[0])))
            reply.lstm_c.CopyFrom(encode(one(memory[1])))
        return reply

    def _infer_batch(self, requests: list[Request]) -> list[tuple[np.ndarray, int, Memory | None]]:
        """One forward pass per (policy, mode) for every request gathered; a recurrent policy's
        from the memories the requests carried, each row its own episode's."""
        groups: dict[tuple[int, bool], list[int]] = defaultdict(list)
        for i, (policy, _, deterministic, _) in enumerate(requests):
            groups[(id(policy), deterministic)].append(i)
        out: list[Any] = [None] * len(requests)
        for (_, deterministic), idx in groups.items():
            policy = requests[idx[0]][0]
            obs = np.concatenate([requests[i][1] for i in idx]).astype(policy.module.raw_dtype, copy=False)
            bounds = np.cumsum([0] + [len(requests[i][1]) for i in idx])
            rows = [slice(bounds[k], bounds[k + 1]) for k in range(len(idx))]
            if policy.module.recurrent:
                memory = tuple(np.concatenate([requests[i][3][j] for i in idx]) for j in (0, 1))
                actions, (h, c) = policy.act_with_memory(obs, memory, deterministic=deterministic)
                for i, r in zip(idx, rows):
                    out[i] = (np.asarray(actions[r]), policy.version, (h[r], c[r]))
                continue
            with torch.no_grad():
                actions = policy.act(obs, deterministic=deterministic)
            for i, r in zip(idx, rows):
                out[i] = (np.asarray(actions[r]), policy.version, None)
        return out


Request = tuple[Policy, np.ndarray, bool, "Memory | None"]
"""One request to :meth:`PolicyServer._infer_batch`: policy, observations [n, ...], deterministic, memory."""


def _memory(policy: Policy, req: pb.ActRequest, n: int, single: bool) -> Memory | None:
    """The memory a request carries for its ``n`` observations: (h, c) [n, 2 * lstm_size] for a
    recurrent policy, which needs it; None for a feed-forward one, which takes none."""
    given = req.HasField("lstm_h"), req.HasField("lstm_c")
    module = policy.module
    if not module.recurrent:
        if any(given):
            raise WireError("this policy is feed-forward: it takes no lstm_h or lstm_c")
        return None
    width = 2 * module.lstm_size
    shape = [width] if single else [n, width]
    if not all(given):
        raise WireError(f"this policy is recurrent (lstm_size {module.lstm_size}): send its memory with the "
                        f"observations, lstm_h and lstm_c, float32 {shape} each: zeros for episodes that start, "
                        "then each reply's lstm_h and lstm_c")
    memory = []
    for name, array in (("lstm_h", req.lstm_h), ("lstm_c", req.lstm_c)):
        m = decode(array)
        if list(m.shape) != shape:
            raise WireError(f"{name} must have shape {shape} for these observations, got {list(m.shape)}")
        if m.dtype.kind != "f" or not np.all(np.isfinite(m)):
            raise WireError(f"{name} must be finite float numbers")
        memory.append(m.astype(np.float32, copy=False).reshape(n, width))
    return memory[0], memory[1]


def _first_policy(source: Path, follow: bool) -> Policy:
    """The newest checkpoint's policy; for a followed run that has none yet but a running trainer
    (``live.json``), an untrained one of the run's config, at version -1 until the store's weights
    load."""
    from shoal.algorithm import load_policy
    from shoal.algos import get
    from shoal.envs import EnvOptions, all_spaces
    from shoal.trainer import run_config

    try:
        return load_policy(source)
    except ShoalError:
        if not (follow and (source / LIVE).is_file()):
            raise
    algo, config = run_config(source)
    obs_space, action_space, own = all_spaces(config.env, config.env_kwargs, EnvOptions.of(config))
    return Policy(get(algo).make_policy(config, obs_space, action_space), version=-1, config=config,
                  env_observation_space=own if isinstance(own, ONE_HOT_SPACES) else None)


def _store_actor(live: dict[str, Any]) -> Any:
    """The WeightStore actor ``live.json`` names, joining its Ray cluster if this process has not."""
    import os

    if live.get("auth_mode") and "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = live["auth_mode"]  # as the trainer joined; Ray reads it on import
    import ray

    from shoal.backends import _check_reachable

    if not ray.is_initialized():
        _check_reachable(live["address"])
        ray.init(address=live["address"], namespace=live["namespace"], include_dashboard=False,
                 logging_level=logging.ERROR, log_to_driver=False)
    return ray.get_actor(live["actor"], namespace=live["namespace"])


class PolicyClient:
    """Python client of a policy server: ``client.act(obs) -> (actions, version)``. A failed call
    raises :class:`~shoal.remote.client.ServerError` (a ``grpc.RpcError`` too, with its status)."""

    def __init__(self, address: str, token: str | None = None, timeout_s: float = 10.0):
        token = token if token is not None else client_token()
        self.address = address
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout_s = timeout_s
        self.channel = open_channel(address)
        self._act = self.channel.unary_unary("/shoal.v1.PolicyService/Act",
                                             request_serializer=lambda m: m.SerializeToString(),
                                             response_deserializer=pb.ActReply.FromString)
        self._describe = self.channel.unary_unary("/shoal.v1.PolicyService/Describe",
                                                  request_serializer=lambda m: m.SerializeToString(),
                                                  response_deserializer=pb.PolicyInfo.FromString)

    def act(self, obs: np.ndarray, deterministic: bool = True, policy_id: str = "") -> tuple[np.ndarray, int]:
        return self.act_with_memory(obs, None, deterministic, policy_id)[:2]

    def act_with_memory(self, obs: np.ndarray, memory: Memory | None, deterministic: bool = True,
                        policy_id: str = "") -> tuple[np.ndarray, int, Memory | None]:
        """:meth:`act` for a recurrent policy (``describe().lstm_size`` > 0), whose memory the
        client holds: ``memory`` (h, c) is the previous reply's, or zeros [n, 2 * lstm_size] for
        episodes that start (:func:`initial_memory`). Returns the actions, the policy version and
        the memory for the episodes' next step."""
        request = _request(obs, memory, deterministic, policy_id)
        reply = _call(self.address, lambda: self._act(request, timeout=self.timeout_s, metadata=self.metadata))
        return _unpack(reply)

    def stream(self) -> "ActStream":
        """An ``ActStream`` call: ``act`` as here, many times over one call (cheaper per request)."""
        return ActStream(self.channel, self.metadata, self.address)

    def describe(self, policy_id: str = "") -> pb.PolicyInfo:
        return _call(self.address, lambda: self._describe(pb.PolicyRequest(policy_id=policy_id),
                                                          timeout=self.timeout_s, metadata=self.metadata))

    def close(self) -> None:
        self.channel.close()


def initial_memory(info: pb.PolicyInfo, n: int | None = None) -> Memory:
    """The memory (h, c) of episodes that start, for the policy ``info`` describes: zeros [n, 2 *
    lstm_size] each ([2 * lstm_size] when ``n`` is None: one observation)."""
    if not info.lstm_size:
        raise ShoalError(f"policy {info.policy_id!r} is feed-forward: it takes no memory")
    shape = (2 * info.lstm_size,) if n is None else (n, 2 * info.lstm_size)
    return np.zeros(shape, np.float32), np.zeros(shape, np.float32)


def _request(obs: np.ndarray, memory: Memory | None, deterministic: bool, policy_id: str) -> pb.ActRequest:
    request = pb.ActRequest(policy_id=policy_id, obs=encode(np.asarray(obs)), deterministic=deterministic)
    if memory is not None:
        request.lstm_h.CopyFrom(encode(np.asarray(memory[0], np.float32)))
        request.lstm_c.CopyFrom(encode(np.asarray(memory[1], np.float32)))
    return request


def _unpack(reply: pb.ActReply) -> tuple[np.ndarray, int, Memory | None]:
    memory = (np.array(decode(reply.lstm_h)), np.array(decode(reply.lstm_c))) if reply.HasField("lstm_h") else None
    return np.array(decode(reply.actions)), reply.version, memory


def _call(address: str, fn: Any) -> Any:
    try:
        return fn()
    except grpc.RpcError as e:
        raise ServerError("policy", address, e) from None


class ActStream:
    """Requests and replies over one ``ActStream`` call, one at a time (``act``); ``close`` ends it."""

    def __init__(self, channel: grpc.Channel, metadata: tuple[tuple[str, str], ...], address: str):
        self.address = address
        self.requests: queue.SimpleQueue[pb.ActRequest | None] = queue.SimpleQueue()
        call = channel.stream_stream("/shoal.v1.PolicyService/ActStream",
                                     request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=pb.ActReply.FromString)
        self.replies = call(iter(self.requests.get, None), metadata=metadata)

    def act(self, obs: np.ndarray, deterministic: bool = True, policy_id: str = "") -> tuple[np.ndarray, int]:
        return self.act_with_memory(obs, None, deterministic, policy_id)[:2]

    def act_with_memory(self, obs: np.ndarray, memory: Memory | None, deterministic: bool = True,
                        policy_id: str = "") -> tuple[np.ndarray, int, Memory | None]:
        """:meth:`PolicyClient.act_with_memory` over this stream."""
        self.requests.put(_request(obs, memory, deterministic, policy_id))
        reply = _call(self.address, lambda: next(self.replies))  # a failed request ends the stream
        return _unpack(reply)

    def close(self) -> None:
        self.requests.put(None)
