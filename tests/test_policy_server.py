"""Policy server: same actions as policy.act across batch sizes, batching, hot swap, bad input."""

from __future__ import annotations

import re
import shutil
import threading
import time

import grpc
import numpy as np
import pytest

import shoal
from shoal.errors import ShoalError
from shoal.remote.policyserver import PolicyClient, PolicyServer


def make_checkpoint(path, env="CartPole-v1", iterations=1, tiny=None):
    config = tiny(env=env, normalize_obs=True)
    with shoal.make(config) as algo:
        for _ in range(iterations):
            algo.train()
        algo.save(path)
    return shoal.load_policy(path)


def test_batched_decorator_gathers_concurrent_calls():
    seen = []

    class Doubler:
        @shoal.batched(max_batch=8, max_wait_ms=50)
        def double(self, xs):
            seen.append(len(xs))
            return [2 * x for x in xs]

    d = Doubler()
    results = [None] * 20
    barrier = threading.Barrier(20)

    def call(i):
        barrier.wait()
        results[i] = d.double(i)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [2 * i for i in range(20)]
    assert max(seen) == 8 and sum(seen) == 20 and len(seen) < 20  # gathered, and bounded by max_batch


def test_a_full_batch_is_served_at_once_and_a_lone_request_at_the_deadline():
    @shoal.batched(max_batch=4, max_wait_ms=2000)
    def ident(xs):
        return xs

    barrier = threading.Barrier(4)
    took = []

    def call(i):
        barrier.wait()
        start = time.monotonic()
        assert ident(i) == i
        took.append(time.monotonic() - start)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(took) == 4 and max(took) < 1.0  # the fourth request filled the batch: no 2 s wait
    start = time.monotonic()
    assert ident(7) == 7
    assert 1.9 < time.monotonic() - start < 10  # alone, it waits out max_wait_ms for company


def test_batched_errors_reach_every_caller_of_the_batch_and_the_service_goes_on():
    @shoal.batched(max_batch=4, max_wait_ms=1)
    def fragile(xs):
        if any(x < 0 for x in xs):
            raise ValueError("negative")
        return xs

    with pytest.raises(ValueError, match="negative"):
        fragile(-1)
    assert fragile(3) == 3


def test_batched_serves_coroutines_with_their_results_and_errors():
    import asyncio

    seen = []

    @shoal.batched(max_batch=8, max_wait_ms=50)
    def square(xs):
        seen.append(len(xs))
        if -1 in xs:
            raise ValueError("negative")
        return [x * x for x in xs]

    async def main():
        got = await asyncio.gather(*[square.acall(i) for i in range(20)])
        with pytest.raises(ValueError, match="negative"):
            await square.acall(-1)
        return got, await square.acall(3)

    got, after = asyncio.run(main())
    assert got == [i * i for i in range(20)] and after == 9
    assert max(seen) == 8 and sum(seen[:3]) == 20  # three gathered batches, bounded by max_batch


def test_served_actions_equal_policy_act_across_batch_sizes(tmp_path, tiny):
    for env in ("CartPole-v1", "Pendulum-v1"):
        policy = make_checkpoint(tmp_path / env, env=env, tiny=tiny)
        server = PolicyServer({"default": tmp_path / env}, port=0, max_batch=16, max_wait_ms=5).start()
        client = PolicyClient(server.address)
        try:
            rng = np.random.default_rng(0)
            obs = rng.normal(size=(64, *policy.observation_space.shape)).astype(np.float32)
            expected = policy.act(obs, deterministic=True)
            for size in (1, 3, 16, 64):
                got = np.concatenate([client.act(obs[i:i + size])[0] for i in range(0, 64, size)])
                np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
            stream = client.stream()
            for i in range(3):  # one observation, not a batch: one action, as policy.act gives it
                for act in (client.act, stream.act):
                    one = act(obs[i])[0]
                    assert one.shape == expected[i].shape
                    np.testing.assert_allclose(one, expected[i], rtol=1e-6, atol=1e-6)
            stream.close()
            # many clients at once: batched into shared forward passes, each gets its own rows
            out = [None] * 32

            def one(i):
                out[i] = client.act(obs[2 * i: 2 * i + 2])[0]

            threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            np.testing.assert_allclose(np.concatenate(out), expected, rtol=1e-6, atol=1e-6)
            assert max(server.infer.plain[0].sizes) > 1  # some forward passes served several clients
        finally:
            client.close()
            server.stop(grace=0)


def test_several_policies_by_id_and_clear_errors(tmp_path, tiny):
    make_checkpoint(tmp_path / "cart", tiny=tiny)
    make_checkpoint(tmp_path / "pend", env="Pendulum-v1", tiny=tiny)
    server = PolicyServer({"cart": tmp_path / "cart", "pend": tmp_path / "pend"}, port=0).start()
    client = PolicyClient(server.address)
    try:
        assert client.describe("pend").policy_ids == ["cart", "pend"]
        assert client.act(np.zeros((2, 3), np.float32), policy_id="pend")[0].shape == (2, 1)
        assert client.act(np.zeros((2, 4), np.float32), policy_id="cart")[0].shape == (2,)
        for obs, pid, code in [(np.zeros((2, 4), np.float32), "nope", grpc.StatusCode.NOT_FOUND),
                               (np.zeros((2, 5), np.float32), "cart", grpc.StatusCode.INVALID_ARGUMENT),
                               (np.full((1, 4), np.inf, np.float32), "cart", grpc.StatusCode.INVALID_ARGUMENT)]:
            with pytest.raises(shoal.ServerError) as e:  # one line naming the server; grpc's status kept
                client.act(obs, policy_id=pid)
            assert e.value.code() == code and e.value.details() and isinstance(e.value, grpc.RpcError)
            assert str(e.value) == f"policy server {server.address}: {code.name}: {e.value.details()}"
        assert client.act(np.zeros((1, 4), np.float32), policy_id="cart")[0].shape == (1,)  # still serving
    finally:
        client.close()
        server.stop(grace=0)


def test_frozen_lake_states_are_served_as_the_env_gives_them(tmp_path, tiny, monkeypatch):
    """A client in another language sends FrozenLake's integer states, one or a batch, as the env
    gives them; Describe names that space. The network still sees one-hot vectors. The server
    knows the space from the checkpoint: it never makes the env (a simulator it may not have)."""
    import gymnasium as gym

    policy = make_checkpoint(tmp_path / "lake", env="FrozenLake-v1", tiny=tiny)
    make_checkpoint(tmp_path / "cart", tiny=tiny)

    def no_env(*args, **kwargs):
        raise AssertionError("the policy server made an env")

    monkeypatch.setattr(gym, "make", no_env)
    server = PolicyServer({"lake": tmp_path / "lake", "cart": tmp_path / "cart"}, port=0, max_batch=8).start()
    client = PolicyClient(server.address)
    try:
        own = client.describe("lake").env_observation_space
        assert (own.kind, own.n, own.start) == ("discrete", 16, 0)
        assert not client.describe("cart").HasField("env_observation_space")
        expected = policy.act(np.eye(16, dtype=np.float32))
        stream = client.stream()
        for act in (client.act, stream.act):
            got = act(np.arange(16), policy_id="lake")[0]  # 16 states, a batch: not one flat vector of 16
            assert got.shape == (16,)
            np.testing.assert_array_equal(got, expected)
            for state in (0, 5, 15):
                one = act(np.int64(state), policy_id="lake")[0]
                assert one.shape == () and one == expected[state]
        stream.close()
        np.testing.assert_array_equal(client.act(np.eye(16, dtype=np.float32), policy_id="lake")[0], expected)
        for obs, message in [(np.array([3, 16]), "observation 16 is not in the env's observation space "
                                                 "Discrete(16)"),
                             (np.zeros(3, np.float32), "obs must have shape [16] (one) or [n, 16] (a batch), or "
                                                       "the env's own observation(s) in Discrete(16), got [3]")]:
            with pytest.raises(shoal.ServerError, match=re.escape(message)) as e:
                client.act(obs, policy_id="lake")
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert client.act(np.int64(1), policy_id="lake")[0] == expected[1]  # still serving
    finally:
        client.close()
        server.stop(grace=0)
    # a small message of integers may not become a large array of one-hot vectors
    server = PolicyServer({"lake": tmp_path / "lake"}, port=0, max_message_bytes=1 << 16).start()
    client = PolicyClient(server.address)
    try:
        assert client.act(np.zeros(1024, np.int64))[0].shape == (1024,)  # 16,384 numbers: at the bound
        with pytest.raises(shoal.ServerError, match="1025 integers of Discrete.16. one-hot into 16400 numbers, more "
                                                    "than the 16384 of a message at the size limit"):
            client.act(np.zeros(1025, np.int64))
    finally:
        client.close()
        server.stop(grace=0)


def test_a_policy_server_from_python_takes_one_path_and_serves_for_a_with_block(tmp_path, tiny):
    policy = make_checkpoint(tmp_path / "cart", tiny=tiny)
    obs = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    with shoal.PolicyServer(tmp_path / "cart", port=0) as server:  # the "default" policy
        client = shoal.PolicyClient(server.address)
        assert client.describe().policy_ids == ["default"]
        assert np.array_equal(client.act(obs)[0], policy.act(obs, deterministic=True))
        client.close()
    client = shoal.PolicyClient(server.address, timeout_s=2)
    with pytest.raises(shoal.ServerError, match="unreachable"):  # stopped at the block's end
        client.act(obs)
    client.close()


def test_a_client_of_a_missing_server_gets_one_line_naming_it():
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    client = PolicyClient(address, timeout_s=2)
    try:
        for call in (lambda: client.act(np.zeros((1, 4), np.float32)), client.describe,
                     lambda: client.stream().act(np.zeros((1, 4), np.float32))):
            with pytest.raises(ShoalError) as e:
                call()
            assert str(e.value) == f"policy server {address}: unreachable (is `shoal serve-policy` running there?)"
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        client.close()


def test_follow_hot_swaps_to_newer_checkpoints(tmp_path, tiny):
    config = tiny(total_steps=2048, checkpoint_interval=512)
    run = tmp_path / "run"
    with shoal.make(config) as algo:
        algo.train()
        algo.save(run / "checkpoints" / "ckpt_000000001")
        server = PolicyServer({"default": run}, port=0, follow=True, poll_s=0.05).start()
        client = PolicyClient(server.address)
        try:
            assert client.act(np.zeros((1, 4), np.float32))[1] == 1
            for _ in range(3):
                algo.train()
            algo.save(run / "checkpoints" / "ckpt_000000004")
            deadline = time.monotonic() + 10
            while client.act(np.zeros((1, 4), np.float32))[1] != 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert client.act(np.zeros((1, 4), np.float32))[1] == 4
        finally:
            client.close()
            server.stop(grace=0)


def test_follow_tries_a_stale_live_file_once_and_follows_the_checkpoints(tmp_path, tiny, caplog):
    """A trainer killed on Ray leaves live.json naming a cluster that is gone: the server says so
    once, serves the checkpoints, and does not knock on the dead address at every poll."""
    run = tmp_path / "run"
    make_checkpoint(run / "checkpoints" / "ckpt_000000001", tiny=tiny)
    (run / "live.json").write_text('{"address": "127.0.0.1:1", "namespace": "shoal", "actor": "weights-x"}')
    server = PolicyServer({"default": run}, port=0, follow=True, poll_s=0.05)
    try:
        assert server.refresh() == [] and server.policies["default"].version == 1
        assert caplog.text.count("cannot follow the trainer") == 1
        make_checkpoint(run / "checkpoints" / "ckpt_000000002", iterations=2, tiny=tiny)
        assert server.refresh() == ["default"] and server.policies["default"].version == 2
    finally:
        server.stop(grace=0)
    no_checkpoint = tmp_path / "fresh"
    shutil.copytree(run, no_checkpoint, ignore=shutil.ignore_patterns("checkpoints"))
    (no_checkpoint / "config.yaml").write_text("algo: ppo\nenv: CartPole-v1\n")
    with pytest.raises(ShoalError, match="no checkpoint yet, and the running trainer's weight store cannot be"):
        PolicyServer({"default": no_checkpoint}, port=0, follow=True)


def test_streams_and_the_guards_of_the_asyncio_server(tmp_path, tiny):
    """ActStream answers as Act does; a token, malformed bytes, an oversize message or a bad
    request fails that call only (a bad request ends its stream); health says SERVING."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from shoal.errors import ShoalError
    from shoal.remote.policyserver import ActStream

    token = "a-test-token-of-32-characters!!"
    policy = make_checkpoint(tmp_path / "cart", tiny=tiny)
    with pytest.raises(ShoalError, match="token"):
        PolicyServer({"default": tmp_path / "cart"}, host="0.0.0.0", port=0)
    server = PolicyServer({"default": tmp_path / "cart"}, port=0, token=token, max_message_bytes=1 << 16).start()
    client = PolicyClient(server.address, token=token)
    try:
        obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
        stream = client.stream()
        got = [stream.act(obs[i:i + 1])[0] for i in range(8)]
        np.testing.assert_allclose(np.concatenate(got), policy.act(obs, deterministic=True))
        with pytest.raises(grpc.RpcError) as e:
            stream.act(np.zeros((1, 5), np.float32))  # wrong shape: ends this stream
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "shape" in e.value.details()

        def status(fn):
            with pytest.raises(grpc.RpcError) as e:
                fn()
            return e.value.code()

        auth = (("authorization", f"Bearer {token}"),)
        raw = client.channel.unary_unary("/shoal.v1.PolicyService/Act")
        assert status(lambda: PolicyClient(server.address, token="x" * 31).act(obs[:1])) == \
            grpc.StatusCode.UNAUTHENTICATED
        assert status(lambda: ActStream(client.channel, (), server.address).act(obs[:1])) == grpc.StatusCode.UNAUTHENTICATED
        assert status(lambda: raw(b"\xff\xff\xff", metadata=auth, timeout=5)) == grpc.StatusCode.INVALID_ARGUMENT
        assert status(lambda: client.act(np.zeros((5000, 4), np.float32))) == grpc.StatusCode.RESOURCE_EXHAUSTED

        health = health_pb2_grpc.HealthStub(client.channel).Check(
            health_pb2.HealthCheckRequest(service="shoal.v1.PolicyService"), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        fresh = client.stream()  # still serving, on a new stream and on single calls
        np.testing.assert_allclose(fresh.act(obs[:2])[0], policy.act(obs[:2], deterministic=True))
        fresh.close()
        np.testing.assert_allclose(client.act(obs[:2])[0], policy.act(obs[:2], deterministic=True))
    finally:
        client.close()
        server.stop(grace=0)


def test_a_server_whose_grpc_stop_hangs_still_stops_past_its_grace(tmp_path, tiny, monkeypatch, caplog):
    """grpc.aio's stop can hang on calls it has already ended (grpc/grpc#28999, #37239; a fresh
    clone's `serve-policy --follow` outlived SIGTERM by 30 s once, 2026-11-29): the server's loop
    ends STOP_SLACK_S past the grace whatever grpc does, so `shoal serve-policy` exits."""
    import asyncio

    from shoal.remote import server as grpc_server

    make_checkpoint(tmp_path / "cart", tiny=tiny)
    server = PolicyServer({"default": tmp_path / "cart"}, port=0).start()
    aio = server.server

    async def never(grace):
        await asyncio.sleep(3600)

    monkeypatch.setattr(aio.server, "stop", never)
    monkeypatch.setattr(grpc_server, "STOP_SLACK_S", 0.5)
    start = time.monotonic()
    server.stop(grace=0.2)
    assert time.monotonic() - start < 3.0
    deadline = time.monotonic() + 5
    while aio.loop.is_running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not aio.loop.is_running()
    assert "had not stopped" in caplog.text
