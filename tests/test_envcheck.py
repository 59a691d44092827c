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
    (["remote://127.0.0.1:1"], "env server 127.0.0.1:1: unreachable (is `shoal serve-env` running there?)"),
    (["remote://127.0.0.1:1", "--env-kwargs", "a=1"], "--env-kwargs and --env-wrapper are the env server's: give "),
    (["CartPole-v1", "--env-kwargs", "nope=1"], "environment 'CartPole-v1' could not be made with env_kwargs"),
])
def test_a_mistaken_check_is_one_line(capsys, argv, message):
    code, _, err = check(capsys, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


# -- env servers: the protocol's checks in place of Gymnasium's ---------------------------------------
class Lenient:
    """An env server (shoal's, told to misbehave) that steps any actions it is sent, clipped or cut
    to fit, as a simulator of the user's might (with ``monkeypatch``), or sends replies ``mangle``
    spoils."""

    def __init__(self, env_id, monkeypatch=None, mangle=None):
        from shoal.remote import envserver

        if monkeypatch is not None:
            monkeypatch.setattr(envserver, "check_actions", lambda space, actions, n: np.clip(
                actions[:n], space.low, space.high))

        class Server(envserver.EnvServer):
            def step(self, req, context):
                reply = super().step(req, context)
                if mangle is not None:
                    mangle(reply)
                return reply

        self.server = Server(env_id, 2).start()

    def __enter__(self):
        return f"remote://{self.server.address}"

    def __exit__(self, *exc):
        self.server.stop(grace=0)


@pytest.mark.parametrize("env_id, takes", [
    ("CartPole-v1", "a2c, appo, ars, dqn, impala, ppo, qrdqn, sac, trpo"),
    ("Pendulum-v1", "a2c, appo, ars, crossq, ddpg, impala, ppo, sac, td3, tqc, trpo")])
def test_an_env_server_passes_the_protocols_checks(capsys, env_id, takes):
    with Lenient(env_id) as url:
        code, out, err = check(capsys, url)
    assert code == 0, err
    assert "proto/shoal.proto's checks: passed" in out and "Gymnasium" not in out
    assert f"sessions: 2 envs (2 on {url.removeprefix('remote://')})" in out
    assert "two resets with seed 0: the same observations" in out
    for bad in ("a row more than its envs", "a value outside the action space"):
        assert f"actions with {bad}: refused with INVALID_ARGUMENT, and the session went on" in out
    assert f"trains with: {takes}" in out
    rate = out.split("random actions: ")[1]
    assert float(rate.split(" steps/s over the wire")[0].replace(",", "")) > 100, out


def test_an_env_server_that_steps_actions_outside_its_space_fails_the_check(capsys, monkeypatch):
    with Lenient("Pendulum-v1", monkeypatch) as url:
        code, out, _ = check(capsys, url)
    assert code == 1
    assert (f"proto/shoal.proto's checks: FAILED: env server {url.removeprefix('remote://')} stepped actions with a "
            "row more than its envs ((3, 1) float32), where it must refuse them with INVALID_ARGUMENT") in out, out


def test_an_env_server_whose_replies_break_the_protocol_fails_the_check_naming_the_array(capsys):
    from shoal.remote.wire import encode

    def mangle(reply):
        reply.rewards.CopyFrom(encode(np.zeros(3)))

    with Lenient("CartPole-v1", mangle=mangle) as url:
        code, out, _ = check(capsys, url)
    assert code == 1
    assert (f"FAILED: env server {url.removeprefix('remote://')} replied to Step with rewards of shape (3,) (float64), "
            "where its 2 envs need shape (2,) (numbers): it does not keep to proto/shoal.proto") in out, out
