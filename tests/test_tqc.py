"""TQC: the quantile Huber loss against its definition, the truncated pooled target, the actor's
mean over every quantile, images, and the one-line refusals."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

import shoal
from conftest import record_quantile_losses
from shoal.algos import tqc
from shoal.algos.tqc import TQCConfig
from shoal.offpolicy import QuantileHuber, quantile_huber_loss, quantile_huber_pairs
from shoal.replay import Transitions
from shoal.weights import WeightStore

QUICK = dict(progress=False, tensorboard=False, eval_interval=0, torch_threads=1)


def by_definition(quantiles, targets):
    """Every (estimate, sample) pair: |tau - 1{sample < estimate}| x Huber(sample - estimate), averaged
    over the samples."""
    m = quantiles.shape[-1]
    tau = (torch.arange(m, dtype=torch.float64) + 0.5) / m
    delta = targets.double()[..., None, :] - quantiles.double()[..., None]  # [..., N, M, T]
    huber = torch.where(delta.abs() <= 1, 0.5 * delta**2, delta.abs() - 0.5)
    return ((tau[:, None] - (delta < 0).double()).abs() * huber).mean(-1)


@pytest.mark.parametrize("way", [quantile_huber_pairs, QuantileHuber.apply], ids=["pairs", "closed-form"])
@pytest.mark.parametrize("shape, samples, scale, offset", [
    ((3, 16, 5), 12, 1.0, 0.0),      # TQC's [K, N, M]: pairs inside and outside the Huber loss's quadratic part
    ((3, 16, 5), 12, 30.0, -900.0),  # returns far from 0, spread wide: no cancellation
    ((16, 7), 7, 0.2, 4.0),          # QR-DQN's [N, M]: all within 1 of each other
])
def test_the_quantile_huber_loss_and_its_gradient_are_the_pairwise_definitions(shape, samples, scale, offset, way):
    g = torch.Generator().manual_seed(0)
    quantiles = (torch.randn(shape, generator=g) * scale + offset).requires_grad_(True)
    targets = torch.randn(shape[-2], samples, generator=g) * 2 * scale + offset
    targets[:, :2] = quantiles[..., :2].detach().reshape(-1, shape[-2], 2)[0]  # ties with estimates
    targets[:, 2] = quantiles[..., 2].detach().reshape(-1, shape[-2])[0] + 1  # on the Huber border
    loss = way(quantiles, targets)
    want = by_definition(quantiles, targets)
    assert loss.shape == shape and loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), want, rtol=1e-6, atol=1e-6)
    probe = torch.rand(shape, generator=g)
    got, = torch.autograd.grad((loss * probe).sum(), quantiles)
    expected, = torch.autograd.grad((want * probe.double()).sum(), quantiles)
    torch.testing.assert_close(got, expected)


def test_small_problems_go_pair_by_pair_and_large_ones_in_closed_form(monkeypatch):
    from shoal import offpolicy

    calls = []
    monkeypatch.setattr(offpolicy, "quantile_huber_pairs", lambda q, t: calls.append("pairs") or q)
    monkeypatch.setattr(offpolicy.QuantileHuber, "apply", lambda q, t: calls.append("closed") or q)
    quantile_huber_loss(torch.zeros(64, 10), torch.zeros(64, 10))  # QR-DQN on CartPole: 6,400 pairs
    quantile_huber_loss(torch.zeros(2, 256, 25), torch.zeros(256, 46))  # TQC's defaults: 588,800
    assert calls == ["pairs", "closed"]


def learner(**settings):
    config = TQCConfig(env="Pendulum-v1", hidden_sizes=(16, 16), seed=0, **settings)
    env = gym.make("Pendulum-v1")
    return shoal.algos.get("tqc").learner_cls(config, env.observation_space, env.action_space, WeightStore())


def batch(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Transitions(torch.randn(n, 3, generator=g), torch.rand(n, 1, generator=g) * 2 - 1,
                       torch.randn(n, generator=g), torch.randn(n, 3, generator=g), torch.full((n,), 0.99),
                       torch.ones(n), np.arange(n))


def test_the_target_keeps_the_smallest_pooled_quantiles_and_the_actor_ascends_their_mean(monkeypatch):
    tqc_learner = learner(n_critics=3, n_quantiles=5, top_quantiles_to_drop_per_net=2, alpha_init=0.5)
    assert tqc_learner.critics.k == 3
    with torch.no_grad():  # targets unlike the critics, so that which is used shows
        for p in tqc_learner.target_critics.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    b = batch()
    seen = record_quantile_losses(monkeypatch, tqc)
    before, generator = copy.deepcopy(tqc_learner), tqc_learner.generator.get_state()
    metrics, _ = tqc_learner.train_batch(b)

    g = torch.Generator().set_state(generator)
    with torch.no_grad():
        next_a, next_logp = before.policy.sample(b.next_obs, g)
        pooled = before.target_critics(b.next_obs, next_a)  # [3, N, 5]
        assert pooled.shape == (3, 32, 5)
        kept = pooled.permute(1, 0, 2).reshape(32, 15).sort(-1).values[:, :9]  # 3 x (5 - 2): the top 6 dropped
        target = b.rewards[:, None] + 0.99 * (kept - 0.5 * next_logp[:, None])
        (z, got), = seen
        torch.testing.assert_close(got, target)
        torch.testing.assert_close(z, before.critics(b.obs, b.actions))
        a, logp = before.policy.sample(b.obs, g)
        q_pi = before.critics(b.obs, a).mean((0, 2))  # every critic's every quantile, no minimum
        torch.testing.assert_close(metrics["loss/actor"], (0.5 * logp - q_pi).mean())
        torch.testing.assert_close(metrics["loss/critic"], quantile_huber_loss(z, target).mean())


def test_tqc_learns_from_images_with_a_critic_encoder_of_its_own():
    config = shoal.make_config("tqc", "PixelReach-v0", learning_starts=64, batch_size=16, buffer_size=500,
                               total_steps=200, n_quantiles=4, **QUICK)
    with shoal.make(config) as algo:
        while algo.env_steps < 96:
            algo.train()
        learner = algo.learner.obj
        assert learner.updates > 0
        assert learner.critics.encoder is not None and learner.critics.encoder is not learner.policy.encoder


@pytest.mark.parametrize("env, settings, message", [
    ("CartPole-v1", {}, "tqc needs continuous (Box) actions"),
    ("Pendulum-v1", {"top_quantiles_to_drop_per_net": 25}, "top_quantiles_to_drop_per_net must be in [0, n_quantiles)"),
    ("Pendulum-v1", {"n_critics": 0}, "n_critics must be at least 1"),
])
def test_what_tqc_cannot_train_is_refused_in_one_line(env, settings, message):
    with pytest.raises(shoal.ShoalError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        shoal.make(shoal.make_config("tqc", env, **settings, **QUICK))
