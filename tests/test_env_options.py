"""What a run asks of its envs besides their kwargs: stacked frames (``frame_stack``) and an
action mask read from ``info`` (``info_action_mask``), the same in every env a run makes:
runners', the evaluator's, `shoal eval`'s, an env server's and a deployed policy's."""

import gymnasium as gym
import numpy as np
import pytest

import shoal
from shoal.algos import spec_for
from shoal.cli import main
from shoal.envs import EnvOptions, MaskedBox, all_spaces, make_env, make_vector_env
from shoal.errors import ConfigError, ShoalError
from shoal.remote.client import RemoteVectorEnv
from shoal.remote.envserver import EnvServer


def play(env, actions, seed):
    """The observations of one env from its reset at ``seed`` through ``actions``."""
    obs, _ = env.reset(seed=seed)
    seen = [obs]
    for a in actions:
        obs, _, term, trunc, _ = env.step(a)
        seen.append(obs)
        assert not (term or trunc)
    return seen


def test_stacked_vectors_are_the_last_observations_oldest_first_the_first_repeated_before_it():
    plain, stacked = make_env("CartPole-v1"), make_env("CartPole-v1", options=EnvOptions(frame_stack=3))
    assert stacked.observation_space.shape == (3, 4) and stacked.observation_space.dtype == np.float32
    actions = [0, 1, 1, 0, 1]
    frames, stacks = play(plain, actions, seed=5), play(stacked, actions, seed=5)
    for t, stack in enumerate(stacks):
        expected = [frames[max(0, i)] for i in range(t - 2, t + 1)]
        np.testing.assert_array_equal(stack, np.stack(expected))
    # the policies take a stack as one flat vector, and act on it
    policy = shoal.Policy(spec_for(shoal.PPOConfig()).make_policy(shoal.PPOConfig(), stacked.observation_space,
                                                                  stacked.action_space))
    assert policy.module.obs_dim == 12 and policy.act(stacks[-1]) in (0, 1)


def test_a_vector_env_starts_each_episode_afresh_and_gives_the_ended_one_stacked():
    envs = make_vector_env("CartPole-v1", 2, options=EnvOptions(frame_stack=2))
    obs, _ = envs.reset(seed=0)
    for _ in range(500):
        previous = obs
        obs, _, term, trunc, info = envs.step(np.zeros(2, np.int64))  # always left: episodes end soon
        ended = term | trunc
        if ended.any():
            break
    i = int(np.flatnonzero(ended)[0])
    # the last observation of the ended episode follows the one before it; the next one's first is
    # its reset observation twice, with nothing of the episode before
    np.testing.assert_array_equal(info["final_obs"][i][0], previous[i][1])
    np.testing.assert_array_equal(obs[i][0], obs[i][1])
    assert not np.array_equal(obs[i][1], info["final_obs"][i][1])


def test_stacked_hwc_frames_gain_channels_and_2d_frames_become_channels_first():
    plain, stacked = make_env("PixelReach-v0"), make_env("PixelReach-v0", options=EnvOptions(frame_stack=3))
    assert stacked.observation_space == gym.spaces.Box(0, 255, (10, 10, 6), np.uint8)
    actions = [np.array([0.8, -0.3], np.float32)] * 4
    frames, stacks = play(plain, actions, seed=1), play(stacked, actions, seed=1)
    assert not np.array_equal(frames[0], frames[-1])  # the dot moved
    for t, stack in enumerate(stacks):
        for k, i in enumerate(range(t - 2, t + 1)):  # channels 2k, 2k+1 are frame t-2+k
            np.testing.assert_array_equal(stack[..., 2 * k: 2 * k + 2], frames[max(0, i)])

    class Gray(gym.ObservationWrapper):  # PixelReach's first channel alone: 2-D frames
        def __init__(self, env):
            super().__init__(env)
            self.observation_space = gym.spaces.Box(0, 255, (10, 10), np.uint8)

        def observation(self, obs):
            return obs[..., 0]

    gym.register("GrayReachTest-v0", entry_point=lambda **kw: Gray(gym.make("PixelReach-v0", **kw)))
    try:
        env = make_env("GrayReachTest-v0", options=EnvOptions(frame_stack=4))
        assert env.observation_space.shape == (4, 10, 10)
        stack = play(env, actions, seed=1)[-1]
        np.testing.assert_array_equal(stack, np.stack([f[..., 0] for f in frames[-4:]]))
    finally:
        del gym.registry["GrayReachTest-v0"]


def test_frame_stacks_that_cannot_work_are_refused_in_one_line():
    with pytest.raises(ShoalError, match=r"frame_stack 8 of environment 'PixelReach-v0''s images \(10, 10, 2\) gives "
                                         "16 channels, more than the images have pixels a side: stack fewer"):
        make_env("PixelReach-v0", options=EnvOptions(frame_stack=8))
    with pytest.raises(ShoalError, match="gives an action mask: frame_stack stacks observations without one"):
        make_env("Taxi-v4", options=EnvOptions(frame_stack=2, info_action_mask=True))
    with pytest.raises(ConfigError, match="frame_stack must be at least 1"):
        shoal.PPOConfig(frame_stack=0)
    with pytest.raises(ConfigError, match="give them to `shoal serve-env ENV_ID --frame-stack N"):
        shoal.PPOConfig(env="remote://127.0.0.1:1", frame_stack=4)
    with pytest.raises(ConfigError, match="takes neither --frame-stack nor --info-action-mask"):
        shoal.SACConfig(env="BitFlipping-v0", her_goals=4, frame_stack=2)


def test_a_frame_stack_or_an_info_mask_leaves_no_own_space_a_policy_would_flatten_wrongly():
    # FrozenLake's states are one-hot; stacked, the policy takes the stacks, not states
    assert all_spaces("FrozenLake-v1")[2] == gym.spaces.Discrete(16)
    assert all_spaces("FrozenLake-v1", options=EnvOptions(frame_stack=2))[0].shape == (2, 16)
    assert all_spaces("FrozenLake-v1", options=EnvOptions(frame_stack=2))[2] is None
    # Taxi's mask from info: a deployed policy takes Taxi's state and the mask as action_mask
    obs_space, _, own = all_spaces("Taxi-v4", options=EnvOptions(info_action_mask=True))
    assert isinstance(obs_space, MaskedBox) and obs_space.mask_dim == 6 and own == gym.spaces.Discrete(500)


def test_atari_games_stack_four_frames_unless_told():
    pytest.importorskip("ale_py")
    assert make_env("ALE/Pong-v5").observation_space.shape == (4, 84, 84)
    assert make_env("ALE/Pong-v5", options=EnvOptions(frame_stack=2)).observation_space.shape == (2, 84, 84)
    assert make_env("ALE/Pong-v5", options=EnvOptions(frame_stack=1)).observation_space.shape == (84, 84)


def test_the_info_mask_is_each_steps_own_after_the_one_hot_state():
    env, raw = make_env("Taxi-v4", options=EnvOptions(info_action_mask=True)), gym.make("Taxi-v4")
    obs, _ = env.reset(seed=3)
    state, info = raw.reset(seed=3)
    for t in range(30):
        expected = np.concatenate([np.eye(500)[state], info["action_mask"]]).astype(np.float32)
        np.testing.assert_array_equal(obs, expected)
        legal = np.flatnonzero(info["action_mask"])
        a = int(legal[t % len(legal)])
        obs, *_ = env.step(a)
        state, _, _, _, info = raw.step(a)


class OddInfo(gym.Env):
    """Three actions; its info is whatever it is made with."""

    observation_space, action_space = gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3)

    def __init__(self, info):
        self.info = info

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), dict(self.info)

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, dict(self.info)


@pytest.mark.parametrize("info, message", [
    ({"lives": 3}, r"gave no info\['action_mask'\] \(its info has \['lives'\]\)"),
    ({"action_mask": np.ones(2)}, r"info\['action_mask'\] has 2 entries, where its action space Discrete\(3\) needs 3")])
def test_an_info_mask_that_is_missing_or_misfits_is_named(info, message):
    gym.register("OddInfoTest-v0", entry_point=OddInfo, kwargs={"info": info})
    try:
        with pytest.raises(ShoalError, match=message):
            make_env("OddInfoTest-v0", options=EnvOptions(info_action_mask=True)).reset()
    finally:
        del gym.registry["OddInfoTest-v0"]


def test_an_info_mask_that_cannot_apply_is_refused():
    with pytest.raises(ShoalError, match="Pendulum-v1'.s actions are continuous"):
        make_env("Pendulum-v1", options=EnvOptions(info_action_mask=True))
    pytest.importorskip("ale_py")
    with pytest.raises(ShoalError, match="Atari games take every action"):
        make_env("ALE/Pong-v5", options=EnvOptions(info_action_mask=True))


def test_an_env_server_stacks_and_masks_for_its_clients():
    server = EnvServer("Taxi-v4", 2, port=0, env_options=EnvOptions(info_action_mask=True)).start()
    stacking = EnvServer("CartPole-v1", 2, port=0, allow=("Acrobot-v1",),
                         env_options=EnvOptions(frame_stack=3)).start()
    try:
        envs = RemoteVectorEnv(f"remote://{server.address}")
        assert envs.single_observation_space.shape == (506,) and envs.single_observation_space.mask_dim == 6
        obs, _ = envs.reset(seed=0)
        assert obs[:, 500:].sum(1).min() >= 1  # each row's mask allows something
        envs.close()
        for env_id, shape in (("CartPole-v1", (3, 4)), ("Acrobot-v1", (3, 6))):
            envs = RemoteVectorEnv(f"remote://{stacking.address}/{env_id}")
            obs, _ = envs.reset(seed=0)
            assert envs.single_observation_space.shape == shape and obs.shape == (2, *shape)
            np.testing.assert_array_equal(obs[:, 0], obs[:, 2])
            envs.close()
    finally:
        server.stop(grace=0)
        stacking.stop(grace=0)


def test_ppo_learns_cartpole_without_velocities_from_four_stacked_frames(tmp_path, capsys):
    """CartPoleNoVel-v1 hides the velocities: PPO without memory stays at ~44 after 100k steps. With
    the last 4 observations stacked it solves it, its preset's settings without the LSTM (475 at
    41k steps, ~6 s). Deployed through ``policy.make_env()``, and through `shoal eval`, the
    policy's envs stack as the run's did."""
    config = shoal.make_config("ppo", "CartPoleNoVel-v1", lstm_size=0, frame_stack=4, total_steps=150_000,
                               stop_return=475.0, eval_interval=8192, progress=False, tensorboard=False)
    summary = shoal.train(config, run_dir=tmp_path / "run")
    assert summary["best_eval_return"] >= 475.0, summary
    policy = shoal.load_policy(summary["checkpoint"])
    env = policy.make_env()
    assert env.observation_space.shape == (4, 4)
    obs, _ = env.reset(seed=100)
    total, done = 0.0, False
    while not done:
        obs, r, term, trunc, _ = env.step(int(policy.act(obs)))
        total, done = total + r, term or trunc
    assert total >= 400, total
    assert main(["eval", str(tmp_path / "run"), "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert float(out.split("return ")[1].split()[0]) >= 400, out
    # an observation alone, unstacked, is refused with the way to stack it
    with pytest.raises(ShoalError, match=r"takes one of shape \(4, 4\) \(stacks of the last 4 observations, as its "
                                         r"run's frame_stack made them: policy.make_env\(\) gives its env"):
        policy.act(obs[-1])


def test_sac_trains_and_evaluates_on_stacked_pixel_frames(tmp_path):
    config = shoal.make_config("sac", "PixelReach-v0", frame_stack=2, total_steps=300, learning_starts=100,
                               batch_size=16, hidden_sizes=(16,), eval_interval=0, eval_episodes=2,
                               progress=False, tensorboard=False)
    summary = shoal.train(config, run_dir=tmp_path / "run")
    assert summary["env_steps"] >= 300
    policy = shoal.load_policy(summary["checkpoint"])
    assert policy.observation_space.shape == (10, 10, 4) and policy.module.input_shape == (4, 10, 10)
    obs, _ = policy.make_env().reset(seed=0)
    assert policy.act(obs).shape == (2,)


def test_observation_normalisation_runs_over_the_flat_stack(tmp_path):
    """normalize_obs keeps one mean and variance per entry of the flat vector the network takes:
    a stack of 3 Pendulum observations has 9 (it failed on the [3, 3] shape before)."""
    config = shoal.PPOConfig(env="Pendulum-v1", frame_stack=3, normalize_obs=True, total_steps=512,
                             num_envs_per_runner=4, rollout_steps=64, minibatch_size=64, num_epochs=1,
                             eval_interval=0, eval_episodes=1, progress=False, tensorboard=False)
    with shoal.make(config) as algo:
        algo.train()
        norm = algo.get_policy().module.obs_norm
        assert norm.mean.shape == (9,)
        # cos and sin of the angle are the first two entries of each of the three observations
        assert np.all(np.abs(norm.mean.numpy().reshape(3, 3)[:, :2]) <= 1) and norm.count >= 256
        assert np.all(norm.var.numpy() != 1)  # every entry's was updated
