"""C51 (`shoal train dqn --num-atoms K`, Bellemare et al. 2017): the projection of the target
distribution against a hand computation and a brute-force one, the network's logits and the
expectations it acts on, the update's loss and priorities by hand, and the refusals. Masks,
export, resume and learning: rows in test_masking, test_export, test_offpolicy and test_learning."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import shoal
from conftest import learner_for
from shoal.algos.dqn import DQNConfig, categorical_targets
from shoal.errors import ConfigError
from shoal.replay import Transitions


def test_the_target_distribution_by_hand():
    support = torch.arange(5.0)  # atoms 0, 1, 2, 3, 4
    p = torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15])
    probs = p.expand(5, 5)
    rewards = torch.tensor([0.5, 2.3, -3.0, 1.0, 1e9])
    discounts = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0])
    got = categorical_targets(probs, rewards, discounts, support)
    p0, p1, p2, p3, p4 = p.tolist()
    want = torch.tensor([
        [p0 / 2, (p0 + p1) / 2, (p1 + p2) / 2, (p2 + p3) / 2, p3 / 2 + p4],  # halfway: halves; 4.5 clipped to 4
        [0, 0, 0.7, 0.3, 0],  # terminal: all of it at r = 2.3, 0.7 to atom 2 and 0.3 to atom 3
        [p0 + p1 + p2 + p3, p4, 0, 0, 0],  # -3 .. 1: clipped to 0 but the last
        [0, p0, p1, p2, p3 + p4],  # landing on atoms: each whole to its atom
        [0, 0, 0, 0, 1],  # far past the support (in float32 too): all of it at its end
    ])
    torch.testing.assert_close(got, want)


def test_the_target_distribution_against_a_brute_force_one():
    g = torch.Generator().manual_seed(0)
    support = torch.linspace(-10, 10, 51, dtype=torch.float64)
    probs = torch.rand(64, 51, generator=g, dtype=torch.float64).softmax(-1)
    rewards = torch.randn(64, generator=g, dtype=torch.float64) * 4
    discounts = torch.rand(64, generator=g, dtype=torch.float64).index_fill(0, torch.tensor([3, 9]), 0.0)
    got = categorical_targets(probs, rewards, discounts, support)
    want = torch.zeros_like(probs)
    dz = 20 / 50
    for i in range(64):
        for j in range(51):
            z = min(max(rewards[i] + discounts[i] * support[j], -10.0), 10.0)
            for k in range(51):  # each atom gets the probability in proportion to nearness, within dz
                want[i, k] += probs[i, j] * max(0.0, 1 - abs(float(z - support[k])) / dz)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got.sum(-1), torch.ones(64, dtype=torch.float64))


def learner(**settings):
    config = DQNConfig(env="CartPole-v1", hidden_sizes=(16, 16), num_atoms=11, v_min=-5.0, v_max=5.0, seed=0,
                       **settings)
    return learner_for(config)


@pytest.mark.parametrize("dueling", [False, True])
def test_the_network_gives_logits_per_action_and_acts_on_their_expectations(dueling):
    net = learner(dueling=dueling).policy
    obs = torch.randn(5, 4)
    logits = net.atom_logits(obs)
    assert logits.shape == (5, 2, 11)
    torch.testing.assert_close(net.support, torch.linspace(-5, 5, 11))
    torch.testing.assert_close(net(obs), (logits.softmax(-1) * torch.linspace(-5, 5, 11)).sum(-1))
    if dueling:  # on the logits: the value's, plus advantages that average 0 over the actions
        torch.testing.assert_close(logits.mean(1), net.value_head(net.trunk(net.encoder(obs))))
    assert "support" not in net.state_dict()  # rebuilt from the settings, not a weight
    net.random_actions.fill_(False)
    net.epsilon.fill_(0.0)
    assert torch.equal(net.act(obs, deterministic=False), net(obs).argmax(-1))


def batch(n=32):
    g = torch.Generator().manual_seed(0)
    return Transitions(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g),
                       torch.randn(n, generator=g), torch.randn(n, 4, generator=g),
                       torch.full((n,), 0.99).index_fill(0, torch.tensor([3, 5]), 0.0),
                       torch.rand(n, generator=g) + 0.5, np.arange(n))


@pytest.mark.parametrize("double", [False, True])
def test_the_loss_is_the_cross_entropy_against_the_projected_target_and_the_priority_its_kl(double):
    c51 = learner(double=double, prioritized=True)
    with torch.no_grad():  # a target network unlike the online one, so that which picks a* shows
        for p in c51.target.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    b = batch()
    before = copy.deepcopy(c51)
    metrics, priorities = c51.train_batch(b)
    with torch.no_grad():
        support = torch.linspace(-5, 5, 11)
        next_p = before.target.atom_logits(b.next_obs).softmax(-1)
        picker = before.policy(b.next_obs) if double else (next_p * support).sum(-1)
        a_star = picker.argmax(-1)
        target = categorical_targets(next_p[torch.arange(32), a_star], b.rewards, b.discounts, support)
        assert torch.allclose(target[3], categorical_targets(next_p[3:4, 0], b.rewards[3:4], torch.zeros(1), support))
        log_p = before.policy.atom_logits(b.obs)[torch.arange(32), b.actions].log_softmax(-1)
        cross_entropy = -(target * log_p).sum(-1)
        torch.testing.assert_close(metrics["loss/q"], (b.weights * cross_entropy).mean())
        kl = (torch.xlogy(target, target) - target * log_p).sum(-1)
        torch.testing.assert_close(priorities, kl)
        assert torch.all(kl >= -1e-6)
    assert (double and not torch.equal(before.policy(b.next_obs).argmax(-1), (next_p * support).sum(-1).argmax(-1))
            or not double)  # the two pickers differ here, so the test tells them apart
    assert not torch.equal(before.policy.q[0].weight, c51.policy.q[0].weight)  # and it learned


@pytest.mark.parametrize("algo, settings, message", [
    ("dqn", {"num_atoms": 0}, "num_atoms must be 1 (expected values) or at least 2"),
    ("dqn", {"num_atoms": 51, "v_min": 10, "v_max": 10}, "v_min must be below v_max"),
    ("qrdqn", {"num_atoms": 51}, "qrdqn learns quantiles: --num-atoms is dqn's categorical distribution (C51)"),
])
def test_what_c51_cannot_train_is_refused_in_one_line(algo, settings, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        shoal.make_config(algo, "CartPole-v1", **settings)


def test_the_rainbow_example_builds_rainbow_on_atari():
    """examples/rainbow/atari.yaml, the paper's settings over DQN's Atari preset."""
    from pathlib import Path

    from shoal.algos.dqn import NoisyLinear
    from shoal.config import build
    from shoal.envs import env_spaces

    file = Path(__file__).parent.parent / "examples" / "rainbow" / "atari.yaml"
    config = build(DQNConfig, "dqn", env="ALE/Pong-v5", file=str(file))
    assert (config.num_atoms, config.noisy, config.dueling, config.double, config.n_step, config.prioritized) == (
        51, True, True, True, 3, True)
    assert config.compress_observations and config.clip_rewards  # the preset's, under it
    net = shoal.algos.get("dqn").make_policy(config, *env_spaces("ALE/Pong-v5"))
    assert net.atom_logits(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape == (2, 6, 51)
    assert isinstance(net.encoder.linear, NoisyLinear)
