"""``--eval-env-kwargs KEY=VALUE ...`` (rl-zoo's eval_env_kwargs): evaluations make their envs
with these keyword arguments over env_kwargs, and so does ``shoal eval`` of the run."""

from __future__ import annotations

import csv
import re

import gymnasium as gym
import pytest

import shoal
from shoal.cli import main


class Scaled(gym.Wrapper):
    """CartPole whose rewards are multiplied by ``scale``: a return is ``scale`` times its length."""

    def __init__(self, scale: float = 1.0):
        super().__init__(gym.make("CartPole-v1"))
        self.scale = scale

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward * self.scale, terminated, truncated, info


gym.register("ScaledCartPole-v0", entry_point=Scaled)


def test_evaluations_and_shoal_eval_use_the_eval_kwargs_and_training_its_own(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "ppo", "--env", "ScaledCartPole-v0", "--env-kwargs", "scale=1.0", "--eval-env-kwargs",
                 "scale=10", "--total-steps", "1024", "--rollout-steps", "32", "--eval-interval", "512",
                 "--eval-episodes", "3", "--run-dir", str(run), "--no-progress", "--no-tensorboard"]) == 0
    with open(run / "eval.csv") as f:
        evaluations = list(csv.DictReader(f))
    with open(run / "progress.csv") as f:
        progress = list(csv.DictReader(f))
    assert len(evaluations) == 2
    for row in evaluations:  # every reward was 10: the evaluations' envs took the eval kwargs
        assert float(row["eval/return_mean"]) == pytest.approx(10 * float(row["eval/length_mean"]))
    last = progress[-1]  # and the training envs their own
    assert float(last["episode/return_mean"]) == pytest.approx(float(last["episode/length_mean"]))
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "2"]) == 0  # as the run's evaluations
    line = capsys.readouterr().out
    ret, length = float(re.search(r"return (\S+) ±", line)[1]), float(re.search(r"length (\S+);", line)[1])
    assert ret == pytest.approx(10 * length, rel=1e-3), line
    assert main(["eval", str(run), "--episodes", "2", "--env-kwargs", "scale=2"]) == 0  # given, they replace them
    line = capsys.readouterr().out
    ret, length = float(re.search(r"return (\S+) ±", line)[1]), float(re.search(r"length (\S+);", line)[1])
    assert ret == pytest.approx(2 * length, rel=1e-3), line


def test_eval_kwargs_whose_envs_the_policy_cannot_act_in_are_refused_in_one_line_and_leave_no_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "ppo", "--env", "FrozenLake-v1", "--eval-env-kwargs", "map_name=8x8", "--run-dir", str(run),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "eval_env_kwargs {'map_name': '8x8'} make envs the policy cannot act in: the env gives observations " \
           "Box(0.0, 1.0, (64,), float32)" in err and len(err.strip().splitlines()) == 1, err
    assert not run.exists()


@pytest.mark.parametrize("settings, message", [
    ({"eval_env_kwargs": {"render_mode": "human"}}, "eval_env_kwargs cannot set render_mode"),
    ({"env": "remote://127.0.0.1:50051", "eval_env_kwargs": {"g": 9.8}}, "env_kwargs and eval_env_kwargs apply to envs "
                                                                        "made in this process"),
    ({"eval_env_kwargs": ["g"]}, "eval_env_kwargs expects a mapping of names to values")])
def test_eval_kwargs_that_cannot_work_are_refused(settings, message):
    with pytest.raises(shoal.ConfigError, match=re.escape(message)):
        shoal.make_config("ppo", **{"env": "Pendulum-v1", **settings})
