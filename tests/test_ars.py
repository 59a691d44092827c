"""ARS: the update against a hand computation, acting with a weight vector per row, the runner's
candidates and episodes, learning on CartPole and MountainCarContinuous, resume (the ray backend's
runners compute what local ones do: tests/test_ray_backend.py)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import shoal
from conftest import learner_for
from shoal.algos.ars import ARSRunner, CandidateEpisodes, make_policy
from shoal.errors import ConfigError, ShoalError
from shoal.policy import Moments
from shoal.weights import WeightStore

QUICK = {"progress": False, "tensorboard": False}


def config(env="CartPole-v1", **sets):
    return shoal.make_config("ars", env, **{**QUICK, **sets})


def episodes(candidates, returns, lengths, version=0, moments=None):
    return CandidateEpisodes(np.asarray(candidates), np.asarray(returns, float), np.asarray(lengths), int(sum(lengths)),
                             version, 0, moments, {})


def test_the_update_is_the_papers_step_along_the_best_directions():
    c = config(n_delta=4, n_top=2, lr=0.1, delta_std=0.05, alive_bonus_offset=-1.0, normalize_obs=True)
    learner = learner_for(c)
    m = learner.policy
    assert torch.equal(m.flat(), torch.zeros(m.num_params))  # zero_policy
    start = torch.randn(m.num_params, generator=torch.Generator().manual_seed(3))
    m.load_flat(start)
    directions = m.directions(4).numpy().astype(np.float64)
    # candidates 0-3 are +d_k, 4-7 are -d_k; two episodes of candidate 1, one of each other
    rets = [10.0, 30.0, 50.0, 5.0, 20.0, 0.0, 8.0, 40.0, 1.0]
    lens = [10, 20, 30, 5, 10, 10, 8, 40, 1]
    cands = [0, 1, 2, 3, 4, 5, 6, 7, 1]
    moments = Moments.of(np.random.default_rng(0).normal(size=(50, 4)))
    learner.learn([episodes(cands, rets, lens, moments=moments)])
    score = np.zeros(8)
    for k, r, n in zip(cands, rets, lens):
        score[k] += (r - n) / (2 if k == 1 else 1)  # mean of candidate 1's two episodes
    plus, minus = score[:4], score[4:]
    top = np.argsort(-np.maximum(plus, minus))[:2]
    std = np.concatenate([plus[top], minus[top]]).std(ddof=1)
    expected = start.numpy() + 0.1 / (2 * std + 1e-6) * ((plus - minus)[top] @ directions[top])
    np.testing.assert_allclose(m.flat().numpy(), expected, rtol=1e-5, atol=1e-6)
    assert torch.allclose(m.obs_norm.mean, torch.tensor(moments.mean), atol=1e-5)  # the states visited
    assert not torch.equal(m.directions(4), torch.tensor(directions, dtype=torch.float32))  # new ones drawn


def test_linear_schedules_shrink_the_step_and_the_noise_runners_explore_with():
    c = config(n_delta=2, lr=0.1, delta_std=0.05, total_steps=1000, lr_schedule="linear",
               delta_std_schedule="linear", normalize_obs=False, num_envs_per_runner=1)
    store = WeightStore()
    learner = learner_for(c, store)
    m = learner.policy
    assert float(m.noise_std) == 0.05  # the first iteration explores with delta_std
    learner.env_steps = 250  # a quarter of the run learned from before this update
    d = m.directions(2).numpy().astype(np.float64)
    metrics = learner.learn([episodes([0, 1, 2, 3], [4.0, 1.0, 2.0, 2.0], [100] * 4)])
    std = np.std([4.0, 1.0, 2.0, 2.0], ddof=1)
    expected = 0.075 / (2 * std + 1e-6) * (np.array([2.0, -1.0]) @ d)  # lr at 3/4 of itself
    np.testing.assert_allclose(m.flat().numpy(), expected, rtol=1e-5, atol=1e-7)
    assert metrics["learner/lr"] == pytest.approx(0.075) and metrics["ars/delta_std"] == 0.05
    assert float(m.noise_std) == pytest.approx(0.05 * 0.35)  # after 250 + 400 steps, for the next iteration
    # a runner explores with the noise the learner published: its candidates are w +- noise_std * d
    learner.publish()
    runner = ARSRunner(c, 0, store)
    played = []
    runner.policy.population_act = lambda x, w: played.append(w.clone()) or torch.zeros(len(x), dtype=torch.int64)
    runner.sample(5)
    offset = played[0][0] - m.flat()  # its one env plays candidate 0 first: +d0
    np.testing.assert_allclose(offset.numpy(), 0.05 * 0.35 * m.directions(2)[0].numpy(), rtol=1e-5, atol=1e-8)
    # constant by default
    learner = learner_for(config(n_delta=2, total_steps=1000))
    learner.env_steps = 900
    metrics = learner.learn([episodes([0, 1, 2, 3], [4.0, 1.0, 2.0, 2.0], [100] * 4)])
    assert metrics["learner/lr"] == 0.02 and float(learner.policy.noise_std) == 0.05


def test_a_checkpoint_from_before_the_noise_was_published_explores_with_delta_std():
    m = make_policy(config(delta_std=0.07), gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2))
    old = {k: v for k, v in m.state_dict().items() if k != "noise_std"}
    fresh = make_policy(config(delta_std=0.07), gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2))
    fresh.load_state_dict(old)
    assert float(fresh.noise_std) == 0.07


def test_directions_of_a_failed_runner_are_left_out():
    learner = learner_for(config(n_delta=3))
    m = learner.policy
    d = m.directions(3)
    learner.learn([episodes([0, 3, 1], [5.0, 1.0, 9.0], [5, 1, 9])])  # direction 1 lost its - candidate
    plus, minus = 5.0, 1.0
    std = np.std([plus, minus], ddof=1)
    expected = 0.02 / (1 * std + 1e-6) * (plus - minus) * d[0]
    torch.testing.assert_close(m.flat(), expected)


@pytest.mark.parametrize("env, policy", [("CartPole-v1", "linear"), ("CartPole-v1", "mlp"),
                                         ("Pendulum-v1", "linear"), ("Pendulum-v1", "mlp")])
def test_each_row_acts_with_its_own_weights(env, policy):
    space = gym.make(env)
    m = make_policy(config(env, policy=policy, hidden_sizes=(8, 8)), space.observation_space, space.action_space)
    weights = torch.randn(5, m.num_params)
    x = torch.randn(5, m.obs_dim)
    together = m.population_act(x, weights)
    for e in range(5):
        m.load_flat(weights[e])
        torch.testing.assert_close(together[e], m.act(x[e:e + 1], True)[0])
    if policy == "mlp" and env == "Pendulum-v1":  # squashed to the bounds, as sb3-contrib's MlpPolicy
        assert m.squash and m.env_actions(torch.tensor([[1.0]])).item() == 2.0
    elif env == "Pendulum-v1":  # the linear policy's output is clipped
        assert not m.squash and m.env_actions(torch.tensor([[7.0]])).item() == 2.0


def replay(env_id, seed, num_envs, queue, weights):
    """The episodes (candidate, length) a runner's envs play, one Gymnasium env at a time in
    lockstep: env b, seeded seed + b when the runner was made, starts its next episode with
    candidate queue[b]; an env whose episode ends takes the next candidate of the queue (the
    lowest-numbered env first) and goes on from its own next episode (same-step autoreset)."""
    envs = [gym.make(env_id) for _ in range(num_envs)]
    for b, env in enumerate(envs):  # the runner's reset when it was made
        env.reset(seed=seed + b)
    obs = [env.reset()[0] for env in envs]  # the iteration's: each env from its own stream
    playing, lengths, nxt, played = list(queue[:num_envs]), [0] * num_envs, num_envs, []
    while any(k is not None for k in playing):
        for b, k in enumerate(playing):
            if k is None:
                continue
            a = int(np.argmax(weights[k].numpy().reshape(2, 4) @ obs[b]))  # the linear policy: argmax of W s
            obs[b], _, term, trunc, _ = envs[b].step(a)
            lengths[b] += 1
            if term or trunc:
                played.append((k, lengths[b]))
                obs[b], lengths[b] = envs[b].reset()[0], 0
                playing[b] = queue[nxt] if nxt < len(queue) else None
                nxt += 1
    return sorted(played)


@pytest.mark.parametrize("num_envs", [8, 2])
def test_a_runner_plays_its_candidates_whole_episodes_with_their_weights(num_envs):
    """Runner 1 of 2 plays candidates 1, 3 and 5 (+d1, -d0, -d2) twice each: on 6 envs (8 asked
    for: more would only wait) one episode each, on 2 envs one after another."""
    c = config(n_delta=3, n_eval_episodes=2, num_env_runners=2, num_envs_per_runner=num_envs, normalize_obs=False,
               delta_std=0.5)
    store = WeightStore()
    learner_for(c, store).publish()  # zero weights: each candidate is its direction
    runner = ARSRunner(c, 1, store)
    assert runner.env.num_envs == min(num_envs, 6)
    got = runner.sample(c.steps_per_rollout)
    assert sorted(got.candidates.tolist()) == [1, 1, 3, 3, 5, 5]
    np.testing.assert_array_equal(got.returns, got.lengths)  # CartPole: a reward per step
    d = runner.policy.directions(3) * c.delta_std
    weights = {k: d[k % 3] * (1 if k < 3 else -1) for k in (1, 3, 5)}
    assert sorted(zip(got.candidates.tolist(), got.lengths.tolist())) == replay(
        c.env, runner.seed, runner.env.num_envs, [1, 3, 5, 1, 3, 5], weights)
    steps = got.env_steps // runner.env.num_envs  # until the last episode ended
    assert steps == max(got.lengths) if num_envs == 8 else got.lengths.sum() <= 2 * steps


def test_episodes_are_cut_at_max_episode_steps():
    c = config("Pendulum-v1", n_delta=1, max_episode_steps=20)  # Pendulum's episodes: 200 steps
    store = WeightStore()
    learner_for(c, store).publish()
    got = ARSRunner(c, 0, store).sample(c.steps_per_rollout)
    assert sorted(got.candidates.tolist()) == [0, 1] and got.lengths.tolist() == [20, 20] and got.env_steps == 40
    assert (got.returns < 0).all()  # scored as they stand


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ars_solves_cartpole_within_100k_steps(seed, tmp_path):
    summary = shoal.train(config(seed=seed, total_steps=100_000, stop_return=475, eval_interval=2_000),
                          run_dir=tmp_path)
    assert summary["best_eval_return"] >= 475 and summary["env_steps"] <= 100_000, summary


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ars_solves_mountain_car_continuous_within_300k_steps(seed, tmp_path):
    """rl-zoo's settings (16 directions, normalised states): 90-120k steps here, 3-5 s."""
    summary = shoal.train(config("MountainCarContinuous-v0", seed=seed, total_steps=300_000, stop_return=90,
                                 eval_interval=10_000), run_dir=tmp_path)
    assert summary["best_eval_return"] >= 90 and summary["env_steps"] <= 300_000, summary


def test_a_resumed_run_goes_on_as_the_run_did(tmp_path):
    def run(n, algo=None):
        algo = algo or shoal.make(config("MountainCarContinuous-v0", n_delta=4, max_episode_steps=200))
        for _ in range(n):
            algo.train()
        return algo

    with run(2) as algo:
        path = algo.save(tmp_path / "ckpt")
        run(2, algo)
        straight = algo.get_policy().module.flat()
    with shoal.load(path) as resumed:
        run(2, resumed)
        torch.testing.assert_close(resumed.get_policy().module.flat(), straight, rtol=0, atol=0)


@pytest.mark.parametrize("sets, message", [
    ({"n_top": 9}, "n_top must be from 1 to n_delta (8)"),
    ({"num_env_runners": 17}, "num_env_runners 17 is more than the 16 candidates"),
    ({"inference": "central"}, "--inference central"),
    ({"delta_std": 0}, "lr and delta_std must be positive"),
])
def test_bad_settings_get_one_line(sets, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(**sets)


def test_an_mlp_needs_bounded_actions():
    space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    with pytest.raises(ShoalError, match="infinite bounds"):
        make_policy(config(policy="mlp"), gym.spaces.Box(-1, 1, (3,), np.float32), space)
    make_policy(config(policy="linear"), gym.spaces.Box(-1, 1, (3,), np.float32), space)  # clipped, not scaled
