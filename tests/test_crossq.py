"""CrossQ: Batch Renormalization by hand, the critics' joint pass, the delayed actor, what travels
with the weights, and the one-line refusals."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import shoal
from shoal.algos.crossq import BatchRenorm, CrossQConfig, batch_statistics
from shoal.replay import Transitions
from shoal.weights import WeightStore

QUICK = dict(progress=False, tensorboard=False, eval_interval=0, torch_threads=1)


def by_hand(x, mean, var, weight, bias, eps=1e-3):
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


@pytest.mark.parametrize("groups", [None, 3])
def test_batch_renorm_is_batch_norm_then_renormalises_with_clipped_r_and_d_then_uses_its_running_statistics(groups):
    torch.manual_seed(0)
    shape = (8, 4) if groups is None else (groups, 8, 4)
    layer = BatchRenorm(4, groups, momentum=0.1, eps=1e-3, warmup=1, r_max=1.5, d_max=0.5)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1, 1)
    assert not layer.training  # made for running statistics: the learner turns batch statistics on

    def stats(x):
        return x.mean(-2, keepdim=True), x.var(-2, unbiased=False, keepdim=True)

    x = torch.randn(*shape) * 2 + 1
    with batch_statistics([layer]):  # the warm-up pass: batch normalisation
        y = layer(x)
    mean, var = stats(x)
    torch.testing.assert_close(y, by_hand(x, mean, var, layer.weight, layer.bias))
    running_mean, running_var = 0.1 * mean, 0.9 + 0.1 * x.var(-2, unbiased=True, keepdim=True)
    torch.testing.assert_close(layer.running_mean, running_mean.reshape(layer.running_mean.shape))
    torch.testing.assert_close(layer.running_var, running_var.reshape(layer.running_var.shape))

    x = (torch.randn(*shape) * 4 - 3).requires_grad_(True)  # far from the running statistics: r and d clip
    with batch_statistics([layer]):
        y = layer(x)
    mean, var = stats(x)
    std, running_std = torch.sqrt(var + 1e-3), torch.sqrt(running_var + 1e-3)
    r = (std / running_std).clamp(1 / 1.5, 1.5).detach()
    d = ((mean - running_mean) / running_std).clamp(-0.5, 0.5).detach()
    assert (r == 1.5).any() and (d.abs() == 0.5).any()
    want = ((x - mean) / std * r + d) * layer.weight + layer.bias
    torch.testing.assert_close(y, want)
    probe = torch.randn(*shape)
    torch.testing.assert_close(torch.autograd.grad((y * probe).sum(), x)[0],
                               torch.autograd.grad((want * probe).sum(), x)[0])
    assert int(layer.steps) == 2

    layer.running_mean.uniform_(-1, 1)
    layer.running_var.uniform_(0.5, 2)
    before = [b.clone() for b in layer.buffers()]
    x = torch.randn(*shape)
    torch.testing.assert_close(layer(x), by_hand(x, layer.running_mean, layer.running_var, layer.weight, layer.bias))
    assert all(torch.equal(a, b) for a, b in zip(before, layer.buffers()))  # outside the block: nothing moves


def crossq_learner(**settings):
    config = CrossQConfig(env="Pendulum-v1", hidden_sizes=(16, 16), critic_hidden_sizes=(32, 32), seed=0, **settings)
    env = gym.make("Pendulum-v1")
    return shoal.algos.get("crossq").learner_cls(config, env.observation_space, env.action_space, WeightStore())


def batch(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Transitions(torch.randn(n, 3, generator=g), torch.rand(n, 1, generator=g) * 2 - 1,
                       torch.randn(n, generator=g), torch.randn(n, 3, generator=g) + 2, torch.full((n,), 0.99),
                       torch.ones(n), np.arange(n))


def test_the_critics_normalise_states_and_next_states_together_and_the_actor_waits_its_delay():
    learner = crossq_learner(policy_delay=3, batch_norm_momentum=1.0)  # the running statistics: the last batch's
    assert not hasattr(learner, "target_critics")
    b = batch()
    actor = [p.detach().clone() for p in learner.policy.parameters()]
    with torch.no_grad():
        next_a, _ = learner.policy.sample(b.next_obs, torch.Generator().manual_seed(0))
    for update in range(3):
        learner.train_batch(b)
        learner.updates += 1
        moved = [not torch.equal(a, p) for a, p in zip(actor, learner.policy.parameters())]
        assert any(moved) == (update == 2), update  # the actor (and alpha) every third update only
        assert (learner.log_alpha.item() != 0.0) == (update == 2)
    # the critics' first layer normalised (s, a) and (s', a') as one batch: both critics' statistics
    first = learner.critics.norms[0]
    inputs = torch.cat([torch.cat([b.obs, b.actions], -1), torch.cat([b.next_obs, next_a], -1)])
    assert int(first.steps) == 3
    torch.testing.assert_close(first.running_mean[0, 0, :3], inputs.mean(0)[:3])  # the states' part
    torch.testing.assert_close(first.running_mean[1, 0, :3], inputs.mean(0)[:3])
    # the actor's layers moved only in its own update, on the states alone
    assert int(learner.policy.trunk[0].steps) == 1
    torch.testing.assert_close(learner.policy.trunk[0].running_mean, b.obs.mean(0))


def test_the_actors_statistics_travel_with_its_weights_and_act_the_same_alone_or_in_a_batch(tmp_path):
    config = shoal.make_config("crossq", "Pendulum-v1", hidden_sizes=(16, 16), critic_hidden_sizes=(32, 32),
                               learning_starts=64, batch_size=32, policy_delay=1, total_steps=400, **QUICK)
    with shoal.make(config) as algo:
        while algo.env_steps < 300:
            algo.train()
        learner = algo.learner.obj
        means = {k: v for k, v in learner.get_weights().items() if k.endswith("running_mean")}
        assert len(means) == 3 and all(np.abs(v).sum() > 0 for v in means.values())  # moved from 0
        algo.save(tmp_path / "ck")
        obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
        acted = algo.get_policy().act(obs)
    policy = shoal.load_policy(tmp_path / "ck")
    for k, v in means.items():
        np.testing.assert_array_equal(policy.module.state_dict()[k].numpy(), v)
    np.testing.assert_allclose(policy.act(obs), acted, rtol=1e-6)
    alone = np.concatenate([policy.act(o[None]) for o in obs])  # running statistics: no batch dependence
    np.testing.assert_allclose(alone, acted, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("env, settings, message", [
    ("CartPole-v1", {}, "crossq needs continuous (Box) actions"),
    ("PixelReach-v0", {}, "images and --encoder train with sac"),
    ("Pendulum-v1", {"policy_delay": 0}, "policy_delay must be at least 1"),
])
def test_what_crossq_cannot_train_is_refused_in_one_line(env, settings, message):
    with pytest.raises(shoal.ShoalError, match=message.replace("(", r"\(").replace(")", r"\)")):
        shoal.make(shoal.make_config("crossq", env, **settings, **QUICK))


def test_renormalised_critics_give_an_actor_dq_da_and_no_weight_a_gradient():
    learner = crossq_learner()
    b = batch()
    with batch_statistics(learner.critic_layers):
        learner.critics(b.obs, b.actions)  # running statistics of their own
    a = b.actions.clone().requires_grad_(True)
    learner.critics(b.obs, a, detach_weights=True).min(0).values.sum().backward()
    assert a.grad is not None and a.grad.abs().sum() > 0
    assert all(p.grad is None for p in learner.critics.parameters())
