"""EnvRunner: autoreset, final observations, episode statistics, weight sync."""

import numpy as np
import pytest
import torch

from shoal.onpolicy import make_actor_critic
from shoal.policy import get_weights
from shoal.runner import EnvRunner
from shoal.weights import WeightStore


def test_truncated_episodes_keep_their_final_observation(tiny):
    # Pendulum always ends by truncation at 200 steps: the rollout must say so and keep the final obs.
    config = tiny(env="Pendulum-v1", num_envs_per_runner=2)
    runner = EnvRunner(config, 0, WeightStore())
    r = runner.sample(250)
    assert r.truncated[199].all() and not r.terminated.any() and r.truncated.sum() == 2
    assert r.final_idx.tolist() == [[199, 0], [199, 1]]
    assert r.final_obs.shape == (2, 3)
    assert not np.allclose(r.final_obs, r.obs[200])  # the next episode's first obs is a different state
    assert len(r.episode_returns) == 2 and r.episode_lengths == [200, 200]
    np.testing.assert_allclose(r.episode_returns, r.rewards[:200].sum(0), rtol=1e-5)


def test_runner_pulls_newer_weights_and_tags_rollouts(tiny):
    config = tiny()
    store = WeightStore()
    runner = EnvRunner(config, 3, store)
    assert runner.sample(4).policy_version == -1
    module = make_actor_critic(config, runner.env.single_observation_space, runner.env.single_action_space)
    store.publish("default", 7, get_weights(module))
    r = runner.sample(4)
    assert (r.policy_version, r.runner_id, r.policy_id) == (7, 3, "default")
    assert store.publish("default", 5, {}) == 7  # an older version never replaces a newer one


def test_observations_that_are_not_a_box_are_flattened_one_hot():
    import gymnasium as gym

    from shoal.envs import env_spaces, make_vector_env

    env = make_vector_env("FrozenLake-v1", 2)
    assert env.single_observation_space == gym.spaces.Box(0, 1, (16,), np.float32)
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs, np.eye(16, dtype=np.float32)[[0, 0]])  # both start on square 0
    obs, *_ = env.step(np.array([1, 1]))  # slippery: each lands on some square, one-hot
    assert obs.dtype == np.float32 and (obs.sum(1) == 1).all()
    # a Tuple of Discretes (Blackjack: hand sum, dealer's card, usable ace) becomes its one-hots side by side
    assert env_spaces("Blackjack-v1")[0] == gym.spaces.Box(0, 1, (32 + 11 + 2,), np.float32)


def test_an_evaluation_episode_that_never_ends_is_cut(tiny):
    from shoal.envs import make_vector_env
    from shoal.evaluator import run_episodes

    # CliffWalking has no time limit; a policy that always walks into the top wall never ends an episode
    env = make_vector_env("CliffWalking-v1", 2)
    config = tiny(env="CliffWalking-v1")
    module = make_actor_critic(config, env.single_observation_space, env.single_action_space)
    module.to_env = lambda a: np.zeros(len(a), np.int64)  # 0 = up
    result = run_episodes(module, env, deterministic=True, seed=0, max_steps=300)
    assert result["eval/length_mean"] == 300 and result["eval/return_mean"] == -300


def state_dependent(module):
    """``module`` with actor weights drawn from their own seed: a fresh actor's near-zero output layer
    (gain 0.01) acts almost the same in every state, so episodes from different seeds can end alike,
    as the global RNG (the tests that ran before) happens to draw it."""
    generator = torch.Generator().manual_seed(3)  # a policy that keeps CartPole up for ~90 steps
    with torch.no_grad():
        for p in module.actor.parameters():
            p.normal_(generator=generator)
    return module


def test_an_evaluation_plays_the_episodes_asked_for_whatever_the_envs_copies(tiny):
    """A remote env has the server's number of copies: 2 copies play 5 episodes in rounds, 8 give
    their first 5, and with a deterministic policy both are the very episodes of 5 copies (the
    same seeds, episode for episode)."""
    from shoal.envs import make_vector_env
    from shoal.evaluator import run_episodes

    config = tiny(env="CartPole-v1")
    env5 = make_vector_env("CartPole-v1", 5)
    module = state_dependent(make_actor_critic(config, env5.single_observation_space, env5.single_action_space))
    expected = run_episodes(module, env5, deterministic=True, seed=3, max_steps=500)
    assert expected["eval/episodes"] == 5 and expected["eval/return_std"] > 0  # episodes that differ
    for copies in (2, 8):
        got = run_episodes(module, make_vector_env("CartPole-v1", copies), deterministic=True, seed=3,
                           max_steps=500, episodes=5)
        assert got == expected, copies


def test_recorded_episodes_report_their_own_returns_the_same_as_an_evaluation(tiny, tmp_path):
    """`shoal eval --video` prints the statistics of the episodes it recorded (one pass): with the
    same seeds and a deterministic policy they are the evaluation's, episode for episode; and a
    recorded episode is cut after max_steps like an evaluated one."""
    from shoal.envs import make_vector_env
    from shoal.evaluator import record_episodes, run_episodes

    config = tiny(env="CartPole-v1")
    env = make_vector_env("CartPole-v1", 3)
    module = state_dependent(make_actor_critic(config, env.single_observation_space, env.single_action_space))
    expected = run_episodes(module, env, deterministic=True, seed=5, max_steps=500)
    paths, got = record_episodes(module, "CartPole-v1", 3, True, 5, tmp_path / "v", 500)
    assert len(paths) == 3 and all(p.is_file() for p in paths)
    assert got == pytest.approx(expected) and got["eval/episodes"] == 3
    assert expected["eval/return_std"] > 0  # three different episodes, not one three times

    module.to_env = lambda a: np.zeros(len(a), np.int64)  # always push left: falls within ~10 steps
    _, cut = record_episodes(module, "CartPole-v1", 1, True, 0, tmp_path / "w", 4)
    assert cut["eval/length_mean"] == 4 == cut["eval/return_mean"]
