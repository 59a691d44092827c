"""On-policy maths and mechanics: V-trace, conjugate gradient, TRPO's KL bound, policy lag."""

import numpy as np
import pytest
import torch

import shoal
from shoal.returns import gae, vtrace


def reference_vtrace(mu_logp, pi_logp, rewards, values, next_value, done, gamma, lam, rho_bar, c_bar):
    """Espeholt et al. eq. 1 written out: v_s = V(x_s) + sum_t gamma^(t-s) (prod_{i<t} c_i) delta_t,
    the sum running to the end of the episode or of the rollout, one env and one step at a time."""
    T, B = rewards.shape
    ratio = np.exp(pi_logp - mu_logp)
    vs, adv = np.zeros((T, B)), np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total, coef = 0.0, 1.0
            for t in range(s, T):
                delta = min(rho_bar, ratio[t, b]) * (rewards[t, b] + gamma * next_value[t, b] - values[t, b])
                total += gamma ** (t - s) * coef * delta
                if done[t, b]:
                    break
                coef *= lam * min(c_bar, ratio[t, b])
            vs[s, b] = values[s, b] + total
    for b in range(B):
        for s in range(T):
            nxt = next_value[s, b] if done[s, b] or s == T - 1 else vs[s + 1, b]
            adv[s, b] = min(rho_bar, ratio[s, b]) * (rewards[s, b] + gamma * nxt - values[s, b])
    return vs, adv


def random_trajectories(T=12, B=3, seed=0):
    rng = np.random.default_rng(seed)
    terminated = np.zeros((T, B), bool)
    truncated = np.zeros((T, B), bool)
    terminated[3, 0] = terminated[8, 1] = True
    truncated[5, 0] = truncated[T - 1, 2] = True
    values = rng.normal(size=(T, B))
    # V(x_{t+1}): the next step's value within an episode, 0 after termination, V(final obs) after truncation
    next_value = np.concatenate([values[1:], rng.normal(size=(1, B))])
    next_value[truncated] = rng.normal(size=truncated.sum())
    next_value[terminated] = 0.0
    return dict(mu_logp=rng.normal(-0.7, 0.3, (T, B)), pi_logp=rng.normal(-0.7, 0.3, (T, B)),
                rewards=rng.normal(size=(T, B)), values=values, next_value=next_value, done=terminated | truncated)


@pytest.mark.parametrize("lam, rho_bar, c_bar", [(1.0, 1.0, 1.0), (0.9, 1.5, 0.8), (1.0, 100.0, 100.0)])
def test_vtrace_matches_the_reference_loop_across_episode_ends(lam, rho_bar, c_bar):
    d = random_trajectories()
    t = {k: torch.as_tensor(v) for k, v in d.items()}
    vs, adv = vtrace(t["mu_logp"], t["pi_logp"], t["rewards"], t["values"], t["next_value"], t["done"],
                     0.9, lam, rho_bar, c_bar)
    ref_vs, ref_adv = reference_vtrace(*d.values(), 0.9, lam, rho_bar, c_bar)
    np.testing.assert_allclose(vs.numpy(), ref_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-10, atol=1e-10)


def test_vtrace_on_policy_is_the_n_step_return():
    d = random_trajectories(seed=1)
    t = {k: torch.as_tensor(v) for k, v in d.items()}
    vs, adv = vtrace(t["mu_logp"], t["mu_logp"], t["rewards"], t["values"], t["next_value"], t["done"], 0.95)
    gae_adv, returns = gae(t["rewards"], t["values"], t["next_value"], t["done"], 0.95, 1.0)
    np.testing.assert_allclose(vs.numpy(), returns.numpy(), rtol=1e-10)
    np.testing.assert_allclose(adv.numpy(), gae_adv.numpy(), rtol=1e-10, atol=1e-12)
    # and by hand for env 0, whose first episode terminates at step 3: plain discounted rewards
    r = d["rewards"][:, 0]
    assert vs[0, 0].item() == pytest.approx(r[0] + 0.95 * r[1] + 0.95**2 * r[2] + 0.95**3 * r[3])


def test_conjugate_gradient_solves_a_known_system():
    from shoal.algos.trpo import conjugate_gradient

    rng = np.random.default_rng(0)
    m = rng.normal(size=(6, 6))
    a = torch.as_tensor(m @ m.T + 6 * np.eye(6))
    b = torch.as_tensor(rng.normal(size=6))
    x = conjugate_gradient(lambda v: a @ v, b, iters=6)
    np.testing.assert_allclose(x.numpy(), np.linalg.solve(a.numpy(), b.numpy()), rtol=1e-8)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_trpo_step_respects_the_kl_bound(env):
    from shoal.algos.trpo import TRPOConfig, TRPOLearner, mean_kl
    from shoal.envs import env_spaces
    from shoal.runner import EnvRunner
    from shoal.weights import WeightStore

    config = TRPOConfig(env=env, max_kl=0.005, rollout_steps=64, num_envs_per_runner=4, torch_threads=1)
    store = WeightStore()
    learner = TRPOLearner(config, *env_spaces(env), store)
    learner.publish()
    rollout = EnvRunner(config, 0, store).sample(64)
    obs = torch.as_tensor(rollout.obs.reshape(-1, rollout.obs.shape[-1]))
    with torch.no_grad():
        before = learner.policy.dist(obs)
    metrics = learner.learn([rollout])
    with torch.no_grad():
        kl = float(mean_kl(before, learner.policy.dist(obs)))
    assert metrics["learner/step_accepted"] == 1.0
    assert 0 < kl <= config.max_kl
    assert kl == pytest.approx(metrics["learner/kl"], rel=1e-5)


@pytest.mark.parametrize("share_encoder", [True, False], ids=["shared", "own-critic-encoder"])
def test_trpo_steps_a_convolutional_policy_within_the_bound_and_fits_the_value_on_its_features(share_encoder):
    """With images the actor and the critic share the encoder. The natural-gradient step (the
    Fisher on every 4th state) moves it within the KL bound over the whole batch; the value
    regression then fits the critic's head alone, so the policy moves by the bounded step only.
    With ``--no-share-encoder`` the value regression trains the critic's own encoder too."""
    from shoal.algos.trpo import TRPOConfig, TRPOLearner, mean_kl
    from shoal.envs import env_spaces
    from shoal.runner import EnvRunner
    from shoal.weights import WeightStore

    env = "MiniGrid-Empty-5x5-v0"
    config = TRPOConfig(env=env, max_kl=0.02, fisher_subsample=4, rollout_steps=32, num_envs_per_runner=4,
                        torch_threads=1, share_encoder=share_encoder)
    store = WeightStore()
    learner = TRPOLearner(config, *env_spaces(env), store)
    learner.publish()
    rollout = EnvRunner(config, 0, store).sample(32)
    m = learner.policy
    obs = torch.as_tensor(rollout.obs.reshape(-1, *m.input_shape))
    assert m.cnn and obs.dtype == torch.uint8
    parts = (m.encoder, m.critic) if share_encoder else (m.encoder, m.critic, m.critic_encoder)
    before_parts = [[p.detach().clone() for p in part.parameters()] for part in parts]
    with torch.no_grad():
        before = m.dist(obs)
    metrics = learner.learn([rollout])
    with torch.no_grad():
        kl = float(mean_kl(before, m.dist(obs)))
    assert metrics["learner/step_accepted"] == 1.0
    assert 0 < kl <= config.max_kl
    assert kl == pytest.approx(metrics["learner/kl"], rel=1e-5)
    for part, old in zip(parts, before_parts):
        assert all(not torch.equal(a, b) for a, b in zip(old, part.parameters())), part


def test_trpo_bounds_the_kl_of_the_whole_action():
    """``max_kl`` bounds the KL summed over a Gaussian's action dimensions (the paper's), where
    sb3-contrib's ``target_kl`` bounds its mean over them."""
    from torch.distributions import Normal

    from shoal.algos.trpo import mean_kl

    old, new = Normal(torch.zeros(5, 3), torch.ones(5, 3)), Normal(torch.full((5, 3), 0.1), torch.ones(5, 3))
    assert float(mean_kl(old, new)) == pytest.approx(3 * 0.5 * 0.1**2)


@pytest.mark.parametrize("env, target_kl", [("Pendulum-v1", 0.01), ("Acrobot-v1", 0.01),
                                            ("LunarLanderContinuous-v3", 0.01), ("BipedalWalker-v3", 0.01),
                                            ("Hopper-v5", 0.01), ("Walker2d-v5", 0.01), ("Ant-v5", 0.01),
                                            ("Humanoid-v5", 0.01), ("Swimmer-v5", 0.01), ("HalfCheetah-v5", 0.04)])
def test_trpo_presets_bound_the_kl_as_rl_zoo_tuned_it(env, target_kl):
    """rl-zoo's TRPO settings were tuned with sb3-contrib's ``target_kl`` (per action dimension),
    so each preset's ``max_kl`` is that times the env's continuous action dimensions."""
    import gymnasium as gym

    from shoal.envs import env_spaces

    if env.endswith("-v5"):
        pytest.importorskip("mujoco")
    action_space = env_spaces(env)[1]
    dims = int(np.prod(action_space.shape)) if isinstance(action_space, gym.spaces.Box) else 1
    assert shoal.make_config("trpo", env).max_kl == pytest.approx(target_kl * dims)


def test_rollouts_older_than_max_policy_lag_are_dropped_and_counted():
    from shoal.algos.impala import IMPALAConfig, IMPALALearner
    from shoal.envs import env_spaces
    from shoal.runner import EnvRunner
    from shoal.weights import WeightStore

    config = IMPALAConfig(env="CartPole-v1", max_policy_lag=1, rollout_steps=8, num_envs_per_runner=2)
    store = WeightStore()
    learner = IMPALALearner(config, *env_spaces("CartPole-v1"), store)
    learner.publish()
    runner = EnvRunner(config, 0, store)
    old = runner.sample(8)  # version 0
    for _ in range(2):
        learner.update(runner.sample(8))  # the learner moves to version 2
    fresh = runner.sample(8)  # version 2
    result = learner.update(old, fresh)
    assert result.metrics["learner/policy_lag_max"] == 2 and result.metrics["learner/policy_lag_mean"] == 1
    assert result.metrics["learner/dropped_rollouts"] == 1 and result.metrics["learner/dropped_steps"] == 16
    assert result.version == 3 and result.env_steps == 32  # dropped steps still count as sampled
    assert learner.update(old).version == 3  # nothing fresh: nothing learned or published


def test_normalized_rewards_are_divided_by_the_running_std_of_the_discounted_return():
    """normalize_rewards as stable-baselines3's VecNormalize: each env's discounted return runs on
    across rollouts and restarts at 0 after its episode ends; the learner divides the rewards by the
    std of every such return so far, clips to +-10, and keeps the statistics in its state."""
    from shoal.algos.ppo import PPOConfig, PPOLearner
    from shoal.envs import env_spaces
    from shoal.runner import EnvRunner
    from shoal.weights import WeightStore

    config = PPOConfig(env="Pendulum-v1", normalize_rewards=True, gamma=0.9, rollout_steps=150,
                       num_envs_per_runner=2, minibatch_size=60)
    store = WeightStore()
    learner = PPOLearner(config, *env_spaces("Pendulum-v1"), store)
    learner.publish()
    runner = EnvRunner(config, 0, store)
    rollouts = [runner.sample(150) for _ in range(2)]  # Pendulum's 200-step episodes end in the second
    rewards = np.concatenate([r.rewards for r in rollouts])
    done = np.concatenate([r.terminated | r.truncated for r in rollouts])
    assert done.any()
    running, returns = np.zeros(2), []
    for t in range(300):
        running = running * 0.9 + rewards[t]
        returns.append(running.copy())
        running[done[t]] = 0.0
    returns = np.array(returns)
    for r, part in zip(rollouts, (returns[:150], returns[150:])):
        np.testing.assert_allclose([r.return_moments.count, r.return_moments.mean, r.return_moments.var],
                                   [300, part.mean(), part.var()], rtol=1e-6)  # rollouts hold float32 rewards
    seen = learner.learner_rewards(rollouts[:1])
    var = returns[:150].var() * 300 / (300 + 1e-4) + returns[:150].mean() ** 2 * 300 * 1e-4 / (300 + 1e-4) ** 2 \
        + 1e-4 / (300 + 1e-4)  # merged with the prior: count 1e-4, mean 0, var 1
    np.testing.assert_allclose(seen.numpy(), np.clip(rewards[:150] / np.sqrt(var + 1e-8), -10, 10), rtol=1e-5)
    assert np.abs(seen.numpy()).max() < 1 < np.abs(rewards[:150]).max()  # Pendulum's, down to -16, scaled down
    learner.update(rollouts[1])
    copy = PPOLearner(config, *env_spaces("Pendulum-v1"), WeightStore())
    copy.set_state(learner.get_state())
    assert float(copy.return_norm.count) == 600 + 1e-4
    assert torch.equal(copy.return_norm.var, learner.return_norm.var)


@pytest.mark.parametrize("algo", ["a2c", "trpo", "impala", "appo"])
@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_each_algorithm_trains_discrete_and_continuous(algo, env, tmp_path):
    from shoal.algos import get

    config = get(algo).config_cls(env=env, rollout_steps=16, num_envs_per_runner=4, total_steps=256,
                                  progress=False, tensorboard=False, eval_episodes=1, eval_interval=0)
    summary = shoal.train(config, run_dir=tmp_path / "run")
    assert summary["env_steps"] == 256
    policy = shoal.load_policy(tmp_path / "run")
    assert policy.action_space.contains(policy.act(policy.observation_space.sample()))


@pytest.mark.parametrize("algo", ["ppo", "a2c", "trpo", "impala", "appo"])
def test_gsde_is_refused_where_an_actor_critic_cannot_hold_its_noise(algo, capsys, tmp_path):
    from shoal.cli import main
    from shoal.config import ConfigError

    config = shoal.make_config(algo, "MountainCarContinuous-v0", use_sde=True, progress=False, tensorboard=False)
    assert config.use_sde
    with pytest.raises(ConfigError, match="cannot be combined with --inference central"):
        shoal.make_config(algo, "Pendulum-v1", use_sde=True, inference="central")
    with pytest.raises(ConfigError, match="sde_sample_freq must be -1"):
        shoal.make_config(algo, "Pendulum-v1", use_sde=True, sde_sample_freq=0)
    with pytest.raises(shoal.ShoalError, match="--use-sde explores continuous actions: it takes Box actions"):
        shoal.make(shoal.make_config(algo, "CartPole-v1", use_sde=True, progress=False, tensorboard=False))
    run = tmp_path / "run"
    assert main(["train", algo, "--env", "CartPole-v1", "--use-sde", "--no-progress", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "--use-sde explores continuous actions" in err and len(err.strip().splitlines()) == 1
    assert not run.exists()
