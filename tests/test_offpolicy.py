"""Off-policy mechanics: TD targets, the squashed Gaussian, dueling, batched critics, SAC's joint
step (continuous and discrete), action scaling, exact resume, the observation and reward normalisers."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal, TanhTransform, TransformedDistribution

import shoal
from shoal.algos.crossq import CrossQConfig
from shoal.algos.dqn import DQNConfig, QNetwork, td_targets
from shoal.algos.sac import SACConfig, SACLearner, SquashedGaussianActor
from shoal.algos.qrdqn import QRDQNConfig
from shoal.algos.ddpg import DDPGConfig
from shoal.algos.td3 import DeterministicActor, TD3Config, TD3Learner
from shoal.algos.tqc import TQCConfig
from shoal.errors import ConfigError, ShoalError
from shoal.offpolicy import QCritics
from shoal.policy import ConvEncoder
from shoal.replay import Transitions
from shoal.weights import WeightStore

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


def test_batched_critics_equal_separate_mlps_and_can_hide_their_weights():
    torch.manual_seed(0)
    critics = QCritics(3, 4, 2, (16, 8), "relu")
    obs, actions = torch.randn(7, 4), torch.randn(7, 2, requires_grad=True)

    def one(k, x):  # critic k as a plain MLP on [obs, action]
        w, b = [w[k] for w in critics.weights], [b[k, 0] for b in critics.biases]
        h = torch.relu(x @ w[0] + b[0])
        h = torch.relu(h @ w[1] + b[1])
        return (h @ w[2] + b[2]).squeeze(-1)

    x = torch.cat([obs, actions], -1)
    torch.testing.assert_close(critics(obs, actions), torch.stack([one(k, x) for k in range(3)]))
    torch.testing.assert_close(critics(obs, actions, members=slice(1, 2))[0], one(1, x))
    # Orthogonal init per critic: each member's hidden weights have orthonormal rows.
    w = critics.weights[1][2]  # [16 in, 8 out]
    torch.testing.assert_close(w.T @ w, 2.0 * torch.eye(8), atol=1e-5, rtol=0)
    critics(obs, actions, detach_weights=True).sum().backward()
    assert actions.grad is not None and actions.grad.abs().sum() > 0
    assert all(p.grad is None for p in critics.parameters())


IMAGES = gym.spaces.Box(0, 255, (2, 10, 10), np.uint8)


def test_critics_of_images_give_an_actor_dq_da_and_no_weight_a_gradient():
    critics = QCritics(2, 200, 3, (16,), "relu", encoder=ConvEncoder((2, 10, 10)))
    obs = torch.randint(0, 256, (5, 2, 10, 10), dtype=torch.uint8)
    actions = torch.zeros(5, 3, requires_grad=True)
    critics(obs, actions, detach_weights=True).sum().backward()
    assert actions.grad is not None and actions.grad.abs().sum() > 0
    assert all(p.grad is None for p in critics.parameters())  # the encoder's included
    features = critics.encode(obs)
    assert features.shape == (5, critics.encoder.out_dim)
    torch.testing.assert_close(critics(features, actions, encoded=True), critics(obs, actions))
    critics(obs, actions).sum().backward()
    assert all(p.grad is not None for p in critics.encoder.parameters())


@pytest.mark.parametrize("obs_space", [gym.spaces.Box(-8, 8, (3,)), IMAGES], ids=["vectors", "images"])
def test_sac_joint_step_gives_each_loss_only_its_own_parameters(obs_space):
    """With images the actor and the critics each read their own encoder: the critics' gets the
    critic loss's gradients only, the actor's the actor loss's."""
    config = SACConfig(env="Pendulum-v1", hidden_sizes=(32, 32), learning_starts=0)
    learner = SACLearner(config, obs_space, gym.spaces.Box(-2, 2, (1,)), WeightStore())
    if obs_space is IMAGES:
        assert learner.critics.encoder is not None and learner.policy.encoder is not learner.critics.encoder
    n = 16
    g = torch.Generator().manual_seed(1)
    draw = ((lambda: torch.randint(0, 256, (n, 2, 10, 10), generator=g, dtype=torch.uint8)) if obs_space is IMAGES
            else (lambda: torch.randn(n, 3, generator=g)))
    b = Transitions(obs=draw(), actions=torch.rand(n, 1, generator=g) * 2 - 1,
                    rewards=torch.randn(n, generator=g), next_obs=draw(),
                    discounts=torch.full((n,), 0.99), weights=torch.ones(n), indices=np.arange(n))
    critic0 = [p.detach().clone() for p in learner.critics.parameters()]
    learner.generator.manual_seed(5)
    learner.train_batch(b)
    # The same losses written as separate steps' gradients, with the same noise.
    learner2 = SACLearner(config, obs_space, gym.spaces.Box(-2, 2, (1,)), WeightStore())
    learner2.generator.manual_seed(5)
    alpha = learner2.log_alpha.exp().detach()
    with torch.no_grad():
        next_a, next_logp = learner2.policy.sample(b.next_obs, learner2.generator)
        next_q = learner2.target_critics(b.next_obs, next_a).min(0).values
        target = b.rewards + b.discounts * (next_q - alpha * next_logp)
    critic_loss = (learner2.critics(b.obs, b.actions) - target).pow(2).sum(0).mean() * 0.5
    critic_grads = torch.autograd.grad(critic_loss, list(learner2.critics.parameters()))
    a, logp = learner2.policy.sample(b.obs, learner2.generator)
    actor_loss = (alpha * logp - learner2.critics(b.obs, a).min(0).values).mean()
    actor_grads = torch.autograd.grad(actor_loss, list(learner2.policy.parameters()))
    # One Adam step from zero moments moves each parameter by -lr * g / (|g| + eps): its sign.
    for p0, p1, gr in zip(critic0, learner.critics.parameters(), critic_grads):
        moved = p1.detach() - p0
        torch.testing.assert_close(moved, -config.lr * gr / (gr.abs() + 1e-8), atol=1e-6, rtol=1e-4)
    for p0, p1, gr in zip(learner2.policy.parameters(), learner.policy.parameters(), actor_grads):
        torch.testing.assert_close(p1.detach() - p0.detach(), -config.lr * gr / (gr.abs() + 1e-8),
                                   atol=1e-6, rtol=1e-4)


def test_discrete_critics_give_every_actions_value():
    torch.manual_seed(0)
    critics = QCritics(2, 4, 3, (16,), "relu", discrete=True)
    obs = torch.randn(5, 4)
    for k in range(2):
        w, b = [w[k] for w in critics.weights], [b[k, 0] for b in critics.biases]
        torch.testing.assert_close(critics(obs)[k], torch.relu(obs @ w[0] + b[0]) @ w[1] + b[1])
    assert critics(obs).shape == (2, 5, 3)


def test_discrete_sac_step_follows_the_papers_losses():
    """SAC-Discrete (Christodoulou 2019): eq. 10's soft target, eq. 12's actor loss and eq. 11's
    temperature loss, written per action with torch's Categorical, give the joint step's moves."""
    obs_space, actions = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3)
    config = SACConfig(env="CartPole-v1", hidden_sizes=(32, 32), learning_starts=0, alpha_init=0.3)
    learner, learner2 = (SACLearner(config, obs_space, actions, WeightStore()) for _ in range(2))
    n = 16
    g = torch.Generator().manual_seed(1)
    b = Transitions(obs=torch.randn(n, 4, generator=g), actions=torch.randint(0, 3, (n,), generator=g),
                    rewards=torch.randn(n, generator=g), next_obs=torch.randn(n, 4, generator=g),
                    discounts=torch.full((n,), 0.99), weights=torch.ones(n), indices=np.arange(n))
    learner.train_batch(b)

    critics, policy, log_alpha = learner2.critics, learner2.policy, learner2.log_alpha
    alpha = log_alpha.exp().detach()
    with torch.no_grad():
        pi_next = Categorical(logits=policy.logits(b.next_obs))
        q_next = [learner2.target_critics(b.next_obs, members=slice(k, k + 1))[0] for k in range(2)]
        v_next = sum(pi_next.probs[:, a] * (torch.minimum(q_next[0][:, a], q_next[1][:, a])
                                            - alpha * pi_next.logits[:, a]) for a in range(3))
        y = b.rewards + b.discounts * v_next
    q = [critics(b.obs, members=slice(k, k + 1))[0] for k in range(2)]
    critic_loss = sum(0.5 * (qk[torch.arange(n), b.actions] - y).pow(2).mean() for qk in q)
    pi = Categorical(logits=policy.logits(b.obs))
    q_min = torch.minimum(q[0], q[1]).detach()
    actor_loss = sum(pi.probs[:, a] * (alpha * pi.logits[:, a] - q_min[:, a]) for a in range(3)).mean()
    target_entropy = config.target_entropy_scale * np.log(3)
    alpha_loss = -(log_alpha * (-pi.entropy().detach() + target_entropy)).mean()
    grads = [*torch.autograd.grad(critic_loss, list(critics.parameters())),
             *torch.autograd.grad(actor_loss, list(policy.parameters())),
             torch.autograd.grad(alpha_loss, log_alpha)[0]]
    before = [*critics.parameters(), *policy.parameters(), log_alpha]
    after = [*learner.critics.parameters(), *learner.policy.parameters(), learner.log_alpha]
    # One Adam step from zero moments moves each parameter by -lr * g / (|g| + eps).
    for p0, p1, gr in zip(before, after, grads, strict=True):
        torch.testing.assert_close(p1.detach() - p0.detach(), -config.lr * gr / (gr.abs() + 1e-8),
                                   atol=1e-6, rtol=1e-4)


def test_categorical_actor_explores_uniformly_then_by_its_probabilities():
    from shoal.algos.sac import CategoricalActor

    actor = CategoricalActor(BOX, gym.spaces.Discrete(3), (8,), "relu")
    with torch.no_grad():
        actor.logits[-1].bias.copy_(torch.tensor([0.0, np.log(3.0), -30.0]))  # pi ~ (1/4, 3/4, 0)
    x, g = torch.zeros(8000, 3), torch.Generator().manual_seed(0)
    counts = np.bincount(actor.explore(x, g)[0].numpy(), minlength=3) / len(x)
    np.testing.assert_allclose(counts, [1 / 3] * 3, atol=0.03)  # before learning starts
    actor.random_actions.fill_(False)
    counts = np.bincount(actor.explore(x, g)[0].numpy(), minlength=3) / len(x)
    np.testing.assert_allclose(counts, [0.25, 0.75, 0.0], atol=0.03)
    assert (actor.act(x[:4], deterministic=True) == 1).all()


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


def test_ornstein_uhlenbeck_noise_follows_its_recurrence_per_env_and_restarts_with_each_episode():
    theta, dt, sigma = 0.15, 0.01, 0.5
    actor = DeterministicActor(BOX, gym.spaces.Box(-1, 1, (2,)), (8,), "relu", sigma, ou=(theta, dt))
    actor.random_actions.fill_(False)
    actor.reset_memory(3)
    x, draws, noise = torch.randn(3, 3), torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    expected, states = torch.zeros(3, 2), []
    with torch.no_grad():
        for t in range(3000):  # x_{t+1} = x_t - theta dt x_t + sigma sqrt(dt) N(0, 1), every env its own
            a, _ = actor.explore(x, draws)
            expected = expected - theta * dt * expected + sigma * dt ** 0.5 * torch.randn(3, 2, generator=noise)
            torch.testing.assert_close(a, (actor(x) + expected).clamp(-1, 1))
            states.append(actor.noise.clone())
        gaussian = DeterministicActor(BOX, gym.spaces.Box(-1, 1, (2,)), (8,), "relu", sigma)
        gaussian.random_actions.fill_(False)
        steps = torch.stack([gaussian.explore(x, draws)[0] - gaussian(x) for _ in range(3000)])[:, 0, 0].numpy()
    path = torch.stack(states)[:, 0, 0].numpy()
    assert np.corrcoef(path[:-1], path[1:])[0, 1] > 0.99  # it keeps pushing one way
    assert abs(np.corrcoef(steps[:-1], steps[1:])[0, 1]) < 0.1  # the normal noise: independent draws
    actor.forget(np.array([False, True, False]))  # env 1's episode ended: its process starts again at 0
    assert actor.noise[1].abs().sum() == 0 and actor.noise[0].abs().sum() > 0 and actor.noise[2].abs().sum() > 0
    held = actor.noise.clone()  # a deployed policy's sampled actions leave the runners' processes alone
    with torch.no_grad():
        sampled = torch.stack([actor.act(x, False, draws) - actor(x) for _ in range(2000)])[:, 0, 0].numpy()
    assert torch.equal(actor.noise, held) and abs(np.corrcoef(sampled[:-1], sampled[1:])[0, 1]) < 0.1
    assert 0.3 < sampled.std() < 0.55  # sigma 0.5, one tail clipped at the bound


def test_runners_hold_an_ornstein_uhlenbeck_process_per_env_from_zero_at_each_episode(tmp_path):
    from shoal.algos.td3 import TD3Config
    from shoal.runner import EnvRunner

    config = TD3Config(env="Pendulum-v1", num_envs_per_runner=3, noise_type="ornstein-uhlenbeck", action_noise=0.5,
                       learning_starts=0, progress=False, tensorboard=False)
    store = WeightStore()
    runner = EnvRunner(config, 0, store)
    runner.policy.random_actions.fill_(False)
    rollout = runner.sample(200)  # Pendulum's episodes end at 200 steps: every env's process restarts
    assert runner.policy.noise.shape == (3, 1) and not runner.policy.noise.any()
    assert rollout.truncated[-1].all()
    runner.sample(5)
    assert runner.policy.noise.abs().min() > 0
    with pytest.raises(ConfigError, match="cannot be combined with --inference central"):
        TD3Config(env="Pendulum-v1", noise_type="ornstein-uhlenbeck", inference="central")


def test_epsilon_schedule():
    c = DQNConfig(total_steps=1000, exploration_fraction=0.5, exploration_initial_eps=1.0, exploration_final_eps=0.1)
    assert c.epsilon(0) == 1.0 and c.epsilon(250) == pytest.approx(0.55) and c.epsilon(10_000) == pytest.approx(0.1)


@pytest.mark.parametrize("cls, env, extra", [
    (SACConfig, "Pendulum-v1", {}),
    (SACConfig, "Pendulum-v1", {"use_sde": True, "sde_sample_freq": 3}),  # noise held in the runners
    (SACConfig, "CartPole-v1", {"n_step": 3}),  # SAC-Discrete
    (DQNConfig, "CartPole-v1", {"prioritized": True, "n_step": 3, "dueling": True}),
    (DQNConfig, "BitFlipping-v0", {"her_goals": 4, "env_kwargs": {"n_bits": 7}}),  # episodes pending at the save
    (DQNConfig, "CartPole-v1", {"compress_observations": True, "prioritized": True}),
    (SACConfig, "PixelReach-v0", {"compress_observations": True}),  # images: an encoder each for actor and critics
    (TD3Config, "PixelReach-v0", {"buffer_size": 1000, "critic_lr": 2e-3}),  # and own rates: a group each
    (CrossQConfig, "Pendulum-v1", {"critic_hidden_sizes": (32, 32), "policy_delay": 2,  # no targets; statistics
                                   "actor_lr": 1e-4, "alpha_lr": 5e-3}),
    (CrossQConfig, "Pendulum-v1", {"critic_hidden_sizes": (32, 32), "use_sde": True}),  # gSDE on renormalised features
    (TQCConfig, "Pendulum-v1", {"n_quantiles": 5, "prioritized": True, "n_step": 2,  # quantile critics, priorities
                                "normalize_obs": True, "normalize_rewards": True}),  # the normalisers' statistics
    (QRDQNConfig, "CartPole-v1", {"n_quantiles": 5, "prioritized": True, "dueling": True, "normalize_obs": True,
                                  "normalize_rewards": True}),
    (DQNConfig, "CartPole-v1", {"noisy": True, "n_step": 2}),  # noise from the learner's and runners' generators
    (DQNConfig, "CartPole-v1", {"num_atoms": 11, "v_min": 0.0, "v_max": 20.0, "prioritized": True}),  # C51
])
def test_resume_with_saved_replay_continues_exactly(tmp_path, caplog, cls, env, extra):
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
    assert "no replay buffer" not in caplog.text
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
        stored = [s.obj.stored() for s in shards]
        assert stored[0] > 0 and stored == [stored[0]] * 3  # runner i -> shard i
        assert metrics["learner/updates"] > 0


@pytest.mark.parametrize("algo, env", [("qrdqn", "CartPole-v1"), ("ddpg", "Pendulum-v1"), ("td3", "Pendulum-v1"),
                                       ("sac", "Pendulum-v1"), ("sac", "CartPole-v1"), ("tqc", "Pendulum-v1"),
                                       ("crossq", "Pendulum-v1")])
def test_every_replay_algorithm_trains_under_apex(algo, env):
    """--apex beside DQN (whose ladder is above, and whose learning is on Ray): two runners fill
    their own shards, and the learner updates from them; TD3's and DDPG's runners explore with
    noise on Ape-X's ladder, from half to twice --action-noise. SAC's family explores by its own
    entropy, the same on every runner."""
    config = shoal.make_config(algo, env, apex=True, num_env_runners=2, num_replay_shards=2, learning_starts=64,
                               batch_size=32, hidden_sizes=(16,), torch_threads=1, progress=False, tensorboard=False)
    with shoal.make(config) as a:  # the local backend runs Ape-X's roles synchronously
        for _ in range(8):
            metrics = a.train()
        stored = [s.obj.stored() for s in a.learner.obj.replay.shards]
        assert stored[0] > 0 and stored == [stored[0]] * 2, stored  # runner i -> shard i
        assert metrics["learner/updates"] > 0
        if algo in ("ddpg", "td3"):
            noise = [float(r.obj.policy.noise_std) for r in a.runners]
            assert noise == pytest.approx([config.action_noise / 2, config.action_noise * 2])


def test_apex_runners_fill_their_shard_in_long_rollouts_until_the_learner_samples_it(tmp_path, caplog):
    """While a shard fills to the size the learner samples from (learning_starts, or after a
    resume without the replay), an Ape-X runner inserts as much as the rate limiter allows, up
    to 256 steps a rollout, then goes back to rollout_steps."""
    config = DQNConfig(env="CartPole-v1", apex=True, num_env_runners=1, num_envs_per_runner=1, rollout_steps=1,
                       learning_starts=1000, batch_size=32, hidden_sizes=(16,), torch_threads=1, progress=False,
                       tensorboard=False)
    # The limiter lets 1000 transitions in, plus its error buffer: 2 rollouts' worth of samples
    # (2 * 32 items), i.e. 2 transitions at 32 samples per insert.
    filling = [256, 256, 256, 234, 1, 1, 1]
    with shoal.make(config) as algo:
        metrics = [algo.train() for _ in range(7)]
        steps = [m["env_steps"] for m in metrics]
        assert np.diff([0, *steps]).tolist() == filling
        # A learner call that changed nothing (no update, still random actions) publishes nothing.
        assert [m["learner/policy_version"] for m in metrics] == [0, 0, 0, 1, 2, 3, 4]
        assert not bool(algo.runners[0].obj.policy.random_actions)
        updates = algo.learner.obj.updates
        algo.save(tmp_path / "ck")  # without --save-replay
    with shoal.load(tmp_path / "ck") as algo:  # the learned policy refills the shard, in long rollouts again
        # and the user is told why the learner waits
        assert "holds no replay buffer (the run did not set --save-replay): updates resume once 1,000 new " \
               "transitions refill it" in caplog.text
        resumed = [algo.train()["env_steps"] for _ in range(7)]
        assert np.diff([steps[-1], *resumed]).tolist() == filling
        assert algo.learner.obj.updates > updates  # and the learner samples it once refilled


def test_apex_rollouts_take_8_steps_unless_told_and_the_synchronous_loop_1():
    """rollout_steps 0 means 1 step between updates, or 8 per Ape-X insert; --apex on the
    command line, parsed after the preset is layered, still gets the 8."""
    from shoal.cli import _parse
    from shoal.config import build

    assert SACConfig(env="Pendulum-v1").steps_per_rollout == 1
    assert SACConfig(env="Pendulum-v1", apex=True, rollout_steps=3).steps_per_rollout == 3
    preset = build(SACConfig, "sac", env="Pendulum-v1")
    assert _parse(SACConfig, ["--apex"], "shoal train sac", default=preset).steps_per_rollout == 8
    config = DQNConfig(env="CartPole-v1", apex=True, num_env_runners=2, learning_starts=32, batch_size=32,
                       hidden_sizes=(16,), torch_threads=1, progress=False, tensorboard=False)
    with shoal.make(config) as algo:
        steps = [algo.train()["env_steps"] for _ in range(4)]
    assert np.diff(steps[1:]).tolist() == [16, 16]  # once the shards hold learning_starts: 2 runners x 8


@pytest.mark.parametrize("cls, env, extra, long", [
    (TD3Config, "Pendulum-v1", {}, [2, 298] + [2] * 50),  # 2 envs x 1 step an iteration
    (DQNConfig, "CartPole-v1", {"rollout_steps": 4}, [8, 296] + [8] * 12),  # 37 iterations' worth, to 304
])
def test_random_steps_before_learning_starts_come_in_long_rollouts_and_train_the_same(monkeypatch, cls, env, extra,
                                                                                     long):
    """Before learning_starts the synchronous loop samples the random steps left in one rollout
    (up to 256 steps per env), which stops where the short ones would: with one runner, the same
    transitions, updates and weights (DQN's epsilon included), in fewer iterations."""
    from shoal.runner import EnvRunner

    config = cls(env=env, hidden_sizes=(16,), batch_size=32, learning_starts=300, num_envs_per_runner=2,
                 torch_threads=1, progress=False, tensorboard=False, **extra)

    def run():
        with shoal.make(config) as algo:
            steps = []
            while algo.env_steps < 400:
                steps.append(algo.train()["env_steps"])
            # a rollout takes at most a tenth of --runner-timeout-s at the last pace: 120 steps of 10 ms in 12 s
            algo.config, algo.env_steps = dataclasses.replace(config, runner_timeout_s=12), 0
            algo.sample_s_per_step = 0.01
            return np.diff([0, *steps]).tolist(), algo.backend.get(algo.learner.call("get_weights")), \
                algo._sync_rollout_steps()

    got, weights, paced = run()
    assert got == long and paced == 120
    monkeypatch.setattr(EnvRunner, "WARMUP_ROLLOUT_STEPS", 1)  # every rollout as long as the config's
    short, one_step_weights, _ = run()
    assert short == [long[0]] * (400 // long[0] + (400 % long[0] > 0))
    for k, v in weights.items():
        np.testing.assert_array_equal(v, one_step_weights[k], err_msg=k)


def test_a_run_shorter_than_its_random_steps_ends_where_one_step_rollouts_would(tmp_path):
    config = TD3Config(env="Pendulum-v1", hidden_sizes=(16,), learning_starts=300, total_steps=151,
                       num_envs_per_runner=2, eval_episodes=1, torch_threads=1, progress=False, tensorboard=False)
    summary = shoal.train(config, run_dir=tmp_path)  # 2 steps, then 75 iterations' worth in one rollout: 152
    assert summary["env_steps"] == 152


def test_a_run_writes_a_row_every_log_interval_steps_and_one_for_its_last_iteration(tmp_path):
    import csv

    config = DQNConfig(env="CartPole-v1", hidden_sizes=(16,), batch_size=32, learning_starts=64, total_steps=1_234,
                       torch_threads=1, progress=False, tensorboard=False, eval_interval=0)
    assert config.log_interval == 500  # an off-policy iteration is one env step: a row for each is too many
    iterations = []
    shoal.train(config, run_dir=tmp_path / "run", callback=lambda algo, metrics: iterations.append(metrics))
    rows = list(csv.DictReader(open(tmp_path / "run" / "progress.csv")))
    # the callback still sees every iteration: the first rollout, then one of the 63 random steps
    # left before learning_starts, then one step each
    assert np.diff([0] + [m["env_steps"] for m in iterations]).tolist() == [1, 63] + [1] * 1_170
    assert [int(r["env_steps"]) for r in rows] == [500, 1_000, 1_234]
    for before, row in zip(rows, rows[1:]):  # each row's rate covers the iterations since the row before
        seconds = float(row["time/elapsed_s"]) - float(before["time/elapsed_s"])
        steps = int(row["env_steps"]) - int(before["env_steps"])
        assert float(row["time/env_steps_per_s"]) == pytest.approx(steps / seconds)
    assert float(rows[-1]["loss/q"]) == pytest.approx(float(iterations[-1]["loss/q"]))  # the last iteration's own


def test_a_callback_that_returns_false_ends_the_run_as_any_stop_does(tmp_path):
    """As a stable-baselines3 callback's False: the iteration it saw is the last, and the run ends
    with its row, an evaluation, a checkpoint and a plot. None (a callback with no return) goes on."""
    import csv

    config = DQNConfig(env="CartPole-v1", hidden_sizes=(16,), batch_size=32, learning_starts=64, total_steps=5_000,
                       torch_threads=1, progress=False, tensorboard=False, eval_interval=0, eval_episodes=2)
    summary = shoal.train(config, run_dir=tmp_path / "run", callback=lambda algo, metrics: algo.env_steps < 700)
    assert summary["stopped_by_callback"] and not summary["timed_out"] and summary["env_steps"] == 700
    rows = list(csv.DictReader(open(tmp_path / "run" / "progress.csv")))
    assert [int(r["env_steps"]) for r in rows] == [500, 700]
    assert [int(r["env_steps"]) for r in csv.DictReader(open(tmp_path / "run" / "eval.csv"))] == [700]
    # iteration 638: the 63 random steps left before learning_starts after the first came in one
    assert summary["checkpoint"].endswith("ckpt_000000638") and (tmp_path / "run" / "curve.png").exists()
    summary = shoal.train(dataclasses.replace(config, total_steps=300), run_dir=tmp_path / "on",
                          callback=lambda algo, metrics: None)
    assert not summary["stopped_by_callback"] and summary["env_steps"] == 300


def test_the_progress_bar_shows_the_step_rate_before_the_first_row(tmp_path):
    import io
    import re

    from rich.console import Console

    out = io.StringIO()
    config = DQNConfig(env="CartPole-v1", hidden_sizes=(16,), batch_size=32, learning_starts=64, total_steps=300,
                       torch_threads=1, tensorboard=False, eval_interval=0)  # 300 steps: no row until the end
    shoal.train(config, run_dir=tmp_path / "run", console=Console(file=out, width=200, force_terminal=True))
    rates = [float(r.replace(",", "")) for r in re.findall(r"steps\s+([\d,]+)/s", out.getvalue())]
    assert rates and rates[-1] > 0, out.getvalue()[-500:]


def sde_actor(freq=-1, seed=0):
    torch.manual_seed(seed)
    actor = SquashedGaussianActor(BOX, gym.spaces.Box(-1, 1, (2,)), (16, 8), "relu", sde=(-1.0, freq))
    actor.random_actions.fill_(False)
    return actor


def test_gsde_log_probabilities_are_the_squashed_gaussian_of_its_features():
    """u = mu + h theta, theta ~ N(0, sigma^2) per element: u ~ N(mu, sqrt(h^2 sigma^2)) given the
    features h, then tanh; sample() gives that density, and its gradient reaches sigma."""
    actor = sde_actor()
    x = torch.randn(64, 3)
    a, logp = actor.sample(x, torch.Generator().manual_seed(3))
    h = actor.trunk(x)
    std = (h.pow(2) @ actor.sde.log_std.exp().pow(2) + 1e-6).sqrt()
    dist = TransformedDistribution(Normal(actor.mu(h), std), TanhTransform(cache_size=1))
    torch.testing.assert_close(logp, dist.log_prob(a.clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1), atol=2e-3, rtol=1e-4)
    (grad,) = torch.autograd.grad(logp.sum(), actor.sde.log_std)
    assert grad.abs().sum() > 0
    # the noise trains the features too (SB3's SAC: learn_features=True)
    u, _, _ = actor._gaussian(x, torch.Generator().manual_seed(3))
    grads = torch.autograd.grad((u - actor.mu(actor.trunk(x))).sum(), list(actor.trunk.parameters()))
    assert all(g.abs().sum() > 0 for g in grads)
    assert actor.sde.log_std.shape == (8, 2) and (actor.mu(h).abs() <= 2).all()  # the mean clipped, as SB3's


def test_gsde_runners_draw_their_noise_afresh_each_rollout():
    from shoal.runner import EnvRunner

    config = SACConfig(env="Pendulum-v1", use_sde=True, num_envs_per_runner=2, progress=False, tensorboard=False)
    runner = EnvRunner(config, 0, WeightStore())
    runner.policy.random_actions.fill_(False)
    runner._rollout(3)
    first = runner.policy.sde.matrices
    runner._rollout(3)
    assert first.shape == (2, 256, 1) and not torch.equal(first, runner.policy.sde.matrices)


def test_gsde_is_refused_where_it_cannot_hold_its_noise():
    with pytest.raises(ConfigError, match="cannot be combined with --inference central"):
        SACConfig(env="Pendulum-v1", use_sde=True, inference="central")
    with pytest.raises(ConfigError, match="sde_sample_freq must be -1"):
        SACConfig(env="Pendulum-v1", use_sde=True, sde_sample_freq=0)
    with pytest.raises(shoal.ShoalError, match="--use-sde explores continuous actions"):
        shoal.make(SACConfig(env="CartPole-v1", use_sde=True, progress=False, tensorboard=False))


@pytest.mark.parametrize("algo, env, own, rates", [
    ("dqn", "CartPole-v1", {}, ["lr"]),
    ("sac", "Pendulum-v1", {}, ["lr"]),  # one group: actor, critics and temperature
    ("td3", "Pendulum-v1", {}, ["lr", "lr"]),  # the actor's optimiser and the critics'
    ("sac", "Pendulum-v1", {"actor_lr": 1e-4, "critic_lr": 2e-3}, [1e-4, 2e-3, "lr"]),  # a group each
    ("td3", "Pendulum-v1", {"critic_lr": 2e-3}, ["lr", 2e-3]),
    ("sac", "Pendulum-v1", {"actor_lr": 1e-4, "critic_lr": 2e-3, "alpha_lr": 5e-3}, [1e-4, 2e-3, 5e-3]),  # no lr
])
@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_a_linear_learning_rate_decays_to_zero_at_total_steps_in_every_optimizer(algo, env, own, rates, schedule):
    """rl-zoo's lin_ learning rates (SB3 sets them at each training phase from the steps taken):
    at an update phase after N of total_steps env steps, lr x (1 - N / total_steps); a network's
    own rate (actor_lr, critic_lr) decays alike."""
    config = shoal.make_config(algo, env, lr_schedule=schedule, total_steps=400, learning_starts=50,
                               num_envs_per_runner=2, rollout_steps=25, batch_size=16, hidden_sizes=(16,),
                               progress=False, tensorboard=False, **own)
    with shoal.make(config) as algo_:
        learner = algo_.learner.obj
        optimizers = learner.optimizers()
        while algo_.env_steps < 200:
            metrics = algo_.train()
        factor = 1 - algo_.env_steps / 400 if schedule == "linear" else 1
        assert metrics["learner/updates"] > 0
        if "lr" in rates:  # lr's column where some network learns at it
            assert metrics["learner/lr"] == pytest.approx(config.lr * factor)
        else:
            assert "learner/lr" not in metrics
        for key, rate in own.items():
            assert metrics[f"learner/{key}"] == pytest.approx(rate * factor)
        assert [group["lr"] for o in optimizers for group in o.param_groups] == pytest.approx(
            [(config.lr if r == "lr" else r) * factor for r in rates])


OWN_RATES = {"actor_lr": 1e-4, "critic_lr": 2e-3, "alpha_lr": 5e-3}


@pytest.mark.parametrize("cls, action_space, extra", [
    (SACConfig, gym.spaces.Box(-2, 2, (1,)), {}),
    (SACConfig, gym.spaces.Discrete(3), {}),
    (TQCConfig, gym.spaces.Box(-2, 2, (1,)), {"n_quantiles": 5}),
    (CrossQConfig, gym.spaces.Box(-2, 2, (1,)), {"critic_hidden_sizes": (32, 32), "policy_delay": 1}),
    (TD3Config, gym.spaces.Box(-2, 2, (1,)), {"policy_delay": 1}),
    (DDPGConfig, gym.spaces.Box(-2, 2, (1,)), {}),
])
def test_own_learning_rates_step_the_actor_critics_and_temperature_each_at_its_rate(cls, action_space, extra):
    """RLlib's actor_lr, critic_lr and alpha_lr (CleanRL's policy_lr and q_lr): Adam's first step
    from zero moments moves each parameter by lr x g / (|g| + eps), so the largest move in each
    network is its own rate."""
    from shoal.algos import spec_for

    own = {k: v for k, v in OWN_RATES.items() if k in {f.name for f in dataclasses.fields(cls)}}
    assert set(own) == ({"actor_lr", "critic_lr"} if cls in (TD3Config, DDPGConfig) else set(OWN_RATES))
    config = cls(env="Pendulum-v1", hidden_sizes=(32, 32), learning_starts=0, **own, **extra)
    obs_space = gym.spaces.Box(-8, 8, (3,))
    learner = spec_for(config).learner_cls(config, obs_space, action_space, WeightStore())
    n = 16
    g = torch.Generator().manual_seed(1)
    actions = (torch.randint(0, 3, (n,), generator=g) if isinstance(action_space, gym.spaces.Discrete)
               else torch.rand(n, 1, generator=g) * 2 - 1)
    b = Transitions(obs=torch.randn(n, 3, generator=g), actions=actions, rewards=torch.randn(n, generator=g),
                    next_obs=torch.randn(n, 3, generator=g), discounts=torch.full((n,), 0.99), weights=torch.ones(n),
                    indices=np.arange(n))
    networks = {"actor_lr": list(learner.policy.parameters()), "critic_lr": list(learner.critics.parameters())}
    if "alpha_lr" in own:
        networks["alpha_lr"] = [learner.log_alpha]
    before = {k: [p.detach().clone() for p in ps] for k, ps in networks.items()}
    learner.train_batch(b)
    for key, params in networks.items():
        moves = torch.cat([(p.detach() - p0).abs().flatten() for p, p0 in zip(params, before[key])])
        assert moves.max().item() == pytest.approx(own[key], rel=1e-2), key  # float32 subtraction's rounding


def test_a_checkpoint_loads_into_learners_whose_networks_have_other_rates_and_so_other_groups():
    """A checkpoint written with one parameter group (every rate lr's, or before own rates existed)
    resumes with own rates (a group per network), and back: the same moments for the same
    parameters, with the resuming run's rates. One written for other networks (another count of
    tensors, or as many of other shapes) is refused in one line."""
    from shoal.learner import load_optimizer

    obs_space, action_space = gym.spaces.Box(-8, 8, (3,)), gym.spaces.Box(-2, 2, (1,))

    def learner(**own):
        config = SACConfig(env="Pendulum-v1", hidden_sizes=(16,), learning_starts=0, batch_size=8, **own)
        return SACLearner(config, obs_space, action_space, WeightStore())

    def train(learner_):
        g = torch.Generator().manual_seed(2)
        for _ in range(3):
            learner_.train_batch(Transitions(
                obs=torch.randn(8, 3, generator=g), actions=torch.rand(8, 1, generator=g) * 2 - 1,
                rewards=torch.randn(8, generator=g), next_obs=torch.randn(8, 3, generator=g),
                discounts=torch.full((8,), 0.99), weights=torch.ones(8), indices=np.arange(8)))
        return learner_

    def moments(learner_):
        return [learner_.optimizer.state[p]["exp_avg_sq"] for group in learner_.optimizer.param_groups
                for p in group["params"]]

    one, split = train(learner()), train(learner(**OWN_RATES))
    assert len(one.optimizer.param_groups) == 1 and len(split.optimizer.param_groups) == 3
    for source in (one, split):
        for target in (learner(), learner(**OWN_RATES)):
            target.set_state(source.get_state())
            assert [group["lr"] for group in target.optimizer.param_groups] == (
                [target.config.lr] if target.config.actor_lr is None else list(OWN_RATES.values()))
            for a, b in zip(moments(source), moments(target), strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
    td3 = TD3Learner(TD3Config(env="Pendulum-v1", hidden_sizes=(16,)), obs_space, action_space, WeightStore())
    with pytest.raises(ShoalError, match="the checkpoint's optimiser holds 11 parameter tensors, this learner's 4"):
        load_optimizer(td3.actor_optimizer, one.optimizer.state_dict())
    narrower = SACLearner(dataclasses.replace(one.config, hidden_sizes=(8,)), obs_space, action_space, WeightStore())
    with pytest.raises(ShoalError, match=r"moments of shape \(16, 3\) for parameter 0, whose shape here is \(8, 3\)"):
        load_optimizer(narrower.optimizer, one.optimizer.state_dict())  # as many tensors, of other shapes


def test_divergence_advice_names_every_learning_rate_the_run_has():
    from shoal.errors import Diverged

    assert Diverged.advice(SACConfig(lr=1e-3, critic_lr=1e-2)) == (
        "lower --lr (now 0.001) or --critic-lr (now 0.01), or scale the env's rewards down")
    assert Diverged.advice(DQNConfig(lr=1e-4)) == "lower --lr (now 0.0001), or scale the env's rewards down"


@pytest.mark.parametrize("cls, env, extra", [
    (SACConfig, "Pendulum-v1", {"reward_scale": 3.0}),  # scaled, then normalised (as on-policy learners do)
    (TD3Config, "Pendulum-v1", {"inference": "central"}),  # the server returns the rows as rollouts hold them
    (DQNConfig, "CartPole-v1", {"apex": True, "prioritized": True}),  # the statistics come with the summaries
])
def test_off_policy_normalize_obs_and_rewards_keep_replay_raw_and_normalise_each_batch_with_its_updates_statistics(
        cls, env, extra):
    """--normalize-obs and --normalize-rewards of the replay-based algorithms, as SB3's
    VecNormalize with them: replay holds observations and rewards as the env gave them, and the
    learner normalises each sampled batch with the running statistics of that update, which
    count every env step; runners act on normalised observations with the statistics published
    with the weights."""
    config = cls(env=env, normalize_obs=True, normalize_rewards=True, hidden_sizes=(16,), batch_size=16,
                 learning_starts=32, rollout_steps=8, num_envs_per_runner=2, torch_threads=1, progress=False,
                 tensorboard=False, eval_interval=0, **extra)
    with shoal.make(config) as algo:
        learner, runner = algo.learner.obj, algo.runners[0].obj
        norm, returns = learner.policy.obs_norm, learner.return_norm
        seen, priorities = [], []
        train_batch = learner.train_batch
        learner.train_batch = lambda batch: (seen.append((batch, norm.mean.clone(), norm.var.clone(),
                                                          returns.var.clone())), train_batch(batch))[1]
        server = algo.inference[0].obj if algo.inference else None
        acting = server.policy if server else runner.policy  # the copy that acts: its inputs and what it acts on
        acted, inputs, explore = [], acting.inputs, acting.explore
        acting.inputs = lambda obs: acted.append([inputs(obs)]) or acted[-1][0]
        acting.explore = lambda x, g: (acted[-1].append((x, acting.obs_norm.mean.clone(), acting.obs_norm.var.clone())),
                                       explore(x, g))[1]
        if config.apex:  # the rows a runner's initial priorities read, and the rows it stores
            nstep, initial = runner.nstep, runner.policy.initial_priorities
            runner.nstep = lambda r: priorities.append([nstep(r)]) or priorities[-1][0]
            runner.policy.initial_priorities = lambda obs, *rest: (
                priorities[-1].append((obs, acting.obs_norm.mean.clone(), acting.obs_norm.var.clone())),
                initial(obs, *rest))[1]
        for _ in range(12):
            algo.train()
        assert float(norm.count) == pytest.approx(algo.env_steps, abs=1e-3) and len(seen) > 0
        assert float(returns.count) == pytest.approx(algo.env_steps, abs=1e-3)
        shard = learner.replay.shards[0].obj
        for batch, mean, var, return_var in seen:
            raw = torch.as_tensor(shard.obs[batch.indices])
            torch.testing.assert_close(batch.obs, ((raw - mean) / torch.sqrt(var + 1e-8)).clamp(-10, 10).float())
            rewards = torch.as_tensor(shard.rewards[batch.indices])  # the env's, as it gave them
            torch.testing.assert_close(batch.rewards, (rewards * config.reward_scale / torch.sqrt(return_var + 1e-8))
                                       .clamp(-10, 10).float())
            if env == "Pendulum-v1":  # cos and sin of the angle, as the env gave them
                torch.testing.assert_close(raw[:, 0] ** 2 + raw[:, 1] ** 2, torch.ones(len(raw)))
        # the acting copy (a runner's, or the inference server's) acts on normalised observations,
        # with the learner's statistics, published with the weights
        acts = [call for call in acted if len(call) == 2]
        assert len(acts) >= 12
        for raw, (x, mean, var) in acts[-3:]:
            torch.testing.assert_close(x, ((raw - mean) / torch.sqrt(var + 1e-8)).clamp(-10, 10).float())
        server._sync() if server else runner.sync_weights()
        assert torch.equal(acting.obs_norm.mean, norm.mean) and float(norm.mean.abs().max()) > 0
        for (raw, *_), (given, mean, var) in priorities[-3:]:
            torch.testing.assert_close(given, ((torch.as_tensor(raw) - mean) / torch.sqrt(var + 1e-8)).clamp(-10, 10)
                                       .float())


def test_reward_scale_multiplies_the_rewards_each_batch_trains_on_while_replay_and_reports_keep_the_envs():
    config = DQNConfig(env="CartPole-v1", reward_scale=5.0, n_step=2, hidden_sizes=(16,), batch_size=16,
                       learning_starts=32, rollout_steps=8, num_envs_per_runner=2, torch_threads=1, progress=False,
                       tensorboard=False, eval_interval=0)
    with shoal.make(config) as algo:
        learner = algo.learner.obj
        seen, train_batch = [], learner.train_batch
        learner.train_batch = lambda batch: (seen.append(batch), train_batch(batch))[1]
        for _ in range(8):
            metrics = algo.train()
        shard = learner.replay.shards[0].obj
        assert len(seen) > 0
        for batch in seen:
            raw = torch.as_tensor(shard.rewards[batch.indices])  # CartPole's 1s, or 2-step sums of them
            assert bool(torch.all((raw == 1) | ((raw - (1 + config.gamma)).abs() < 1e-6)))
            torch.testing.assert_close(batch.rewards, raw.float() * 5)
        assert metrics["episode/return_mean"] == metrics["episode/length_mean"]  # the env's returns, unscaled
    for cls in (DQNConfig, shoal.PPOConfig):
        with pytest.raises(ConfigError, match="reward_scale must be positive and finite"):
            cls(env="CartPole-v1", reward_scale=-1.0)


def test_off_policy_normalize_obs_is_refused_for_images_in_one_line():
    with pytest.raises(shoal.ShoalError, match="^--normalize-obs is for vector observations"):
        shoal.make(SACConfig(env="PixelReach-v0", normalize_obs=True, progress=False, tensorboard=False))


def test_resume_with_another_replay_size_loads_the_saved_transitions_newest_kept(tmp_path, caplog):
    config = DQNConfig(env="CartPole-v1", hidden_sizes=(16,), batch_size=32, learning_starts=64, rollout_steps=8,
                       num_envs_per_runner=2, buffer_size=256, save_replay=True, total_steps=10_000, torch_threads=1,
                       progress=False, tensorboard=False, eval_interval=0)
    with shoal.make(config) as algo:
        for _ in range(20):  # 320 transitions in a ring of 256: it wrapped
            algo.train()
        saved = algo.backend.get(algo.learner.call("get_state"))["replay"][0]
        algo.save(tmp_path / "ck")
    oldest_first = saved["obs"][np.r_[saved["pos"]:256, 0:saved["pos"]]]
    with shoal.load(tmp_path / "ck", buffer_size=128) as algo:
        buf = algo.learner.obj.replay.shards[0].obj
        assert "resuming with buffer_size 128 where the checkpoint's replay had buffer_size 256" in caplog.text
        np.testing.assert_array_equal(buf.obs[np.r_[buf.pos:128, 0:buf.pos]], oldest_first[-128:])
        algo.train()
    with shoal.load(tmp_path / "ck", buffer_size=512) as algo:  # room for them all, then for new ones
        buf = algo.learner.obj.replay.shards[0].obj
        np.testing.assert_array_equal(buf.obs[:256], oldest_first)
        for _ in range(4):
            metrics = algo.train()
        assert len(buf) == 256 + 64 and metrics["learner/updates_this_call"] > 0
        assert (buf.rewards[:len(buf)] == 1).all()  # CartPole's rewards in every slot sampled: none left empty
    with pytest.raises(shoal.ShoalError, match=r"\(gamma 0.99 there, 0.9 here\): resume with its values "
                                               r"\(--set gamma=0.99\)"):
        shoal.load(tmp_path / "ck", gamma=0.9)


def test_resume_with_another_number_of_replay_shards_keeps_every_transition(tmp_path):
    config = DQNConfig(env="CartPole-v1", apex=True, num_env_runners=2, num_replay_shards=2, learning_starts=64,
                       batch_size=32, rollout_steps=16, hidden_sizes=(16,), save_replay=True, torch_threads=1,
                       progress=False, tensorboard=False)
    with shoal.make(config) as algo:
        for _ in range(4):
            algo.train()
        held = sum(s.obj.stored() for s in algo.learner.obj.replay.shards)
        algo.save(tmp_path / "ck")
    with shoal.load(tmp_path / "ck", num_env_runners=3, num_replay_shards=3) as algo:
        stored = [s.obj.stored() for s in algo.learner.obj.replay.shards]
        assert sum(stored) == held and max(stored) - min(stored) <= 1, stored
        algo.train()


def linear_widths(module):
    """Output widths of a module's linear layers in order (QCritics' ensembled ones included)."""
    if isinstance(module, QCritics):
        return [w.shape[-1] for w in module.weights]
    return [m.out_features for m in module.modules() if isinstance(m, torch.nn.Linear)]


@pytest.mark.parametrize("algo, env", [("sac", "Pendulum-v1"), ("sac", "CartPole-v1"), ("td3", "Pendulum-v1"),
                                       ("ddpg", "Pendulum-v1"), ("tqc", "Pendulum-v1"), ("crossq", "Pendulum-v1"),
                                       ("ppo", "CartPole-v1"), ("a2c", "Pendulum-v1"), ("trpo", "CartPole-v1"),
                                       ("impala", "CartPole-v1"), ("appo", "Pendulum-v1")])
def test_critics_take_their_own_widths_where_given_else_the_actors(algo, env):
    """critic_hidden_sizes (SB3's net_arch=dict(pi=..., qf=/vf=...), RLlib's critic_hiddens) shapes
    the critics (and their targets) or the value network alone; unset, they have the actor's widths."""
    spaces = gym.make(env)
    for critic, expected in (((48, 40), [48, 40]), (None, [16])):
        config = shoal.make_config(algo, env, hidden_sizes=(16,), critic_hidden_sizes=critic)
        if algo in ("ppo", "a2c", "trpo", "impala", "appo"):
            policy = shoal.algos.get(algo).make_policy(config, spaces.observation_space, spaces.action_space)
            assert linear_widths(policy.actor)[:-1] == [16] and linear_widths(policy.critic) == [*expected, 1]
            continue
        learner = shoal.algos.get(algo).learner_cls(config, spaces.observation_space, spaces.action_space,
                                                    WeightStore())
        assert linear_widths(learner.critics)[:-1] == expected
        if hasattr(learner, "target_critics"):
            assert linear_widths(learner.target_critics)[:-1] == expected
        assert 16 in linear_widths(learner.policy) and not {40, 48} & set(linear_widths(learner.policy))


@pytest.mark.parametrize("value", [[], [64, 0]])
def test_critic_widths_that_build_no_network_are_refused(value):
    with pytest.raises(ConfigError, match="critic_hidden_sizes needs at least one positive width"):
        shoal.make_config("sac", "Pendulum-v1", critic_hidden_sizes=value)


@pytest.mark.parametrize("algo, env", [("sac", "Pendulum-v1"), ("sac", "CartPole-v1"), ("crossq", "Pendulum-v1")])
@pytest.mark.parametrize("k", [1, 3])
def test_sac_learns_with_n_critics(algo, env, k):
    """n_critics (SB3's; RLlib's twin_q) critics, each with its own target (CrossQ: its own Batch
    Renormalization statistics), all of them learning."""
    spaces = gym.make(env)
    config = shoal.make_config(algo, env, n_critics=k, hidden_sizes=(16,), critic_hidden_sizes=(16,), seed=0)
    learner = shoal.algos.get(algo).learner_cls(config, spaces.observation_space, spaces.action_space, WeightStore())
    critics = [learner.critics, *([learner.target_critics] if hasattr(learner, "target_critics") else [])]
    assert all(w.shape[0] == k for c in critics for w in c.weights)
    n, g = 32, torch.Generator().manual_seed(0)
    obs = torch.randn(2, n, *spaces.observation_space.shape, generator=g)
    actions = torch.randint(0, 2, (n,), generator=g) if env == "CartPole-v1" else torch.rand(n, 1, generator=g) * 4 - 2
    batch = Transitions(obs[0], actions, torch.randn(n, generator=g), obs[1], torch.full((n,), 0.99), torch.ones(n),
                        np.arange(n))
    before = [p.detach().clone() for p in learner.critics.parameters()]
    for _ in range(3):
        metrics, _ = learner.train_batch(batch)
    assert all(torch.isfinite(v).all() for v in metrics.values())
    assert all(not torch.equal(a, b) for a, b in zip(before, learner.critics.parameters()) if a.dim() > 1)


def test_n_critics_below_one_are_refused():
    with pytest.raises(ConfigError, match="n_critics must be at least 1"):
        shoal.make_config("sac", "Pendulum-v1", n_critics=0)


def test_sacs_soft_target_is_the_smallest_of_its_n_target_critics():
    """The first update's critic loss, by hand: the next actions drawn as the learner draws them (its
    generator's first draw), the soft target from the smallest of 3 target critics' values."""
    spaces = gym.make("Pendulum-v1")
    config = shoal.make_config("sac", "Pendulum-v1", n_critics=3, hidden_sizes=(16,), seed=0)
    learner = SACLearner(config, spaces.observation_space, spaces.action_space, WeightStore())
    n, g = 32, torch.Generator().manual_seed(1)
    obs, next_obs = torch.randn(2, n, 3, generator=g)
    actions, rewards = torch.rand(n, 1, generator=g) * 4 - 2, torch.randn(n, generator=g)
    batch = Transitions(obs, actions, rewards, next_obs, torch.full((n,), 0.99), torch.ones(n), np.arange(n))
    draws = torch.Generator().set_state(learner.generator.get_state())
    with torch.no_grad():
        next_a, next_logp = learner.policy.sample(next_obs, draws)
        values = learner.target_critics(next_obs, next_a)  # [3, N]
        assert (values.max(0).values - values.min(0).values).min() > 0  # the three disagree everywhere
        target = rewards + 0.99 * (values.min(0).values - learner.log_alpha.exp() * next_logp)
        expected = ((learner.critics(obs, actions) - target).pow(2).sum(0).mean() * 0.5).item()
    metrics, _ = learner.train_batch(batch)
    assert metrics["loss/critic"].item() == pytest.approx(expected, rel=1e-5)
