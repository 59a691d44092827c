"""QR-DQN: the network's quantiles and the Q-values it acts on, the distributional target (with
and without double Q-learning), and the one-line refusals. With an action mask:
tests/test_masking.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import shoal
from conftest import learner_for, record_quantile_losses
from shoal.algos import qrdqn
from shoal.algos.qrdqn import QRDQNConfig
from shoal.offpolicy import quantile_huber_loss
from shoal.replay import Transitions

QUICK = dict(progress=False, tensorboard=False, eval_interval=0, torch_threads=1)


def learner(env="CartPole-v1", **settings):
    config = QRDQNConfig(env=env, hidden_sizes=(16, 16), n_quantiles=7, seed=0, **settings)
    return learner_for(config)


def batch(n=32, seed=0, obs_dim=4, actions=2):
    g = torch.Generator().manual_seed(seed)
    return Transitions(torch.randn(n, obs_dim, generator=g), torch.randint(0, actions, (n,), generator=g),
                       torch.randn(n, generator=g), torch.randn(n, obs_dim, generator=g),
                       torch.full((n,), 0.99).index_fill(0, torch.tensor([3, 5]), 0.0), torch.ones(n), np.arange(n))


@pytest.mark.parametrize("dueling", [False, True])
def test_the_network_gives_quantiles_per_action_and_acts_on_their_means(dueling):
    net = learner(dueling=dueling).policy
    obs = torch.randn(5, 4)
    z = net.quantiles(obs)
    assert z.shape == (5, 2, 7)
    torch.testing.assert_close(net(obs), z.mean(-1))
    if dueling:  # each quantile: the value's, plus advantages that average 0 over the actions (Wang et al. eq. 9)
        torch.testing.assert_close(z.mean(1), net.value_head(net.trunk(net.encoder(obs))))
    net.random_actions.fill_(False)
    net.epsilon.fill_(0.0)
    assert torch.equal(net.act(obs, deterministic=False), z.mean(-1).argmax(-1))


@pytest.mark.parametrize("double", [False, True])
def test_the_target_is_the_target_networks_quantiles_at_the_best_next_action(monkeypatch, double):
    qr = learner(double=double)
    with torch.no_grad():  # a target network unlike the online one, so that which picks a* shows
        for p in qr.target.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    b = batch()
    seen = record_quantile_losses(monkeypatch, qrdqn)
    before = copy.deepcopy(qr)
    metrics, _ = qr.train_batch(b)
    with torch.no_grad():
        next_z = before.target.quantiles(b.next_obs)  # [N, 2, 7]
        picker = before.policy(b.next_obs) if double else next_z.mean(-1)
        best = next_z[torch.arange(32), picker.argmax(-1)]
        want = b.rewards[:, None] + b.discounts[:, None] * best
        (z, target), = seen
        torch.testing.assert_close(target, want)
        assert torch.equal(target[3], b.rewards[3].expand(7))  # terminated: the reward alone
        torch.testing.assert_close(z, before.policy.quantiles(b.obs)[torch.arange(32), b.actions])
        # summed over the quantiles, averaged over the batch (eq. 10)
        torch.testing.assert_close(metrics["loss/q"], quantile_huber_loss(z, want).sum(-1).mean())
    assert (double and not torch.equal(before.policy(b.next_obs).argmax(-1), next_z.mean(-1).argmax(-1))
            or not double)  # the two pickers differ here, so the test tells them apart


@pytest.mark.parametrize("env, settings, message", [
    ("Pendulum-v1", {}, "dqn needs discrete actions"),
    ("CartPole-v1", {"n_quantiles": 1}, "n_quantiles must be at least 2 (1 is dqn)"),
])
def test_what_qrdqn_cannot_train_is_refused_in_one_line(env, settings, message):
    with pytest.raises(shoal.ShoalError, match=message.replace("(", r"\(").replace(")", r"\)")):
        shoal.make(shoal.make_config("qrdqn", env, **settings, **QUICK))
