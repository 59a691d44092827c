"""`shoal check-env ENV_ID`: Gymnasium's checker, the algorithms that take the env's spaces, and its
step rate; exit status 1 for an env that is not ready, 2 for a mistaken command."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control import PendulumEnv

from shoal.cli import main


def check(capsys, *argv):
    code = main(["check-env", *argv, "--seconds", "0.2"])
    out, err = capsys.readouterr()
    return code, out, err


def test_cartpole_is_ready_for_the_algorithms_of_discrete_actions(capsys):
    code, out, err = check(capsys, "CartPole-v1")
    assert code == 0, err
    assert "Gymnasium's env checker: passed" in out
    assert "trains with: a2c, appo, ars, dqn, impala, ppo, qrdqn, sac, trpo" in out
    assert "not td3: td3 needs continuous (Box) actions" in out
    rate = out.split("random actions: ")[1]
    assert float(rate.split(" steps/s")[0].replace(",", "")) > 1000 and "episodes ended" in rate, out


def test_a_goal_env_is_said_to_take_hindsight_goals(capsys):
    code, out, err = check(capsys, "BitFlipping-v0")
    assert code == 0, err
    assert "a goal env: --her-goals relabels its transitions with hindsight goals (dqn, sac, td3, ddpg)" in out
    code, out, _ = check(capsys, "CartPole-v1")
    assert "goal env" not in out


class OutOfSpace(gym.Env):
    """Its first observation lies outside its observation space."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(2, 5, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


class FailsLater(PendulumEnv):
    """Pendulum, which raises at its 30th step of an episode."""

    def reset(self, *, seed=None, options=None):
        self.steps = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.steps == 30:
            raise RuntimeError("the simulator lost its licence")
        return super().step(action)


class TextObservations(gym.Env):
    observation_space = gym.spaces.Text(8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "hello", {}

    def step(self, action):
        return "hello", 0.0, True, False, {}


@pytest.fixture(scope="module", autouse=True)
def registered():
    for cls in (OutOfSpace, FailsLater, TextObservations):
        gym.register(f"ShoalCheck{cls.__name__}-v0", entry_point=cls, max_episode_steps=100)
    yield
    for cls in (OutOfSpace, FailsLater, TextObservations):
        gym.registry.pop(f"ShoalCheck{cls.__name__}-v0")


def test_an_env_that_breaks_gymnasiums_api_fails_with_the_checkers_words(capsys):
    code, out, _ = check(capsys, "ShoalCheckOutOfSpace-v0")
    assert code == 1
    assert ("Gymnasium's env checker: FAILED: AssertionError: The first element returned by `env.reset()` is not "
            "within the observation space") in out
    assert "random actions" not in out  # not stepped further


def test_an_env_that_raises_on_random_actions_fails_with_what_it_raised(capsys):
    code, out, _ = check(capsys, "ShoalCheckFailsLater-v0")
    assert code == 1 and "Gymnasium's env checker: passed" in out
    assert "trains with: a2c, appo, ars, crossq, ddpg, impala, ppo, sac, td3, tqc, trpo" in out
    assert "random actions: FAILED after 29 steps: RuntimeError: the simulator lost its licence" in out


def test_an_env_no_algorithm_takes_says_why_for_each(capsys):
    code, out, _ = check(capsys, "ShoalCheckTextObservations-v0")
    assert code == 1 and "trains with: no algorithm" in out
    assert "not a2c, appo, ars, dqn, impala, ppo, qrdqn, sac, trpo: observation space Text(" in out
    assert "not td3: td3 needs continuous (Box) actions" in out


@pytest.mark.parametrize("argv, message", [
    (["NoSuchEnv-v0"], "unknown environment 'NoSuchEnv-v0'"),
    (["remote://127.0.0.1:50051"], "check-env checks an env made here"),
    (["CartPole-v1", "--env-kwargs", "nope=1"], "environment 'CartPole-v1' could not be made with env_kwargs"),
])
def test_a_mistaken_check_is_one_line(capsys, argv, message):
    code, _, err = check(capsys, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
