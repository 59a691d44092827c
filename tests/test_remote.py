"""Env server and RemoteVectorEnv over real gRPC on loopback: semantics, learning, bad input."""

from __future__ import annotations

import grpc
import gymnasium as gym
import numpy as np
import pytest
import yaml
from conftest import raw_call, status_of

from shoal.errors import ShoalError
from shoal.remote import shoal_pb2 as pb
from shoal.remote.client import RemoteVectorEnv
from shoal.remote.envserver import EnvServer
from shoal.remote.wire import WireError, check_actions, decode, decode_space, encode, encode_space

TOKEN = "a-test-token-of-32-characters!!"


@pytest.fixture
def servers():
    started = []

    def start(env_id="CartPole-v1", num_envs=4, **kw):
        server = EnvServer(env_id, num_envs, **kw).start()
        started.append(server)
        return server

    start.started = started
    yield start
    for s in started:
        s.stop(grace=0)


@pytest.mark.parametrize("space, good, bad", [
    (gym.spaces.Box(-2.0, 2.0, (3,)), [[0.5, -2.0, 2.0]], [[0.5, -2.0, 2.5]]),
    (gym.spaces.Discrete(3, start=-1), [-1, 1], [-1, 2]),
    (gym.spaces.MultiDiscrete([3, 4]), [[2, 3]], [[2, 4]]),
    (gym.spaces.MultiDiscrete([3, 4], start=[-1, 2]), [[-1, 5]], [[-2, 5]]),
    (gym.spaces.MultiBinary(4), [[1, 0, 0, 1]], [[1, 0, 2, 1]]),
    (gym.spaces.MultiBinary([2, 2]), [[[1, 0], [0, 1]]], [[[1, 0], [0, -1]]]),
])
def test_every_space_kind_crosses_the_wire_and_bounds_its_actions(space, good, bad):
    """A client rebuilds the very space the server describes (equal to the env's own), and the
    server takes actions inside it and refuses the first one out of bounds."""
    assert decode_space(pb.Space.FromString(encode_space(space).SerializeToString())) == space
    good, bad = np.asarray(good, space.dtype), np.asarray(bad, space.dtype)
    assert np.array_equal(check_actions(space, good, len(good)), good)
    with pytest.raises(WireError, match="out of bounds"):
        check_actions(space, bad, len(bad))


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.arange(12, dtype=">i4").reshape(3, 4),  # big-endian: sent little-endian
    np.arange(12.0).reshape(3, 4).T,  # not C-contiguous: sent in C order
    np.zeros((2, 6), np.uint8)[:, ::2],
    np.array([True, False]),
    np.float16(1.5),  # rank 0
])
def test_arrays_cross_the_wire_with_their_values_shape_and_dtype(array):
    msg = pb.Array.FromString(encode(array).SerializeToString())
    assert msg.dtype == array.dtype.name and len(msg.data) == array.nbytes
    back = decode(msg)
    assert back.shape == array.shape and back.dtype == array.dtype.newbyteorder("<")
    assert np.array_equal(back, array)
    with pytest.raises(WireError, match="cannot send dtype <U1"):
        encode(np.array(["a"]))


def test_remote_vector_env_steps_like_the_local_one(servers):
    from shoal.envs import make_vector_env

    server = servers(num_envs=3)
    remote = RemoteVectorEnv(f"remote://{server.address}")
    local = make_vector_env("CartPole-v1", 3)
    assert remote.num_envs == 3 and remote.single_action_space == local.single_action_space
    obs_r, _ = remote.reset(seed=5)
    obs_l, _ = local.reset(seed=5)
    np.testing.assert_array_equal(obs_r, obs_l)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(300):
        a = rng.integers(0, 2, 3)
        r1, r2 = remote.step(a), local.step(a)
        for x, y in zip(r1[:4], r2[:4]):
            np.testing.assert_array_equal(x, y)
        if r2[2].any() or r2[3].any():
            ended += 1
            done = r2[2] | r2[3]
            for b in np.flatnonzero(done):  # same-step autoreset: the true last observation travels too
                np.testing.assert_array_equal(r1[4]["final_obs"][b], r2[4]["final_obs"][b])
    assert ended > 0
    remote.close()


def test_the_served_env_is_made_with_the_servers_env_kwargs(servers):
    """FrozenLake without slipping: every env walks right along the top row, one cell per step."""
    server = servers("FrozenLake-v1", 3, env_kwargs={"is_slippery": False})
    env = RemoteVectorEnv(f"remote://{server.address}")
    obs, _ = env.reset(seed=0)
    for cell in range(4):
        np.testing.assert_array_equal(obs.argmax(1), [cell] * 3)
        obs = env.step(np.full(3, 2))[0]  # 2: right
    env.close()


# PPO solves CartPole through remote envs spread over two env servers in tests/test_faults.py,
# through a restart of one of them.


def test_env_servers_named_by_a_repeated_flag_or_a_list_in_a_config_file_and_eval_on_a_local_copy(servers, tmp_path, capsys):
    from shoal.cli import main

    a, b = servers(num_envs=2), servers(num_envs=2)
    fast = ["--total-steps", "64", "--rollout-steps", "16", "--minibatch-size", "32", "--num-epochs", "1",
            "--eval-episodes", "2", "--no-progress", "--no-tensorboard"]
    assert main(["train", "ppo", "--env", f"remote://{a.address}/CartPole-v1", "--env", f"remote://{b.address}",
                 "--run-dir", str(tmp_path / "flags"), *fast]) == 0, capsys.readouterr().err
    saved = yaml.safe_load((tmp_path / "flags" / "config.yaml").read_text())
    assert saved["env"] == f"remote://{a.address},{b.address}/CartPole-v1"
    assert saved["rollout_steps"] == 16 and saved["gamma"] == 0.98  # the flag over the CartPole-v1 preset
    served = a.steps_served, b.steps_served
    assert min(served) > 0
    (tmp_path / "my.yaml").write_text(yaml.safe_dump({"env": [f"remote://{a.address}", f"remote://{b.address}"]}))
    assert main(["train", "ppo", "--config", str(tmp_path / "my.yaml"), "--run-dir", str(tmp_path / "file"),
                 *fast]) == 0, capsys.readouterr().err
    assert yaml.safe_load((tmp_path / "file" / "config.yaml").read_text())["env"] == f"remote://{a.address},{b.address}"
    assert a.steps_served > served[0] and b.steps_served > served[1]
    # a run on env servers is evaluated on a local copy of the env, whose spaces must match
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "flags"), "--env", "CartPole-v1", "--episodes", "2"]) == 0
    assert capsys.readouterr().out.startswith("CartPole-v1: return")
    assert main(["eval", str(tmp_path / "flags"), "--env", "Pendulum-v1"]) == 2
    assert "does not fit Pendulum-v1: the env gives observations" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "flags"), "--video", str(tmp_path / "v")]) == 2
    assert "add --env ENV_ID" in capsys.readouterr().err


@pytest.mark.parametrize("env, name", [
    ("remote://127.0.0.1:50051,127.0.0.1:50052/CartPole-v1", "remote-CartPole-v1"),
    ("remote://127.0.0.1:50051/ALE/Pong-v5", "remote-ALE_Pong-v5"),
    ("remote://127.0.0.1:50051", "remote-127.0.0.1_50051"),
    ("remote://10.0.0.5:50051,10.0.0.6:50051,10.0.0.7:50051", "remote-10.0.0.5_50051+2"),
])
def test_a_run_on_env_servers_gets_a_run_directory_named_by_its_env_or_first_server(env, name):
    from shoal.rundir import RunDir

    path = RunDir.default_path("ppo", env, 0)
    assert path.parent.name == "runs" and path.name.startswith(f"ppo-{name}-") and path.name.endswith("-s0")


def spoiling(servers, spoil, env_id="CartPole-v1"):
    """A started env server of 2 ``env_id`` envs whose step replies ``spoil`` changes."""
    class Spoiling(EnvServer):
        def step(self, req, context):
            reply = super().step(req, context)
            spoil(reply)
            return reply

    server = Spoiling(env_id, 2).start()
    servers.started.append(server)
    return server


def _spoil(field, value):
    def spoil(reply):
        if isinstance(value, bytes):
            getattr(reply, field).data = value
        elif field.startswith("final_info/"):
            reply.info[field].CopyFrom(encode(value))
        else:
            getattr(reply, field).CopyFrom(encode(value))
    return spoil


@pytest.mark.parametrize("spoil, message", [
    (_spoil("obs", np.zeros((2, 3), np.float32)), "replied to Step with obs of shape (2, 3) (float32), where its 2 "
                                                  "envs need shape (2, 4) (numbers)"),
    (_spoil("rewards", np.zeros(1)), "replied to Step with rewards of shape (1,) (float64), where its 2 envs need "
                                     "shape (2,) (numbers)"),
    (_spoil("terminated", np.zeros(2)), "replied to Step with terminated of shape (2,) (float64), where its 2 envs "
                                        "need shape (2,) (bool)"),
    (_spoil("final_obs", np.zeros((2, 4), bool)), "replied to Step with final_obs of shape (2, 4) (bool), where its 2 "
                                                  "envs need shape (2, 4) (numbers)"),
    (_spoil("obs", b"abc"), "replied to Step with a malformed obs array (3 bytes do not hold a float32 array of shape "
                            "(2, 4))"),
    (_spoil("final_info/score", np.zeros(3)), "replied to Step with info entry final_info/score of shape (3,), where "
                                              "its 2 envs need one value each"),
])
def test_a_server_whose_replies_break_the_protocol_is_named_in_one_line(servers, spoil, message):
    """A simulator in another language behind the .proto may get a reply wrong: the client says
    which server, which array and what the protocol needs, instead of failing later in NumPy or
    the policy with shapes nobody can place."""
    server = spoiling(servers, spoil)
    env = RemoteVectorEnv(f"remote://{server.address}")
    env.reset(seed=0)
    with pytest.raises(ShoalError) as caught:
        env.step(np.zeros(2, np.int64))
    assert str(caught.value) == f"env server {server.address} {message}: it does not keep to proto/shoal.proto"
    env.close()


def test_replies_in_another_numeric_dtype_are_taken_as_the_spaces(servers):
    def wider(reply):
        reply.obs.CopyFrom(encode(decode(reply.obs).astype(np.float64)))
        reply.rewards.CopyFrom(encode(decode(reply.rewards).astype(np.int32)))

    server = spoiling(servers, wider)
    env = RemoteVectorEnv(f"remote://{server.address}")
    env.reset(seed=0)
    obs, rewards, *_ = env.step(np.zeros(2, np.int64))
    assert obs.dtype == np.float32 and rewards.dtype == np.float64 and (rewards == 1).all()
    env.close()


class Pixels(gym.Env):
    """Three uint8 "pixels" of value 7, as an image env gives them."""
    observation_space = gym.spaces.Box(0, 255, (3,), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(3, 7, np.uint8), {}

    def step(self, action):
        return np.full(3, 7, np.uint8), 1.0, False, False, {}


@pytest.mark.parametrize("value, taken", [(200, True), (300, False), (-1, False)])
def test_integer_observations_in_a_wider_dtype_are_cast_only_where_their_values_fit(servers, value, taken):
    """A uint8 image sent as int16 is taken as uint8; a value a cast would wrap (300 to 44) fails
    the run in one line instead."""
    gym.register("ShoalTestPixels-v0", entry_point=Pixels)

    def wider(reply):
        obs = decode(reply.obs).astype(np.int16)
        obs[1, 2] = value
        reply.obs.CopyFrom(encode(obs))

    try:
        server = spoiling(servers, wider, "ShoalTestPixels-v0")
        env = RemoteVectorEnv(f"remote://{server.address}")
        env.reset(seed=0)
        if taken:
            obs = env.step(np.zeros(2, np.int64))[0]
            assert obs.dtype == np.uint8 and obs[1, 2] == value and (obs[0] == 7).all()
        else:
            with pytest.raises(ShoalError) as caught:
                env.step(np.zeros(2, np.int64))
            assert str(caught.value) == (f"env server {server.address} replied to Step with obs values from "
                                         f"{min(value, 7)} to {max(value, 7)} (int16), outside the range of its "
                                         "space's uint8: it does not keep to proto/shoal.proto")
        env.close()
    finally:
        gym.registry.pop("ShoalTestPixels-v0")


def test_an_env_class_is_served_from_python_for_a_with_block():
    """shoal.EnvServer takes a gymnasium.Env subclass, as a config's env does (its import path)."""
    import shoal

    with shoal.EnvServer(Pixels, 2) as server:
        assert server.env_id == "test_remote:Pixels"
        env = shoal.RemoteVectorEnv(f"remote://{server.address}")
        obs, _ = env.reset(seed=0)
        assert obs.dtype == np.uint8 and obs.shape == (2, 3) and (obs == 7).all()
        env.close()
    with pytest.raises(ShoalError, match="unreachable"):  # stopped at the block's end
        shoal.RemoteVectorEnv(f"remote://{server.address}", timeout_s=2)


def test_a_restarted_server_is_reconnected(servers):
    server = servers(num_envs=2)
    port = server.server.port
    env = RemoteVectorEnv(f"remote://{server.address}", reconnect_s=20)
    env.reset(seed=0)
    env.step(np.zeros(2, np.int64))
    server.stop(grace=0)
    restarted = servers(num_envs=2, port=port)
    obs, rewards, terminated, truncated, info = env.step(np.zeros(2, np.int64))
    assert env.reconnects == 1 and env.dropped_episodes == 2
    assert truncated.all() and not terminated.any() and "final_obs" in info  # old episodes end there
    obs, *_ = env.step(np.zeros(2, np.int64))  # and the new session goes on
    assert len(restarted.sessions) == 1
    env.close()


def test_an_env_that_raises_on_the_server_is_replaced_and_its_client_counts_it(servers, monkeypatch):
    """The server replaces an env that raises (its other envs go on) and says so in the reply: the
    client marks that env's episode as lost (truncated, reward 0) and counts it, as a runner
    does for a local env, instead of taking the cut for an ordinary one-step episode."""
    import json

    monkeypatch.setenv("SHOAL_FAULTS", json.dumps({"101": [5]}))  # env 1 (reset seed 100 + 1), step 5
    server = servers(env_id="shoal.testing:FaultyCartPole-v1", num_envs=2)
    env = RemoteVectorEnv(f"remote://{server.address}")
    env.reset(seed=100)
    for _ in range(4):
        _, _, _, _, info = env.step(np.zeros(2, np.int64))
        assert "_env_error" not in info
    obs, rewards, terminated, truncated, info = env.step(np.zeros(2, np.int64))
    assert info["_env_error"].tolist() == [False, True] and truncated[1] and not terminated[1] and rewards[1] == 0
    assert env.env_restarts == 1 and env.last_error.startswith("RuntimeError: injected fault at step 5")
    _, _, _, _, info = env.step(np.zeros(2, np.int64))  # the replacement steps on
    assert "_env_error" not in info and env.env_restarts == 1
    env.close()


class _BrokenStep(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        raise RuntimeError("the simulator is down")


def test_an_env_that_raises_on_every_step_is_logged_once_per_interval_not_per_step(servers, caplog, monkeypatch):
    """A broken env fails every step of every session: the server's log says so at once, then at
    most once per interval with a count, and counts every failure."""
    from shoal.remote import envserver

    gym.register("ShoalBrokenStep-v0", entry_point=_BrokenStep)
    server = servers(env_id="ShoalBrokenStep-v0", num_envs=2)
    env = RemoteVectorEnv(f"remote://{server.address}")
    env.reset(seed=0)
    caplog.set_level("WARNING", logger="shoal")
    for _ in range(50):
        env.step(np.zeros(2, np.int64))
    warnings = [r.getMessage() for r in caplog.records if "were replaced" in r.getMessage()]
    assert warnings == ["2 env(s) of ShoalBrokenStep-v0 raised and were replaced; the last said RuntimeError: "
                        f"the simulator is down (at {__file__}:{_BrokenStep.step.__code__.co_firstlineno + 1})"]
    assert server.env_failures == 100
    monkeypatch.setattr(envserver, "ENV_ERROR_LOG_INTERVAL_S", 0.0)  # the interval has passed
    env.step(np.zeros(2, np.int64))
    assert caplog.records[-1].getMessage().startswith("100 env(s) of ShoalBrokenStep-v0 raised in the last ")
    env.close()
    gym.registry.pop("ShoalBrokenStep-v0")


def test_a_server_that_stays_down_fails_clearly(servers):
    server = servers(num_envs=2)
    env = RemoteVectorEnv(f"remote://{server.address}", reconnect_s=1.0, timeout_s=1.0)
    env.reset(seed=0)
    server.stop(grace=0)
    with pytest.raises(ShoalError, match=f"env server {server.address} did not come back within 1 s"):
        env.step(np.zeros(2, np.int64))
    with pytest.raises(ShoalError, match="unreachable"):
        RemoteVectorEnv(f"remote://{server.address}", timeout_s=1.0)
    with pytest.raises(ShoalError, match=f"^env server {server.address}: unreachable"):  # a list, as a config's env
        RemoteVectorEnv([f"remote://{server.address}", "remote://127.0.0.1:1"], timeout_s=1.0)


def test_bad_requests_get_clear_statuses_and_the_server_keeps_serving(servers):
    server = servers(env_id="Pendulum-v1", num_envs=2, token=TOKEN, max_message_bytes=1 << 16, max_sessions=2)
    addr = server.address
    good = pb.OpenRequest().SerializeToString()
    session = pb.OpenReply.FromString(raw_call(addr, "Open", good, TOKEN)).session
    raw_call(addr, "Reset", pb.ResetRequest(session=session, seed=1).SerializeToString(), TOKEN)

    def step(actions, session=session, token=TOKEN):
        return raw_call(addr, "Step", pb.StepRequest(session=session, actions=actions).SerializeToString(), token)

    ok = encode(np.zeros((2, 1), np.float32))
    cases = {
        "no token": (lambda: step(ok, token=None), grpc.StatusCode.UNAUTHENTICATED),
        "wrong token": (lambda: step(ok, token="x" * 31), grpc.StatusCode.UNAUTHENTICATED),
        "oversize": (lambda: raw_call(addr, "Step", b"\0" * (1 << 17), TOKEN), grpc.StatusCode.RESOURCE_EXHAUSTED),
        "malformed bytes": (lambda: raw_call(addr, "Step", b"\xff\xff\xff", TOKEN), grpc.StatusCode.INVALID_ARGUMENT),
        "wrong shape": (lambda: step(encode(np.zeros((3, 1), np.float32))), grpc.StatusCode.INVALID_ARGUMENT),
        "wrong dtype": (lambda: step(encode(np.zeros((2, 1), np.int64))), grpc.StatusCode.INVALID_ARGUMENT),
        "byte count": (lambda: step(pb.Array(dtype="float32", shape=[2, 1], data=b"\0" * 7)),
                       grpc.StatusCode.INVALID_ARGUMENT),
        "unknown dtype": (lambda: step(pb.Array(dtype="object", shape=[2, 1], data=b"")),
                          grpc.StatusCode.INVALID_ARGUMENT),
        "out of bounds": (lambda: step(encode(np.full((2, 1), 9.0, np.float32))), grpc.StatusCode.INVALID_ARGUMENT),
        "not finite": (lambda: step(encode(np.full((2, 1), np.nan, np.float32))), grpc.StatusCode.INVALID_ARGUMENT),
        "negative seed": (lambda: raw_call(addr, "Reset", pb.ResetRequest(session=session, seed=-1).SerializeToString(),
                                           TOKEN), grpc.StatusCode.INVALID_ARGUMENT),
        "unknown session": (lambda: step(ok, session="nope"), grpc.StatusCode.NOT_FOUND),
        "unknown env id": (lambda: raw_call(addr, "Open", pb.OpenRequest(env_id="CartPole-v1").SerializeToString(),
                                            TOKEN), grpc.StatusCode.NOT_FOUND),
    }
    for name, (call, expected) in cases.items():
        code, details = status_of(call)
        assert code == expected, (name, code, details)
        assert details, name
        step(ok)  # after every bad request, the good client is served as before
    # a client vanishing mid-episode: its session expires and frees its slot
    raw_call(addr, "Open", good, TOKEN)
    assert status_of(lambda: raw_call(addr, "Open", good, TOKEN))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    server.session_timeout_s = 0.0
    assert server.reap() == 2
    raw_call(addr, "Open", good, TOKEN)


def test_one_client_holds_at_most_its_share_of_sessions_and_others_still_get_theirs(servers, monkeypatch):
    """--max-sessions-per-client: a client is the host its calls come from (all of one machine's
    runners); here two clients on loopback are told apart by a header the test sends."""
    import shoal.remote.envserver as envserver

    monkeypatch.setattr(envserver, "client_of", lambda context: dict(context.invocation_metadata())["x-client"])
    server = servers(num_envs=1, max_sessions=3, max_sessions_per_client=2)

    def open_as(client):
        with grpc.insecure_channel(server.address) as channel:
            call = channel.unary_unary("/shoal.v1.EnvService/Open")
            return pb.OpenReply.FromString(call(b"", timeout=5, metadata=(("x-client", client),))).session

    a = [open_as("a"), open_as("a")]
    assert status_of(lambda: open_as("a")) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "client a holds its maximum of 2 "
                                               "sessions here (--max-sessions-per-client); close one or retry later")
    open_as("b")
    assert status_of(lambda: open_as("b")) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "server holds its maximum of 3 sessions; close one or retry later")
    server.close(pb.CloseRequest(session=a[0]), None)
    open_as("a")
    assert sorted(s.client for s in server.sessions.values()) == ["a", "a", "b"]
    with pytest.raises(ShoalError, match="^--max-sessions-per-client must be at least 1, got 0$"):
        EnvServer("CartPole-v1", 1, max_sessions_per_client=0)  # in Python as on the command line


class IdleStreams:
    """Step streams opened and never sent a message (a buggy or hostile client), each held by a
    thread of this process until closed."""

    def __init__(self, address, count, client="a"):
        import queue
        import threading

        self.channel = grpc.insecure_channel(address)
        method = self.channel.stream_stream("/shoal.v1.EnvService/StepStream")
        self.requests = [queue.SimpleQueue() for _ in range(count)]
        self.calls = [method(iter(q.get, None), metadata=(("x-client", client),)) for q in self.requests]
        self.ends = [None] * count  # each stream's status once it ended
        for i in range(count):
            threading.Thread(target=self._wait, args=(i,), daemon=True).start()

    def _wait(self, i):
        try:
            for _ in self.calls[i]:
                pass
        except grpc.RpcError as e:
            self.ends[i] = (e.code(), e.details())

    def ended(self, expected, timeout=5.0):
        """The statuses of the streams that ended, once ``expected`` of them have (or at the timeout)."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and sum(end is not None for end in self.ends) < expected:
            time.sleep(0.02)
        return [end for end in self.ends if end is not None]

    def close(self):
        for q in self.requests:
            q.put(None)
        self.channel.close()


def test_streams_that_send_nothing_leave_the_server_its_threads_and_other_clients_their_steps(servers):
    """Each open StepStream holds one of the server's threads while it waits for a message: a
    client that opened streams and sent nothing once took them all, and every other call (Open,
    Describe, health) waited for its deadline. Streams beyond one per session are now refused,
    and a client refused one steps by unary calls instead."""
    import time

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    server = servers(num_envs=2, max_sessions=2)  # 10 threads: 2 for streams, 8 for the rest
    idle = IdleStreams(server.address, 12)
    refused = idle.ended(10)
    assert len(refused) == 10 and set(refused) == {(grpc.StatusCode.RESOURCE_EXHAUSTED, "server holds its maximum of 2 "
                                                    "open streams; close one or retry later")}, refused
    assert len(server.server.streams) == 2
    with grpc.insecure_channel(server.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    env = RemoteVectorEnv(f"remote://{server.address}", timeout_s=2)  # Open and Reset answer
    env.reset(seed=0)
    for _ in range(3):  # its stream is refused: the step goes again as a unary call, and so do the next
        obs, rewards, *_ = env.step(np.zeros(2, np.int64))
    assert obs.shape == (2, 4) and (rewards == 1).all() and env.conns[0].stream is None
    idle.close()
    for _ in range(250):  # their handlers see the streams end
        if not len(server.server.streams):
            break
        time.sleep(0.02)
    env.conns[0].unary_until = 0.0  # STREAM_RETRY_S on: a stream again, now that there is room
    env.step(np.zeros(2, np.int64))
    assert env.conns[0].stream is not None and env.conns[0].stream.answered
    env.close()


def test_a_run_refused_a_session_is_told_what_its_sessions_are(servers):
    server = servers(num_envs=1, max_sessions=1)
    env = RemoteVectorEnv(f"remote://{server.address}")
    with pytest.raises(ShoalError) as caught:
        RemoteVectorEnv(f"remote://{server.address}")  # a second runner, or the evaluator
    assert str(caught.value) == (f"env server {server.address}: RESOURCE_EXHAUSTED: server holds its maximum of 1 "
                                 "sessions; close one or retry later (a training run holds a session on each server "
                                 "for each of its runners and one for its evaluator)")
    env.close()


def test_one_client_holds_at_most_its_share_of_streams(servers, monkeypatch):
    import shoal.remote.envserver as envserver

    monkeypatch.setattr(envserver, "client_of", lambda context: dict(context.invocation_metadata())["x-client"])
    server = servers(num_envs=1, max_sessions=4, max_sessions_per_client=1)
    a = IdleStreams(server.address, 2, client="a")
    assert a.ended(1) == [(grpc.StatusCode.RESOURCE_EXHAUSTED, "client a holds its maximum of 1 open streams here; "
                                                              "close one or retry later")]
    b = IdleStreams(server.address, 1, client="b")
    assert b.ended(1, timeout=0.3) == [] and len(server.server.streams) == 2
    a.close(), b.close()


def test_an_idle_stream_is_ended_with_its_session_and_its_client_opens_another():
    """A stream idle for longer than --session-timeout-s is ended (cancelled) as its idle session
    is closed; the client's next step reopens a session there, as after a restart."""
    import time

    server = EnvServer("CartPole-v1", 2, session_timeout_s=0.3).start()
    try:
        env = RemoteVectorEnv(f"remote://{server.address}")
        env.reset(seed=0)
        env.step(np.zeros(2, np.int64))
        assert len(server.server.streams) == 1
        time.sleep(0.4)
        server.reap()
        assert len(server.server.streams) == 0 and not server.sessions
        obs, rewards, terminated, truncated, info = env.step(np.zeros(2, np.int64))
        assert env.reconnects == 1 and truncated.all() and len(server.sessions) == 1
        env.step(np.zeros(2, np.int64))
        assert len(server.server.streams) == 1  # back on a stream
        env.close()
    finally:
        server.stop(grace=0)


def test_a_stream_busy_with_a_step_is_not_ended_as_idle():
    from shoal.remote.server import OpenStreams

    class Context:
        cancelled = 0

        def cancel(self):
            self.cancelled += 1

    streams = OpenStreams(2, 2, 0.0, lambda context: "a")
    busy, idle = Context(), Context()
    streams.enter(busy).busy = True
    streams.enter(idle)
    assert streams.end_idle() == 1 and (busy.cancelled, idle.cancelled) == (0, 1)
    assert len(streams) == 1 and streams.end_idle() == 0  # ended once; the busy one still counts
    streams.enter(Context())  # the ended one's place is free before its handler leaves


def test_a_client_is_the_host_its_calls_come_from(servers):
    server = servers(num_envs=1)
    env, other = RemoteVectorEnv(f"remote://{server.address}"), RemoteVectorEnv(f"remote://{server.address}")
    assert [s.client for s in server.sessions.values()] == ["ipv4:127.0.0.1"] * 2  # one machine, any port
    env.close(), other.close()


def test_health_service_reports_serving(servers):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    server = servers()
    with grpc.insecure_channel(server.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="shoal.v1.EnvService"),
                                                          timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_binding_beyond_loopback_needs_a_token():
    with pytest.raises(ShoalError, match="token"):
        EnvServer("CartPole-v1", 1, host="0.0.0.0", port=0)


class HangingCartPole:
    """CartPole whose 5th step hangs for 3 s: a server that stops answering without dying."""

    def __new__(cls, **kwargs):
        import time

        import gymnasium as gym

        env = gym.make("CartPole-v1")
        steps = [0]
        step = env.step

        def slow_step(action):
            steps[0] += 1
            if steps[0] == 5:
                time.sleep(3)
            return step(action)

        env.step = slow_step
        return env


def test_a_server_that_hangs_is_timed_out_and_reconnected(servers):
    import time

    import gymnasium as gym

    if "HangingCartPole-v0" not in gym.registry:
        gym.register("HangingCartPole-v0", entry_point=HangingCartPole)
    server = servers(env_id="HangingCartPole-v0", num_envs=1)
    env = RemoteVectorEnv(f"remote://{server.address}", timeout_s=1.0, reconnect_s=5)
    env.reset(seed=0)
    for _ in range(4):
        env.step(np.zeros(1, np.int64))
    start = time.monotonic()
    *_, truncated, info = env.step(np.zeros(1, np.int64))  # the 5th step hangs
    assert time.monotonic() - start < 2.9 and env.reconnects == 1 and truncated.all()
    env.step(np.zeros(1, np.int64))  # the new session's env answers
    env.close()


def test_a_client_without_the_token_is_told_where_to_give_it(servers, monkeypatch):
    server = servers(num_envs=2, token=TOKEN)
    monkeypatch.delenv("SHOAL_TOKEN", raising=False)
    monkeypatch.delenv("SHOAL_TOKEN_FILE", raising=False)
    with pytest.raises(ShoalError, match=f"env server {server.address}: UNAUTHENTICATED.*SHOAL_TOKEN"):
        RemoteVectorEnv(f"remote://{server.address}", timeout_s=2)


def test_tls_with_a_ca_and_a_token(servers, tmp_path, monkeypatch):
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    server = servers(num_envs=2, token=TOKEN, tls_cert=str(cert), tls_key=str(key))
    monkeypatch.setenv("SHOAL_TOKEN", TOKEN)
    with pytest.raises(ShoalError, match="unreachable"):  # plaintext against a TLS server
        RemoteVectorEnv(f"remote://{server.address}", timeout_s=2)
    monkeypatch.setenv("SHOAL_TLS_CA", str(cert))
    env = RemoteVectorEnv(f"remote://{server.address}")
    env.reset(seed=0)
    assert env.step(np.zeros(2, np.int64))[0].shape == (2, 4)
    env.close()
