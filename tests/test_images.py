"""Image observations: kept uint8 in their shape from the env through rollouts, replay and
checkpoints, read by a convolutional encoder; Atari's and MiniGrid's envs made as their agents
train on them."""

import av
import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import serving

import shoal
from shoal.algos.dqn import QNetwork
from shoal.envs import env_spaces, make_env
from shoal.errors import ShoalError
from shoal.offpolicy import replay_args
from shoal.policy import ActorCritic, Policy
from shoal.replay import ReplayBuffer
from shoal.runner import EnvRunner
from shoal.weights import WeightStore


@pytest.mark.parametrize("shape, chw", [((12, 10, 3), (3, 12, 10)), ((4, 84, 84), (4, 84, 84)), ((9, 8), (1, 9, 8))])
def test_images_become_uint8_channels_first_network_inputs(shape, chw):
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    m = ActorCritic(space, gym.spaces.Discrete(3), images=True)
    obs = np.stack([space.sample() for _ in range(5)])
    x = m.normalize(torch.as_tensor(obs))
    assert (m.input_shape, m.input_dtype, x.dtype, tuple(x.shape)) == (chw, np.uint8, torch.uint8, (5, *chw))
    # the pixel at (h, w, c) of a channels-last frame is the network's (c, h, w)
    expected = obs.transpose(0, 3, 1, 2) if shape[-1] == 3 else obs.reshape(5, *chw)
    np.testing.assert_array_equal(x.numpy(), expected)
    # one pass of the shared encoder gives what the separate calls give
    actions = torch.tensor([0, 1, 2, 0, 1])
    logp, entropy, value = m.evaluate(x, actions)
    torch.testing.assert_close((logp, entropy), m.evaluate_actions(x, actions))
    torch.testing.assert_close(value, m.value(x))
    assert any(name.startswith("encoder.") for name, _ in m.named_parameters())


def test_the_encoder_reads_pixels_scaled_to_one_and_the_policy_acts_on_one_frame_or_a_batch():
    space = gym.spaces.Box(0, 255, (7, 7, 3), np.uint8)
    m = ActorCritic(space, gym.spaces.Discrete(4), images=True)
    frames = np.stack([space.sample() for _ in range(6)])
    h = m.encoder(m.normalize(torch.as_tensor(frames)))
    direct = torch.relu(m.encoder.linear(m.encoder.convs(torch.as_tensor(frames).permute(0, 3, 1, 2).float() / 255)))
    torch.testing.assert_close(h, direct)
    policy = Policy(m)
    batch = policy.act(frames)
    assert batch.shape == (6,) and [int(policy.act(f)) for f in frames] == batch.tolist()


def test_algorithms_without_an_image_encoder_refuse_images_clearly():
    space = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)
    config = shoal.make_config("ars", "CartPole-v1")
    with pytest.raises(ShoalError, match=r"takes vector observations, not images .*ppo, a2c, trpo, impala, appo, "
                                         r"dqn, qrdqn, sac, tqc, td3 or ddpg \(a convolutional encoder\)"):
        shoal.algos.spec_for(config).make_policy(config, space, gym.spaces.Discrete(3))
    with pytest.raises(ShoalError, match="normalize_obs is for vector observations"):
        ActorCritic(space, gym.spaces.Discrete(3), normalize_obs=True, images=True)
    # a float Box of three dimensions is not an image: it stays a flat vector
    m = ActorCritic(gym.spaces.Box(-1, 1, (2, 3, 4)), gym.spaces.Discrete(3), images=True)
    assert (m.input_shape, m.image) == ((24,), False)


def test_minigrid_envs_are_their_agents_view_and_runners_and_replay_keep_it_uint8(tiny):
    obs_space, action_space = env_spaces("MiniGrid-Empty-5x5-v0")  # the package is imported by its ids' prefix
    assert obs_space == gym.spaces.Box(0, 255, (7, 7, 3), np.uint8) and action_space == gym.spaces.Discrete(7)
    config = shoal.make_config("dqn", "MiniGrid-Empty-5x5-v0", num_envs_per_runner=2, learning_starts=0,
                               buffer_size=1000, batch_size=8, progress=False, tensorboard=False)
    runner = EnvRunner(config, 0, WeightStore())
    r = runner.sample(120)  # episodes end within 100 steps: every env ends one
    assert r.obs.dtype == np.uint8 and r.obs.shape == (120, 2, 3, 7, 7)
    assert r.last_obs.shape == (2, 3, 7, 7) and r.final_obs.dtype == np.uint8 and len(r.final_obs) >= 2
    args, kwargs = replay_args(config, obs_space, action_space)
    buffer = ReplayBuffer(*args, **kwargs)
    assert buffer.obs.dtype == np.uint8 and buffer.obs.shape == (1000, 3, 7, 7)
    assert buffer.add_rollout(r) == 240 and buffer.next_obs.dtype == np.uint8
    np.testing.assert_array_equal(buffer.obs[:240], r.obs.reshape(240, 3, 7, 7))  # row t * 2 + b
    for (t, b), final in zip(r.final_idx, r.final_obs):  # an ended episode bootstraps from its own last view
        np.testing.assert_array_equal(buffer.next_obs[t * 2 + b], final)
        assert not np.array_equal(final, r.obs[t + 1, b])  # not from the next episode's first
    batch = buffer.sample(8)
    q = QNetwork(obs_space, action_space, (64,), "relu", dueling=True)
    assert batch.obs.dtype == torch.uint8 and q(batch.obs).shape == (8, 7)


@pytest.mark.parametrize("apex", [False, True], ids=["synchronous", "apex"])
def test_dqn_learns_the_same_from_compressed_images(apex, monkeypatch):
    """compress_observations changes how replay keeps observations, not what it gives back: the
    same run with and without it ends with the same weights, bit for bit. Under --apex the
    runners compress what they insert, and their shards store the LZ4 rows as sent."""
    sent = []
    add = ReplayBuffer.add

    def spy(self, obs, *rest, **kw):
        sent.append(obs.dtype)
        return add(self, obs, *rest, **kw)

    monkeypatch.setattr(ReplayBuffer, "add", spy)
    layout = (dict(apex=True, num_env_runners=2, num_replay_shards=2, learning_starts=64) if apex
              else dict(num_envs_per_runner=2, learning_starts=32))
    weights = []
    for compress in (False, True):
        config = shoal.make_config("dqn", "MiniGrid-Empty-5x5-v0", buffer_size=1000, batch_size=16, rollout_steps=8,
                                   torch_threads=1, compress_observations=compress, progress=False,
                                   tensorboard=False, eval_interval=0, **layout)
        sent.clear()
        with shoal.make(config) as algo:
            for _ in range(6 if apex else 12):
                algo.train()
            state = algo.backend.get(algo.learner.call("get_state"))
            assert state["updates"] > 0
            weights.append(state["weights"])
        assert set(sent) == {np.dtype(object) if compress and apex else np.dtype(np.uint8)}
    for k, v in weights[0].items():
        np.testing.assert_array_equal(v, weights[1][k], err_msg=k)


@pytest.mark.parametrize("algo", ["sac", "td3", "ddpg"])
def test_continuous_control_from_pixels_trains_and_deploys_on_the_envs_frames(algo, tmp_path):
    """SAC, TD3 and DDPG read images through an encoder of the actor's own and one of the
    critics'; frames stay uint8 through rollouts and replay; the deployed policy and the video
    of an evaluation take the env's channels-last frames."""
    config = shoal.make_config(algo, "PixelReach-v0", num_envs_per_runner=2, learning_starts=32, batch_size=16,
                               rollout_steps=8, buffer_size=2000, hidden_sizes=(32,), torch_threads=1,
                               total_steps=160, eval_interval=0, progress=False, tensorboard=False)
    summary = shoal.train(config, run_dir=tmp_path / "run")
    assert summary["env_steps"] == 160
    with shoal.make(config) as algo_:
        learner = algo_.learner.obj
        assert learner.policy.image and learner.policy.encoder is not learner.critics.encoder
        assert learner.replay.shards[0].obj.obs.dtype == np.uint8
    policy = shoal.load_policy(summary["checkpoint"])
    env = make_env("PixelReach-v0")
    frame, _ = env.reset(seed=0)
    action = policy.act(frame)
    assert action.shape == (2,) and env.action_space.contains(action.astype(np.float32))
    assert policy.act(np.stack([frame, frame])).shape == (2, 2)
    from shoal.cli import main

    code = main(["eval", str(tmp_path / "run"), "--episodes", "1", "--video", str(tmp_path / "v")])
    assert code == 0 and av.open(str(next((tmp_path / "v").glob("*.mp4")))).streams.video[0].frames == 16  # the first frame, then 15 steps


def test_atari_games_are_preprocessed_as_dqn_trained_on_them():
    env = make_env("ALE/Pong-v5")
    try:
        assert env.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        obs, _ = env.reset(seed=0)
        assert obs.dtype == np.uint8 and obs.shape == (4, 84, 84)
        frames = [env.step(0)[0] for _ in range(3)]
        assert np.array_equal(frames[-1][:3], frames[-2][1:])  # a stack of the last 4 frames, oldest first
        assert env.unwrapped._frameskip == 1 and env.spec.kwargs["repeat_action_probability"] == 0.25
    finally:
        env.close()
    config = shoal.make_config("ppo", "ALE/Pong-v5")
    assert (config.clip_rewards, config.num_envs_per_runner, config.rollout_steps, config.clip) == (True, 8, 128, 0.1)
    assert shoal.make_config("dqn", "ALE/Breakout-v5").buffer_size == 100_000  # the ALE/* presets
    assert shoal.make_config("dqn", "ALE/Breakout-v5").compress_observations


def test_a_missing_env_package_names_the_extra_to_install(monkeypatch):
    import importlib

    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module",
                        lambda name, *a: (_ for _ in ()).throw(ImportError(name)) if name == "minigrid" else real(name, *a))
    monkeypatch.delitem(gym.registry, "MiniGrid-FourRooms-v0", raising=False)
    with pytest.raises(ShoalError, match=r"its envs need the minigrid package \(`pip install 'shoal\[minigrid\]'`\)"):
        make_env("MiniGrid-FourRooms-v0")


def test_clip_rewards_trains_on_signs_and_reports_the_env_returns(tiny):
    r = EnvRunner(tiny(env="Pendulum-v1", num_envs_per_runner=2, clip_rewards=True), 0, WeightStore()).sample(200)
    assert set(np.unique(r.rewards)) <= {-1.0, 0.0} and (r.rewards == -1).sum() > 300
    assert len(r.episode_returns) == 2 and max(r.episode_returns) < -200  # Pendulum's own returns


def test_ppo_trains_on_atari_checkpoints_and_evaluates_with_video(tmp_path):
    config = shoal.make_config("ppo", "ALE/Breakout-v5", num_envs_per_runner=2, rollout_steps=32,
                               minibatch_size=32, total_steps=128, eval_interval=0, eval_episodes=1,
                               eval_max_steps=50, progress=False, tensorboard=False)
    summary = shoal.train(config, run_dir=tmp_path / "run")
    assert summary["env_steps"] == 128
    policy = shoal.load_policy(tmp_path / "run")
    assert policy.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    saved = torch.load(next((tmp_path / "run" / "checkpoints").glob("ckpt_*/policy.pt")), weights_only=True)
    assert (saved["obs_space"]["low"], saved["obs_space"]["high"]) == (0, 255)  # once, not 28,224 times each
    from shoal.evaluator import record_episodes

    paths, stats = record_episodes(policy.module, "ALE/Breakout-v5", 1, False, 0, tmp_path / "videos", max_steps=50)
    assert paths[0].name == "ALE_Breakout-v5-episode-0.mp4" and stats["eval/length_mean"] == 50
    with av.open(str(paths[0])) as video:  # the reset's frame and one per step, at the screen's size
        stream = video.streams.video[0]
        assert (stream.codec_context.name, stream.width, stream.height) == ("h264", 160, 210)
        assert sum(1 for _ in video.decode(stream)) == 51


def test_videos_of_odd_sized_frames_keep_every_frame_padded_to_even_sides(tmp_path):
    from shoal.evaluator import write_mp4

    frames = [np.full((75, 51, 3), 3 * i, np.uint8) for i in range(12)]
    write_mp4(tmp_path / "odd.mp4", frames, fps=50)
    with av.open(str(tmp_path / "odd.mp4")) as video:
        stream = video.streams.video[0]
        assert (stream.width, stream.height, stream.average_rate) == (52, 76, 50)
        decoded = [f.to_ndarray(format="rgb24") for f in video.decode(stream)]
    assert len(decoded) == 12
    assert abs(int(decoded[-1][37, 25, 0]) - 33) <= 2  # lossy, but the frames stay in their order


def test_image_observations_cross_the_wire_as_uint8_and_central_inference_serves_them(tmp_path):
    from shoal.remote.envserver import EnvServer

    server = EnvServer("MiniGrid-Empty-5x5-v0", 2).start()
    try:
        config = shoal.make_config("ppo", f"remote://{server.address}", rollout_steps=16, minibatch_size=32,
                                   total_steps=64, eval_interval=0, progress=False, tensorboard=False)
        runner = EnvRunner(config, 0, WeightStore())
        assert runner.env.single_observation_space == gym.spaces.Box(0, 255, (7, 7, 3), np.uint8)
        r = runner.sample(8)
        assert r.obs.dtype == np.uint8 and r.obs.shape == (8, 2, 3, 7, 7)
    finally:
        server.stop(grace=0)
    config = shoal.make_config("ppo", "MiniGrid-Empty-5x5-v0", inference="central", rollout_steps=16,
                               minibatch_size=64, total_steps=256, eval_interval=0, progress=False, tensorboard=False)
    assert shoal.train(config, run_dir=tmp_path / "central")["env_steps"] == 256


def test_the_policy_server_serves_an_image_policy_as_it_acts(tmp_path):
    import grpc

    with serving("MiniGrid-Empty-5x5-v0", tmp_path / "run") as (policy, client):
        obs = np.random.default_rng(0).integers(0, 11, (16, 7, 7, 3), dtype=np.uint8)
        expected = policy.act(obs)
        np.testing.assert_array_equal(np.concatenate([client.act(obs[i:i + 4])[0] for i in range(0, 16, 4)]), expected)
        np.testing.assert_array_equal(client.act(obs.astype(np.float32))[0], expected)  # the same pixels as floats
        with pytest.raises(shoal.ServerError) as e:
            client.act(np.full((1, 7, 7, 3), 300.0, np.float32))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "[0, 255]" in e.value.details()
