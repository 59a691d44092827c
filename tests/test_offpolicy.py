"""Off-policy mechanics: TD targets, the squashed Gaussian, dueling, action scaling, exact resume."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

import shoal
from shoal.algos.dqn import DQNConfig, QNetwork, td_targets
from shoal.algos.sac import SACConfig, SquashedGaussianActor
from shoal.algos.td3 import DeterministicActor

BOX = gym.spaces.Box(-1, 1, (3,))


def test_double_and_vanilla_td_targets_by_hand():
    r, disc = torch.tensor([1.0, 2.0]), torch.tensor([0.9, 0.0])
    q_target = torch.tensor([[1.0, 5.0], [3.0, 4.0]])
    q_online = torch.tensor([[2.0, 0.0], [0.0, 1.0]])  # online prefers action 0, then action 1
    torch.testing.assert_close(td_targets(r, disc, q_target, None), torch.tensor([1 + 0.9 * 5, 2.0]))
    torch.testing.assert_close(td_targets(r, disc, q_target, q_online), torch.tensor([1 + 0.9 * 1, 2.0]))


def test_dueling_head_advantages_have_zero_mean():
    torch.manual_seed(0)
    net = QNetwork(BOX, gym.spaces.Discrete(4), (16,), "relu", dueling=True)
    x = torch.randn(5, 3)
    h = net.trunk(x)
    torch.testing.assert_close(net(x).mean(-1), net.value_head(h).squeeze(-1))


def test_squashed_gaussian_log_prob_matches_torch():
    torch.manual_seed(0)
    actor = SquashedGaussianActor(BOX, gym.spaces.Box(-2, 2, (2,)), (16,), "relu")
    x = torch.randn(64, 3)
    a, logp = actor.sample(x, torch.Generator().manual_seed(0))
    h = actor.trunk(x)
    ref = TransformedDistribution(Normal(actor.mu(h), actor.log_std(h).clamp(-20, 2).exp()), [TanhTransform()])
    torch.testing.assert_close(logp, ref.log_prob(a.clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1), rtol=1e-3, atol=1e-3)


def test_actions_scale_to_the_bounds_and_exploration_starts_uniform():
    space = gym.spaces.Box(np.array([0.0, -4.0], np.float32), np.array([1.0, 4.0], np.float32))
    actor = DeterministicActor(BOX, space, (8,), "relu", noise_std=0.1)
    out = actor.to_env(torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.5]]))
    np.testing.assert_allclose(out, [[0.0, -4.0], [1.0, 4.0], [0.5, 2.0]])
    assert bool(actor.random_actions)  # until the learner says learning has started
    a, _ = actor.explore(torch.zeros(2000, 3), torch.Generator().manual_seed(0))
    assert a.min() < -0.95 and a.max() > 0.95 and abs(float(a.mean())) < 0.05


def test_epsilon_schedule():
    c = DQNConfig(total_steps=1000, exploration_fraction=0.5, exploration_initial_eps=1.0, exploration_final_eps=0.1)
    assert c.epsilon(0) == 1.0 and c.epsilon(250) == pytest.approx(0.55) and c.epsilon(10_000) == pytest.approx(0.1)


@pytest.mark.parametrize("cls, env, extra", [
    (SACConfig, "Pendulum-v1", {}),
    (DQNConfig, "CartPole-v1", {"prioritized": True, "n_step": 3, "dueling": True}),
])
def test_resume_with_saved_replay_continues_exactly(tmp_path, cls, env, extra):
    config = cls(env=env, hidden_sizes=(32, 32), batch_size=32, learning_starts=64, rollout_steps=8,
                 num_envs_per_runner=2, save_replay=True, total_steps=10_000, torch_threads=1,
                 progress=False, tensorboard=False, eval_interval=0, **extra)

    def run(algo, n):
        for _ in range(n):
            algo.train()
        return algo.backend.get(algo.learner.call("get_state"))

    with shoal.make(config) as algo:
        full = run(algo, 12)
    with shoal.make(config) as algo:
        run(algo, 6)
        algo.save(tmp_path / "ck")
    with shoal.load(tmp_path / "ck") as algo:
        resumed = run(algo, 6)
    assert resumed["updates"] == full["updates"] > 0
    for k, v in full["weights"].items():
        np.testing.assert_array_equal(v, resumed["weights"][k], err_msg=k)


def test_apex_runners_explore_on_a_ladder_and_fill_their_own_shards():
    config = DQNConfig(env="CartPole-v1", apex=True, num_env_runners=3, num_replay_shards=3, learning_starts=64,
                       batch_size=32, rollout_steps=16, hidden_sizes=(16,), torch_threads=1, progress=False,
                       tensorboard=False)
    with shoal.make(config) as algo:  # the local backend runs Ape-X's roles synchronously
        for _ in range(4):
            metrics = algo.train()
        eps = [float(r.obj.policy.epsilon) for r in algo.runners]
        assert eps == pytest.approx([0.4, 0.4 ** 4.5, 0.4 ** 8])
        shards = algo.learner.obj.replay.shards
        assert [s.obj.stored() for s in shards] == [64, 64, 64]  # runner i -> shard i
        assert metrics["learner/updates"] > 0
