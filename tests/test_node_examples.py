"""The Node.js examples, written from proto/shoal.proto alone: a client that drives shoal's env
server (examples/node_env_client), and a simulator (examples/node_simulator) that serves
EnvService itself for shoal to train on, then plays with the trained policy through
`shoal serve-policy`. The protocol is a contract that another language keeps, on either side."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import grpc
import gymnasium as gym
import numpy as np
import pytest
from conftest import npm_installed, raw_call, status_of

import shoal
from shoal.errors import ShoalError
from shoal.remote import shoal_pb2 as pb
from shoal.remote.client import RemoteVectorEnv
from shoal.remote.envserver import EnvServer
from shoal.remote.policyserver import PolicyServer
from shoal.remote.wire import encode

EXAMPLES = Path(__file__).parent.parent / "examples"
TOKEN = "node-examples-test-token-0123456789"

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")


@pytest.fixture(scope="module")
def node_client():
    return npm_installed(EXAMPLES / "node_env_client") / "client.js"


@pytest.fixture(scope="module")
def server_js():
    return npm_installed(EXAMPLES / "node_simulator") / "server.js"


def run(client, address, token, steps=200):
    env = {**os.environ, "SHOAL_TOKEN": token}
    return subprocess.run(["node", str(client), address, "--steps", str(steps), "--seed", "3"], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("env_id, low, high", [("CartPole-v1", 8, 60), ("Pendulum-v1", -1800, -700)])
def test_node_client_plays_episodes_of_a_served_env(node_client, env_id, low, high):
    server = EnvServer(env_id, 4, port=0, token=TOKEN).start()
    try:
        out = run(node_client, server.address, TOKEN, steps=400)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["env_id"] == env_id and result["num_envs"] == 4 and result["steps"] == 1600
        assert result["episodes"] > 0 and low < result["mean_return"] < high  # random actions' returns
        assert not server.sessions  # the client closed its session
        bad = run(node_client, server.address, "wrong-token-wrong-token-wrong")
        assert bad.returncode == 1 and "missing or wrong bearer token" in bad.stderr
    finally:
        server.stop(grace=0)


@pytest.fixture
def serve(server_js):
    """Start `node server.js ARGS --port 0` (with SHOAL_TOKEN=token); returns its address."""
    procs = []

    def start(*args, token=TOKEN):
        env = {k: v for k, v in os.environ.items() if k != "SHOAL_TOKEN"}
        if token:
            env["SHOAL_TOKEN"] = token
        proc = subprocess.Popen(["node", str(server_js), *args, "--port", "0"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        line = proc.stdout.readline()
        assert " on " in line, line + proc.stdout.read()
        return line.split(" on ")[1].split()[0]

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_node_simulator_steps_as_gymnasiums_cartpole_through_remote_vector_env(serve, monkeypatch):
    monkeypatch.setenv("SHOAL_TOKEN", TOKEN)
    env = RemoteVectorEnv(f"remote://{serve('--num-envs', '3')}/CartPole-v1")
    reference = gym.make("CartPole-v1")
    assert env.num_envs == 3 and env.single_action_space == reference.action_space
    assert env.single_observation_space == reference.observation_space
    obs, _ = env.reset(seed=3)
    assert np.array_equal(obs, env.reset(seed=3)[0]) and len({tuple(o) for o in obs}) == 3  # env i: seed + i
    assert obs.dtype == np.float32 and np.all(np.abs(obs) < 0.05)
    sim = reference.unwrapped
    rng = np.random.default_rng(0)
    episodes = 0
    for _ in range(400):
        actions = rng.integers(0, 2, 3)
        before, (obs, rewards, terminated, truncated, info) = obs, env.step(actions)
        assert np.all(rewards == 1.0) and not truncated.any()
        for i in range(3):  # Gymnasium's CartPole, put in the state the Node.js one was in, steps alike
            sim.state, sim.steps_beyond_terminated = before[i].astype(np.float64), None
            expected, _, ended, _, _ = sim.step(int(actions[i]))
            last = np.asarray(info["final_obs"][i], np.float32) if terminated[i] else obs[i]
            np.testing.assert_allclose(last, expected, atol=1e-5)
            assert ended == terminated[i]
            if ended:  # same-step autoreset: the next episode's first observation
                assert np.all(np.abs(obs[i]) < 0.05)
        episodes += int(terminated.sum())
    assert episodes >= 20
    env.close()
    # episodes that last are truncated at the step limit, as TimeLimit truncates CartPole-v1's at 500
    env = RemoteVectorEnv(f"remote://{serve('--num-envs', '2', '--max-episode-steps', '5')}")
    env.reset(seed=0)
    ends = [env.step(np.array([0, 1]))[2:4] for _ in range(5)]
    assert not any(t.any() for t, _ in ends) and [bool(u.all()) for _, u in ends] == [False] * 4 + [True]
    env.close()


def test_the_node_simulator_passes_shoal_check_env(serve, monkeypatch, capsys):
    """`shoal check-env remote://...`: the checks a simulator's author runs against a server of
    their own, here the Node.js one: every reply's arrays, seeded resets, bad actions refused."""
    from shoal.cli import main

    monkeypatch.setenv("SHOAL_TOKEN", TOKEN)
    code = main(["check-env", f"remote://{serve('--num-envs', '3')}", "--seconds", "0.3"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "proto/shoal.proto's checks: passed" in out and "two resets with seed 0: the same observations" in out
    assert out.count("refused with INVALID_ARGUMENT, and the session went on") == 2, out
    assert "trains with: a2c, appo, ars, dqn, impala, ppo, qrdqn, sac, trpo" in out and "steps/s over the wire" in out


def test_bad_requests_get_clear_statuses_and_the_node_server_keeps_serving(serve, monkeypatch, server_js):
    addr = serve("--num-envs", "2", "--max-sessions", "3", "--max-message-mb", "0.0625")
    session = pb.OpenReply.FromString(raw_call(addr, "Open", b"", TOKEN)).session
    raw_call(addr, "Reset", pb.ResetRequest(session=session, seed=1).SerializeToString(), TOKEN)

    def step(actions, session=session, token=TOKEN):
        return pb.StepReply.FromString(
            raw_call(addr, "Step", pb.StepRequest(session=session, actions=actions).SerializeToString(), token))

    ok = encode(np.zeros(2, np.int64))
    fresh = pb.OpenReply.FromString(raw_call(addr, "Open", b"", TOKEN)).session
    cases = {
        "no token": (lambda: step(ok, token=None), grpc.StatusCode.UNAUTHENTICATED),
        "wrong token": (lambda: step(ok, token="x" * 33), grpc.StatusCode.UNAUTHENTICATED),
        "oversize": (lambda: raw_call(addr, "Step", b"\0" * (1 << 17), TOKEN), grpc.StatusCode.RESOURCE_EXHAUSTED),
        "malformed bytes": (lambda: raw_call(addr, "Step", b"\xff\xff\xff", TOKEN), grpc.StatusCode.INVALID_ARGUMENT),
        "no actions": (lambda: raw_call(addr, "Step", pb.StepRequest(session=session).SerializeToString(), TOKEN),
                       grpc.StatusCode.INVALID_ARGUMENT),
        "wrong shape": (lambda: step(encode(np.zeros(3, np.int64))), grpc.StatusCode.INVALID_ARGUMENT),
        "wrong dtype": (lambda: step(encode(np.zeros(2, np.float32))), grpc.StatusCode.INVALID_ARGUMENT),
        "byte count": (lambda: step(pb.Array(dtype="int64", shape=[2], data=b"\0" * 7)),
                       grpc.StatusCode.INVALID_ARGUMENT),
        "out of bounds": (lambda: step(encode(np.array([0, 2]))), grpc.StatusCode.INVALID_ARGUMENT),
        "negative seed": (lambda: raw_call(addr, "Reset", pb.ResetRequest(session=session, seed=-1).SerializeToString(),
                                           TOKEN), grpc.StatusCode.INVALID_ARGUMENT),
        "unknown session": (lambda: step(ok, session="nope"), grpc.StatusCode.NOT_FOUND),
        "unknown env id": (lambda: raw_call(addr, "Open", pb.OpenRequest(env_id="Pendulum-v1").SerializeToString(),
                                            TOKEN), grpc.StatusCode.NOT_FOUND),
        "step before reset": (lambda: step(ok, session=fresh), grpc.StatusCode.FAILED_PRECONDITION),
    }
    for name, (call, expected) in cases.items():
        code, details = status_of(call)
        assert code == expected, (name, code, details)
        assert details, name
        assert step(ok).rewards.shape == [2]  # after every bad request, the good client is served as before
    raw_call(addr, "Open", b"", TOKEN)
    assert status_of(lambda: raw_call(addr, "Open", b"", TOKEN))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    # over StepStream (what RemoteVectorEnv uses) a bad action ends that stream with its status
    monkeypatch.setenv("SHOAL_TOKEN", TOKEN)
    raw_call(addr, "Close", pb.CloseRequest(session=fresh).SerializeToString(), TOKEN)
    env = RemoteVectorEnv(f"remote://{addr}")
    env.reset(seed=0)
    env.step(np.array([1, 0]))
    with pytest.raises(ShoalError, match="INVALID_ARGUMENT: actions out of bounds"):
        env.step(np.array([1, 5]))
    assert step(ok).rewards.shape == [2]
    # the standard health service answers, without a token
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(addr) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="shoal.v1.EnvService"),
                                                           timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    # binding beyond loopback without a token is refused in one line
    out = subprocess.run(["node", str(server_js), "--host", "0.0.0.0", "--port", "0"], capture_output=True, text=True,
                         timeout=30, env={k: v for k, v in os.environ.items() if k != "SHOAL_TOKEN"})
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "give it a token" in out.stderr


def test_the_node_simulator_answers_1000_malformed_requests_with_clear_statuses_and_keeps_serving(serve):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_fuzz_server import EXPECTED, METHODS, payloads

    addr = serve("--num-envs", "2", "--max-sessions", "4", "--max-message-mb", "0.0625", token=None)
    session = pb.OpenReply.FromString(raw_call(addr, "Open", b"")).session
    raw_call(addr, "Reset", pb.ResetRequest(session=session, seed=0).SerializeToString())
    with grpc.insecure_channel(addr) as channel:
        calls = {m: channel.unary_unary(f"/shoal.v1.EnvService/{m}") for m in METHODS}

        @settings(max_examples=1_000, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
        @given(method=st.sampled_from(METHODS), payload=payloads)
        def fuzz(method, payload):
            if method == "Close" and session.encode() in payload:
                return  # closing the fuzzer's own session is a valid request
            try:
                calls[method](payload, timeout=5)
            except grpc.RpcError as e:
                assert e.code() in EXPECTED, (method, payload, e.code(), e.details())

        fuzz()
    step = pb.StepRequest(session=session, actions=encode(np.array([1, 0]))).SerializeToString()
    assert pb.StepReply.FromString(raw_call(addr, "Step", step)).rewards.shape == [2]


def test_ppo_learns_the_node_simulator_and_the_simulator_plays_with_the_served_policy(serve, server_js, tmp_path,
                                                                                      capsys, monkeypatch):
    from shoal.algos.ppo import PPOConfig
    from shoal.cli import main
    from shoal.config import build

    monkeypatch.setenv("SHOAL_TOKEN", TOKEN)
    config = build(PPOConfig, "ppo", env=f"remote://{serve('--num-envs', '8')}/CartPole-v1", sets={
        "seed": 0, "total_steps": 100_000, "stop_return": 475, "progress": False, "tensorboard": False})
    summary = shoal.train(config, run_dir=tmp_path / "run")
    assert summary["best_eval_return"] >= 475, summary
    # the policy learned on the JavaScript simulator balances Gymnasium's CartPole-v1 as well
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--env", "CartPole-v1", "--episodes", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("CartPole-v1: return") and float(out.split("return")[1].split()[0]) >= 475, out
    # and the simulator plays with it, asking `shoal serve-policy` for each step's action
    server = PolicyServer({"default": tmp_path / "run"}, port=0, token=TOKEN).start()
    try:
        played = subprocess.run(["node", str(server_js.parent / "play.js"), server.address, "--episodes", "3"],
                                capture_output=True, text=True, timeout=120, env={**os.environ, "SHOAL_TOKEN": TOKEN})
        assert played.returncode == 0, played.stderr
        result = json.loads(played.stdout)
        assert result["episodes"] == 3 and result["mean_return"] >= 475, result
        assert result["version"] == shoal.load_policy(tmp_path / "run").version
        refused = subprocess.run(["node", str(server_js.parent / "play.js"), server.address], capture_output=True,
                                 text=True, timeout=60, env={**os.environ, "SHOAL_TOKEN": "w" * 32})
        assert refused.returncode == 1 and refused.stderr.strip() == "error: missing or wrong bearer token"
    finally:
        server.stop(grace=0)
