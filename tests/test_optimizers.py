"""`--optimizer-eps`: every algorithm's optimizers take it, each family's default is its peers',
QR-DQN's is its paper's (and its presets sb3-contrib's), and a resumed learner keeps the setting's."""

from __future__ import annotations

import pytest

import shoal
from conftest import learner_for
from shoal.errors import ConfigError

ENVS = {"discrete": "CartPole-v1", "continuous": "Pendulum-v1"}
ALGOS = [("ppo", "discrete", {}), ("a2c", "discrete", {}), ("a2c", "discrete", {"optimizer": "adam"}),
         ("trpo", "continuous", {}), ("impala", "discrete", {}), ("appo", "discrete", {}),
         ("dqn", "discrete", {}), ("qrdqn", "discrete", {}), ("sac", "continuous", {}), ("td3", "continuous", {}),
         ("ddpg", "continuous", {}), ("crossq", "continuous", {}), ("tqc", "continuous", {})]


def learner(algo, env, **settings):
    config = shoal.make_config(algo, env, hidden_sizes=(8, 8), **settings)
    return learner_for(config)


def epsilons(lr):
    return {group["eps"] for optimizer in lr.optimizers() for group in optimizer.param_groups}


@pytest.mark.parametrize("algo, actions, settings", ALGOS, ids=[f"{a}{'-' + str(s) if s else ''}" for a, _, s in ALGOS])
def test_every_optimizer_of_every_algorithm_takes_the_setting(algo, actions, settings):
    lr = learner(algo, ENVS[actions], optimizer_eps=3e-3, **settings)
    assert lr.optimizers() and epsilons(lr) == {3e-3}


def test_the_defaults_are_the_peers_and_qrdqns_its_papers():
    assert epsilons(learner("ppo", "CartPole-v1")) == {1e-5}  # stable-baselines3's
    assert epsilons(learner("a2c", "CartPole-v1")) == {1e-5}  # SB3's RMSprop's
    assert epsilons(learner("sac", "Pendulum-v1")) == {1e-8}  # torch's, as SB3's off-policy ones
    assert shoal.QRDQNConfig(env="CartPole-v1").optimizer_eps == 0.01 / 32  # the paper's, for its batches of 32
    preset = shoal.make_config("qrdqn", "CartPole-v1")  # sb3-contrib's 0.01 / batch_size
    assert preset.optimizer_eps == 0.01 / preset.batch_size == 0.01 / 64
    assert shoal.make_config("qrdqn", "LunarLander-v3").optimizer_eps == 0.01 / 128


@pytest.mark.parametrize("algo, env", [("dqn", "CartPole-v1"), ("td3", "Pendulum-v1"), ("ppo", "CartPole-v1")])
def test_a_resumed_learner_keeps_the_settings_epsilon_not_the_saved_optimizers(algo, env):
    state = learner(algo, env, optimizer_eps=1e-3).get_state()
    resumed = learner(algo, env, optimizer_eps=2e-4)
    resumed.set_state(state)
    assert epsilons(resumed) == {2e-4}


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_an_epsilon_that_is_not_positive_is_refused(algo):
    with pytest.raises(ConfigError, match="optimizer_eps must be positive and finite"):
        shoal.make_config(algo, "CartPole-v1", optimizer_eps=0.0)
