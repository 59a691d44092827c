"""MultiDiscrete and MultiBinary actions: one categorical per element, for the on-policy algorithms."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import user_module
from torch.distributions import Categorical, kl_divergence

import shoal
from shoal.envs import describe_space, space_from_description
from shoal.policy import ActorCritic

SWITCH_ENVS = """
import gymnasium as gym
import numpy as np


class Switches(gym.Env):
    '''Set every switch to the position the observation shows (one-hot per switch): a point a
    step for each switch set right, 10 steps an episode. Actions outside the space raise.'''

    def __init__(self, space):
        self.action_space = space
        if isinstance(space, gym.spaces.MultiBinary):
            self.sizes, self.start = np.full(space.n, 2), np.zeros(space.n, np.int64)
        else:
            self.sizes, self.start = space.nvec, space.start
        self.observation_space = gym.spaces.Box(0, 1, (int(self.sizes.sum()),), np.float32)

    def _observe(self):
        self.target = self.np_random.integers(0, self.sizes)
        obs = np.zeros(self.observation_space.shape, np.float32)
        obs[np.concatenate([[0], np.cumsum(self.sizes)[:-1]]) + self.target] = 1
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        reward = float(np.sum(np.asarray(action) - self.start == self.target))
        self.t += 1
        return self._observe(), reward, False, self.t >= 10, {}


gym.register("Switches-v0", entry_point=Switches,
             kwargs={"space": gym.spaces.MultiDiscrete([3, 4, 2], start=[-1, 0, 5])})
gym.register("BinarySwitches-v0", entry_point=Switches, kwargs={"space": gym.spaces.MultiBinary(4)})
"""


@pytest.fixture
def switch_envs(tmp_path, monkeypatch):
    user_module(tmp_path, monkeypatch, "shoal_switch_envs", SWITCH_ENVS)
    yield
    for env_id in ("Switches-v0", "BinarySwitches-v0"):  # the next test's copy registers its own
        gym.registry.pop(env_id, None)


def test_a_multi_discrete_policy_is_one_categorical_per_element():
    """Log-probabilities and entropies are the sums of each element's Categorical (of different
    sizes), the most likely action is each element's argmax, and the env gets actions counted from
    each element's start, in the space's dtype. TRPO's distribution agrees and has a KL."""
    space = gym.spaces.MultiDiscrete([3, 4, 2], start=[-1, 0, 5])
    m = ActorCritic(gym.spaces.Box(-1, 1, (5,), np.float32), space)
    assert not hasattr(m, "log_std") and m.actor[-1].out_features == 9
    with torch.no_grad():
        for p in m.actor.parameters():
            p.normal_()
    x = torch.randn(64, 5)
    per_element = [Categorical(logits=out) for out in torch.split(m.actor(x), [3, 4, 2], dim=-1)]
    actions, logp = m.explore(x, torch.Generator().manual_seed(0))
    assert actions.shape == (64, 3) and all(((0 <= a) & (a < n)).all() for a, n in zip(actions.T, [3, 4, 2]))
    expected = sum(d.log_prob(a) for d, a in zip(per_element, actions.T))
    entropy = sum(d.entropy() for d in per_element)
    new_logp, new_entropy, _ = m.evaluate(x, actions)
    for got, want in [(logp, expected), (new_logp, expected), (new_entropy, entropy),
                      (m.dist(x).log_prob(actions), expected), (m.dist(x).entropy(), entropy)]:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(m.act(x, deterministic=True), torch.stack([d.logits.argmax(-1) for d in per_element], -1))
    other = ActorCritic(m.obs_space, space)
    kl = kl_divergence(m.dist(x), other.dist(x))
    assert kl.shape == (64,) and (kl > 0).all() and kl_divergence(m.dist(x), m.dist(x)).abs().max() < 1e-5
    env_actions = m.to_env(m.act(x, deterministic=False, generator=torch.Generator().manual_seed(1)))
    assert env_actions.dtype == np.int64 and all(space.contains(a) for a in env_actions)
    assert set(env_actions[:, 0]) == {-1, 0, 1} and set(env_actions[:, 2]) == {5, 6}

    binary = gym.spaces.MultiBinary([2, 3])
    b = ActorCritic(gym.spaces.Box(-1, 1, (5,), np.float32), binary)
    sampled = b.to_env(b.act(x, deterministic=False))
    assert sampled.shape == (64, 2, 3) and sampled.dtype == np.int8 and all(binary.contains(a) for a in sampled)
    for s in (space, binary, gym.spaces.MultiBinary(4)):  # as a checkpoint describes them
        assert space_from_description(describe_space(s)) == s


@pytest.mark.parametrize("algo, env, threshold", [
    ("ppo", "Switches-v0", 25),  # returns: at most 30, a random policy's 10.8
    ("appo", "Switches-v0", 25),
    ("trpo", "BinarySwitches-v0", 38),  # at most 40, random 20
    ("a2c", "BinarySwitches-v0", 34),
])
def test_on_policy_algorithms_learn_multi_discrete_and_multi_binary_actions(
        switch_envs, tmp_path, algo, env, threshold):
    """Each switch's right position is in the observation: a policy that learns all of them scores
    a point per switch per step. The env raises on an action outside its space, and
    --max-env-restarts 0 fails the run on the first."""
    from shoal.cli import main

    run = tmp_path / algo
    assert main(["train", algo, "--env", f"shoal_switch_envs:{env}", "--run-dir", str(run), "--no-progress",
                 "--no-tensorboard", "--total-steps", "12000", "--eval-episodes", "10",
                 "--max-env-restarts", "0"]) == 0
    evals = np.loadtxt(run / "eval.csv", delimiter=",", skiprows=1, usecols=3, ndmin=1)
    assert evals.max() >= threshold, evals
    policy = shoal.load_policy(run)  # the checkpoint's spaces, and actions the env takes
    space = gym.make(f"shoal_switch_envs:{env}").action_space
    assert policy.action_space == space
    obs = np.eye(policy.observation_space.shape[0], dtype=np.float32)
    assert all(space.contains(a) for a in policy.act(obs, deterministic=False))


@pytest.mark.parametrize("algo", ["dqn", "sac"])
def test_off_policy_algorithms_refuse_multi_discrete_actions_in_one_line(switch_envs, tmp_path, capsys, algo):
    from shoal.cli import main

    run = tmp_path / algo
    assert main(["train", algo, "--env", "shoal_switch_envs:Switches-v0", "--run-dir", str(run),
                 "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"shoal: error: {algo} does not support action space MultiDiscrete([3 4 2], start=[-1  0  5]): "
        "MultiDiscrete and MultiBinary actions train with ppo, a2c, trpo, impala or appo")
    assert not run.exists()
