"""Property-based fuzzing of the env server: 10,000 malformed requests, and it still serves."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.remote import shoal_pb2 as pb
from shoal.remote.envserver import EnvServer
from shoal.remote.wire import DTYPES, encode

# A clear status for the client; UNKNOWN or INTERNAL would mean the server itself broke.
EXPECTED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.RESOURCE_EXHAUSTED}
METHODS = ["Describe", "Open", "Reset", "Step", "Close"]


@pytest.fixture(scope="module")
def target():
    server = EnvServer("Pendulum-v1", 2, port=0, max_sessions=4, max_message_bytes=1 << 16).start()
    channel = grpc.insecure_channel(server.address)
    calls = {m: channel.unary_unary(f"/shoal.v1.EnvService/{m}") for m in METHODS}
    session = pb.OpenReply.FromString(calls["Open"](b"", timeout=5)).session
    calls["Reset"](pb.ResetRequest(session=session, seed=0).SerializeToString(), timeout=5)
    yield server, calls, session
    channel.close()
    server.stop(grace=0)


arrays = st.builds(
    lambda dtype, shape, data: pb.Array(dtype=dtype, shape=shape, data=data),
    st.one_of(st.sampled_from(list(DTYPES)), st.text(max_size=12)),
    st.lists(st.integers(-3, 1 << 40), max_size=10),
    st.binary(max_size=64))
payloads = st.one_of(
    st.binary(max_size=256),  # arbitrary bytes: mostly not a message at all
    arrays.map(lambda a: pb.StepRequest(session="x", actions=a).SerializeToString()),
    st.tuples(st.just(None), arrays).map(lambda t: t[1].SerializeToString()),
    st.text(max_size=40).map(lambda s: pb.ResetRequest(session=s).SerializeToString()),
    st.text(max_size=40).map(lambda s: pb.OpenRequest(env_id=s).SerializeToString()),
)


# Ten requests an example: one request an example, the hypothesis engine's own work per example
# (choosing, mutating, caching what it drew) took twice the time of the calls themselves
BATCH = 10


def fuzz(requests, send, total):
    """Send ``total`` requests drawn from ``requests``, ``BATCH`` to a hypothesis example; what
    ``send`` returned for each (None: it was not sent)."""
    sent = []

    @settings(max_examples=total // BATCH, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(requests, min_size=BATCH, max_size=BATCH))
    def run(batch):
        sent.extend(send(*request) for request in batch)

    run()
    return [s for s in sent if s is not None]


def test_malformed_requests_get_clear_statuses(target):
    server, calls, session = target

    def send(method, payload, use_session):
        if use_session and method == "Step":  # the real session, with whatever actions were generated
            try:
                req = pb.StepRequest.FromString(payload)
            except Exception:
                req = pb.StepRequest()
            req.session = session
            payload = req.SerializeToString()
        if method == "Close" and session.encode() in payload:
            return None  # closing the fuzzer's own session is a valid request
        try:
            calls[method](payload, timeout=5)
        except grpc.RpcError as e:
            assert e.code() in EXPECTED, (method, payload[:64], e.code(), e.details())
        return method

    sent = fuzz(st.tuples(st.sampled_from(METHODS), payloads, st.booleans()), send, 10_000)
    assert len(sent) >= 10_000 and set(sent) == set(METHODS), len(sent)


def test_malformed_step_streams_get_clear_statuses_and_give_their_places_back(target):
    """StepStream calls of malformed requests, each a stream of a few: every one ends with a clear
    status, and none keeps its place among the streams the server takes (one per session: a leak
    would soon refuse every stream)."""
    server, calls, session = target
    channel = grpc.insecure_channel(server.address)
    stream = channel.stream_stream("/shoal.v1.EnvService/StepStream")

    def send(payloads):
        try:
            list(stream(iter(payloads), timeout=5))
        except grpc.RpcError as e:
            assert e.code() in EXPECTED, (payloads[0][:64], e.code(), e.details())
        return len(payloads)

    try:
        sent = fuzz(st.tuples(st.lists(payloads, min_size=1, max_size=3)), send, 1_000)
    finally:
        channel.close()
    for _ in range(250):  # the last stream's handler may still be giving its place back
        if not len(server.server.streams):
            break
        time.sleep(0.02)
    assert len(sent) == 1_000 and len(server.server.streams) == 0


def test_the_server_still_serves_after_the_fuzzing(target):
    server, calls, session = target
    reply = pb.StepReply.FromString(calls["Step"](pb.StepRequest(
        session=session, actions=encode(np.zeros((2, 1), np.float32))).SerializeToString(), timeout=5))
    assert reply.obs.shape == [2, 3]


@pytest.fixture(scope="module")
def policy_target(tmp_path_factory):
    """The policy server (grpc.aio) on an untrained CartPole policy."""
    import shoal
    from shoal.algos.ppo import PPOConfig
    from shoal.remote.policyserver import PolicyServer

    path = tmp_path_factory.mktemp("policy") / "ckpt"
    with shoal.make(PPOConfig(env="CartPole-v1", progress=False, tensorboard=False)) as algo:
        algo.save(path)
    server = PolicyServer({"default": path}, port=0, max_batch=8, max_wait_ms=1,
                          max_message_bytes=1 << 16).start()
    channel = grpc.insecure_channel(server.address)
    yield channel.unary_unary("/shoal.v1.PolicyService/Act"), channel.stream_stream("/shoal.v1.PolicyService/ActStream")
    channel.close()
    server.stop(grace=0)


act_payloads = st.one_of(
    st.binary(max_size=256),
    st.tuples(st.text(max_size=12), arrays, st.booleans()).map(
        lambda t: pb.ActRequest(policy_id=t[0], obs=t[1], deterministic=t[2]).SerializeToString()),
)


def test_the_policy_server_answers_malformed_requests_clearly(policy_target):
    act, act_stream = policy_target

    def send(payload, stream):
        try:
            if stream:  # a stream of one bad request, then the end
                list(act_stream(iter([payload]), timeout=5))
            else:
                act(payload, timeout=5)
        except grpc.RpcError as e:
            assert e.code() in EXPECTED, (stream, payload[:64], e.code(), e.details())
        return stream

    assert len(fuzz(st.tuples(act_payloads, st.booleans()), send, 3_000)) == 3_000


def test_the_policy_server_still_serves_after_the_fuzzing(policy_target):
    act, _ = policy_target
    reply = pb.ActReply.FromString(act(pb.ActRequest(obs=encode(np.zeros((3, 4), np.float32)),
                                                     deterministic=True).SerializeToString(), timeout=5))
    assert reply.actions.shape == [3]
