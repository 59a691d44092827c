"""``--episode-info KEY ...`` (SB3 Monitor's info_keywords, RLlib's custom metrics): the info an
env gives at the step that ends a training episode, logged as episode/KEY, the mean over the last
100 episodes, on every path episodes take to the driver: a runner's rollout, Ape-X's summaries,
env servers' replies, and a checkpoint."""

from __future__ import annotations

import csv

import pytest

import shoal
from shoal.envs import EnvOptions, wrapper_pairs
from shoal.remote.envserver import EnvServer

QUICK = {"progress": False, "tensorboard": False, "eval_interval": 0, "eval_episodes": 1}
SCORED = ["user_wrappers:EpisodeScore"]  # score: the episode's length, at its last step only


def train(config, iterations):
    with shoal.make(config) as algo:
        for _ in range(iterations):
            metrics = algo.train()
    return metrics


@pytest.mark.parametrize("algo, settings", [("ppo", {}), ("dqn", {"apex": True, "learning_starts": 100})])
def test_the_info_at_each_episodes_end_is_logged_beside_the_returns(algo, settings):
    config = shoal.make_config(algo, "CartPole-v1", env_wrappers=SCORED, episode_info=("score", "tag", "absent"),
                               total_steps=10_000, **QUICK, **settings)
    metrics = train(config, 6)
    assert metrics["episode/count"] > 10
    # the same episodes' lengths, through the info: none of the others' steps, which give no score
    assert metrics["episode/score"] == pytest.approx(metrics["episode/length_mean"])
    assert "episode/tag" not in metrics and "episode/absent" not in metrics  # text, and a key never given


def test_an_env_servers_episodes_give_their_info_and_a_run_logs_and_resumes_it(tmp_path):
    server = EnvServer("CartPole-v1", 4, port=0, env_options=EnvOptions(wrappers=wrapper_pairs(SCORED))).start()
    try:
        config = shoal.make_config("ppo", f"remote://{server.address}", episode_info=("score",), total_steps=2_048,
                                   **QUICK)
        summary = shoal.train(config, run_dir=tmp_path / "run")
        with open(tmp_path / "run" / "progress.csv") as f:
            last = list(csv.DictReader(f))[-1]
        assert float(last["episode/score"]) == pytest.approx(float(last["episode/length_mean"]))
        with shoal.load(summary["checkpoint"]) as algo:  # the last 100 episodes' values come back with the run
            assert list(algo.recent_infos["score"]) == pytest.approx(list(algo.recent_lengths))
    finally:
        server.stop(grace=0)


def test_evaluations_report_the_info_of_their_own_episodes_and_shoal_eval_does_too(tmp_path, capsys):
    from shoal.cli import main

    config = shoal.make_config("ppo", "CartPole-v1", env_wrappers=SCORED, episode_info=("score", "tag"),
                               total_steps=1_024, progress=False, tensorboard=False, eval_interval=512,
                               eval_episodes=3)
    shoal.train(config, run_dir=tmp_path / "run")
    with open(tmp_path / "run" / "eval.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 2 and "eval/tag" not in rows[0]
    for row in rows:  # each evaluation's own episodes: their lengths, through the info of their last steps
        assert float(row["eval/score"]) == pytest.approx(float(row["eval/length_mean"]))
    capsys.readouterr()
    for extra in ([], ["--video", str(tmp_path / "videos")]):  # the vector env's episodes, and one env's
        assert main(["eval", str(tmp_path / "run"), "--episodes", "2", *extra]) == 0
        line = capsys.readouterr().out.strip().splitlines()[-1]
        length = float(line.split("length ")[1].split(";")[0])
        assert f"; score {length:.4g}; length" in line and "tag" not in line, line
    assert main(["eval", str(tmp_path / "run"), "--episodes", "1", "--episode-info"]) == 0  # none asked for
    assert "score" not in capsys.readouterr().out


@pytest.mark.parametrize("keys, message", [(("score", ""), "episode_info takes info keys, not an empty name"),
                                           (("return_mean",), "episode_info: return_mean would replace shoal's own")])
def test_info_keys_with_no_name_or_shoals_own_metrics_name_are_refused(keys, message):
    with pytest.raises(shoal.ConfigError, match=message):
        shoal.make_config("ppo", "CartPole-v1", episode_info=keys)
