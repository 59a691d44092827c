"""Your own env wrappers (``--env-wrapper module:Name KEY=VALUE ...``, rl-zoo's env_wrapper and
SB3's wrapper_class): every env a run makes is inside them (runners', the evaluator's, `shoal
eval`'s, a deployed policy's, an env server's); a run with them learns; mistakes end in one line
before a run directory is written."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
import user_wrappers
import yaml

import shoal
from shoal.cli import main
from shoal.envs import EnvOptions, env_spaces, make_env, wrapper_pairs
from shoal.errors import ConfigError, ShoalError
from shoal.remote.client import RemoteVectorEnv
from shoal.remote.envserver import EnvServer

QUICK = {"progress": False, "tensorboard": False}


def test_ppo_learns_cartpole_inside_your_wrappers_and_is_evaluated_inside_them(tmp_path):
    """Episodes cut at 100 steps, rewards doubled: a solved eval is 200, never more, as the
    evaluator's envs are wrapped as the runners' are."""
    config = shoal.make_config("ppo", "CartPole-v1", env_wrappers=[{"user_wrappers:time_limit": {"steps": 100}},
                                                                   (user_wrappers.ScaleReward, {"scale": 2.0})],
                               stop_return=195, total_steps=40_000, eval_episodes=5, **QUICK)
    assert config.env_wrappers == [{"user_wrappers:time_limit": {"steps": 100}},
                                   {"user_wrappers:ScaleReward": {"scale": 2.0}}]
    summary = shoal.train(config, run_dir=tmp_path)
    assert 195 <= summary["best_eval_return"] <= 200, summary
    with shoal.load(tmp_path) as algo:  # the run's envs again, from its config
        returns = algo.evaluate()
    assert returns["eval/return_mean"] <= 200
    env = shoal.load_policy(tmp_path).make_env()  # a deployed policy's env, as `shoal eval` makes it
    env.reset(seed=0)
    assert env.step(0)[1] == 2.0


def test_the_command_line_takes_wrappers_with_their_arguments_and_eval_uses_them(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "ppo", "--env", "CartPole-v1", "--env-wrapper", "user_wrappers:time_limit", "steps=12",
                 "--env-wrappers=gymnasium.wrappers.TimeAwareObservation", "--total-steps", "256",
                 "--eval-episodes", "2", "--run-dir", str(run), "--no-progress", "--no-tensorboard"]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["env_wrappers"] == [{"user_wrappers:time_limit": {"steps": 12}},
                                     "gymnasium.wrappers:TimeAwareObservation"]
    assert shoal.load_policy(run).observation_space.shape == (5,)  # the time the wrapper adds
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "3"]) == 0
    mean = float(re.search(r"return ([-\d.]+)", capsys.readouterr().out)[1])
    assert mean <= 12


MISTAKES = [
    (["--env-wrapper", "no_colon"], "takes 'module:Name'"),
    (["--env-wrapper", "no_such_module_here:Wrap"], "cannot import 'no_such_module_here'"),
    (["--env-wrapper", "user_wrappers:Missing"], "holds nothing by the name 'Missing'"),
    (["--env-wrapper", "user_wrappers:NOT_CALLABLE"], "holds a int by the name 'NOT_CALLABLE'"),
    (["--env-wrapper", "user_wrappers:Raises"], "Raises(env, **{}) raised ValueError: no wrapper today"),
    (["--env-wrapper", "user_wrappers:not_an_env"], "returned a int, not a gymnasium.Env"),
    (["--env-wrapper", "user_wrappers:ScaleReward", "factor=2"], "unexpected keyword argument 'factor'"),
    (["--env-wrapper", "user_wrappers:ScaleReward", "scale"], "expects key=value, got 'scale'"),
    (["--set", "env_wrappers=[{a:B: 1, c:D: 2}]"], "one 'module:Name': {key: value} mapping"),
    (["--set", "env_wrapper=[a:B]"], "rl-zoo's env_wrapper: shoal calls it env_wrappers"),
]


@pytest.mark.parametrize("flags, message", MISTAKES)
def test_a_mistaken_wrapper_ends_in_one_line_before_a_run_directory_is_written(tmp_path, capsys, flags, message):
    code = main(["train", "ppo", "--env", "CartPole-v1", *flags, "--total-steps", "64", "--run-dir",
                 str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_wrappers_come_before_shoals_own_changes_to_observations():
    """MiniGrid's view is taken from the Dict only where the user's wrapper left it; a Discrete
    observation a wrapper gives is one-hot encoded, as the env's own would be."""
    flat = EnvOptions(wrappers=(("minigrid.wrappers:FlatObsWrapper", {}),))
    obs_space, _ = env_spaces("MiniGrid-Empty-5x5-v0", options=flat)
    assert len(obs_space.shape) == 1 and obs_space.shape[0] > 147  # the flat view and the mission, no image
    assert env_spaces("MiniGrid-Empty-5x5-v0")[0].shape == (7, 7, 3)
    stacked = make_env("CartPole-v1", options=EnvOptions(frame_stack=2, wrappers=(
        ("gymnasium.wrappers:TimeAwareObservation", {}),)))
    assert stacked.observation_space.shape == (2, 5)  # stacked after the wrapper adds its entry


def test_an_env_server_serves_wrapped_envs_and_a_run_on_it_takes_none_of_its_own(tmp_path):
    server = EnvServer("CartPole-v1", 2, port=0, env_options=EnvOptions(
        wrappers=wrapper_pairs([{"user_wrappers:ScaleReward": {"scale": -1.0}}]))).start()
    try:
        envs = RemoteVectorEnv(f"remote://{server.address}")
        envs.reset(seed=0)
        rewards = envs.step(np.zeros(2, dtype=np.int64))[1]
        np.testing.assert_array_equal(rewards, [-1.0, -1.0])
        envs.close()
        with pytest.raises(ConfigError, match="give them to `shoal serve-env ENV_ID"):
            shoal.make_config("ppo", f"remote://{server.address}", env_wrappers=["user_wrappers:ScaleReward"])
    finally:
        server.stop(grace=0)


def test_check_env_checks_the_env_inside_its_wrappers(capsys):
    assert main(["check-env", "CartPole-v1", "--env-wrapper", "gymnasium.wrappers:TimeAwareObservation",
                 "--env-wrapper", "user_wrappers:time_limit", "steps=10", "--seconds", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "(5,)" in out and "unwrapped" not in out, out
    assert float(re.search(r"([\d.]+) steps each", out)[1]) <= 10, out
    assert main(["check-env", "CartPole-v1", "--env-wrapper", "user_wrappers:OutOfSpace", "--seconds", "0"]) == 1
    failed = "FAILED: AssertionError: The first element returned by `env.reset()` is not within the observation space"
    assert failed in capsys.readouterr().out
    with pytest.raises(ShoalError, match="no wrapper today"):
        make_env("CartPole-v1", options=EnvOptions(wrappers=(("user_wrappers:Raises", {}),)))


def test_a_wrapper_defined_in_a_script_is_refused_with_where_to_put_it():
    class Local(gym.Wrapper):
        pass

    with pytest.raises(ConfigError, match="put it in a module of its own"):
        shoal.PPOConfig(env="CartPole-v1", env_wrappers=[Local])
