"""Noisy nets (`--noisy`, Fortunato et al. 2018) for dqn and qrdqn: the layer's factorised noise
against its definition, which layers are noisy, where noise is drawn (exploring and updating) and
where it is not (deterministic acting), and epsilon giving way to the noise. Resume, export and
learning: rows in test_offpolicy, test_export and test_learning."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import shoal
from conftest import learner_for
from shoal.algos.dqn import DQNConfig, NoisyLinear
from shoal.replay import Transitions


def f(e):
    return e.sign() * e.abs().sqrt()


@pytest.mark.parametrize("per_row", [True, False])
def test_a_noisy_layer_is_its_means_outside_a_noise_block_and_draws_noise_per_row_or_per_call(per_row):
    torch.manual_seed(0)
    plain = nn.Linear(5, 3)
    layer = NoisyLinear(plain, sigma0=0.5)
    with torch.no_grad():  # scales unlike each other, so that a misplaced one shows
        layer.weight_sigma.uniform_(0.1, 0.9)
        layer.bias_sigma.uniform_(0.1, 0.9)
    assert torch.equal(layer.weight, plain.weight) and torch.equal(layer.bias, plain.bias)
    x = torch.randn(4, 5)
    torch.testing.assert_close(layer(x), plain(x))  # no noise drawn: the means
    layer.draws = (torch.Generator().manual_seed(7), per_row)
    y = layer(x)
    g = torch.Generator().manual_seed(7)
    rows = (4,) if per_row else (1,)
    e_in, e_out = f(torch.randn(*rows, 5, generator=g)), f(torch.randn(*rows, 3, generator=g))
    for n in range(4):  # W = mu + sigma * (f(e_out) f(e_in)^T), b likewise: each row's draw, or the call's
        i = n if per_row else 0
        w = layer.weight + layer.weight_sigma * torch.outer(e_out[i], e_in[i])
        b = layer.bias + layer.bias_sigma * e_out[i]
        torch.testing.assert_close(y[n], w @ x[n] + b)
    y.sum().backward()
    assert layer.weight_sigma.grad.abs().sum() > 0 and layer.bias_sigma.grad.abs().sum() > 0


def test_the_noise_scales_start_at_sigma0_over_the_square_root_of_the_inputs():
    layer = NoisyLinear(nn.Linear(16, 4), sigma0=0.5)
    assert torch.all(layer.weight_sigma == 0.5 / 4) and torch.all(layer.bias_sigma == 0.5 / 4)


def learner(algo="dqn", env="CartPole-v1", **settings):
    settings = {"hidden_sizes": (16, 16), "seed": 0, "noisy": True, "learning_starts": 100,
                **({"n_quantiles": 5} if algo == "qrdqn" else {}), **settings}
    config = shoal.make_config(algo, env, **settings)
    return learner_for(config)


@pytest.mark.parametrize("algo, dueling", [("dqn", False), ("dqn", True), ("qrdqn", True)])
def test_every_linear_layer_of_the_heads_is_noisy_and_deterministic_acting_uses_the_means(algo, dueling):
    net = learner(algo, dueling=dueling).policy
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(m, NoisyLinear) for m in linears)
    net.random_actions.fill_(False)
    net.epsilon.fill_(0.0)
    obs = torch.randn(1, 4).expand(256, 4)  # one state, 256 times
    q = net(obs)
    assert torch.equal(q, net(obs)) and torch.equal(q[0].expand_as(q), q)  # no noise outside a block
    assert torch.equal(net.act(obs, deterministic=True), q.argmax(-1))
    g = torch.Generator().manual_seed(0)
    with net.noise(g):
        noisy_q = net(obs)
    assert len({tuple(row) for row in noisy_q.tolist()}) == 256  # each row its own draw
    # exploring with epsilon 0: the noise alone makes the same state's actions differ
    with torch.no_grad():  # (means that tie the actions, so that small noise shows)
        for m in net.modules():
            if isinstance(m, NoisyLinear) and m.out_features in (2, 10):
                m.weight.zero_()
                m.bias.zero_()
    explored, _ = net.explore(obs, g)
    assert 0 < explored.float().mean() < 1
    stochastic = net.act(obs, deterministic=False, generator=g)
    assert 0 < stochastic.float().mean() < 1


def test_an_image_networks_fully_connected_layers_are_noisy_and_its_convolutions_plain():
    net = shoal.algos.get("dqn").make_policy(
        DQNConfig(env="CartPole-v1", noisy=True, dueling=True), gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
        gym.spaces.Discrete(6))
    assert isinstance(net.encoder.linear, NoisyLinear)  # the Nature network's 512 units
    assert all(isinstance(m, NoisyLinear) for m in net.modules() if isinstance(m, nn.Linear))
    assert any(isinstance(m, nn.Conv2d) for m in net.modules())


def test_noise_explores_in_place_of_epsilon_once_learning_starts_and_no_ladder_applies():
    lr = learner(exploration_initial_eps=1.0, exploration_final_eps=0.3)
    assert float(lr.policy.epsilon) == 1.0  # random actions until learning starts, as without noise
    lr.set_exploration(100)
    assert float(lr.policy.epsilon) == 0.0
    lr.policy.apply_ladder(0, 4)  # Ape-X: each actor explores by its own draws of the noise
    assert float(lr.policy.epsilon) == 0.0
    plain = learner(noisy=False, exploration_initial_eps=1.0, exploration_final_eps=0.3)
    plain.set_exploration(100)
    assert 0.3 <= float(plain.policy.epsilon) < 1.0


def batch(n=32):
    g = torch.Generator().manual_seed(0)
    return Transitions(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g),
                       torch.randn(n, generator=g), torch.randn(n, 4, generator=g), torch.full((n,), 0.99),
                       torch.ones(n), np.arange(n))


@pytest.mark.parametrize("algo", ["dqn", "qrdqn"])
def test_an_update_draws_noise_in_the_online_and_the_target_network_and_learns_its_scales(algo):
    lr = learner(algo)
    drew: list[nn.Module] = []

    def record(module, inputs, output):
        assert module.draws in (None, (lr.generator, False))  # one draw a call, from the learner's generator
        if module.draws is not None:
            drew.append(module)

    layers = [m for net in (lr.policy, lr.target) for m in net.modules() if isinstance(m, NoisyLinear)]
    hooks = [m.register_forward_hook(record) for m in layers]
    sigmas = [m.weight_sigma.detach().clone() for m in lr.policy.modules() if isinstance(m, NoisyLinear)]
    lr.train_batch(batch())
    for h in hooks:
        h.remove()
    assert {id(m) for m in drew} == {id(m) for m in layers}  # every noisy layer of both networks drew
    after = [m.weight_sigma for m in lr.policy.modules() if isinstance(m, NoisyLinear)]
    assert all(not torch.equal(a, b) for a, b in zip(sigmas, after))  # the scales learn
    assert all(m.draws is None for m in layers)  # and the noise ends with the update
    assert math.isfinite(float(lr.train_batch(batch())[0]["loss/q"]))
